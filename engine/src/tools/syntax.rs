//! The call syntaxes of the model families we serve: how a call opens and ends, the grammar a
//! call must follow, and a finished call's text read back into a [`Call`].

use serde_json::{Map, Value, json};

use super::{Call, Request};
use crate::grammar::{CallPart, Calls, Grammar};

/// How a model writes a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`: Qwen 2.5 and 3, Hermes, and
    /// the fallback for templates that take no tools.
    Hermes,
    /// `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`:
    /// Qwen 3.5 and Qwen3-Coder.
    QwenXml,
    /// A bare `{"name": …, "parameters": {…}}`: Llama 3.1, 3.2 and 3.3.
    Llama3,
    /// `<|tool_call>call:NAME{key:value,…}<tool_call|>` with `<|"|>`-quoted strings: Gemma 4.
    Gemma4,
}

/// Where a call that has begun stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The call is this many bytes long.
    At(usize),
    /// More text is needed.
    NotYet,
    /// What followed the opener is no call.
    Broken,
}

/// Where a call may begin in text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begins {
    /// A call begins here.
    At(usize),
    /// From here on the text may become a call's beginning: hold it back.
    Maybe(usize),
    /// No call begins in the text.
    Nowhere,
}

impl Syntax {
    /// Where the first call begins in `text`: at its opener. A Llama 3 call is the whole
    /// answer (as llama.cpp reads it): a `{` and, after any whitespace, `"name"`, where nothing
    /// but whitespace came before (`at_start`: nothing was passed on yet).
    pub fn find_call(self, text: &str, at_start: bool) -> Begins {
        if self != Syntax::Llama3 {
            let opener = self.opener();
            if let Some(at) = text.find(opener) {
                return Begins::At(at);
            }
            let keep = (1..opener.len().min(text.len() + 1))
                .rev()
                .find(|&n| {
                    text.is_char_boundary(text.len() - n)
                        && opener.starts_with(&text[text.len() - n..])
                })
                .unwrap_or(0);
            return if keep > 0 {
                Begins::Maybe(text.len() - keep)
            } else {
                Begins::Nowhere
            };
        }
        let trimmed = text.trim_start();
        if !at_start || trimmed.is_empty() {
            return if at_start {
                Begins::Maybe(0)
            } else {
                Begins::Nowhere
            };
        }
        let at = text.len() - trimmed.len();
        if !trimmed.starts_with('{') {
            return Begins::Nowhere;
        }
        let rest = trimmed[1..].trim_start();
        if rest.starts_with("\"name\"") {
            Begins::At(at)
        } else if "\"name\"".starts_with(rest) {
            Begins::Maybe(at)
        } else {
            Begins::Nowhere
        }
    }

    /// Whether a call may only open the answer (a lazily applied grammar then starts only
    /// there).
    pub fn opens_the_answer(self) -> bool {
        self == Syntax::Llama3
    }

    /// The syntax `template` writes calls in, if it takes tools at all and writes calls in a
    /// syntax we read (`None`: the fallback, tools described in the system turn).
    pub fn of_template(template: &str) -> Option<Syntax> {
        if !template.contains("tools") {
            return None;
        }
        if template.contains("<|tool_call>") {
            Some(Syntax::Gemma4)
        } else if template.contains("<function=") && template.contains("<parameter=") {
            Some(Syntax::QwenXml)
        } else if template.contains("<tool_call>") {
            Some(Syntax::Hermes)
        } else if template.contains("\"parameters\": ") && template.contains("\"name\"") {
            Some(Syntax::Llama3)
        } else {
            None
        }
    }

    /// The text a call begins with: where a lazily applied grammar starts.
    pub fn opener(self) -> &'static str {
        match self {
            Syntax::Hermes | Syntax::QwenXml => "<tool_call>",
            Syntax::Llama3 => "{\"name\"",
            Syntax::Gemma4 => "<|tool_call>",
        }
    }

    /// Where a lazily applied grammar starts: the opener, or for Llama 3 the `{` that opens
    /// the answer (JSON lets whitespace come before `"name"`).
    pub fn trigger(self) -> &'static str {
        match self {
            Syntax::Llama3 => "{",
            _ => self.opener(),
        }
    }

    /// The text a call ends with, where it has one.
    pub fn closer(self) -> Option<&'static str> {
        match self {
            Syntax::Hermes | Syntax::QwenXml => Some("</tool_call>"),
            Syntax::Llama3 => None,
            Syntax::Gemma4 => Some("<tool_call|>"),
        }
    }

    /// Most calls one answer may hold in this syntax.
    fn most_calls(self, request: &Request) -> Option<usize> {
        match self {
            // Llama 3's templates describe one call per answer.
            Syntax::Llama3 => Some(1),
            _ if !request.parallel => Some(1),
            _ => None,
        }
    }

    /// The grammar of one or more calls of the request's callable tools, from the opener on.
    /// Arguments follow each tool's schema (for Gemma 4, written in its own value notation).
    pub fn grammar(self, request: &Request) -> Result<Grammar, String> {
        let mut defs = Map::new();
        let mut forms = Vec::new();
        for (i, tool) in request.callable().into_iter().enumerate() {
            let params = format!("tool{i}");
            defs.insert(
                params.clone(),
                rebased(&tool.parameters, &format!("#/$defs/{params}")),
            );
            let arguments = match self {
                Syntax::Llama3 => "parameters",
                _ => "arguments",
            };
            let call = format!("call{i}");
            defs.insert(
                call.clone(),
                json!({
                    "type": "object",
                    "properties": { "name": { "const": tool.name }, arguments: { "$ref": format!("#/$defs/{params}") } },
                    "required": ["name", arguments],
                }),
            );
            forms.push(match self {
                Syntax::Hermes => vec![
                    CallPart::Text("<tool_call>".into()),
                    CallPart::Space,
                    CallPart::Json(format!("/$defs/{call}")),
                    CallPart::Space,
                    CallPart::Text("</tool_call>".into()),
                ],
                Syntax::QwenXml => vec![
                    CallPart::Text(format!("<tool_call>\n<function={}>\n", tool.name)),
                    CallPart::XmlParameters(format!("/$defs/{params}")),
                    CallPart::Text("</function>\n</tool_call>".into()),
                ],
                Syntax::Llama3 => vec![CallPart::Json(format!("/$defs/{call}"))],
                Syntax::Gemma4 => vec![
                    CallPart::Text(format!("<|tool_call>call:{}", tool.name)),
                    CallPart::GemmaArguments(format!("/$defs/{params}")),
                    CallPart::Text("<tool_call|>".into()),
                ],
            });
        }
        Grammar::tool_calls(&Calls {
            doc: json!({ "$defs": defs }),
            forms,
            between: vec![CallPart::Space],
            min: 1,
            max: self.most_calls(request),
        })
        .map_err(|e| e.replacen("json_schema:", "tools:", 1))
    }

    /// Where the call at the start of `text` (which begins with the opener) ends.
    pub fn end_of_call(self, text: &str) -> End {
        match self.closer() {
            Some(closer) => match text.find(closer) {
                Some(at) => End::At(at + closer.len()),
                None => End::NotYet,
            },
            None => {
                let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
                match values.next() {
                    Some(Ok(_)) => End::At(values.byte_offset()),
                    Some(Err(e)) if e.is_eof() => End::NotYet,
                    _ => End::Broken,
                }
            }
        }
    }

    /// The call `text` (a whole call, opener to end) makes, if it is a well-formed call of
    /// one of the request's callable tools.
    pub fn read_call(self, text: &str, request: &Request) -> Option<Call> {
        let (name, arguments) = match self {
            Syntax::Hermes | Syntax::Llama3 => {
                let body = text.strip_prefix("<tool_call>").unwrap_or(text);
                let body = body.strip_suffix("</tool_call>").unwrap_or(body).trim();
                let Value::Object(call) = serde_json::from_str::<Value>(body).ok()? else {
                    return None;
                };
                let name = call.get("name")?.as_str()?.to_string();
                let arguments = match call.get("arguments").or_else(|| call.get("parameters")) {
                    Some(Value::Object(a)) => a.clone(),
                    Some(Value::String(s)) => match serde_json::from_str(s).ok()? {
                        Value::Object(a) => a,
                        _ => return None,
                    },
                    None => Map::new(),
                    Some(_) => return None,
                };
                (name, arguments)
            }
            Syntax::QwenXml => read_xml(text, request)?,
            Syntax::Gemma4 => read_gemma(text)?,
        };
        request.callable().iter().find(|t| t.name == name)?;
        Some(Call {
            name,
            arguments: Value::Object(arguments).to_string(),
        })
    }
}

/// `schema` with every local `$ref` (`#…`) pointing under `base` instead of the root.
fn rebased(schema: &Value, base: &str) -> Value {
    match schema {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("$ref", Value::String(r)) if r.starts_with('#') => {
                            Value::String(format!("{base}{}", &r[1..]))
                        }
                        _ => rebased(v, base),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| rebased(v, base)).collect()),
        other => other.clone(),
    }
}

/// Qwen's XML call: the function's name and its parameters, typed by the tool's schema (a
/// string parameter's value is its raw text; any other is JSON, or text when it does not parse).
fn read_xml(text: &str, request: &Request) -> Option<(String, Map<String, Value>)> {
    let body = text
        .strip_prefix("<tool_call>")?
        .strip_suffix("</tool_call>")?
        .trim();
    let rest = body.strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let rest = rest.trim_end().strip_suffix("</function>")?;
    let tool = request.tool(name)?;
    let mut arguments = Map::new();
    let mut rest = rest.trim_start();
    while !rest.is_empty() {
        let after = rest.strip_prefix("<parameter=")?;
        let (key, after) = after.split_once('>')?;
        // A value ends at the first line holding only the closing tag, as its grammar does.
        let (value, after) = after.split_once("\n</parameter>")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let typed = if tool.argument_is_string(key) {
            Value::String(value.to_string())
        } else {
            serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
        };
        arguments.insert(key.to_string(), typed);
        rest = after.trim_start();
    }
    Some((name.to_string(), arguments))
}

/// Gemma 4's call: `<|tool_call>call:NAME{key:value,…}<tool_call|>`, values in its notation.
fn read_gemma(text: &str) -> Option<(String, Map<String, Value>)> {
    let body = text
        .strip_prefix("<|tool_call>")?
        .strip_suffix("<tool_call|>")?
        .trim();
    let rest = body.strip_prefix("call:")?;
    let brace = rest.find('{')?;
    let name = rest[..brace].trim().to_string();
    let mut reader = GemmaValue {
        text: &rest[brace..],
    };
    let Value::Object(arguments) = reader.value(0)? else {
        return None;
    };
    reader.text.trim().is_empty().then_some((name, arguments))
}

/// Gemma 4's value notation: `<|"|>text<|"|>`, numbers, `true`/`false`/`null`, `{key:value,…}`
/// (keys bare or quoted) and `[value,…]`.
struct GemmaValue<'t> {
    text: &'t str,
}

/// Gemma's string quote.
const QUOTE: &str = "<|\"|>";
/// Deepest nesting read.
const MAX_GEMMA_DEPTH: usize = 64;

impl GemmaValue<'_> {
    fn skip_space(&mut self) {
        self.text = self.text.trim_start();
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_space();
        match self.text.strip_prefix(s) {
            Some(rest) => {
                self.text = rest;
                true
            }
            None => false,
        }
    }

    fn string(&mut self) -> Option<String> {
        let rest = self.text.strip_prefix(QUOTE)?;
        let (s, rest) = rest.split_once(QUOTE)?;
        self.text = rest;
        Some(s.to_string())
    }

    fn key(&mut self) -> Option<String> {
        self.skip_space();
        if self.text.starts_with(QUOTE) {
            return self.string();
        }
        let end = self.text.find(':')?;
        let key = self.text[..end].trim().to_string();
        self.text = &self.text[end..];
        (!key.is_empty()).then_some(key)
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MAX_GEMMA_DEPTH {
            return None;
        }
        self.skip_space();
        if self.text.starts_with(QUOTE) {
            return self.string().map(Value::String);
        }
        if self.eat("{") {
            let mut object = Map::new();
            if self.eat("}") {
                return Some(Value::Object(object));
            }
            loop {
                let key = self.key()?;
                if !self.eat(":") {
                    return None;
                }
                object.insert(key, self.value(depth + 1)?);
                if self.eat("}") {
                    return Some(Value::Object(object));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut list = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(list));
            }
            loop {
                list.push(self.value(depth + 1)?);
                if self.eat("]") {
                    return Some(Value::Array(list));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        // A bare word: a number, true, false or null.
        let end = self.text.find([',', '}', ']']).unwrap_or(self.text.len());
        let word = self.text[..end].trim();
        self.text = &self.text[end..];
        serde_json::from_str::<Value>(word)
            .ok()
            .filter(|v| !v.is_object() && !v.is_array() && !v.is_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolChoice;

    fn weather(choice: ToolChoice) -> Request {
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time", "parameters": {
                "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
        ]);
        let choice = match choice {
            ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
            ToolChoice::Required => json!("required"),
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
        };
        Request::from_fields(Some(&tools), Some(&choice), None, None, None)
            .expect("valid")
            .expect("tools")
    }

    #[test]
    fn a_template_that_never_mentions_tools_gets_the_fallback() {
        assert_eq!(Syntax::of_template("{{ messages }}"), None);
        assert_eq!(
            Syntax::of_template("{% if tools %}<tool_call>{% endif %}"),
            Some(Syntax::Hermes)
        );
    }

    #[test]
    fn each_family_reads_its_own_calls() {
        let r = weather(ToolChoice::Auto);
        let hermes = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let llama = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        let gemma = "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,days:3}<tool_call|>";
        let want = |args: &str| Call {
            name: "get_weather".into(),
            arguments: args.into(),
        };
        assert_eq!(
            Syntax::Hermes.read_call(hermes, &r),
            Some(want(r#"{"city":"Oslo"}"#))
        );
        assert_eq!(
            Syntax::QwenXml.read_call(xml, &r),
            Some(want(r#"{"city":"Oslo","days":3}"#))
        );
        assert_eq!(
            Syntax::Llama3.read_call(llama, &r),
            Some(want(r#"{"city":"Oslo"}"#))
        );
        assert_eq!(
            Syntax::Gemma4.read_call(gemma, &r),
            Some(want(r#"{"city":"Oslo","days":3}"#))
        );
        let unknown = "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(Syntax::Hermes.read_call(unknown, &r), None, "not a tool");
        assert_eq!(
            Syntax::Hermes.read_call("<tool_call>{\"name\": </tool_call>", &r),
            None
        );
    }

    #[test]
    fn the_grammar_of_each_family_takes_its_calls_and_only_valid_arguments() {
        use crate::grammar::Matcher;
        use std::sync::Arc;
        let r = weather(ToolChoice::Required);
        let follows = |syntax: Syntax, text: &str| {
            let g = Arc::new(syntax.grammar(&r).expect("grammar"));
            let mut m = Matcher::new(g);
            m.advance(text.as_bytes()) && m.is_complete()
        };
        assert!(follows(
            Syntax::Hermes,
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>"
        ));
        assert!(!follows(
            Syntax::Hermes,
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 5}}\n</tool_call>"
        ));
        assert!(follows(
            Syntax::QwenXml,
            "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>"
        ));
        assert!(follows(
            Syntax::Llama3,
            "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}"
        ));
        assert!(!follows(
            Syntax::Llama3,
            "{\"name\": \"get_time\", \"parameters\": {}}"
        ));
        assert!(follows(
            Syntax::Gemma4,
            "<|tool_call>call:get_time{zone:<|\"|>UTC<|\"|>}<tool_call|>"
        ));
        assert!(!follows(
            Syntax::Gemma4,
            "<|tool_call>call:rm{}<tool_call|>"
        ));
        let named = weather(ToolChoice::Named("get_time".into()));
        let g = Arc::new(Syntax::Hermes.grammar(&named).expect("grammar"));
        let mut m = Matcher::new(g);
        assert!(
            !m.advance(b"<tool_call>{\"name\": \"get_weather\""),
            "only the named tool"
        );
    }

    #[test]
    fn references_in_a_tool_schema_resolve_inside_its_own_definitions() {
        let tools = json!([{"type": "function", "function": {"name": "move_to", "parameters": {
            "type": "object", "properties": {"at": {"$ref": "#/$defs/point"}}, "required": ["at"],
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}}}]);
        let r = Request::from_fields(Some(&tools), Some(&json!("required")), None, None, None)
            .expect("valid")
            .expect("tools");
        let g = std::sync::Arc::new(Syntax::Hermes.grammar(&r).expect("grammar"));
        let mut m = crate::grammar::Matcher::new(g);
        assert!(m.advance(
            br#"<tool_call>{"name": "move_to", "arguments": {"at": {"x": 3}}}</tool_call>"#
        ));
        assert!(m.is_complete());
        let bad = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}]);
        let r = Request::from_fields(Some(&bad), Some(&json!("required")), None, None, None)
            .expect("valid")
            .expect("tools");
        for syntax in [Syntax::Hermes, Syntax::QwenXml, Syntax::Gemma4] {
            let e = syntax.grammar(&r).expect_err("pattern is not supported");
            assert!(e.contains("pattern"), "{syntax:?}: {e}");
        }
    }

    #[test]
    fn gemma_references_compile_once_and_may_recurse() {
        // Fifteen levels, each naming the next twice: without a cache, 2^15 copies.
        let mut defs = serde_json::Map::new();
        for k in 0..15 {
            let next = json!({"$ref": format!("#/$defs/L{}", k + 1)});
            defs.insert(
                format!("L{k}"),
                json!({"type": "object", "properties": {"a": next, "b": next}}),
            );
        }
        defs.insert("L15".into(), json!({"type": "integer"}));
        defs.insert(
            "tree".into(),
            json!({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}),
        );
        let tools = json!([{"type": "function", "function": {"name": "deep", "parameters": {
            "type": "object", "properties": {"x": {"$ref": "#/$defs/L0"}, "t": {"$ref": "#/$defs/tree"}},
            "$defs": defs}}}]);
        let r = Request::from_fields(Some(&tools), Some(&json!("required")), None, None, None)
            .expect("valid")
            .expect("tools");
        let started = std::time::Instant::now();
        let g = std::sync::Arc::new(Syntax::Gemma4.grammar(&r).expect("compiles"));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let mut m = crate::grammar::Matcher::new(g);
        assert!(m.advance(b"<|tool_call>call:deep{t:{kids:[{kids:[]}]}}<tool_call|>"));
        assert!(m.is_complete());
    }

    #[test]
    fn a_tool_without_an_argument_schema_takes_an_object_and_odd_names_are_refused() {
        let tools = json!([{"type": "function", "function": {"name": "now", "parameters": {}}}]);
        let r = Request::from_fields(Some(&tools), Some(&json!("required")), None, None, None)
            .expect("valid")
            .expect("tools");
        for syntax in [Syntax::Hermes, Syntax::Gemma4, Syntax::QwenXml] {
            syntax.grammar(&r).expect("an empty object schema compiles");
        }
        let g = std::sync::Arc::new(Syntax::Hermes.grammar(&r).expect("grammar"));
        let mut m = crate::grammar::Matcher::new(g);
        assert!(
            !m.advance(br#"<tool_call>{"name": "now", "arguments": "x""#),
            "an object only"
        );
        let odd = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a>b": {"type": "string"}}}}}]);
        let r = Request::from_fields(Some(&odd), Some(&json!("required")), None, None, None)
            .expect("valid")
            .expect("tools");
        for syntax in [Syntax::QwenXml, Syntax::Gemma4] {
            let e = syntax
                .grammar(&r)
                .expect_err("a name the syntax cannot carry");
            assert!(e.contains("a>b"), "{syntax:?}: {e}");
        }
    }
}
