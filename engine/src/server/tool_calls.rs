//! A chat answer's tool calls in OpenAI's shape: `message.tool_calls` (or the legacy
//! `function_call`) with `finish_reason: "tool_calls"`, and, streamed, `delta.tool_calls`
//! chunks: a call's id and name first, then its arguments. The text outside the calls is the
//! `content`.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::error::ApiError;
use super::request::ChatRequest;
use crate::chat::{ChatTemplate, Vars};
use crate::tools::{self, Call, Delta, Splitter, Syntax, ToolChoice};

/// A chat request's tools as its answer must treat them (`None` when it declares none or
/// `tool_choice` is `none`), and its template variables: with the tools for a template that
/// takes them; a template that does not gets them described in the messages instead.
pub fn for_chat(
    template: &ChatTemplate,
    request: &ChatRequest,
) -> Result<(Option<Calling>, Vars), ApiError> {
    let mut vars = request.vars();
    let native = template.tool_syntax();
    let Some(tools) = request.tools()?.filter(|t| t.choice != ToolChoice::None) else {
        return Ok((None, vars));
    };
    if native.is_some() {
        vars.tools = Some(tools.tools.iter().map(tools::Tool::for_template).collect());
    }
    let calling = Calling {
        syntax: native.unwrap_or(Syntax::Hermes),
        request: Arc::new(tools),
        legacy: request.functions.as_ref().is_some_and(|f| !f.is_null()),
    };
    Ok((Some(calling), vars))
}

/// A chat request's tools, as its answer is generated and shaped.
#[derive(Debug, Clone)]
pub struct Calling {
    /// The syntax the model calls in: its template's, or the fallback's.
    pub syntax: Syntax,
    /// The tools and what the request allows.
    pub request: Arc<tools::Request>,
    /// The request came with legacy `functions`: answers carry `function_call`.
    pub legacy: bool,
}

impl Calling {
    /// The grammar the answer follows and where it starts: the whole answer for `required`
    /// and a named tool, from a call's opener on for `auto`.
    pub fn grammar(&self) -> Result<(crate::grammar::Grammar, Option<String>), String> {
        let grammar = self.syntax.grammar(&self.request)?;
        let trigger = match self.request.choice {
            ToolChoice::Auto => Some(self.syntax.opener().to_string()),
            _ => None,
        };
        Ok((grammar, trigger))
    }

    /// A whole answer's message and finish reason (`finish` unless it made calls).
    pub fn message(&self, text: &str, finish: &'static str) -> (Value, &'static str) {
        let parsed = tools::parse(self.syntax, Arc::clone(&self.request), text);
        if parsed.calls.is_empty() {
            return (
                json!({ "role": "assistant", "content": parsed.content }),
                finish,
            );
        }
        let content = (!parsed.content.is_empty()).then_some(parsed.content);
        let mut message = json!({ "role": "assistant", "content": content });
        if self.legacy {
            // One call per answer in the legacy shape.
            let call = &parsed.calls[0];
            message["function_call"] = json!({ "name": call.name, "arguments": call.arguments });
        } else {
            let calls: Vec<Value> = parsed
                .calls
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
        (message, self.called(finish))
    }

    /// The finish reason of an answer that made calls.
    fn called(&self, finish: &'static str) -> &'static str {
        match (finish, self.legacy) {
            ("stop", false) => "tool_calls",
            ("stop", true) => "function_call",
            (other, _) => other,
        }
    }

    /// The state of `choices` streamed answers.
    pub fn streaming(&self, choices: usize) -> Streaming {
        Streaming {
            calling: self.clone(),
            choices: Mutex::new(
                (0..choices)
                    .map(|_| ChoiceStream {
                        splitter: Splitter::new(self.syntax, Arc::clone(&self.request)),
                        calls: 0,
                    })
                    .collect(),
            ),
        }
    }
}

/// Streamed answers being split into text and calls.
pub struct Streaming {
    calling: Calling,
    choices: Mutex<Vec<ChoiceStream>>,
}

struct ChoiceStream {
    splitter: Splitter,
    calls: usize,
}

impl Streaming {
    /// The `delta` objects a choice's next text completes.
    pub fn text(&self, choice: usize, text: &str) -> Vec<Value> {
        self.with(choice, |c, legacy| {
            let deltas = c.splitter.push(text);
            c.deltas(deltas, legacy)
        })
    }

    /// At a choice's end: its last `delta` objects and its finish reason.
    pub fn end(&self, choice: usize, finish: &'static str) -> (Vec<Value>, &'static str) {
        let (deltas, called) = self.with(choice, |c, legacy| {
            let deltas = c.splitter.finish();
            (c.deltas(deltas, legacy), c.calls > 0)
        });
        let finish = if called {
            self.calling.called(finish)
        } else {
            finish
        };
        (deltas, finish)
    }

    fn with<T: Default>(&self, choice: usize, f: impl FnOnce(&mut ChoiceStream, bool) -> T) -> T {
        let mut choices = self.choices.lock().unwrap_or_else(|p| p.into_inner());
        choices
            .get_mut(choice)
            .map(|c| f(c, self.calling.legacy))
            .unwrap_or_default()
    }
}

impl ChoiceStream {
    fn deltas(&mut self, deltas: Vec<Delta>, legacy: bool) -> Vec<Value> {
        let mut out = Vec::new();
        for delta in deltas {
            match delta {
                Delta::Content(text) => out.push(json!({ "content": text })),
                Delta::Call(call) => {
                    // The legacy shape holds one call per answer; later ones are dropped.
                    if !(legacy && self.calls > 0) {
                        out.extend(call_deltas(legacy, self.calls, &call));
                    }
                    self.calls += 1;
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
