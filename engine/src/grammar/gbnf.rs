//! llama.cpp's GBNF grammar text compiled to a [`Grammar`].
//!
//! What is understood (as llama.cpp's `grammars/README.md` describes the format): rules
//! `name ::= alternatives` (names of letters, digits, `-` and `_`; the start rule is `root`),
//! alternatives separated by `|`, grouping `( )`, string literals `"..."`, character classes
//! `[a-z]` / `[^"\\]`, `.` (any character), rule references, repetition `*` `+` `?` `{m}` `{m,}`
//! `{m,n}` `{,n}` (bounds up to 10,000), comments from `#` to the end of the line. Escapes in
//! literals and classes: `\n` `\r` `\t` `\\` `\"` `\'` `\[` `\]` `\-` `\^` `\/` `\xHH` `\uHHHH`
//! `\UHHHHHHHH`. A rule ends at the end of its line unless the line ends inside parentheses or
//! right after `::=` or `|`. Literals, classes and `.` are over Unicode scalar values and compile
//! to their UTF-8 bytes. llama.cpp's token syntax (`<...>`, `!<...>`) is not supported.
//!
//! Errors say `gbnf: line L, column C: problem`; a rule defined twice, a rule used but never
//! defined and left recursion (including a repetition of something that can be empty) are
//! errors.

use std::collections::HashMap;

use super::utf8::{self, MAX_CHAR};
use super::{Builder, ByteSet, Grammar, Item};

/// Most a repetition bound may be.
const MAX_REPEAT: usize = 10_000;
/// Deepest parentheses may nest.
const MAX_NESTING: usize = 100;

/// Compiles GBNF `text`.
pub(crate) fn parse(text: &str) -> Result<Grammar, String> {
    let mut p = Parser {
        text,
        pos: 0,
        b: Builder::new("gbnf"),
        rules: HashMap::new(),
        defined: HashMap::new(),
        used_at: HashMap::new(),
        nesting: 0,
    };
    p.grammar()?;
    let Some(&root) = p.rules.get("root") else {
        return Err("gbnf: the grammar has no `root` rule".into());
    };
    let mut undefined: Vec<(usize, &String)> = p
        .rules
        .iter()
        .filter(|(_, id)| !p.b.is_defined(**id))
        .map(|(name, id)| (p.used_at.get(id).copied().unwrap_or(0), name))
        .collect();
    undefined.sort();
    if let Some(&(at, name)) = undefined.first() {
        return Err(p.error_at(at, &format!("rule `{name}` is used but not defined")));
    }
    p.b.finish(root)
}

struct Parser<'a> {
    text: &'a str,
    /// Byte offset into `text`.
    pos: usize,
    b: Builder,
    rules: HashMap<String, u32>,
    defined: HashMap<u32, usize>,
    used_at: HashMap<u32, usize>,
    nesting: usize,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser<'_> {
    fn error_at(&self, at: usize, msg: &str) -> String {
        let before = &self.text[..at.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("gbnf: line {line}, column {col}: {msg}")
    }

    fn error(&self, msg: &str) -> String {
        self.error_at(self.pos, msg)
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Skips blanks and comments, and line ends too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\n' {
                            break;
                        }
                        self.pos += c.len_utf8();
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> &str {
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        &self.text[start..self.pos]
    }

    fn rule_id(&mut self, name: &str, at: usize) -> Result<u32, String> {
        if let Some(&id) = self.rules.get(name) {
            return Ok(id);
        }
        let id = self.b.reserve(name.to_string())?;
        self.rules.insert(name.to_string(), id);
        self.used_at.insert(id, at);
        Ok(id)
    }

    fn grammar(&mut self) -> Result<(), String> {
        loop {
            self.space(true);
            if self.peek().is_none() {
                return Ok(());
            }
            let at = self.pos;
            let name = self.name().to_string();
            if name.is_empty() {
                return Err(self.error("expected a rule name"));
            }
            let id = self.rule_id(&name, at)?;
            if self.defined.contains_key(&id) {
                return Err(self.error_at(at, &format!("rule `{name}` is defined twice")));
            }
            self.defined.insert(id, at);
            self.space(false);
            if !self.text[self.pos..].starts_with("::=") {
                return Err(self.error("expected `::=`"));
            }
            self.pos += 3;
            self.space(true);
            let alts = self.alternatives(&name, false)?;
            self.b.define(id, alts)?;
            match self.peek() {
                None | Some('\n' | '\r') => {}
                Some(')') => return Err(self.error("unmatched `)`")),
                Some(c) => return Err(self.error(&format!("unexpected `{c}`"))),
            }
        }
    }

    fn alternatives(&mut self, rule: &str, nested: bool) -> Result<Vec<Vec<Item>>, String> {
        let mut alts = vec![self.sequence(rule, nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(rule, nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, rule: &str, nested: bool) -> Result<Vec<Item>, String> {
        let mut seq: Vec<Item> = Vec::new();
        // The last element, still open to a repetition operator.
        let mut last: Option<Vec<Item>> = None;
        loop {
            self.space(nested);
            let at = self.pos;
            let Some(c) = self.peek() else { break };
            let element = match c {
                '|' | ')' | '\n' | '\r' => break,
                '"' => {
                    self.pos += 1;
                    self.literal()?
                }
                '[' => {
                    self.pos += 1;
                    let ranges = self.class()?;
                    self.chars(rule, at, &ranges)?
                }
                '.' => {
                    self.pos += 1;
                    self.chars(rule, at, &[(0, MAX_CHAR)])?
                }
                '(' => {
                    self.pos += 1;
                    self.nesting += 1;
                    if self.nesting > MAX_NESTING {
                        return Err(
                            self.error(&format!("parentheses nest more than {MAX_NESTING} deep"))
                        );
                    }
                    self.space(true);
                    let alts = self.alternatives(rule, true)?;
                    self.space(true);
                    if self.bump() != Some(')') {
                        return Err(self.error_at(at, "unclosed `(`"));
                    }
                    self.nesting -= 1;
                    match <[_; 1]>::try_from(alts) {
                        Ok([one]) => one,
                        Err(alts) => vec![Item::Rule(
                            self.b.rule(self.origin(rule, at, "group"), alts)?,
                        )],
                    }
                }
                '*' | '+' | '?' | '{' => {
                    let Some(elem) = last.take() else {
                        return Err(self.error(&format!("`{c}` has nothing before it to repeat")));
                    };
                    let (min, max) = self.repetition()?;
                    let name = self.origin(rule, at, "repetition");
                    self.b.repeat(&name, &elem, min, max)?
                }
                c if is_name_char(c) => {
                    let name = self.name().to_string();
                    let id = self.rule_id(&name, at)?;
                    vec![Item::Rule(id)]
                }
                c => return Err(self.error(&format!("unexpected `{c}`"))),
            };
            if let Some(prev) = last.replace(element) {
                seq.extend(prev);
            }
        }
        if let Some(prev) = last {
            seq.extend(prev);
        }
        Ok(seq)
    }

    fn origin(&self, rule: &str, at: usize, what: &str) -> String {
        let place = self.error_at(at, "");
        let place = place.trim_start_matches("gbnf: ").trim_end_matches(": ");
        format!("{rule}: {what} at {place}")
    }

    /// The bounds after a repetition operator (at `self.pos`).
    fn repetition(&mut self) -> Result<(usize, Option<usize>), String> {
        match self.bump() {
            Some('*') => return Ok((0, None)),
            Some('+') => return Ok((1, None)),
            Some('?') => return Ok((0, Some(1))),
            _ => {}
        }
        let number = |p: &mut Self| -> Result<Option<usize>, String> {
            p.space(false);
            let start = p.pos;
            while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                p.pos += 1;
            }
            if p.pos == start {
                return Ok(None);
            }
            match p.text[start..p.pos].parse::<usize>() {
                Ok(n) if n <= MAX_REPEAT => Ok(Some(n)),
                _ => Err(p.error_at(start, &format!("repetition bound above {MAX_REPEAT}"))),
            }
        };
        let at = self.pos;
        let min = number(self)?;
        self.space(false);
        let (min, max) = match self.bump() {
            Some('}') => match min {
                Some(n) => (n, Some(n)),
                None => return Err(self.error_at(at, "expected a number in `{}`")),
            },
            Some(',') => {
                let max = number(self)?;
                self.space(false);
                if self.bump() != Some('}') {
                    return Err(self.error_at(at, "expected `}`"));
                }
                (min.unwrap_or(0), max)
            }
            _ => return Err(self.error_at(at, "expected `}` or `,`")),
        };
        if max.is_some_and(|max| max < min) {
            return Err(self.error_at(at, "repetition maximum below its minimum"));
        }
        Ok((min, max))
    }

    /// One character of a literal or class, escapes decoded; `None` at the end of the text.
    fn char(&mut self) -> Result<Option<u32>, String> {
        let at = self.pos;
        let Some(c) = self.bump() else {
            return Ok(None);
        };
        if c != '\\' {
            return Ok(Some(c as u32));
        }
        let hex = |p: &mut Self, n: usize| -> Result<u32, String> {
            let digits = p
                .text
                .get(p.pos..p.pos + n)
                .filter(|d| d.chars().all(|c| c.is_ascii_hexdigit()));
            let Some(value) = digits.and_then(|d| u32::from_str_radix(d, 16).ok()) else {
                return Err(p.error_at(at, &format!("expected {n} hex digits in the escape")));
            };
            p.pos += n;
            if char::from_u32(value).is_none() {
                return Err(p.error_at(at, &format!("U+{value:X} is not a character")));
            }
            Ok(value)
        };
        let value = match self.bump() {
            Some('n') => '\n' as u32,
            Some('r') => '\r' as u32,
            Some('t') => '\t' as u32,
            Some(c @ ('\\' | '"' | '\'' | '[' | ']' | '-' | '^' | '/')) => c as u32,
            Some('x') => hex(self, 2)?,
            Some('u') => hex(self, 4)?,
            Some('U') => hex(self, 8)?,
            Some(c) => return Err(self.error_at(at, &format!("unknown escape `\\{c}`"))),
            None => return Err(self.error_at(at, "unfinished escape")),
        };
        Ok(Some(value))
    }

    /// The rest of a string literal after its `"`.
    fn literal(&mut self) -> Result<Vec<Item>, String> {
        let start = self.pos - 1;
        let mut bytes = Vec::new();
        loop {
            if self.peek() == Some('"') {
                self.pos += 1;
                break;
            }
            match self.char()? {
                Some(c) => {
                    let mut buf = [0u8; 4];
                    let s = char::from_u32(c).map_or("", |ch| ch.encode_utf8(&mut buf));
                    bytes.extend_from_slice(s.as_bytes());
                }
                None => return Err(self.error_at(start, "unterminated string literal")),
            }
        }
        Ok(super::literal(&bytes))
    }

    /// The rest of a character class after its `[`: its ranges, normalized.
    fn class(&mut self) -> Result<Vec<(u32, u32)>, String> {
        let start = self.pos - 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            if self.peek() == Some(']') {
                self.pos += 1;
                break;
            }
            let Some(lo) = self.char()? else {
                return Err(self.error_at(start, "unterminated character class"));
            };
            let mut hi = lo;
            if self.peek() == Some('-') && !self.text[self.pos + 1..].starts_with(']') {
                self.pos += 1;
                let at = self.pos;
                hi = match self.char()? {
                    Some(hi) => hi,
                    None => return Err(self.error_at(start, "unterminated character class")),
                };
                if hi < lo {
                    return Err(self.error_at(at, "range end before its start"));
                }
            }
            ranges.push((lo, hi));
        }
        let ranges = utf8::normalize(ranges);
        Ok(if negated {
            utf8::complement(&ranges)
        } else {
            ranges
        })
    }

    /// One character from `ranges` as items: inline when one sequence, else a rule.
    fn chars(&mut self, rule: &str, at: usize, ranges: &[(u32, u32)]) -> Result<Vec<Item>, String> {
        let mut alts = utf8::class_alternatives(ranges);
        if alts.is_empty() {
            // A class matching nothing.
            return Ok(vec![Item::Bytes(ByteSet::default())]);
        }
        if alts.len() == 1 {
            return Ok(alts.remove(0));
        }
        Ok(vec![Item::Rule(
            self.b
                .rule(self.origin(rule, at, "character class"), alts)?,
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::Matcher;
    use std::sync::Arc;

    fn full(g: &Arc<Grammar>, text: &str) -> bool {
        let mut m = Matcher::new(g.clone());
        (text.is_empty() || m.advance(text.as_bytes())) && m.is_complete()
    }

    fn compile(text: &str) -> Arc<Grammar> {
        Arc::new(Grammar::from_gbnf(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
    }

    #[test]
    fn arithmetic() {
        let g = compile(
            r#"
# Arithmetic, llama.cpp's example style.
root   ::= (expr "=" ws term "\n")+
expr   ::= term ([-+*/] term)*
term   ::= ident | num | "(" ws expr ")" ws
ident  ::= [a-z] [a-z0-9_]* ws
num    ::= [0-9]+ ws
ws     ::= [ \t\n]*
"#,
        );
        for ok in ["1+2=3\n", "(a+b)*c=x1\n", "(1 )=1\n2=2\n", "x=y\n"] {
            assert!(full(&g, ok), "{ok:?}");
        }
        for bad in ["1+2=3", "1++2=3\n", "=3\n", "A=1\n", "(1=1\n"] {
            assert!(!full(&g, bad), "{bad:?}");
        }
    }

    #[test]
    fn list_and_choice() {
        let g = compile(
            "root ::= item{1,3}\nitem ::= \"- \" (\"apple\" | \"banana\" | [0-9]{2,}) \"\\n\"\n",
        );
        assert!(full(&g, "- apple\n"));
        assert!(full(&g, "- banana\n- 42\n- 1234\n"));
        assert!(!full(&g, "- apple\n- apple\n- apple\n- apple\n"));
        assert!(!full(&g, "- 4\n"));
        assert!(!full(&g, ""));
        let g = compile(r#"root ::= "yes" | "no" | "maybe""#);
        assert!(full(&g, "no") && !full(&g, "n") && !full(&g, "nope"));
        let g = compile("root ::= \"a\"{3} \"b\"{,2} \"c\"{1,}");
        assert!(
            full(&g, "aaac") && full(&g, "aaabbccc") && !full(&g, "aaabbbc") && !full(&g, "aac")
        );
    }

    #[test]
    fn classes_literals_and_any_char_are_unicode() {
        let g =
            compile(r#"root ::= [α-ω]+ " " [^a-z\n]* "\u00e9" "\x41" . [\U0001F600-\U0001F64F]"#);
        assert!(full(&g, "λμ Ωé\u{e9}A日😀"));
        assert!(full(&g, "α \u{e9}A\n🙏"));
        assert!(!full(&g, "a Ωé\u{e9}A日😀"));
        assert!(!full(&g, "λ zé\u{e9}A日😀"));
        let mut m = Matcher::new(g.clone());
        assert!(m.advance("λ é".as_bytes()));
        // A lone continuation byte or a surrogate's encoding is not a character.
        assert!(!m.accepts(&[0x80]) && !m.accepts(&[0xED, 0xA0, 0x80]));
        let g = compile(r#"root ::= [\]\-\\] "\"" ['] "\t""#);
        assert!(full(&g, "]\"'\t") && full(&g, "-\"'\t") && full(&g, "\\\"'\t"));
    }

    #[test]
    fn multi_line_rules_and_comments() {
        let g = compile("root ::= (\n  \"a\" # first\n  | \"b\"\n) \"c\" |\n \"d\"\n# end\n");
        assert!(full(&g, "ac") && full(&g, "bc") && full(&g, "d"));
    }

    #[test]
    fn rules_continue_after_the_arrow_and_bars_and_may_be_empty() {
        let g = compile(
            "root ::=\n  pair (\"&\" pair)*\npair ::= key \"=\" val\nkey ::= [a-z_]+\nval ::= |\n  [^&\\x00-\\x1F\\x7F]+\n",
        );
        assert!(full(&g, "a=1&b_c=x y&d="));
        assert!(!full(&g, "a=1&") && !full(&g, "A=1") && !full(&g, "a=\u{1}"));
        let mut m = Matcher::new(g.clone());
        assert!(m.advance(b"k=") && !m.accepts(b"\x7f") && m.accepts("é".as_bytes()));
    }

    #[test]
    fn errors_name_the_line_column_and_problem() {
        let cases = [
            (
                "root ::= \"a\"\nroot ::= \"b\"",
                "line 2, column 1: rule `root` is defined twice",
            ),
            (
                "root ::= foo",
                "line 1, column 10: rule `foo` is used but not defined",
            ),
            (
                "root ::= \"abc",
                "line 1, column 10: unterminated string literal",
            ),
            (
                "root ::= [a-",
                "line 1, column 10: unterminated character class",
            ),
            ("root ::= (\"a\"", "line 1, column 10: unclosed `(`"),
            ("root ::= \"a\" )", "line 1, column 14: unmatched `)`"),
            (
                "root ::= * \"a\"",
                "line 1, column 10: `*` has nothing before it to repeat",
            ),
            (
                "root ::= \"a\"{2,1}",
                "line 1, column 14: repetition maximum below its minimum",
            ),
            ("root ::= \"a\"{99999}", "repetition bound above 10000"),
            (
                "root ::= \"\\q\"",
                "line 1, column 11: unknown escape `\\q`",
            ),
            ("root ::= \"\\uD800\"", "U+D800 is not a character"),
            ("root ::= [z-a]", "range end before its start"),
            ("root  \"a\"", "line 1, column 7: expected `::=`"),
            ("root ::= <think>", "line 1, column 10: unexpected `<`"),
            ("other ::= \"a\"", "no `root` rule"),
            (
                "root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"",
                "`expr` is left-recursive",
            ),
            ("root ::= (\"a\"?)*", "left-recursive"),
        ];
        for (text, want) in cases {
            let e = Grammar::from_gbnf(text).expect_err(text);
            assert!(e.starts_with("gbnf: ") && e.contains(want), "{text:?}: {e}");
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(1000), ")".repeat(1000));
        assert!(
            Grammar::from_gbnf(&deep)
                .expect_err("deep")
                .contains("nest")
        );
    }

    #[test]
    fn hostile_grammars_stay_bounded() {
        let start = std::time::Instant::now();
        // Ambiguous: every split of the x's between the two stars.
        let g = compile(r#"root ::= ("x"* "x"*)  ("x"* "x"*) ("x"* "x"*)"#);
        let mut m = Matcher::new(g);
        for _ in 0..5000 {
            assert!(m.advance(b"x"));
        }
        assert!(m.is_complete());
        // Huge repetition counts are refused at compile time, not expanded without bound.
        let e =
            Grammar::from_gbnf("root ::= ((\"ab\"{10000}){10000}){10000}").expect_err("too big");
        assert!(e.contains("symbols") || e.contains("rules"), "{e}");
        // Big grammars compile in time linear in their size: a long chain of nullable rules
        // (each found nullable only after the next), and one rule of many alternatives.
        let chain: String = (0..20_000)
            .map(|i| format!("r{i} ::= r{} \"\"\n", i + 1))
            .collect();
        let g = compile(&format!("root ::= r0 \"x\"\n{chain}r20000 ::= \"\"\n"));
        assert!(full(&g, "x"));
        let choice = |n: usize| {
            let many: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
            let defs: String = many.iter().map(|w| format!("{w} ::= \"{w}\"\n")).collect();
            compile(&format!("root ::= {}\n{defs}", many.join(" | ")))
        };
        let g = choice(3000);
        assert!(full(&g, "w2999") && !full(&g, "w3000"));
        // Past MAX_STACKS alternatives alive at once, the matcher accepts nothing (bounded).
        let g = choice(30_000);
        assert!(!Matcher::new(g).can_continue());
        assert!(start.elapsed().as_secs() < 10);
    }
}
