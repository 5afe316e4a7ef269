use std::sync::Arc;

use serde_json::{Value, json};

use crate::grammar::{Grammar, Matcher};

fn schema(s: Value) -> Arc<Grammar> {
    Arc::new(Grammar::from_json_schema(&s).unwrap_or_else(|e| panic!("{e}")))
}

/// Whether `text` is a whole sentence of `g`.
fn full(g: &Arc<Grammar>, text: &str) -> bool {
    let mut m = Matcher::new(g.clone());
    m.advance(text.as_bytes()) && m.is_complete()
}

/// Feeds `bytes` one at a time: the index of the first refused byte, or `None`.
fn refused_at(g: &Arc<Grammar>, bytes: &[u8]) -> Option<usize> {
    let mut m = Matcher::new(g.clone());
    bytes.iter().position(|&b| !m.advance(&[b]))
}

const VALID: &[&str] = &[
    "{}",
    "{\"a\":1}",
    "{ \"a\" : [ 1 , 2.5 , -3e+2 , 0 , -0.0E-1 ] }",
    "{\n  \"name\": \"Ada\",\n  \"age\": 36,\n  \"tags\": [\"x\", \"y\"],\n  \"nested\": {\"deep\": {\"deeper\": [[], {}]}}\n}",
    "{\"unicode\":\"café 日本語 😀 Ωμέγα\",\"escapes\":\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00 \\u0000\"}",
    "{\"t\":true,\"f\":false,\"n\":null,\"e\":\"\",\"z\":0.0001,\"big\":12345678901234567890}",
    "{\"\":{\"\":{\"\":[null]}}}",
    "{\"a\":[{\"b\":[{\"c\":[1,[2,[3,[4]]]]}]}]}",
    "{\"k\":\"\u{7f}\u{80}\u{7ff}\u{800}\u{ffff}\u{10000}\u{10ffff}\"}",
    "{\"tab\":\t1,\"nl\":\n2}",
];

#[test]
fn json_object_accepts_a_varied_corpus_byte_by_byte() {
    let g = Arc::new(Grammar::json_object());
    for doc in VALID {
        serde_json::from_str::<Value>(doc).expect("the corpus is JSON");
        let mut m = Matcher::new(g.clone());
        for (i, &b) in doc.as_bytes().iter().enumerate() {
            assert!(!m.is_complete(), "{doc:?} complete before byte {i}");
            assert!(
                m.accepts(&[b]),
                "{doc:?}: byte {i} ({:?}) refused",
                b as char
            );
            assert!(m.advance(&[b]));
        }
        assert!(m.is_complete(), "{doc:?} not complete at its end");
        assert!(!m.can_continue(), "{doc:?}: nothing may follow the object");
    }
}

#[test]
fn json_object_refuses_invalid_json_at_the_right_byte() {
    let g = Arc::new(Grammar::json_object());
    let cases: &[(&[u8], usize)] = &[
        (b"{\"a\":1,}", 7),       // trailing comma
        (b"{\"a\":01}", 6),       // leading zero
        (b"{\"a\":\"x\ny\"}", 7), // raw control character
        (b"{\"a\":\"x\x01\"}", 7),
        (b"[1,2]", 0), // not an object at the top
        (b"\"x\"", 0),
        (b"1", 0),
        (b" {}", 0),        // nothing before the object
        (b"{\"a\":1}}", 7), // nothing after it
        (b"{\"a\":1} ", 7),
        (b"{\"a\":tru}", 8),
        (b"{\"a\":\"\\x\"}", 7),      // unknown escape
        (b"{\"a\":\"\\ud800\"}", 12), // lone surrogate
        (b"{\"a\":\"\\udc00\"}", 9),
        (b"{\"a\":\"\xC0\x80\"}", 6),     // overlong UTF-8
        (b"{\"a\":\"\xED\xA0\x80\"}", 7), // surrogate in UTF-8
        (b"{\"a\":\"\x80\"}", 6),         // stray continuation byte
        (b"{\"a\":-}", 6),
        (b"{\"a\":1.}", 7),
        (b"{\"a\":1e}", 7),
        (b"{\"a\":.5}", 5),
        (b"{\"a\" 1}", 5),
        (b"{a:1}", 1),
        (b"{\"a\":1 \"b\":2}", 7),
        (b"{\"a\":1e123}", 9), // an exponent past f64's range
        (b"{\"a\":\n\n1}", 6), // at most one newline per gap
    ];
    for &(doc, at) in cases {
        assert_eq!(
            refused_at(&g, doc),
            Some(at),
            "{:?}",
            String::from_utf8_lossy(doc)
        );
    }
    // Unclosed: every byte accepted, never complete.
    for doc in ["{\"a\":[1,2", "{\"a\":\"x", "{", "{\"a\""] {
        let mut m = Matcher::new(g.clone());
        assert!(m.advance(doc.as_bytes()) && !m.is_complete(), "{doc}");
    }
    // Whitespace is bounded: 20 blanks after one newline, no more.
    assert!(full(&g, &format!("{{\n{}}}", " ".repeat(20))));
    assert_eq!(
        refused_at(&g, format!("{{{}}}", " ".repeat(21)).as_bytes()),
        Some(21)
    );
    // Digits are bounded too (so a number always fits an f64).
    assert_eq!(
        refused_at(&g, format!("{{\"a\":{}}}", "1".repeat(21)).as_bytes()),
        Some(25)
    );
}

#[test]
fn json_object_nesting_is_bounded_below_serde_jsons_limit() {
    let g = Arc::new(Grammar::json_object());
    let deep = format!("{{\"a\":{}1{}}}", "[".repeat(63), "]".repeat(63));
    assert!(full(&g, &deep));
    assert_eq!(
        refused_at(&g, format!("{{\"a\":{}", "[".repeat(64)).as_bytes()),
        Some(5 + 63)
    );
}

#[test]
fn required_and_optional_properties_in_every_combination() {
    let g = schema(json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "b": {"type": "string"},
            "c": {"type": "boolean"},
            "d": {"type": "null"},
            "name": {"type": "string"}
        },
        "required": ["name", "id"],
        "additionalProperties": false
    }));
    let optional = [("b", "\"x\""), ("c", "true"), ("d", "null")];
    for mask in 0..8 {
        let mut parts = vec!["\"name\": \"n\"".to_string(), "\"id\": 7".to_string()];
        for (i, (k, v)) in optional.iter().enumerate() {
            if mask & (1 << i) != 0 {
                parts.push(format!("\"{k}\": {v}"));
            }
        }
        let doc = format!("{{{}}}", parts.join(", "));
        assert!(full(&g, &doc), "{doc}");
        assert!(full(&g, &doc.replace(", ", ",")), "{doc}");
    }
    // A missing required property, an extra one, a wrong type, a duplicate.
    for bad in [
        "{\"name\": \"n\"}",
        "{\"id\": 7}",
        "{}",
        "{\"name\": \"n\", \"id\": 7, \"e\": 1}",
        "{\"name\": 1, \"id\": 7}",
        "{\"name\": \"n\", \"id\": 7.5}",
        "{\"name\": \"n\", \"id\": 7, \"b\": \"x\", \"b\": \"y\"}",
        "{\"name\": \"n\", \"id\": 7,}",
        "{, \"name\": \"n\", \"id\": 7}",
    ] {
        assert!(!full(&g, bad), "{bad}");
    }
}

#[test]
fn only_optional_properties_and_extra_ones() {
    let g = schema(json!({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}));
    for ok in ["{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}"] {
        assert!(full(&g, ok), "{ok}");
    }
    assert!(!full(&g, "{\"c\":1}") && !full(&g, "{\"a\":1,}"));
    let g = schema(json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": {"type": "string"}
    }));
    for ok in [
        "{\"a\":1}",
        "{\"a\":1,\"z\":\"x\"}",
        "{\"a\":1,\"ab\":2,\"abc\":\"x\",\"\":\"y\"}",
        "{\"a\":1,\"b\":\"x\"}",
    ] {
        assert!(full(&g, ok), "{ok}");
    }
    // Extra keys never repeat a listed one (the value would then break that property's schema).
    for bad in [
        "{\"a\":1,\"a\":\"x\"}",
        "{\"a\":1,\"ab\":\"x\"}",
        "{\"a\":1,\"z\":2}",
    ] {
        assert!(!full(&g, bad), "{bad}");
    }
    let g = schema(json!({"type": "object", "additionalProperties": {"type": "integer"}}));
    assert!(full(&g, "{\"x\":1,\"y\":2}") && !full(&g, "{\"x\":\"s\"}"));
    let g = schema(json!({"type": "object"}));
    assert!(full(&g, "{\"x\":[1,{\"y\":null}]}"));
}

#[test]
fn enum_const_any_of_and_types() {
    let g = schema(json!({"enum": ["red", "green", 1, null, {"x": [1, 2]}, "gr"]}));
    for ok in [
        "\"red\"",
        "\"green\"",
        "1",
        "null",
        "{\"x\":[1,2]}",
        "\"gr\"",
    ] {
        assert!(full(&g, ok), "{ok}");
    }
    for bad in ["\"blue\"", "2", "\"re\"", "{\"x\":[1]}", "\"red\" "] {
        assert!(!full(&g, bad), "{bad}");
    }
    let g = schema(json!({"type": "string", "enum": ["a", 1]}));
    assert!(full(&g, "\"a\"") && !full(&g, "1"));
    let g = schema(json!({"const": {"k": "v\"q"}}));
    assert!(full(&g, r#"{"k":"v\"q"}"#));
    let g = schema(json!({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}));
    assert!(full(&g, "\"ab\"") && full(&g, "-12") && !full(&g, "\"abc\"") && !full(&g, "1.5"));
    let g = schema(json!({"type": ["number", "null"]}));
    assert!(full(&g, "1.5e-3") && full(&g, "null") && full(&g, "-7") && !full(&g, "\"1\""));
    let g = schema(json!({"type": "boolean"}));
    assert!(full(&g, "true") && full(&g, "false") && !full(&g, "null"));
    let g = schema(json!({"allOf": [{"type": "integer"}], "description": "one"}));
    assert!(full(&g, "3") && !full(&g, "3.0"));
    for s in [json!({}), json!(true)] {
        let g = schema(s);
        assert!(full(&g, "[1, \"x\", {\"a\": null}]") && full(&g, "\"s\"") && full(&g, "0"));
    }
}

#[test]
fn refs_recurse() {
    let g = schema(json!({
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
                },
                "required": ["value"]
            }
        }
    }));
    assert!(full(
        &g,
        r#"{"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4,"children":[]}]}]}"#
    ));
    assert!(!full(&g, r#"{"value":1,"children":[{"children":[]}]}"#));
    let g = schema(json!({
        "definitions": {"list": {"anyOf": [{"type": "null"}, {"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#/definitions/list"}], "items": false}]}},
        "$ref": "#/definitions/list"
    }));
    assert!(full(&g, "[1,[2,[3,null]]]") && full(&g, "[1,[2]]") && !full(&g, "[1,[2,3]]"));
    let g = schema(json!({"type": "object", "properties": {"self": {"$ref": "#"}}}));
    assert!(full(&g, r#"{"self":{"self":{}}}"#));
}

#[test]
fn array_bounds_and_tuples() {
    let g = schema(
        json!({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}),
    );
    for ok in ["[1,2]", "[1, 2, 3]", "[ 1 ,2 ]"] {
        assert!(full(&g, ok), "{ok}");
    }
    assert_eq!(refused_at(&g, b"[1]"), Some(2));
    assert_eq!(refused_at(&g, b"[1,2,3,4]"), Some(6));
    assert!(!full(&g, "[]") && !full(&g, "[1,\"a\"]"));
    let g = schema(
        json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false}),
    );
    assert!(
        full(&g, "[\"a\",1]")
            && full(&g, "[\"a\"]")
            && full(&g, "[]")
            && !full(&g, "[\"a\",1,2]")
            && !full(&g, "[1]")
    );
    let g = schema(
        json!({"type": "array", "prefixItems": [{"const": 0}], "items": {"type": "boolean"}, "minItems": 2}),
    );
    assert!(
        full(&g, "[0,true]")
            && full(&g, "[0,true,false,true]")
            && !full(&g, "[0]")
            && !full(&g, "[true]")
    );
    let g = schema(json!({"type": "array"}));
    assert!(full(&g, "[]") && full(&g, "[1,[2],{}]") && !full(&g, "[1,]") && !full(&g, "[,1]"));
    let g = schema(json!({"type": "array", "maxItems": 0}));
    assert!(full(&g, "[]") && !full(&g, "[1]"));
}

#[test]
fn string_lengths_and_formats() {
    let g = schema(json!({"type": "string", "minLength": 2, "maxLength": 3}));
    for ok in ["\"ab\"", "\"abc\"", "\"é日\"", "\"\\n\\u0041\"", "\"😀😀\""] {
        assert!(full(&g, ok), "{ok}");
    }
    for bad in ["\"a\"", "\"abcd\"", "\"\""] {
        assert!(!full(&g, bad), "{bad}");
    }
    let g = schema(json!({"type": "string", "format": "date"}));
    for ok in ["\"2024-02-28\"", "\"1999-12-31\"", "\"2000-04-30\""] {
        assert!(full(&g, ok), "{ok}");
    }
    for bad in [
        "\"2024-02-30\"",
        "\"2024-13-01\"",
        "\"2024-04-31\"",
        "\"2024-1-01\"",
        "\"x\"",
    ] {
        assert!(!full(&g, bad), "{bad}");
    }
    let g = schema(json!({"type": "string", "format": "date-time"}));
    assert!(full(&g, "\"2024-05-06T07:08:09Z\"") && full(&g, "\"2024-05-06T23:59:59.123+02:00\""));
    assert!(!full(&g, "\"2024-05-06T24:00:00Z\"") && !full(&g, "\"2024-05-06 07:08:09Z\""));
    let g = schema(json!({"type": "string", "format": "uuid"}));
    assert!(
        full(&g, "\"123e4567-e89b-12d3-a456-426614174000\"")
            && !full(&g, "\"123e4567e89b12d3a456426614174000\"")
    );
    let g = schema(json!({"type": "string", "format": "email"}));
    assert!(full(&g, "\"anything\""));
}

#[test]
fn integer_bounds_are_exact() {
    let cases = [
        (
            json!({"type": "integer", "minimum": 5, "maximum": 123}),
            5,
            123,
        ),
        (
            json!({"type": "integer", "minimum": -50, "maximum": -3}),
            -50,
            -3,
        ),
        (
            json!({"type": "integer", "minimum": -7, "maximum": 1000}),
            -7,
            1000,
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}),
            1,
            9,
        ),
        (json!({"type": "integer", "minimum": 0}), 0, i64::MAX),
        (json!({"type": "integer", "maximum": 19}), i64::MIN, 19),
        (
            json!({"type": "integer", "minimum": 99, "maximum": 101}),
            99,
            101,
        ),
        (
            json!({"type": "integer", "minimum": 1.5, "maximum": 3.5}),
            2,
            3,
        ),
    ];
    for (s, lo, hi) in cases {
        let g = schema(s.clone());
        for n in -1200i64..=1200 {
            assert_eq!(full(&g, &n.to_string()), lo <= n && n <= hi, "{n} for {s}");
        }
        assert!(!full(&g, "05") && !full(&g, "-0") && !full(&g, "+5"));
    }
    let g = schema(json!({"type": "integer", "minimum": 0}));
    assert!(full(&g, "12345678901234567890") && !full(&g, "123456789012345678901"));
    assert!(
        Grammar::from_json_schema(&json!({"type": "integer", "minimum": 5, "maximum": 4})).is_err()
    );
}

#[test]
fn unsupported_keywords_are_errors_naming_them() {
    let cases = [
        (
            json!({"properties": {"a": {"type": "object", "patternProperties": {}}}}),
            "`patternProperties` at /properties/a is not supported",
        ),
        (
            json!({"type": "string", "pattern": "^a$"}),
            "`pattern` at / is not supported",
        ),
        (
            json!({"type": "number", "minimum": 0}),
            "`minimum` for type `number` at /",
        ),
        (json!({"not": {}}), "`not` at / is not supported"),
        (
            json!({"allOf": [{}, {}]}),
            "`allOf` with other than one schema",
        ),
        (
            json!({"$ref": "https://example.com/s.json"}),
            "only references within the schema",
        ),
        (json!({"$ref": "#/$defs/missing"}), "does not resolve"),
        (json!({"type": "text"}), "`type` at / must be one of"),
        (
            json!({"type": "array", "uniqueItems": true}),
            "`uniqueItems` at / is not supported",
        ),
        (
            json!({"type": "array", "items": {"type": "integer", "multipleOf": 2}}),
            "`multipleOf` at /items",
        ),
        (
            json!({"anyOf": [{"type": "string"}], "type": "string"}),
            "`type` together with `anyOf`",
        ),
        (
            json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            "left-recursive",
        ),
        (
            json!({"type": "object", "properties": {"a": false}, "required": ["a"]}),
            "required property `a`",
        ),
        (
            json!({"type": "object", "required": ["q"], "additionalProperties": false}),
            "required property `q`",
        ),
        (json!(false), "`false`"),
        (json!(3), "must be an object or a boolean"),
        (
            json!({"type": "string", "minLength": 5000}),
            "`minLength` at / above 1024",
        ),
    ];
    for (s, want) in cases {
        let e = Grammar::from_json_schema(&s).expect_err(&s.to_string());
        assert!(
            e.starts_with("json_schema: ") && e.contains(want),
            "{s}: {e}"
        );
    }
    // Descriptive keywords and extensions are fine.
    let ok = json!({"title": "T", "description": "d", "examples": [1], "default": 1, "$schema": "x", "$comment": "c", "x-order": 1, "type": "integer"});
    assert!(Grammar::from_json_schema(&ok).is_ok());
}

#[test]
fn deep_schemas_are_refused_not_overflowing_the_stack() {
    let mut defs = serde_json::Map::new();
    for i in 0..2000 {
        defs.insert(
            format!("d{i}"),
            json!({"type": "array", "items": {"$ref": format!("#/$defs/d{}", i + 1)}}),
        );
    }
    defs.insert("d2000".into(), json!({"type": "integer"}));
    let s = json!({"$defs": defs, "$ref": "#/$defs/d0"});
    let e = Grammar::from_json_schema(&s).expect_err("too deep");
    assert!(e.contains("nests more than"), "{e}");
    // Within the bound, fine.
    let mut s = json!({"type": "integer"});
    for _ in 0..60 {
        s = json!({"type": "array", "items": s});
    }
    let g = schema(s);
    assert!(full(&g, &format!("{}7{}", "[".repeat(60), "]".repeat(60))));
}

#[test]
fn a_long_enum_keeps_few_stacks() {
    let values: Vec<String> = (0..20_000).map(|i| format!("value-{i}")).collect();
    let g = schema(json!({"enum": values}));
    let m = Matcher::new(g.clone());
    assert!(m.stacks() < 8, "{}", m.stacks());
    assert!(full(&g, "\"value-12345\"") && !full(&g, "\"value-20000\""));
}

// ---- random walks: a JSON answer that does not parse is a bug ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random sentence of `g`: random allowed bytes, then (after `budget` bytes) bytes that tend
/// to close what is open.
fn random_sentence(g: &Arc<Grammar>, seed: u64, budget: usize) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut m = Matcher::new(g.clone());
    let mut out = Vec::new();
    loop {
        let finishing = out.len() > budget;
        if m.is_complete() && (!m.can_continue() || finishing || rng.below(10) == 0) {
            return out;
        }
        assert!(
            out.len() < budget + 5000,
            "seed {seed}: no end in sight: {}",
            String::from_utf8_lossy(&out)
        );
        let set = m.next_bytes();
        let mut candidates: Vec<u8> = (0..=255u8).filter(|&b| set.contains(b)).collect();
        assert!(
            !candidates.is_empty(),
            "seed {seed}: stuck after {:?}",
            String::from_utf8_lossy(&out)
        );
        if finishing {
            if let Some(&b) = b"\"}]0:".iter().find(|b| candidates.contains(b)) {
                candidates = vec![b];
            } else if candidates.iter().any(|b| !b" \t\n,[{".contains(b)) {
                candidates.retain(|b| !b" \t\n,[{".contains(b));
            }
        }
        let b = candidates[rng.below(candidates.len())];
        assert!(
            m.advance(&[b]),
            "seed {seed}: a byte of the union of the stacks' sets was refused"
        );
        out.push(b);
    }
}

/// An independent check of the supported subset of JSON Schema.
fn valid(root: &Value, s: &Value, v: &Value) -> bool {
    let m = match s {
        Value::Bool(b) => return *b,
        Value::Object(m) => m,
        _ => return false,
    };
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        let target = if r == "#" {
            root
        } else {
            root.pointer(&r[1..]).expect("reference")
        };
        return valid(root, target, v);
    }
    for kw in ["anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = m.get(kw) {
            let n = list.iter().filter(|s| valid(root, s, v)).count();
            return if kw == "oneOf" { n == 1 } else { n >= 1 };
        }
    }
    if let Some(Value::Array(list)) = m.get("allOf") {
        return list.iter().all(|s| valid(root, s, v));
    }
    if m.get("const").is_some_and(|c| c != v) {
        return false;
    }
    if m.get("enum")
        .and_then(Value::as_array)
        .is_some_and(|e| !e.contains(v))
    {
        return false;
    }
    if let Some(t) = m.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s],
            Value::Array(l) => l.iter().filter_map(Value::as_str).collect(),
            _ => return false,
        };
        if !types.iter().any(|t| super::has_type(v, t)) {
            return false;
        }
    }
    let count = |k: &str| m.get(k).and_then(Value::as_u64);
    match v {
        Value::Object(o) => {
            let props = m.get("properties").and_then(Value::as_object);
            for r in m
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !o.contains_key(r.as_str().unwrap_or("")) {
                    return false;
                }
            }
            o.iter().all(|(k, val)| match props.and_then(|p| p.get(k)) {
                Some(ps) => valid(root, ps, val),
                None => m
                    .get("additionalProperties")
                    .is_none_or(|a| valid(root, a, val)),
            })
        }
        Value::Array(a) => {
            let prefix = m.get("prefixItems").and_then(Value::as_array);
            let n_prefix = prefix.map_or(0, Vec::len);
            count("minItems").is_none_or(|n| a.len() as u64 >= n)
                && count("maxItems").is_none_or(|n| a.len() as u64 <= n)
                && a.iter()
                    .enumerate()
                    .all(|(i, x)| match prefix.and_then(|p| p.get(i)) {
                        Some(ps) => valid(root, ps, x),
                        None => i < n_prefix || m.get("items").is_none_or(|s| valid(root, s, x)),
                    })
        }
        Value::String(s) => {
            let n = s.chars().count() as u64;
            let format_ok = match m.get("format").and_then(Value::as_str) {
                Some("date") => {
                    let p: Vec<u32> = s.split('-').filter_map(|x| x.parse().ok()).collect();
                    s.len() == 10
                        && p.len() == 3
                        && (1..=12).contains(&p[1])
                        && p[2] >= 1
                        && p[2]
                            <= [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][p[1] as usize - 1]
                }
                Some("uuid") => {
                    s.len() == 36
                        && s.chars().enumerate().all(|(i, c)| {
                            if [8, 13, 18, 23].contains(&i) {
                                c == '-'
                            } else {
                                c.is_ascii_hexdigit()
                            }
                        })
                }
                _ => true,
            };
            format_ok
                && count("minLength").is_none_or(|x| n >= x)
                && count("maxLength").is_none_or(|x| n <= x)
        }
        Value::Number(num) => {
            let x = num.as_f64().unwrap_or(f64::NAN);
            let f = |k: &str| m.get(k).and_then(Value::as_f64);
            f("minimum").is_none_or(|b| x >= b)
                && f("maximum").is_none_or(|b| x <= b)
                && f("exclusiveMinimum").is_none_or(|b| x > b)
                && f("exclusiveMaximum").is_none_or(|b| x < b)
        }
        _ => true,
    }
}

fn walk_many(s: Option<Value>, seeds: u64) {
    let g = Arc::new(match &s {
        Some(s) => Grammar::from_json_schema(s).expect("schema"),
        None => Grammar::json_object(),
    });
    for seed in 0..seeds {
        let text = random_sentence(&g, seed, 40 + (seed as usize % 7) * 60);
        let v: Value = serde_json::from_slice(&text).unwrap_or_else(|e| {
            panic!("seed {seed}: {e}: {:?}", String::from_utf8_lossy(&text));
        });
        match &s {
            Some(s) => assert!(valid(s, s, &v), "seed {seed}: {v} not valid against {s}"),
            None => assert!(v.is_object(), "seed {seed}: {v}"),
        }
    }
}

#[test]
fn random_json_objects_parse() {
    walk_many(None, 400);
}

#[test]
fn random_answers_satisfy_their_schemas() {
    let schemas = [
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "email": {"type": "string", "format": "email"},
                "born": {"type": "string", "format": "date"},
                "id": {"type": "string", "format": "uuid"},
                "score": {"type": "number"},
                "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
                "kind": {"const": "person"},
                "extra": {"anyOf": [{"type": "null"}, {"type": "boolean"}, {"type": "array", "items": {"type": "integer"}, "minItems": 1}]}
            },
            "required": ["name", "age", "kind"],
            "additionalProperties": false
        }),
        json!({
            "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "exclusiveMaximum": 10}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
            "$ref": "#/$defs/node"
        }),
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": ["integer", "null"]}}),
        json!({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "string"}], "items": {"type": "number"}, "minItems": 3}),
        json!({"type": ["string", "integer", "null"], "maxLength": 5}),
        json!({"type": "object", "properties": {"any": true, "obj": {"type": "object"}}, "required": ["any", "obj"]}),
        json!({"oneOf": [{"type": "object", "properties": {"t": {"const": 1}}, "required": ["t"]}, {"type": "array", "maxItems": 2}]}),
    ];
    for s in schemas {
        walk_many(Some(s), 150);
    }
}
