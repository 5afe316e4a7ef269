//! JSON as a grammar: any JSON object (OpenAI's `json_object`) and JSON Schema compiled to a
//! grammar whose every sentence is JSON valid against the schema.
//!
//! The JSON itself: strings are valid UTF-8 with the JSON escapes (`\uXXXX` only as scalar
//! values or surrogate pairs, so serde_json can decode every one) and no raw control characters;
//! numbers have no leading zeros, at most 20 digits before and after the point and an exponent of
//! at most two digits (so none overflows an `f64`); whitespace between tokens is at most one
//! newline followed by up to 20 spaces or tabs, and none is required; a value of unconstrained
//! type nests at most 64 levels deep; nothing may come before or after the top-level value.
//!
//! The JSON Schema subset. Supported: `type` (one or a list of object, array, string, number,
//! integer, boolean, null), `properties`, `required`, `additionalProperties` (false or absent:
//! only the listed properties are generated, still valid; true or a schema: other properties may
//! follow the listed ones, with keys that are none of the listed ones and use no escapes; an
//! object schema with no `properties` and no `required` is any object), `items`, `prefixItems`
//! (and the older array form of `items` with `additionalItems`), `minItems`/`maxItems` (unrolled:
//! at most 256 items are generated), `uniqueItems: false`, `enum`, `const` (emitted as compact
//! JSON), `anyOf`/`oneOf` (as alternatives: `oneOf`'s exclusivity is not enforced), `allOf` with
//! one schema, `$ref` to any JSON pointer in the document (`#`, `#/$defs/..`, `#/definitions/..`;
//! recursion allowed), string `minLength`/`maxLength` (unrolled, at most 1024 characters),
//! `format` date, time, date-time (RFC 3339, February has 28 days) and uuid, and integer
//! `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`. Ignored (descriptive): `title`,
//! `description`, `examples`, `default`, `$schema`, `$id`, `$comment`, `$anchor`, `$defs`,
//! `definitions`, `deprecated`, `readOnly`, `writeOnly`, `contentEncoding`, `contentMediaType`,
//! other `format`s and `x-` extensions. Anything else (`pattern`, `patternProperties`, number
//! bounds, `multipleOf`, `not`, `if`, ...) is an error naming the keyword and where it is.
//! Without `type`, the type follows from the keywords present (e.g. `properties` → object).
//!
//! Property order: serde_json here keeps object keys sorted (no `preserve_order`), so the
//! schema's own order is not known; properties are generated in `required`'s order, then the
//! optional ones alphabetically. Required properties always appear; optional ones may be left
//! out in any combination (a linear construction: one rule per property for "nothing emitted
//! yet" and one for "something emitted, so a comma first").

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value};

use super::utf8::{self, MAX_CHAR};
use super::{Builder, ByteSet, Grammar, Item, literal};

/// How deep a value of unconstrained type may nest.
const ANY_DEPTH: usize = 64;
const INT_DIGITS: usize = 20;
const FRAC_DIGITS: usize = 20;
/// Most blanks in one stretch of whitespace.
const WS_BLANKS: usize = 20;
/// Most array items unrolled for `minItems`/`maxItems`.
const MAX_ITEMS: u64 = 256;
/// Most characters unrolled for `minLength`/`maxLength`.
const MAX_LENGTH: u64 = 1024;
/// Deepest schema nesting (through subschemas and references) compiled.
const MAX_SCHEMA_DEPTH: usize = 128;

pub(super) const IGNORED: &[&str] = &[
    "title",
    "description",
    "examples",
    "default",
    "$schema",
    "$id",
    "$comment",
    "$anchor",
    "$defs",
    "definitions",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
];
const OBJECT_KEYS: &[&str] = &["properties", "required", "additionalProperties"];
const ARRAY_KEYS: &[&str] = &[
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
];
const STRING_KEYS: &[&str] = &["minLength", "maxLength", "format"];
const INTEGER_KEYS: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];
const OTHER_KEYS: &[&str] = &["type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"];
const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];

/// Any JSON object.
pub(crate) fn json_object() -> Grammar {
    let mut j = Json::new(&Value::Null);
    let built = j.any().and_then(|(_, object)| j.b.finish(object));
    built.expect("the JSON grammar is a fixed size, within every bound")
}

/// JSON valid against `schema`.
pub(crate) fn from_schema(schema: &Value) -> Result<Grammar, String> {
    let mut j = Json::new(schema);
    let root = j.schema(schema, "")?;
    j.b.finish(root)
}

fn err(msg: String) -> String {
    format!("json_schema: {msg}")
}

fn at(path: &str) -> &str {
    if path.is_empty() { "/" } else { path }
}

fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn digit() -> Item {
    Item::Bytes(ByteSet::range(b'0', b'9'))
}

fn hex() -> Item {
    let mut s = ByteSet::range(b'0', b'9');
    s.insert_range(b'a', b'f');
    s.insert_range(b'A', b'F');
    Item::Bytes(s)
}

fn bytes_of(s: &[u8]) -> Item {
    Item::Bytes(ByteSet::of(s))
}

fn cat(parts: &[&[Item]]) -> Vec<Item> {
    parts.concat()
}

/// Whether JSON value `v` has JSON Schema type `t`.
fn has_type(v: &Value, t: &str) -> bool {
    match (t, v) {
        ("null", Value::Null) | ("boolean", Value::Bool(_)) | ("string", Value::String(_)) => true,
        ("array", Value::Array(_))
        | ("object", Value::Object(_))
        | ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

pub(super) struct Json<'a> {
    pub(super) b: Builder,
    doc: &'a Value,
    refs: HashMap<String, u32>,
    depth: usize,
    ws: Option<u32>,
    char_rule: Option<u32>,
    string: Option<u32>,
    noesc_rest: Option<u32>,
    number: Option<u32>,
    integer: Option<u32>,
    any: Option<(u32, u32)>,
    /// Tool calls' raw text rules, by the end they stop before (`calls.rs`).
    pub(super) raw: HashMap<Vec<u8>, u32>,
    /// Tool calls' Gemma 4 value rules, by the `$ref` they were reached through (`calls.rs`).
    pub(super) gemma_refs: HashMap<String, u32>,
}

impl<'a> Json<'a> {
    pub(super) fn new(doc: &'a Value) -> Json<'a> {
        Json {
            b: Builder::new("json_schema"),
            doc,
            refs: HashMap::new(),
            depth: 0,
            ws: None,
            char_rule: None,
            string: None,
            noesc_rest: None,
            number: None,
            integer: None,
            any: None,
            raw: HashMap::new(),
            gemma_refs: HashMap::new(),
        }
    }

    // ---- JSON's own pieces ----

    pub(super) fn ws(&mut self) -> Result<Item, String> {
        if let Some(id) = self.ws {
            return Ok(Item::Rule(id));
        }
        let blanks = self
            .b
            .repeat("blank", &[bytes_of(b" \t")], 0, Some(WS_BLANKS))?;
        let id = self
            .b
            .rule("ws", vec![cat(&[&literal(b"\n"), &blanks]), blanks])?;
        self.ws = Some(id);
        Ok(Item::Rule(id))
    }

    /// One character of a JSON string, literal or escaped, as alternatives.
    fn char_alts(&mut self) -> Result<Vec<Vec<Item>>, String> {
        let uesc = self.b.rule(
            "unicode escape",
            vec![
                vec![bytes_of(b"0123456789abcABCefEF"), hex(), hex(), hex()],
                vec![
                    bytes_of(b"dD"),
                    Item::Bytes(ByteSet::range(b'0', b'7')),
                    hex(),
                    hex(),
                ],
                cat(&[
                    &[bytes_of(b"dD"), bytes_of(b"89abAB"), hex(), hex()],
                    &literal(b"\\u"),
                    &[bytes_of(b"dD"), bytes_of(b"cdefCDEF"), hex(), hex()],
                ]),
            ],
        )?;
        let esc = self.b.rule(
            "escape",
            vec![
                vec![bytes_of(b"\"\\/bfnrt")],
                vec![bytes_of(b"u"), Item::Rule(uesc)],
            ],
        )?;
        let mut alts = utf8::class_alternatives(&utf8::normalize(vec![
            (0x20, 0x21),
            (0x23, 0x5B),
            (0x5D, MAX_CHAR),
        ]));
        alts.push(vec![bytes_of(b"\\"), Item::Rule(esc)]);
        Ok(alts)
    }

    fn char_rule(&mut self) -> Result<u32, String> {
        if let Some(id) = self.char_rule {
            return Ok(id);
        }
        let alts = self.char_alts()?;
        let id = self.b.rule("char", alts)?;
        self.char_rule = Some(id);
        Ok(id)
    }

    fn string(&mut self) -> Result<u32, String> {
        if let Some(id) = self.string {
            return Ok(id);
        }
        let rest = self.b.reserve("string contents")?;
        let mut alts: Vec<Vec<Item>> = self
            .char_alts()?
            .into_iter()
            .map(|a| cat(&[&a, &[Item::Rule(rest)]]))
            .collect();
        alts.push(literal(b"\""));
        self.b.define(rest, alts)?;
        let id = self
            .b
            .rule("string", vec![vec![bytes_of(b"\""), Item::Rule(rest)]])?;
        self.string = Some(id);
        Ok(id)
    }

    /// The rest of a string after its opening quote, without escapes.
    fn noesc_rest(&mut self) -> Result<u32, String> {
        if let Some(id) = self.noesc_rest {
            return Ok(id);
        }
        let rest = self.b.reserve("key contents")?;
        let chars = utf8::normalize(vec![(0x20, 0x21), (0x23, 0x5B), (0x5D, MAX_CHAR)]);
        let mut alts: Vec<Vec<Item>> = utf8::class_alternatives(&chars)
            .into_iter()
            .map(|a| cat(&[&a, &[Item::Rule(rest)]]))
            .collect();
        alts.push(literal(b"\""));
        self.b.define(rest, alts)?;
        self.noesc_rest = Some(rest);
        Ok(rest)
    }

    /// `0` or a natural number without leading zeros.
    fn natural(&mut self) -> Result<u32, String> {
        let more = self
            .b
            .repeat("digit", &[digit()], 0, Some(INT_DIGITS - 1))?;
        self.b.rule(
            "natural",
            vec![
                literal(b"0"),
                cat(&[&[Item::Bytes(ByteSet::range(b'1', b'9'))], &more]),
            ],
        )
    }

    fn integer(&mut self) -> Result<u32, String> {
        if let Some(id) = self.integer {
            return Ok(id);
        }
        let nat = self.natural()?;
        let id = self.b.rule(
            "integer",
            vec![vec![bytes_of(b"-"), Item::Rule(nat)], vec![Item::Rule(nat)]],
        )?;
        self.integer = Some(id);
        Ok(id)
    }

    fn number(&mut self) -> Result<u32, String> {
        if let Some(id) = self.number {
            return Ok(id);
        }
        let nat = self.natural()?;
        let frac_digits = self
            .b
            .repeat("fraction digit", &[digit()], 1, Some(FRAC_DIGITS))?;
        let frac = self.b.rule(
            "fraction",
            vec![cat(&[&literal(b"."), &frac_digits]), Vec::new()],
        )?;
        let sign = self
            .b
            .rule("exponent sign", vec![vec![bytes_of(b"+-")], Vec::new()])?;
        let exp_digits = self.b.repeat("exponent digit", &[digit()], 1, Some(2))?;
        let exp = self.b.rule(
            "exponent",
            vec![
                cat(&[&[bytes_of(b"eE"), Item::Rule(sign)], &exp_digits]),
                Vec::new(),
            ],
        )?;
        let body = [Item::Rule(nat), Item::Rule(frac), Item::Rule(exp)];
        let id = self
            .b
            .rule("number", vec![cat(&[&literal(b"-"), &body]), body.to_vec()])?;
        self.number = Some(id);
        Ok(id)
    }

    /// `{ key: value, ... }` with keys from rule `key` (a whole quoted string) and values `value`.
    fn object_of(&mut self, name: &str, key: u32, value: u32) -> Result<u32, String> {
        let ws = self.ws()?;
        let member = self.b.rule(
            format!("{name} member"),
            vec![cat(&[
                &[ws, Item::Rule(key), ws],
                &literal(b":"),
                &[ws, Item::Rule(value)],
            ])],
        )?;
        let more = self.b.reserve(format!("{name} more"))?;
        self.b.define(
            more,
            vec![
                cat(&[&[ws], &literal(b"}")]),
                cat(&[
                    &[ws],
                    &literal(b","),
                    &[Item::Rule(member), Item::Rule(more)],
                ]),
            ],
        )?;
        let first = self.b.rule(
            format!("{name} first"),
            vec![
                cat(&[&[ws], &literal(b"}")]),
                vec![Item::Rule(member), Item::Rule(more)],
            ],
        )?;
        self.b.rule(
            name.to_string(),
            vec![cat(&[&literal(b"{"), &[Item::Rule(first)]])],
        )
    }

    fn array_of(&mut self, name: &str, value: u32) -> Result<u32, String> {
        let ws = self.ws()?;
        let more = self.b.reserve(format!("{name} more"))?;
        self.b.define(
            more,
            vec![
                cat(&[&[ws], &literal(b"]")]),
                cat(&[
                    &[ws],
                    &literal(b","),
                    &[ws, Item::Rule(value), Item::Rule(more)],
                ]),
            ],
        )?;
        let first = self.b.rule(
            format!("{name} first"),
            vec![
                cat(&[&[ws], &literal(b"]")]),
                vec![ws, Item::Rule(value), Item::Rule(more)],
            ],
        )?;
        self.b.rule(
            name.to_string(),
            vec![cat(&[&literal(b"["), &[Item::Rule(first)]])],
        )
    }

    /// Any JSON value and any JSON object, both nesting at most [`ANY_DEPTH`] levels.
    fn any(&mut self) -> Result<(u32, u32), String> {
        if let Some(ids) = self.any {
            return Ok(ids);
        }
        let string = self.string()?;
        let number = self.number()?;
        let scalars = vec![
            vec![Item::Rule(string)],
            vec![Item::Rule(number)],
            literal(b"true"),
            literal(b"false"),
            literal(b"null"),
        ];
        let mut inner: Option<u32> = None;
        let mut object0 = None;
        for level in (0..=ANY_DEPTH).rev() {
            let mut alts = scalars.clone();
            if let Some(v) = inner {
                let obj = self.object_of(&format!("object@{level}"), string, v)?;
                let arr = self.array_of(&format!("array@{level}"), v)?;
                alts.push(vec![Item::Rule(obj)]);
                alts.push(vec![Item::Rule(arr)]);
                object0 = Some(obj);
            }
            inner = Some(self.b.rule(format!("value@{level}"), alts)?);
        }
        let ids = match (inner, object0) {
            (Some(v), Some(o)) => (v, o),
            _ => return Err(err("internal: no JSON value rule".into())),
        };
        self.any = Some(ids);
        Ok(ids)
    }

    /// Exactly one of `values` (byte strings), prefix-shared so a long list keeps few stacks.
    fn one_of_literals(&mut self, name: &str, mut values: Vec<Vec<u8>>) -> Result<u32, String> {
        values.sort();
        values.dedup();
        let root = self.b.reserve(name.to_string())?;
        let mut work = vec![(root, 0usize, values.len(), 0usize)];
        while let Some((id, lo, hi, depth)) = work.pop() {
            let mut alts = Vec::new();
            let mut i = lo;
            while i < hi && values[i].len() == depth {
                alts.push(Vec::new());
                i += 1;
            }
            while i < hi {
                let b = values[i][depth];
                let mut j = i + 1;
                while j < hi && values[j][depth] == b {
                    j += 1;
                }
                if j - i == 1 {
                    alts.push(literal(&values[i][depth..]));
                } else {
                    let (first, last) = (&values[i], &values[j - 1]);
                    let common = first[depth..]
                        .iter()
                        .zip(&last[depth..])
                        .take_while(|(a, b)| a == b)
                        .count();
                    let sub = self
                        .b
                        .reserve(format!("{name} ({} bytes in)", depth + common))?;
                    alts.push(cat(&[
                        &literal(&first[depth..depth + common]),
                        &[Item::Rule(sub)],
                    ]));
                    work.push((sub, i, j, depth + common));
                }
                i = j;
            }
            self.b.define(id, alts)?;
        }
        Ok(root)
    }

    /// A quoted key that is none of `keys` and has no escapes.
    fn key_not_in(&mut self, name: &str, keys: &[&str]) -> Result<u32, String> {
        struct Node {
            children: BTreeMap<char, usize>,
            end: bool,
        }
        let mut nodes = vec![Node {
            children: BTreeMap::new(),
            end: false,
        }];
        for key in keys {
            // A key needing escapes can never be written without them.
            if key.chars().any(|c| c == '"' || c == '\\' || c < ' ') {
                continue;
            }
            let mut n = 0;
            for c in key.chars() {
                n = match nodes[n].children.get(&c) {
                    Some(&next) => next,
                    None => {
                        nodes.push(Node {
                            children: BTreeMap::new(),
                            end: false,
                        });
                        let next = nodes.len() - 1;
                        nodes[n].children.insert(c, next);
                        next
                    }
                };
            }
            nodes[n].end = true;
        }
        let free = self.noesc_rest()?;
        let mut ids = Vec::with_capacity(nodes.len());
        for i in 0..nodes.len() {
            ids.push(self.b.reserve(format!("{name} key ({i})"))?);
        }
        for (i, node) in nodes.iter().enumerate() {
            let mut alts = Vec::new();
            if !node.end {
                alts.push(literal(b"\""));
            }
            let mut taken = vec![(0x22, 0x22), (0x5C, 0x5C), (0, 0x1F)];
            for (&c, &child) in &node.children {
                alts.push(cat(&[
                    &literal(c.to_string().as_bytes()),
                    &[Item::Rule(ids[child])],
                ]));
                taken.push((c as u32, c as u32));
            }
            let others = utf8::complement(&utf8::normalize(taken));
            for a in utf8::class_alternatives(&others) {
                alts.push(cat(&[&a, &[Item::Rule(free)]]));
            }
            self.b.define(ids[i], alts)?;
        }
        self.b.rule(
            format!("{name} key"),
            vec![vec![bytes_of(b"\""), Item::Rule(ids[0])]],
        )
    }

    fn quoted(&mut self, name: &str, body: Vec<Item>) -> Result<u32, String> {
        self.b.rule(
            name.to_string(),
            vec![cat(&[&literal(b"\""), &body, &literal(b"\"")])],
        )
    }

    fn date(&mut self) -> Result<u32, String> {
        let two = |a: &[u8], b: ByteSet| vec![bytes_of(a), Item::Bytes(b)];
        let day28 = self.b.rule(
            "day",
            vec![
                two(b"0", ByteSet::range(b'1', b'9')),
                two(b"1", ByteSet::range(b'0', b'9')),
                two(b"2", ByteSet::range(b'0', b'8')),
            ],
        )?;
        let day30 = self.b.rule(
            "day",
            vec![vec![Item::Rule(day28)], literal(b"29"), literal(b"30")],
        )?;
        let day31 = self
            .b
            .rule("day", vec![vec![Item::Rule(day30)], literal(b"31")])?;
        let month = |ms: &[&str], day: u32| -> Vec<Vec<Item>> {
            ms.iter()
                .map(|m| cat(&[&literal(m.as_bytes()), &literal(b"-"), &[Item::Rule(day)]]))
                .collect()
        };
        let mut md = month(&["01", "03", "05", "07", "08", "10", "12"], day31);
        md.extend(month(&["04", "06", "09", "11"], day30));
        md.extend(month(&["02"], day28));
        let md = self.b.rule("month and day", md)?;
        self.b.rule(
            "date",
            vec![vec![
                digit(),
                digit(),
                digit(),
                digit(),
                bytes_of(b"-"),
                Item::Rule(md),
            ]],
        )
    }

    fn time(&mut self) -> Result<u32, String> {
        let hh = self.b.rule(
            "hour",
            vec![
                vec![bytes_of(b"01"), digit()],
                vec![bytes_of(b"2"), Item::Bytes(ByteSet::range(b'0', b'3'))],
            ],
        )?;
        let mm = vec![Item::Bytes(ByteSet::range(b'0', b'5')), digit()];
        let frac_digits = self.b.repeat("second fraction", &[digit()], 1, Some(9))?;
        let frac = self.b.rule(
            "second fraction",
            vec![cat(&[&literal(b"."), &frac_digits]), Vec::new()],
        )?;
        let tz = self.b.rule(
            "time zone",
            vec![
                literal(b"Z"),
                cat(&[&[bytes_of(b"+-"), Item::Rule(hh)], &literal(b":"), &mm]),
            ],
        )?;
        self.b.rule(
            "time",
            vec![cat(&[
                &[Item::Rule(hh)],
                &literal(b":"),
                &mm,
                &literal(b":"),
                &mm,
                &[Item::Rule(frac), Item::Rule(tz)],
            ])],
        )
    }

    /// A string of a supported `format`, or `None` for a format generated as any string.
    fn format(&mut self, format: &str) -> Result<Option<u32>, String> {
        let body = match format {
            "date" => vec![Item::Rule(self.date()?)],
            "time" => vec![Item::Rule(self.time()?)],
            "date-time" => vec![
                Item::Rule(self.date()?),
                bytes_of(b"T"),
                Item::Rule(self.time()?),
            ],
            "uuid" => {
                let mut body = Vec::new();
                for (i, n) in [8, 4, 4, 4, 12].into_iter().enumerate() {
                    if i > 0 {
                        body.push(bytes_of(b"-"));
                    }
                    body.extend(std::iter::repeat_n(hex(), n));
                }
                body
            }
            _ => return Ok(None),
        };
        Ok(Some(self.quoted(&format!("{format} string"), body)?))
    }

    // ---- schemas ----

    pub(super) fn schema(&mut self, s: &Value, path: &str) -> Result<u32, String> {
        self.depth += 1;
        let r = if self.depth > MAX_SCHEMA_DEPTH {
            Err(err(format!(
                "the schema nests more than {MAX_SCHEMA_DEPTH} levels deep at {}",
                at(path)
            )))
        } else {
            match s {
                Value::Bool(true) => self.any().map(|(v, _)| v),
                Value::Bool(false) => Err(err(format!(
                    "the schema at {} is `false`: no value is valid",
                    at(path)
                ))),
                Value::Object(m) => self.object_schema(m, path),
                _ => Err(err(format!(
                    "the schema at {} must be an object or a boolean",
                    at(path)
                ))),
            }
        };
        self.depth -= 1;
        r
    }

    fn object_schema(&mut self, m: &Map<String, Value>, path: &str) -> Result<u32, String> {
        let known = |k: &str| {
            [
                OBJECT_KEYS,
                ARRAY_KEYS,
                STRING_KEYS,
                INTEGER_KEYS,
                OTHER_KEYS,
            ]
            .iter()
            .any(|ks| ks.contains(&k))
        };
        let mut asserted: Vec<&str> = Vec::new();
        for k in m.keys() {
            if IGNORED.contains(&k.as_str()) || k.starts_with("x-") {
                continue;
            }
            if !known(k) {
                return Err(err(format!("`{k}` at {} is not supported", at(path))));
            }
            asserted.push(k);
        }
        let only = |allowed: &[&str], with: &str| -> Result<(), String> {
            match asserted.iter().find(|k| !allowed.contains(k)) {
                Some(k) => Err(err(format!(
                    "`{k}` together with `{with}` at {} is not supported",
                    at(path)
                ))),
                None => Ok(()),
            }
        };
        if let Some(r) = m.get("$ref") {
            only(&["$ref"], "$ref")?;
            return self.reference(r, path);
        }
        if let Some(all) = m.get("allOf") {
            only(&["allOf"], "allOf")?;
            return match all.as_array().map(Vec::as_slice) {
                Some([one]) => self.schema(one, &format!("{path}/allOf/0")),
                Some(_) => Err(err(format!(
                    "`allOf` with other than one schema at {} is not supported",
                    at(path)
                ))),
                None => Err(err(format!("`allOf` at {} must be an array", at(path)))),
            };
        }
        for kw in ["anyOf", "oneOf"] {
            if let Some(list) = m.get(kw) {
                only(&[kw], kw)?;
                let list = match list.as_array() {
                    Some(l) if !l.is_empty() => l,
                    _ => {
                        return Err(err(format!(
                            "`{kw}` at {} must be a non-empty array",
                            at(path)
                        )));
                    }
                };
                let mut alts = Vec::with_capacity(list.len());
                for (i, s) in list.iter().enumerate() {
                    alts.push(vec![Item::Rule(
                        self.schema(s, &format!("{path}/{kw}/{i}"))?,
                    )]);
                }
                return self.b.rule(format!("{kw} at {}", at(path)), alts);
            }
        }
        let types = self.types(m, path)?;
        for kw in ["const", "enum"] {
            if let Some(v) = m.get(kw) {
                only(&[kw, "type"], kw)?;
                let values: Vec<&Value> = match (kw, v) {
                    ("const", v) => vec![v],
                    (_, Value::Array(vs)) if !vs.is_empty() => vs.iter().collect(),
                    _ => {
                        return Err(err(format!(
                            "`enum` at {} must be a non-empty array",
                            at(path)
                        )));
                    }
                };
                let texts: Vec<Vec<u8>> = values
                    .into_iter()
                    .filter(|v| {
                        types
                            .as_ref()
                            .is_none_or(|ts| ts.iter().any(|t| has_type(v, t)))
                    })
                    .map(|v| {
                        serde_json::to_string(v)
                            .map(String::into_bytes)
                            .map_err(|e| err(e.to_string()))
                    })
                    .collect::<Result<_, _>>()?;
                if texts.is_empty() {
                    return Err(err(format!(
                        "no value of `{kw}` at {} has the schema's `type`",
                        at(path)
                    )));
                }
                return self.one_of_literals(&format!("{kw} at {}", at(path)), texts);
            }
        }
        let Some(mut types) = types.or_else(|| {
            // Without `type`, the keywords present say which types the schema is about.
            let mut inferred = Vec::new();
            for (keys, t) in [
                (OBJECT_KEYS, "object"),
                (ARRAY_KEYS, "array"),
                (STRING_KEYS, "string"),
                (INTEGER_KEYS, "integer"),
            ] {
                if asserted.iter().any(|k| keys.contains(k)) {
                    inferred.push(t);
                }
            }
            (!inferred.is_empty()).then_some(inferred)
        }) else {
            return self.any().map(|(v, _)| v);
        };
        if types.contains(&"number") && !asserted.iter().any(|k| INTEGER_KEYS.contains(k)) {
            types.retain(|t| *t != "integer");
        }
        let mut alts = Vec::with_capacity(types.len());
        for t in types {
            let id = match t {
                "null" => self.b.rule("null", vec![literal(b"null")])?,
                "boolean" => self
                    .b
                    .rule("boolean", vec![literal(b"true"), literal(b"false")])?,
                "string" => self.string_type(m, path)?,
                "number" => {
                    if let Some(k) = asserted.iter().find(|k| INTEGER_KEYS.contains(k)) {
                        return Err(err(format!(
                            "`{k}` for type `number` at {} is not supported (only for `integer`)",
                            at(path)
                        )));
                    }
                    self.number()?
                }
                "integer" => self.integer_type(m, path)?,
                "object" => self.object_type(m, path)?,
                _ => self.array_type(m, path)?,
            };
            alts.push(vec![Item::Rule(id)]);
        }
        self.b.rule(format!("schema at {}", at(path)), alts)
    }

    /// The schema's `type`s, checked; `None` when it has no `type`.
    fn types(
        &self,
        m: &Map<String, Value>,
        path: &str,
    ) -> Result<Option<Vec<&'static str>>, String> {
        let bad = || {
            err(format!(
                "`type` at {} must be one of {} or a list of them",
                at(path),
                TYPES.join(", ")
            ))
        };
        let names: Vec<&str> = match m.get("type") {
            None => return Ok(None),
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|v| v.as_str().ok_or_else(bad))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad()),
        };
        let mut out = Vec::new();
        for n in names {
            let t = TYPES.iter().find(|t| **t == n).ok_or_else(bad)?;
            if !out.contains(t) {
                out.push(*t);
            }
        }
        Ok(Some(out))
    }

    fn reference(&mut self, r: &Value, path: &str) -> Result<u32, String> {
        let Some(target) = r.as_str() else {
            return Err(err(format!("`$ref` at {} must be a string", at(path))));
        };
        if let Some(&id) = self.refs.get(target) {
            return Ok(id);
        }
        let Some(pointer) = target.strip_prefix('#') else {
            return Err(err(format!(
                "`$ref` `{target}` at {}: only references within the schema (`#/...`) are supported",
                at(path)
            )));
        };
        let doc: &'a Value = self.doc;
        let Some(schema) = (if pointer.is_empty() {
            Some(doc)
        } else {
            doc.pointer(pointer)
        }) else {
            return Err(err(format!(
                "`$ref` `{target}` at {} does not resolve",
                at(path)
            )));
        };
        let id = self.b.reserve(format!("$ref {target}"))?;
        self.refs.insert(target.to_string(), id);
        let inner = self.schema(schema, pointer)?;
        self.b.define(id, vec![vec![Item::Rule(inner)]])?;
        Ok(id)
    }

    fn count(&self, m: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, String> {
        match m.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().or_else(|| {
                v.as_f64()
                    .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                    .map(|f| f as u64)
            }) {
                Some(n) => Ok(Some(n)),
                None => Err(err(format!(
                    "`{key}` at {} must be a non-negative integer",
                    at(path)
                ))),
            },
        }
    }

    fn string_type(&mut self, m: &Map<String, Value>, path: &str) -> Result<u32, String> {
        let min = self.count(m, "minLength", path)?;
        let max = self.count(m, "maxLength", path)?;
        if min.is_none() && max.is_none() {
            if let Some(format) = m.get("format").and_then(Value::as_str)
                && let Some(id) = self.format(format)?
            {
                return Ok(id);
            }
            return self.string();
        }
        let min = min.unwrap_or(0);
        if min > MAX_LENGTH {
            return Err(err(format!(
                "`minLength` at {} above {MAX_LENGTH} is not supported",
                at(path)
            )));
        }
        if max.is_some_and(|max| max < min) {
            return Err(err(format!(
                "`maxLength` at {} is below `minLength`",
                at(path)
            )));
        }
        let max = max.map(|max| max.min(MAX_LENGTH));
        let c = self.char_rule()?;
        let body = self.b.repeat(
            "char",
            &[Item::Rule(c)],
            min as usize,
            max.map(|m| m as usize),
        )?;
        self.quoted(&format!("string at {}", at(path)), body)
    }

    fn integer_type(&mut self, m: &Map<String, Value>, path: &str) -> Result<u32, String> {
        let num = |k: &str| -> Result<Option<f64>, String> {
            match m.get(k) {
                None | Some(Value::Bool(_)) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| err(format!("`{k}` at {} must be a number", at(path)))),
            }
        };
        let flag = |k: &str| m.get(k) == Some(&Value::Bool(true));
        let limit = 10f64.powi(INT_DIGITS as i32) - 1.0;
        let mut lo: Option<f64> = None;
        let mut hi: Option<f64> = None;
        if let Some(x) = num("minimum")? {
            lo = Some(if flag("exclusiveMinimum") {
                x.floor() + 1.0
            } else {
                x.ceil()
            });
        }
        if let Some(x) = num("exclusiveMinimum")? {
            lo = Some(lo.unwrap_or(f64::MIN).max(x.floor() + 1.0));
        }
        if let Some(x) = num("maximum")? {
            hi = Some(if flag("exclusiveMaximum") {
                x.ceil() - 1.0
            } else {
                x.floor()
            });
        }
        if let Some(x) = num("exclusiveMaximum")? {
            hi = Some(hi.unwrap_or(f64::MAX).min(x.ceil() - 1.0));
        }
        if lo.is_none() && hi.is_none() {
            return self.integer();
        }
        let lo = lo.unwrap_or(-limit).max(-limit) as i128;
        let hi = hi.unwrap_or(limit).min(limit) as i128;
        if lo > hi {
            return Err(err(format!(
                "no integer lies within the bounds at {}",
                at(path)
            )));
        }
        let mut alts = Vec::new();
        if lo < 0 {
            for seq in naturals(1.max(-hi), -lo) {
                alts.push(cat(&[&literal(b"-"), &seq]));
            }
        }
        if hi >= 0 {
            alts.extend(naturals(lo.max(0), hi));
        }
        self.b.rule(format!("integer at {}", at(path)), alts)
    }

    fn object_type(&mut self, m: &Map<String, Value>, path: &str) -> Result<u32, String> {
        let empty = Map::new();
        let props = match m.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => {
                return Err(err(format!(
                    "`properties` at {} must be an object",
                    at(path)
                )));
            }
        };
        let mut required: Vec<&str> = Vec::new();
        match m.get("required") {
            None => {}
            Some(Value::Array(list)) => {
                for v in list {
                    let name = v.as_str().ok_or_else(|| {
                        err(format!("`required` at {} must list strings", at(path)))
                    })?;
                    if !required.contains(&name) {
                        required.push(name);
                    }
                }
            }
            Some(_) => return Err(err(format!("`required` at {} must be an array", at(path)))),
        }
        let additional = m.get("additionalProperties");
        let extra: Option<u32> = match additional {
            None | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some(self.any()?.0),
            Some(s @ Value::Object(_)) => {
                Some(self.schema(s, &format!("{path}/additionalProperties"))?)
            }
            Some(_) => {
                return Err(err(format!(
                    "`additionalProperties` at {} must be a boolean or a schema",
                    at(path)
                )));
            }
        };
        if props.is_empty()
            && required.is_empty()
            && matches!(additional, None | Some(Value::Bool(true)))
        {
            return Ok(self.any()?.1);
        }
        let ws = self.ws()?;
        let mut names: Vec<&str> = required.clone();
        names.extend(
            props
                .keys()
                .map(String::as_str)
                .filter(|k| !required.contains(k)),
        );
        let mut members: Vec<(Vec<Item>, bool)> = Vec::new();
        for name in &names {
            let is_required = required.contains(name);
            let value = match props.get(*name) {
                Some(Value::Bool(false)) if is_required => {
                    return Err(err(format!(
                        "required property `{name}` at {} can have no valid value",
                        at(path)
                    )));
                }
                Some(Value::Bool(false)) => continue,
                Some(s) => {
                    self.schema(s, &format!("{path}/properties/{}", pointer_escape(name)))?
                }
                None => match (additional, extra) {
                    (Some(Value::Bool(false)), _) => {
                        return Err(err(format!(
                            "required property `{name}` at {} is not in `properties` and `additionalProperties` is false",
                            at(path)
                        )));
                    }
                    (_, Some(e)) => e,
                    (_, None) => self.any()?.0,
                },
            };
            let key = serde_json::to_string(name).map_err(|e| err(e.to_string()))?;
            let kv = cat(&[
                &[ws],
                &literal(key.as_bytes()),
                &[ws],
                &literal(b":"),
                &[ws, Item::Rule(value)],
            ]);
            members.push((kv, is_required));
        }
        let name = format!("object at {}", at(path));
        let n = members.len();
        let mut s_ids = Vec::with_capacity(n + 1);
        let mut t_ids = Vec::with_capacity(n + 1);
        for i in 0..n {
            s_ids.push(
                self.b
                    .reserve(format!("{name}: from property {i}, none yet"))?,
            );
            t_ids.push(
                self.b
                    .reserve(format!("{name}: from property {i}, after one"))?,
            );
        }
        let (s_end, t_end) = match extra {
            Some(value) => {
                let key = if names.is_empty() {
                    self.string()?
                } else {
                    self.key_not_in(&name, &names)?
                };
                let kv = cat(&[
                    &[ws, Item::Rule(key), ws],
                    &literal(b":"),
                    &[ws, Item::Rule(value)],
                ]);
                let more = self.b.reserve(format!("{name}: more properties"))?;
                self.b.define(
                    more,
                    vec![
                        cat(&[&[ws], &literal(b","), &kv, &[Item::Rule(more)]]),
                        Vec::new(),
                    ],
                )?;
                let first = self.b.rule(
                    format!("{name}: other properties"),
                    vec![cat(&[&kv, &[Item::Rule(more)]]), Vec::new()],
                )?;
                (first, more)
            }
            None => {
                let none = self.b.rule(format!("{name}: end"), vec![Vec::new()])?;
                (none, none)
            }
        };
        s_ids.push(s_end);
        t_ids.push(t_end);
        for (i, (kv, is_required)) in members.into_iter().enumerate() {
            let mut s_alts = vec![cat(&[&kv, &[Item::Rule(t_ids[i + 1])]])];
            let mut t_alts = vec![cat(&[
                &[ws],
                &literal(b","),
                &kv,
                &[Item::Rule(t_ids[i + 1])],
            ])];
            if !is_required {
                s_alts.push(vec![Item::Rule(s_ids[i + 1])]);
                t_alts.push(vec![Item::Rule(t_ids[i + 1])]);
            }
            self.b.define(s_ids[i], s_alts)?;
            self.b.define(t_ids[i], t_alts)?;
        }
        self.b.rule(
            name,
            vec![cat(&[
                &literal(b"{"),
                &[Item::Rule(s_ids[0]), ws],
                &literal(b"}"),
            ])],
        )
    }

    fn array_type(&mut self, m: &Map<String, Value>, path: &str) -> Result<u32, String> {
        if m.get("uniqueItems")
            .is_some_and(|v| v != &Value::Bool(false))
        {
            return Err(err(format!(
                "`uniqueItems` at {} is not supported",
                at(path)
            )));
        }
        let mut prefix = Vec::new();
        let (tuple, rest, rest_path) = match (m.get("prefixItems"), m.get("items")) {
            (Some(p), items) => (Some((p, "prefixItems")), items, format!("{path}/items")),
            (None, Some(list @ Value::Array(_))) => (
                Some((list, "items")),
                m.get("additionalItems"),
                format!("{path}/additionalItems"),
            ),
            (None, items) => (None, items, format!("{path}/items")),
        };
        if let Some((list, kw)) = tuple {
            let list = list
                .as_array()
                .ok_or_else(|| err(format!("`{kw}` at {} must be an array", at(path))))?;
            for (i, s) in list.iter().enumerate() {
                prefix.push(self.schema(s, &format!("{path}/{kw}/{i}"))?);
            }
        }
        let item: Option<u32> = match rest {
            None | Some(Value::Bool(true)) => Some(self.any()?.0),
            Some(Value::Bool(false)) => None,
            Some(s) => Some(self.schema(s, &rest_path)?),
        };
        let k = prefix.len() as u64;
        let min = self.count(m, "minItems", path)?.unwrap_or(0);
        let max = self.count(m, "maxItems", path)?;
        if min > MAX_ITEMS {
            return Err(err(format!(
                "`minItems` at {} above {MAX_ITEMS} is not supported",
                at(path)
            )));
        }
        // At most MAX_ITEMS items are generated: fewer than a larger `maxItems` allows is still valid.
        let max = match item {
            None => Some(max.map_or(k, |m| m.min(k))),
            Some(_) => max.map(|m| m.min(MAX_ITEMS.max(k))),
        };
        if max.is_some_and(|max| min > max) {
            return Err(err(format!(
                "`minItems` at {} is more than the array can hold",
                at(path)
            )));
        }
        let top = max.unwrap_or(k.max(min).max(1)) as usize;
        let name = format!("array at {}", at(path));
        let ws = self.ws()?;
        let ids: Vec<u32> = (0..=top)
            .map(|j| self.b.reserve(format!("{name}: after {j} items")))
            .collect::<Result<_, _>>()?;
        for j in 0..=top {
            let mut alts = Vec::new();
            if j as u64 >= min {
                alts.push(cat(&[&[ws], &literal(b"]")]));
            }
            let schema = if j < prefix.len() {
                Some(prefix[j])
            } else {
                item
            };
            if let (true, Some(schema)) = (j < top || max.is_none(), schema) {
                let sep = if j == 0 {
                    Vec::new()
                } else {
                    cat(&[&[ws], &literal(b",")])
                };
                alts.push(cat(&[
                    &sep,
                    &[ws, Item::Rule(schema), Item::Rule(ids[(j + 1).min(top)])],
                ]));
            }
            self.b.define(ids[j], alts)?;
        }
        self.b
            .rule(name, vec![cat(&[&literal(b"["), &[Item::Rule(ids[0])]])])
    }
}

/// The natural numbers `lo..=hi` (no leading zeros) as alternatives of digit-set sequences.
fn naturals(lo: i128, hi: i128) -> Vec<Vec<Item>> {
    let mut out = Vec::new();
    let mut low = 0i128;
    for len in 1..=INT_DIGITS as u32 {
        let high = 10i128.pow(len) - 1;
        let (a, b) = (lo.max(low), hi.min(high));
        if a <= b {
            for seq in digit_ranges(a.to_string().as_bytes(), b.to_string().as_bytes()) {
                out.push(seq.into_iter().map(Item::Bytes).collect());
            }
        }
        low = high + 1;
    }
    out
}

/// The digit strings of one length between `a` and `b` inclusive, as sequences of digit sets.
fn digit_ranges(a: &[u8], b: &[u8]) -> Vec<Vec<ByteSet>> {
    let (Some((&a0, a_rest)), Some((&b0, b_rest))) = (a.split_first(), b.split_first()) else {
        return vec![Vec::new()];
    };
    let prefixed = |d: ByteSet, seqs: Vec<Vec<ByteSet>>| -> Vec<Vec<ByteSet>> {
        seqs.into_iter().map(|s| cat_sets(d, s)).collect()
    };
    if a0 == b0 {
        return prefixed(ByteSet::byte(a0), digit_ranges(a_rest, b_rest));
    }
    let any = ByteSet::range(b'0', b'9');
    let (mut first, mut last) = (a0, b0);
    let mut out = Vec::new();
    if !a_rest.iter().all(|&d| d == b'0') {
        out.extend(prefixed(
            ByteSet::byte(a0),
            digit_ranges(a_rest, &vec![b'9'; a_rest.len()]),
        ));
        first += 1;
    }
    let mut upper = Vec::new();
    if !b_rest.iter().all(|&d| d == b'9') {
        upper = prefixed(
            ByteSet::byte(b0),
            digit_ranges(&vec![b'0'; b_rest.len()], b_rest),
        );
        last -= 1;
    }
    if first <= last {
        out.push(cat_sets(
            ByteSet::range(first, last),
            vec![any; a_rest.len()],
        ));
    }
    out.extend(upper);
    out
}

fn cat_sets(first: ByteSet, rest: Vec<ByteSet>) -> Vec<ByteSet> {
    let mut s = Vec::with_capacity(rest.len() + 1);
    s.push(first);
    s.extend(rest);
    s
}

#[cfg(test)]
mod tests;
