//! Tool calls as a grammar: each call is a sequence of [`CallPart`]s (the family's literal
//! syntax around JSON valid against the tool's parameter schema, or Qwen's XML parameters), one
//! alternative per tool, repeated between a minimum and a maximum number of times.
//!
//! Every tool's schema lives in one document ([`Calls::doc`]) so `$ref`s resolve: the caller
//! puts tool `i`'s parameters under `/$defs/tool{i}` and rewrites its references to point there.

use serde_json::Value;

use super::json::{IGNORED, Json};
use super::utf8::{self, MAX_CHAR};
use super::{ByteSet, Grammar, Item, literal};

/// One piece of a call's text.
#[derive(Debug, Clone, PartialEq)]
pub enum CallPart {
    /// This text exactly.
    Text(String),
    /// Optional whitespace (as JSON allows between tokens).
    Space,
    /// A JSON value valid against the schema at this JSON pointer of the document.
    Json(String),
    /// The object schema at this pointer in Gemma 4's value notation: `{key:value,…}` with
    /// bare keys, strings between `<|"|>` quotes, numbers and literals as in JSON.
    GemmaArguments(String),
    /// The properties of the object schema at this pointer as Qwen's XML parameters:
    /// `<parameter=NAME>\nVALUE\n</parameter>\n` each, required ones first; a string's value is
    /// its raw text, any other value JSON.
    XmlParameters(String),
}

/// What the output may be: calls of the given forms.
#[derive(Debug, Clone)]
pub struct Calls {
    /// The document every pointer points into.
    pub doc: Value,
    /// The forms of one call: the output's calls are each one of these.
    pub forms: Vec<Vec<CallPart>>,
    /// Between two calls.
    pub between: Vec<CallPart>,
    /// Fewest calls.
    pub min: usize,
    /// Most calls (`None`: no bound).
    pub max: Option<usize>,
}

/// The end of a raw XML parameter value.
const PARAMETER_END: &[u8] = b"\n</parameter>";

/// The grammar of `calls`; an error names what in a schema cannot be followed.
pub(crate) fn grammar(calls: &Calls) -> Result<Grammar, String> {
    let mut j = Json::new(&calls.doc);
    let mut call_alts = Vec::with_capacity(calls.forms.len());
    for form in &calls.forms {
        call_alts.push(parts(&mut j, &calls.doc, form)?);
    }
    if call_alts.is_empty() {
        return Err("tools: no tool to call".into());
    }
    let call = j.b.rule("call", call_alts)?;
    let between = parts(&mut j, &calls.doc, &calls.between)?;
    let mut more = between;
    more.push(Item::Rule(call));
    let tail = j.b.repeat(
        "more calls",
        &more,
        calls.min.saturating_sub(1),
        calls.max.map(|m| m.saturating_sub(1)),
    )?;
    let mut first = vec![Item::Rule(call)];
    first.extend(tail);
    let root = if calls.min == 0 {
        j.b.rule("calls", vec![first, Vec::new()])?
    } else {
        j.b.rule("calls", vec![first])?
    };
    j.b.finish(root)
}

fn resolve<'d>(doc: &'d Value, pointer: &str) -> Result<&'d Value, String> {
    doc.pointer(pointer)
        .ok_or_else(|| format!("tools: no schema at {pointer} (an engine bug)"))
}

fn parts(j: &mut Json<'_>, doc: &Value, parts: &[CallPart]) -> Result<Vec<Item>, String> {
    let mut seq = Vec::new();
    for part in parts {
        match part {
            CallPart::Text(t) => seq.extend(literal(t.as_bytes())),
            CallPart::Space => seq.push(j.ws()?),
            CallPart::Json(pointer) => {
                let schema = resolve(doc, pointer)?;
                seq.push(Item::Rule(j.schema(schema, pointer)?));
            }
            CallPart::XmlParameters(pointer) => {
                let schema = resolve(doc, pointer)?;
                seq.extend(xml_parameters(j, schema, pointer)?);
            }
            CallPart::GemmaArguments(pointer) => {
                let schema = resolve(doc, pointer)?;
                seq.push(Item::Rule(gemma_value(j, doc, schema, pointer, 0)?));
            }
        }
    }
    Ok(seq)
}

/// The properties of `schema`, required ones in their order then the others by name, each
/// optional one optional.
fn xml_parameters(j: &mut Json<'_>, schema: &Value, pointer: &str) -> Result<Vec<Item>, String> {
    let listed = listed_properties(schema.as_object(), pointer)?;
    let mut seq = Vec::new();
    for (name, property, is_required) in listed {
        if name.is_empty() || name.contains(['<', '>', '\n']) {
            return Err(format!(
                "tools: the property name {name:?} at {pointer} cannot be a Qwen XML parameter \
                 (no `<`, `>` or line breaks)"
            ));
        }
        let at = format!(
            "{pointer}/properties/{}",
            name.replace('~', "~0").replace('/', "~1")
        );
        let value = if property.get("type").and_then(Value::as_str) == Some("string") {
            raw_string(j, property, &at, PARAMETER_END)?
        } else {
            j.schema(property, &at)?
        };
        let mut one = literal(format!("<parameter={name}>\n").as_bytes());
        one.push(Item::Rule(value));
        one.extend(literal(PARAMETER_END));
        one.extend(literal(b"\n"));
        if is_required {
            seq.extend(one);
        } else {
            let id = j.b.rule(
                format!("optional parameter {}", short(name)),
                vec![one, Vec::new()],
            )?;
            seq.push(Item::Rule(id));
        }
    }
    Ok(seq)
}

/// A string's raw value (a template writes it unquoted, up to `end`): one of its `enum` or its
/// `const` exactly; one line of `minLength` to `maxLength` characters when it has either (none
/// of them the end's first); else any text without the end. `format` is not checked on raw
/// text; any keyword JSON strings refuse (`pattern`, …) is refused here too.
fn raw_string(j: &mut Json<'_>, property: &Value, at: &str, end: &[u8]) -> Result<u32, String> {
    if let Some(m) = property.as_object() {
        only_keys(
            m,
            &["type", "enum", "const", "minLength", "maxLength", "format"],
            at,
        )?;
    }
    let listed: Option<Vec<&Value>> = match (property.get("enum"), property.get("const")) {
        (Some(Value::Array(values)), _) => Some(values.iter().collect()),
        (_, Some(value)) => Some(vec![value]),
        (Some(_), None) => return Err(format!("json_schema: `enum` at {at} must be a list")),
        (None, None) => None,
    };
    if let Some(values) = listed {
        let alts = values
            .into_iter()
            .map(|v| {
                v.as_str().map(|s| literal(s.as_bytes())).ok_or_else(|| {
                    format!("json_schema: a string's `enum` or `const` at {at} must hold strings")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        return j.b.rule(format!("{} (listed)", short(at)), alts);
    }
    let bound = |key: &str| -> Result<Option<usize>, String> {
        match property.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n <= MAX_RAW_LENGTH)
                .map(|n| Some(n as usize))
                .ok_or_else(|| {
                    format!(
                        "json_schema: `{key}` at {at} must be a whole number up to {MAX_RAW_LENGTH}"
                    )
                }),
        }
    };
    let (min, max) = (bound("minLength")?, bound("maxLength")?);
    if min.is_none() && max.is_none() {
        return raw_text(j, end);
    }
    // Bounded: characters other than a newline and the end's first, so the end never appears.
    let first = u32::from(end.first().copied().unwrap_or(b'\n'));
    let line = utf8::complement(&utf8::normalize(vec![
        (u32::from(b'\n'), u32::from(b'\n')),
        (first, first),
    ]));
    let char_rule =
        j.b.rule("one-line character", utf8::class_alternatives(&line))?;
    let seq = j.b.repeat(
        &format!("{} (characters)", short(at)),
        &[Item::Rule(char_rule)],
        min.unwrap_or(0),
        max,
    )?;
    j.b.rule(format!("{} (bounded)", short(at)), vec![seq])
}

/// Gemma 4's string quote.
const GEMMA_QUOTE: &str = "<|\"|>";
/// Deepest schema nesting compiled into Gemma's notation.
const MAX_GEMMA_DEPTH: usize = 32;

/// A value valid against `schema` in Gemma 4's notation.
fn gemma_value(
    j: &mut Json<'_>,
    doc: &Value,
    schema: &Value,
    at: &str,
    depth: usize,
) -> Result<u32, String> {
    let refuse = |what: &str| {
        Err(format!(
            "tools: {what} at {at} cannot be written in Gemma 4's call notation"
        ))
    };
    if depth > MAX_GEMMA_DEPTH {
        return refuse("a schema nested this deep");
    }
    let Some(m) = schema.as_object() else {
        return match schema {
            Value::Bool(true) => refuse("a value of any type"),
            _ => refuse("a schema that is not an object"),
        };
    };
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix('#')
            .and_then(|p| doc.pointer(p))
            .ok_or_else(|| format!("json_schema: `$ref` {r:?} at {at} points nowhere"))?;
        // Each reference is compiled once (reserved first, so a schema may refer to itself):
        // a schema that names one definition many times stays as small as it is.
        if let Some(&id) = j.gemma_refs.get(r) {
            return Ok(id);
        }
        let id = j.b.reserve(format!("ref {}", short(r)))?;
        j.gemma_refs.insert(r.to_string(), id);
        let value = gemma_value(j, doc, target, "a referenced schema", depth + 1)?;
        j.b.define(id, vec![vec![Item::Rule(value)]])?;
        return Ok(id);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(list) = m.get(key).and_then(Value::as_array) {
            let mut alts = Vec::with_capacity(list.len());
            for (i, sub) in list.iter().enumerate() {
                let id = gemma_value(j, doc, sub, &format!("{at}/{key}/{i}"), depth + 1)?;
                alts.push(vec![Item::Rule(id)]);
            }
            return j.b.rule(format!("{} (one of)", short(at)), alts);
        }
    }
    let listed: Option<Vec<&Value>> = match (m.get("enum"), m.get("const")) {
        (Some(Value::Array(values)), _) => Some(values.iter().collect()),
        (_, Some(value)) => Some(vec![value]),
        _ => None,
    };
    if let Some(values) = listed {
        let alts = values
            .into_iter()
            .map(|v| match v {
                Value::String(s) => literal(format!("{GEMMA_QUOTE}{s}{GEMMA_QUOTE}").as_bytes()),
                other => literal(other.to_string().as_bytes()),
            })
            .collect();
        return j.b.rule(format!("{} (listed)", short(at)), alts);
    }
    let kind = match m.get("type") {
        Some(Value::String(t)) => t.as_str(),
        None if m.contains_key("properties") => "object",
        None if m.contains_key("items") => "array",
        _ => return refuse("a value without one `type`"),
    };
    match kind {
        "string" => {
            let mut seq = literal(GEMMA_QUOTE.as_bytes());
            seq.push(Item::Rule(raw_string(
                j,
                schema,
                at,
                GEMMA_QUOTE.as_bytes(),
            )?));
            seq.extend(literal(GEMMA_QUOTE.as_bytes()));
            j.b.rule(format!("{} (string)", short(at)), vec![seq])
        }
        "integer" | "number" | "boolean" | "null" => j.schema(schema, at),
        "array" => {
            only_keys(m, &["type", "items"], at)?;
            let items = m.get("items").unwrap_or(&Value::Bool(true));
            let item = gemma_value(j, doc, items, &format!("{at}/items"), depth + 1)?;
            let more = j.b.repeat(
                &format!("{} (more items)", short(at)),
                &[Item::Bytes(ByteSet::byte(b',')), Item::Rule(item)],
                0,
                None,
            )?;
            let mut some = vec![Item::Rule(item)];
            some.extend(more);
            let body =
                j.b.rule(format!("{} (items)", short(at)), vec![some, Vec::new()])?;
            j.b.rule(
                format!("{} (array)", short(at)),
                vec![vec![
                    Item::Bytes(ByteSet::byte(b'[')),
                    Item::Rule(body),
                    Item::Bytes(ByteSet::byte(b']')),
                ]],
            )
        }
        "object" => gemma_object(j, doc, m, at, depth),
        other => refuse(&format!("type {other:?}")),
    }
}

/// `{key:value,…}`: required properties in their order, then the others by name, each of
/// those optional; a comma between any two present.
fn gemma_object(
    j: &mut Json<'_>,
    doc: &Value,
    m: &serde_json::Map<String, Value>,
    at: &str,
    depth: usize,
) -> Result<u32, String> {
    only_keys(
        m,
        &["type", "properties", "required", "additionalProperties"],
        at,
    )?;
    if m.get("additionalProperties")
        .is_some_and(|a| a != &Value::Bool(false))
    {
        return Err(format!(
            "tools: `additionalProperties` other than false at {at} cannot be written in Gemma \
             4's call notation"
        ));
    }
    let listed = listed_properties(Some(m), at)?;
    // after[i]: properties i.. once one was written (each present one after a comma);
    // first[i]: the same before any was written.
    let mut after: u32 = j.b.rule(format!("{} (end)", short(at)), vec![Vec::new()])?;
    let mut first: u32 = after;
    for &(name, property, is_required) in listed.iter().rev() {
        if name.is_empty()
            || name
                .chars()
                .any(|c| c.is_whitespace() || ":,{}[]<>\"".contains(c))
        {
            return Err(format!(
                "tools: the property name {name:?} at {at} cannot be written in Gemma 4's call \
                 notation (no spaces or `:,{{}}[]<>\"`)"
            ));
        }
        let value = gemma_value(
            j,
            doc,
            property,
            &format!("{at}/properties/{name}"),
            depth + 1,
        )?;
        let mut item = literal(format!("{name}:").as_bytes());
        item.push(Item::Rule(value));
        let mut with_comma = vec![Item::Bytes(ByteSet::byte(b','))];
        with_comma.extend(item.iter().copied());
        with_comma.push(Item::Rule(after));
        let mut leading = item;
        leading.push(Item::Rule(after));
        // An optional property may also be left out, in either state.
        let (mut after_alts, mut first_alts) = (vec![with_comma], vec![leading]);
        if !is_required {
            after_alts.push(vec![Item::Rule(after)]);
            first_alts.push(vec![Item::Rule(first)]);
        }
        let new_after =
            j.b.rule(format!("{} {}", short(at), short(name)), after_alts)?;
        let new_first =
            j.b.rule(format!("{} {} (first)", short(at), short(name)), first_alts)?;
        after = new_after;
        first = new_first;
    }
    j.b.rule(
        format!("{} (object)", short(at)),
        vec![vec![
            Item::Bytes(ByteSet::byte(b'{')),
            Item::Rule(first),
            Item::Bytes(ByteSet::byte(b'}')),
        ]],
    )
}

/// A rule name from client text, cut short: names are for messages, not copies of the schema.
fn short(text: &str) -> &str {
    match text.char_indices().nth(60) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// Refuses, by name, a keyword of `m` outside `allowed` (descriptive ones and `x-` aside).
fn only_keys(m: &serde_json::Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), String> {
    match m.keys().find(|k| {
        !allowed.contains(&k.as_str()) && !IGNORED.contains(&k.as_str()) && !k.starts_with("x-")
    }) {
        Some(key) => Err(format!("json_schema: `{key}` at {at} is not supported")),
        None => Ok(()),
    }
}

/// An object schema's properties in the order a call writes them: the required ones as
/// `required` lists them, then the others by name; each with its schema and whether it is
/// required.
fn listed_properties<'s>(
    m: Option<&'s serde_json::Map<String, Value>>,
    at: &str,
) -> Result<Vec<(&'s str, &'s Value, bool)>, String> {
    let required: Vec<&str> = m
        .and_then(|m| m.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let missing = |name: &str| {
        format!("json_schema: `required` names {name:?}, which is not in `properties` at {at}")
    };
    let Some(properties) = m
        .and_then(|m| m.get("properties"))
        .and_then(Value::as_object)
    else {
        return match required.first() {
            Some(name) => Err(missing(name)),
            None => Ok(Vec::new()),
        };
    };
    let mut listed = Vec::with_capacity(properties.len());
    for name in &required {
        let (name, schema) = properties
            .get_key_value(*name)
            .ok_or_else(|| missing(name))?;
        if !listed.iter().any(|(n, _, _)| *n == name.as_str()) {
            listed.push((name.as_str(), schema, true));
        }
    }
    let mut optional: Vec<(&str, &Value, bool)> = properties
        .iter()
        .filter(|(k, _)| !required.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v, false))
        .collect();
    optional.sort_unstable_by_key(|(k, _, _)| *k);
    listed.extend(optional);
    Ok(listed)
}

/// Most characters a raw string's length bounds unroll.
const MAX_RAW_LENGTH: u64 = 1024;

/// Text (valid UTF-8) that does not contain `end`: a state per prefix of it matched. `end` is
/// ASCII and its first byte appears nowhere else in it, so a mismatch restarts the match at
/// that byte or at nothing.
fn raw_text(j: &mut Json<'_>, end: &[u8]) -> Result<u32, String> {
    if let Some(&id) = j.raw.get(end) {
        return Ok(id);
    }
    let n = end.len();
    let Some(&first) = end.first() else {
        return Err("tools: an empty end of raw text (an engine bug)".into());
    };
    if !end.is_ascii() || end[1..].contains(&first) {
        return Err(format!(
            "tools: {:?} cannot end raw text (an engine bug)",
            String::from_utf8_lossy(end)
        ));
    }
    let states: Vec<u32> = (0..n)
        .map(|k| j.b.reserve(format!("raw text ({k} of the end matched)")))
        .collect::<Result<_, _>>()?;
    for k in 0..n {
        let mut alts: Vec<Vec<Item>> = vec![Vec::new()];
        // The end's next byte continues the match (unless it would complete it).
        let next = end[k];
        if k + 1 < n {
            alts.push(vec![
                Item::Bytes(ByteSet::byte(next)),
                Item::Rule(states[k + 1]),
            ]);
        }
        // Its first byte starts a new match (the end repeats no prefix of itself).
        if k > 0 {
            alts.push(vec![
                Item::Bytes(ByteSet::byte(first)),
                Item::Rule(states[1]),
            ]);
        }
        // Any other character starts over.
        let excluded = [u32::from(next), u32::from(first)];
        let others = utf8::complement(&utf8::normalize(excluded.iter().map(|&c| (c, c)).collect()));
        let others: Vec<(u32, u32)> = others
            .into_iter()
            .filter(|&(_, hi)| hi <= MAX_CHAR)
            .collect();
        for mut alt in utf8::class_alternatives(&others) {
            alt.push(Item::Rule(states[0]));
            alts.push(alt);
        }
        j.b.define(states[k], alts)?;
    }
    j.raw.insert(end.to_vec(), states[0]);
    Ok(states[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::Matcher;
    use serde_json::json;
    use std::sync::Arc;

    fn follows(g: &Arc<Grammar>, text: &str) -> bool {
        let mut m = Matcher::new(Arc::clone(g));
        m.advance(text.as_bytes()) && m.is_complete()
    }

    fn hermes(max: Option<usize>) -> Arc<Grammar> {
        let doc = json!({"$defs": {"tool0": {
            "type": "object",
            "properties": {"name": {"const": "get_weather"}, "arguments": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            "required": ["name", "arguments"],
        }}});
        let form = vec![
            CallPart::Text("<tool_call>".into()),
            CallPart::Space,
            CallPart::Json("/$defs/tool0".into()),
            CallPart::Space,
            CallPart::Text("</tool_call>".into()),
        ];
        let calls = Calls {
            doc,
            forms: vec![form],
            between: vec![CallPart::Space],
            min: 1,
            max,
        };
        Arc::new(grammar(&calls).expect("grammar"))
    }

    #[test]
    fn a_call_must_name_a_tool_and_carry_its_required_arguments() {
        let g = hermes(None);
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        assert!(follows(&g, call));
        assert!(follows(&g, &format!("{call}\n{call}")), "parallel calls");
        assert!(!follows(
            &g,
            "<tool_call>\n{\"name\": \"other\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
        ));
        assert!(!follows(
            &g,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"
        ));
        assert!(!follows(&g, ""), "at least one call");
        let one = hermes(Some(1));
        assert!(follows(&one, call));
        assert!(
            !follows(&one, &format!("{call}\n{call}")),
            "one call at most"
        );
    }

    #[test]
    fn xml_parameters_take_raw_strings_and_json_for_other_types() {
        let doc = json!({"$defs": {"tool0": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "note": {"type": "string", "maxLength": 3}},
            "required": ["city"],
        }}});
        let form = vec![
            CallPart::Text("<tool_call>\n<function=get_weather>\n".into()),
            CallPart::XmlParameters("/$defs/tool0".into()),
            CallPart::Text("</function>\n</tool_call>".into()),
        ];
        let calls = Calls {
            doc,
            forms: vec![form],
            between: vec![CallPart::Text("\n".into())],
            min: 1,
            max: None,
        };
        let g = Arc::new(grammar(&calls).expect("grammar"));
        let city =
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n<b>\n</parameter>\n";
        assert!(follows(&g, &format!("{city}</function>\n</tool_call>")));
        assert!(follows(
            &g,
            &format!("{city}<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
        ));
        assert!(!follows(
            &g,
            &format!("{city}<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>")
        ));
        assert!(!follows(
            &g,
            "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"
        ));
        let with = |extra: &str| format!("{city}{extra}</function>\n</tool_call>");
        assert!(follows(
            &g,
            &with("<parameter=unit>\ncelsius\n</parameter>\n")
        ));
        assert!(
            !follows(&g, &with("<parameter=unit>\n\"celsius\"\n</parameter>\n")),
            "raw, not JSON"
        );
        assert!(follows(&g, &with("<parameter=note>\nabc\n</parameter>\n")));
        assert!(
            !follows(&g, &with("<parameter=note>\nabcd\n</parameter>\n")),
            "maxLength"
        );
    }
}
