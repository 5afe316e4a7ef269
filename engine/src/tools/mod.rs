//! Tool calling (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`, and the legacy
//! `functions` / `function_call`): the request's tools checked ([`Request`]), the family
//! syntax a model calls them in ([`Syntax`], `syntax.rs`), the grammar a call must follow, and
//! the model's text split into content and calls ([`parse`], [`Splitter`] for streams).
//!
//! A model's own template decides how tools reach the prompt when it takes them (Qwen 2.5/3's
//! and Hermes' `<tool_call>` JSON, Qwen 3.5's XML parameters, Llama 3.x's bare JSON, Gemma 4's
//! `<|tool_call>` tokens). A template that does not (Gemma 3, SmolLM2, ChatML) gets the
//! documented fallback: the tools described in the system turn and calls asked for in the
//! `<tool_call>` JSON syntax ([`Syntax::Hermes`]), tool results sent back as user turns.

mod describe;
mod parse;
mod syntax;

use serde_json::{Map, Value, json};

pub use describe::describe;
pub use parse::{Delta, Parsed, Splitter, parse};
pub use syntax::Syntax;

/// Most tools one request may declare (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;
/// Longest tool name (OpenAI's limit).
pub const MAX_NAME: usize = 64;

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name: letters, digits, `_` and `-`.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// A JSON Schema of its arguments (an object schema; `{}` when none was given).
    pub parameters: Value,
}

impl Tool {
    /// The tool as chat templates take it: `{"type": "function", "function": {…}}`.
    pub fn for_template(&self) -> Value {
        let mut function = json!({ "name": self.name, "parameters": self.parameters });
        if let Some(d) = &self.description {
            function["description"] = json!(d);
        }
        json!({ "type": "function", "function": function })
    }

    /// Whether the schema says this argument is a string (Qwen's XML values are raw text then).
    pub fn argument_is_string(&self, argument: &str) -> bool {
        self.parameters
            .get("properties")
            .and_then(|p| p.get(argument))
            .and_then(|s| s.get("type"))
            .and_then(Value::as_str)
            == Some("string")
    }
}

/// What the model may or must do with the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Answer in text; the tools are not offered.
    None,
    /// Answer or call, as the model decides (calls constrained once begun).
    Auto,
    /// Call one or more of the tools, and nothing else.
    Required,
    /// Call this tool, and nothing else.
    Named(String),
}

/// A chat request's tools and what it allows.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The tools declared.
    pub tools: Vec<Tool>,
    /// `tool_choice` (or `function_call`).
    pub choice: ToolChoice,
    /// Whether one answer may hold several calls (`parallel_tool_calls`; default false, as
    /// llama.cpp's server has it; the legacy `functions` never).
    pub parallel: bool,
}

impl Request {
    /// The tools of a chat request's fields, `None` when it declares none (then a
    /// `tool_choice` other than `none`/`auto` is an error). Errors name the field.
    pub fn from_fields(
        tools: Option<&Value>,
        tool_choice: Option<&Value>,
        parallel_tool_calls: Option<&Value>,
        functions: Option<&Value>,
        function_call: Option<&Value>,
    ) -> Result<Option<Request>, String> {
        let (tools, legacy) = match (present(tools), present(functions)) {
            (Some(_), Some(_)) => return Err("give `tools` or `functions`, not both".into()),
            (Some(t), None) => (checked_tools(t, "tools", true)?, false),
            (None, Some(f)) => (checked_tools(f, "functions", false)?, true),
            (None, None) => (Vec::new(), false),
        };
        let (choice_field, choice) = match (present(tool_choice), present(function_call)) {
            (Some(_), Some(_)) => {
                return Err("give `tool_choice` or `function_call`, not both".into());
            }
            (Some(c), None) => ("tool_choice", Some(c)),
            (None, Some(c)) => ("function_call", Some(c)),
            (None, None) => ("tool_choice", None),
        };
        let choice = match choice {
            None => ToolChoice::Auto,
            Some(c) => checked_choice(c, choice_field)?,
        };
        // llama.cpp's default, not OpenAI's: one call per answer unless asked, so a small model
        // does not repeat its call until the token limit.
        let parallel = match present(parallel_tool_calls) {
            None => false,
            Some(Value::Bool(b)) => *b && !legacy,
            Some(_) => return Err("parallel_tool_calls must be true or false".into()),
        };
        if tools.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(None),
                _ => Err(format!(
                    "{choice_field} asks for a tool call, but the request declares no tools"
                )),
            };
        }
        if let ToolChoice::Named(name) = &choice
            && !tools.iter().any(|t| &t.name == name)
        {
            return Err(format!(
                "{choice_field} names the function {name:?}, which is not among the tools"
            ));
        }
        Ok(Some(Request {
            tools,
            choice,
            parallel,
        }))
    }

    /// The tool called `name`.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The tools the model may call: all, or the named one.
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            _ => self.tools.iter().collect(),
        }
    }
}

/// `value` unless it is JSON null.
fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

/// `tools` (`{"type": "function", "function": {…}}` each) or legacy `functions` (the inner
/// objects), checked.
fn checked_tools(value: &Value, field: &str, wrapped: bool) -> Result<Vec<Tool>, String> {
    let list = value
        .as_array()
        .ok_or_else(|| format!("{field} must be a list"))?;
    if list.len() > MAX_TOOLS {
        return Err(format!(
            "{field} holds {} tools; at most {MAX_TOOLS} are accepted",
            list.len()
        ));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let function = if wrapped {
            match entry.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(format!(
                        "{at}.type is {other:?}; only \"function\" tools are supported"
                    ));
                }
                None => return Err(format!("{at}.type must be \"function\"")),
            }
            entry
                .get("function")
                .ok_or_else(|| format!("{at}.function is missing"))?
        } else {
            entry
        };
        let at = if wrapped {
            format!("{at}.function")
        } else {
            at
        };
        let function = function
            .as_object()
            .ok_or_else(|| format!("{at} must be an object"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{at}.name must be a string"))?;
        check_name(name).map_err(|e| format!("{at}.name: {e}"))?;
        if tools.iter().any(|t| t.name == name) {
            return Err(format!("{at}.name: {name:?} is declared twice"));
        }
        let description = match function.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(_) => return Err(format!("{at}.description must be a string")),
        };
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => json!({ "type": "object", "properties": {} }),
            // A schema that says nothing of its shape (`{}`, only a description) is a tool
            // without arguments: its arguments are an object all the same.
            Some(Value::Object(p))
                if ![
                    "type",
                    "properties",
                    "$ref",
                    "anyOf",
                    "oneOf",
                    "allOf",
                    "enum",
                    "const",
                ]
                .iter()
                .any(|k| p.contains_key(*k)) =>
            {
                let mut p = p.clone();
                p.insert("type".into(), json!("object"));
                p.entry("properties").or_insert_with(|| json!({}));
                Value::Object(p)
            }
            Some(Value::Object(p)) => Value::Object(p.clone()),
            Some(_) => return Err(format!("{at}.parameters must be a JSON Schema object")),
        };
        tools.push(Tool {
            name: name.to_string(),
            description,
            parameters,
        });
    }
    Ok(tools)
}

/// OpenAI's rule for function names: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("must be 1 to {MAX_NAME} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "{name:?} holds {c:?}; a name is letters, digits, `_` and `-`"
        ));
    }
    Ok(())
}

fn checked_choice(value: &Value, field: &str) -> Result<ToolChoice, String> {
    match value {
        Value::String(s) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" if field == "tool_choice" => Ok(ToolChoice::Required),
            other => Err(format!(
                "{field} must be none, auto{}, or name a function, not {other:?}",
                if field == "tool_choice" {
                    ", required"
                } else {
                    ""
                }
            )),
        },
        Value::Object(o) => {
            // `{"type": "function", "function": {"name": …}}`, or legacy `{"name": …}`.
            let inner: &Map<String, Value> = match o.get("function") {
                Some(Value::Object(f)) => f,
                _ => o,
            };
            inner
                .get("name")
                .and_then(Value::as_str)
                .map(|n| ToolChoice::Named(n.to_string()))
                .ok_or_else(|| format!("{field} must name a function: {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"))
        }
        _ => Err(format!(
            "{field} must be a string or an object naming a function"
        )),
    }
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The tool's name.
    pub name: String,
    /// Its arguments, a JSON object as compact text.
    pub arguments: String,
}

/// A fresh call id, as OpenAI's look: `call_` and 24 letters and digits. Ids only need to
/// differ within a conversation, so a randomly keyed hash of the clock and a counter will do.
pub fn call_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::from("call_");
    for part in 0..3u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u64(count);
        h.write_u8(part);
        let mut bits = h.finish();
        for _ in 0..8 {
            id.push(ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char);
            bits /= ALPHABET.len() as u64;
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    }

    #[test]
    fn tools_and_choices_are_checked_and_named_when_wrong() {
        let tools = weather();
        let r = Request::from_fields(Some(&tools), None, None, None, None)
            .expect("valid")
            .expect("tools");
        assert_eq!(r.choice, ToolChoice::Auto);
        assert!(!r.parallel, "one call per answer unless asked");
        let asked = Request::from_fields(Some(&tools), None, Some(&json!(true)), None, None)
            .expect("valid")
            .expect("tools");
        assert!(asked.parallel);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let r = Request::from_fields(Some(&tools), Some(&named), None, None, None)
            .expect("valid")
            .expect("tools");
        assert_eq!(r.choice, ToolChoice::Named("get_weather".into()));
        let other = json!({"type": "function", "function": {"name": "nope"}});
        let e = Request::from_fields(Some(&tools), Some(&other), None, None, None)
            .expect_err("unknown");
        assert!(e.contains("\"nope\""), "{e}");
        let e = Request::from_fields(None, Some(&json!("required")), None, None, None)
            .expect_err("no tools");
        assert!(e.contains("declares no tools"), "{e}");
        assert_eq!(
            Request::from_fields(Some(&json!([])), Some(&json!("auto")), None, None, None),
            Ok(None)
        );
        let bad = json!([{"type": "function", "function": {"name": "rm -rf"}}]);
        let e = Request::from_fields(Some(&bad), None, None, None, None).expect_err("name");
        assert!(e.contains("tools[0].function.name"), "{e}");
        let e = Request::from_fields(
            Some(&json!([{"type": "code_interpreter"}])),
            None,
            None,
            None,
            None,
        )
        .expect_err("type");
        assert!(e.contains("only \"function\""), "{e}");
    }

    #[test]
    fn legacy_functions_map_onto_tools_without_parallel_calls() {
        let functions = json!([{"name": "get_weather", "parameters": {"type": "object"}}]);
        let r = Request::from_fields(
            None,
            None,
            None,
            Some(&functions),
            Some(&json!({"name": "get_weather"})),
        )
        .expect("valid")
        .expect("tools");
        assert_eq!(r.tools[0].name, "get_weather");
        assert_eq!(r.choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel);
    }

    #[test]
    fn call_ids_look_like_openais_and_differ() {
        let (a, b) = (call_id(), call_id());
        assert!(a.starts_with("call_") && a.len() == 29, "{a}");
        assert_ne!(a, b);
    }
}
