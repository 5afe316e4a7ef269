//! A chat answer in OpenAI's shape, split into its parts: the reasoning
//! (`message.reasoning_content`, streamed as `delta.reasoning_content`), the text (`content`)
//! and the tool calls (`message.tool_calls` or the legacy `function_call`, with
//! `finish_reason: "tool_calls"`; streamed as `delta.tool_calls` chunks, a call's id and name
//! first, then its arguments).

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::error::ApiError;
use super::request::{ChatRequest, Defaults};
use crate::chat::{ChatTemplate, Vars};
use crate::grammar::Grammar;
use crate::reasoning::{self, Part, Thinking, ThoughtSplitter};
use crate::tools::{self, Call, Delta, Splitter, Syntax, ToolChoice};

/// A chat request's tools, as its answer is generated and shaped.
#[derive(Debug, Clone)]
pub struct Calling {
    /// The syntax the model calls in: its template's, or the fallback's.
    pub syntax: Syntax,
    /// The tools and what the request allows.
    pub request: Arc<tools::Request>,
    /// The request came with legacy `functions`: answers carry `function_call`.
    pub legacy: bool,
    /// The calls' grammar: generation follows it, and a call read back must too.
    pub grammar: Arc<Grammar>,
}

/// A chat request's tools as its answer must treat them (`None` when it declares none or
/// `tool_choice` is `none`), and its template variables: with the tools for a template that
/// takes them; a template that does not gets them described in the messages instead.
pub fn for_chat(
    template: &ChatTemplate,
    request: &ChatRequest,
    defaults: &Defaults,
) -> Result<(Option<Calling>, Vars), ApiError> {
    request.check_reasoning_effort()?;
    let mut vars = request.vars(defaults);
    let native = template.tool_syntax();
    let Some(tools) = request.tools()?.filter(|t| t.choice != ToolChoice::None) else {
        return Ok((None, vars));
    };
    if native.is_some() {
        vars.tools = Some(tools.tools.iter().map(tools::Tool::for_template).collect());
    }
    let syntax = native.unwrap_or(Syntax::Hermes);
    let grammar = syntax.grammar(&tools).map_err(ApiError::bad_request)?;
    let calling = Calling {
        syntax,
        request: Arc::new(tools),
        legacy: request.functions.as_ref().is_some_and(|f| !f.is_null()),
        grammar: Arc::new(grammar),
    };
    Ok((Some(calling), vars))
}

impl Calling {
    /// Where the calls' grammar starts: at the answer's first byte for `required` and a
    /// named tool, at a call's opener for `auto`.
    pub fn trigger(&self) -> Option<String> {
        match self.request.choice {
            ToolChoice::Auto => Some(self.syntax.trigger().to_string()),
            _ => None,
        }
    }

    /// The finish reason of an answer that made calls.
    fn called(&self, finish: &'static str) -> &'static str {
        match (finish, self.legacy) {
            ("stop", false) => "tool_calls",
            ("stop", true) => "function_call",
            (other, _) => other,
        }
    }

    /// `calls` in the message: `tool_calls`, or the legacy `function_call` (the first).
    fn put(&self, message: &mut Value, calls: &[Call]) {
        if self.legacy {
            message["function_call"] =
                json!({ "name": calls[0].name, "arguments": calls[0].arguments });
        } else {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    json!({
                        "id": tools::call_id(), "type": "function",
                        "function": { "name": c.name, "arguments": c.arguments },
                    })
                })
                .collect();
            message["tool_calls"] = json!(calls);
        }
    }
}

/// A tool-offering answer's calls: how many were answered, and how many begun were given
/// back as text (for `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Calls answered.
    pub calls: usize,
    /// Calls begun but malformed, of no callable tool, or cut off.
    pub broken: usize,
}

/// How a chat's answer is split.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// The template's thinking syntax and whether the prompt left a block open, when the
    /// reasoning goes to `reasoning_content`.
    pub thinking: Option<(Thinking, bool)>,
    /// `deepseek-legacy`: `content` keeps the whole text, reasoning included.
    pub keep_reasoning_in_content: bool,
    /// The tools, when calls are to be read.
    pub calling: Option<Calling>,
}

impl Shape {
    /// Whether the answer is its text, unsplit.
    pub fn is_plain(&self) -> bool {
        self.thinking.is_none() && self.calling.is_none() && !self.keep_reasoning_in_content
    }

    /// A whole answer's message and finish reason, and its calls' tally when it offered tools.
    pub fn message(
        &self,
        text: &str,
        finish: &'static str,
    ) -> (Value, &'static str, Option<Tally>) {
        let (reasoning, answer) = match self.thinking {
            Some((thinking, open)) => reasoning::split(thinking, open, text),
            None => (String::new(), text.to_string()),
        };
        let (mut message, finish, tally) = match &self.calling {
            None => (
                json!({ "role": "assistant", "content": answer }),
                finish,
                None,
            ),
            Some(calling) => {
                let parsed = tools::parse(
                    calling.syntax,
                    Arc::clone(&calling.request),
                    Some(Arc::clone(&calling.grammar)),
                    &answer,
                );
                let tally = Some(Tally {
                    calls: parsed.calls.len(),
                    broken: parsed.broken,
                });
                if parsed.calls.is_empty() {
                    let message = json!({ "role": "assistant", "content": parsed.content });
                    (message, finish, tally)
                } else {
                    let content = (!parsed.content.is_empty()).then_some(parsed.content);
                    let mut message = json!({ "role": "assistant", "content": content });
                    calling.put(&mut message, &parsed.calls);
                    (message, calling.called(finish), tally)
                }
            }
        };
        if self.keep_reasoning_in_content {
            message["content"] = json!(text);
        }
        if !reasoning.is_empty() {
            message["reasoning_content"] = json!(reasoning);
        }
        (message, finish, tally)
    }

    /// The state of `choices` streamed answers.
    pub fn streaming(&self, choices: usize) -> Streaming {
        Streaming {
            shape: self.clone(),
            choices: Mutex::new(
                (0..choices)
                    .map(|_| ChoiceStream {
                        thought: self
                            .thinking
                            .map(|(thinking, open)| ThoughtSplitter::new(thinking, open)),
                        calls: self.calling.as_ref().map(|c| {
                            Splitter::new(
                                c.syntax,
                                Arc::clone(&c.request),
                                Some(Arc::clone(&c.grammar)),
                            )
                        }),
                        called: 0,
                    })
                    .collect(),
            ),
        }
    }
}

/// Streamed answers being split.
pub struct Streaming {
    shape: Shape,
    choices: Mutex<Vec<ChoiceStream>>,
}

struct ChoiceStream {
    thought: Option<ThoughtSplitter>,
    calls: Option<Splitter>,
    /// Calls passed on so far.
    called: usize,
}

impl Streaming {
    /// The `delta` objects a choice's next text completes.
    pub fn text(&self, choice: usize, text: &str) -> Vec<Value> {
        self.with(choice, |c, shape| {
            let parts = match &mut c.thought {
                Some(t) => t.push(text),
                None => vec![Part::Text(text.to_string())],
            };
            let mut out = c.deltas(parts, shape, false);
            if shape.keep_reasoning_in_content {
                out.push(json!({ "content": text }));
            }
            out
        })
    }

    /// At a choice's end: its last `delta` objects, its finish reason, and its calls' tally
    /// when it offered tools.
    pub fn end(
        &self,
        choice: usize,
        finish: &'static str,
    ) -> (Vec<Value>, &'static str, Option<Tally>) {
        let (deltas, tally) = self.with(choice, |c, shape| {
            let parts = c
                .thought
                .as_mut()
                .map(ThoughtSplitter::finish)
                .unwrap_or_default();
            let deltas = c.deltas(parts, shape, true);
            let tally = c.calls.as_ref().map(|splitter| Tally {
                calls: c.called,
                broken: splitter.broken(),
            });
            (deltas, tally)
        });
        let finish = match (&self.shape.calling, tally) {
            (Some(calling), Some(t)) if t.calls > 0 => calling.called(finish),
            _ => finish,
        };
        (deltas, finish, tally)
    }

    fn with<T: Default>(&self, choice: usize, f: impl FnOnce(&mut ChoiceStream, &Shape) -> T) -> T {
        let mut choices = self.choices.lock().unwrap_or_else(|p| p.into_inner());
        choices
            .get_mut(choice)
            .map(|c| f(c, &self.shape))
            .unwrap_or_default()
    }
}

impl ChoiceStream {
    /// The deltas of `parts`; at the `end`, what the call splitter still holds too.
    fn deltas(&mut self, parts: Vec<Part>, shape: &Shape, end: bool) -> Vec<Value> {
        let mut out = Vec::new();
        let legacy_text = shape.keep_reasoning_in_content;
        let mut text_pieces = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(r) => out.push(json!({ "reasoning_content": r })),
                Part::Text(t) => match &mut self.calls {
                    Some(splitter) => text_pieces.extend(splitter.push(&t)),
                    None if legacy_text => {}
                    None => out.push(json!({ "content": t })),
                },
            }
        }
        if end && let Some(splitter) = &mut self.calls {
            text_pieces.extend(splitter.finish());
        }
        let legacy_calls = shape.calling.as_ref().is_some_and(|c| c.legacy);
        for delta in text_pieces {
            match delta {
                Delta::Content(t) if !legacy_text => out.push(json!({ "content": t })),
                Delta::Content(_) => {}
                Delta::Call(call) => {
                    // The legacy shape holds one call per answer; later ones are dropped.
                    if !(legacy_calls && self.called > 0) {
                        out.extend(call_deltas(legacy_calls, self.called, &call));
                    }
                    self.called += 1;
                }
            }
        }
        out
    }
}

/// A call as two deltas: its id, type and name (arguments empty), then its arguments.
fn call_deltas(legacy: bool, index: usize, call: &Call) -> [Value; 2] {
    if legacy {
        return [
            json!({ "function_call": { "name": call.name, "arguments": "" } }),
            json!({ "function_call": { "arguments": call.arguments } }),
        ];
    }
    [
        json!({ "tool_calls": [{
            "index": index, "id": tools::call_id(), "type": "function",
            "function": { "name": call.name, "arguments": "" },
        }] }),
        json!({ "tool_calls": [{ "index": index, "function": { "arguments": call.arguments } }] }),
    ]
}
