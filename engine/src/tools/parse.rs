//! A model's answer split into its text and its calls, as it streams: text is passed on at
//! once except what may be the beginning of a call's opener, and a call is passed on whole when
//! it ends. A call that turns out malformed (or not of a callable tool) is passed on as text,
//! so nothing the model wrote is lost and nothing breaks a client.

use std::sync::Arc;

use super::syntax::{Begins, End};
use super::{Call, Request, Syntax};
use crate::grammar::{Grammar, Matcher};

/// A piece of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Text for `content`.
    Content(String),
    /// A whole call.
    Call(Call),
}

/// An answer split at once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// The text outside the calls (whitespace around calls dropped).
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<Call>,
    /// Calls begun that came out malformed, not of a callable tool, or cut off (given back as
    /// text).
    pub broken: usize,
}

/// Splits a whole answer (see [`Splitter::new`] for `grammar`).
pub fn parse(
    syntax: Syntax,
    request: Arc<Request>,
    grammar: Option<Arc<Grammar>>,
    text: &str,
) -> Parsed {
    let mut splitter = Splitter::new(syntax, request, grammar);
    let mut parsed = Parsed::default();
    let mut deltas = splitter.push(text);
    deltas.extend(splitter.finish());
    for delta in deltas {
        match delta {
            Delta::Content(t) => parsed.content.push_str(&t),
            Delta::Call(c) => parsed.calls.push(c),
        }
    }
    parsed.broken = splitter.broken();
    parsed
}

/// Splits an answer as it streams.
#[derive(Debug)]
pub struct Splitter {
    syntax: Syntax,
    request: Arc<Request>,
    /// The calls' grammar: a call is one only if it follows it.
    grammar: Option<Arc<Grammar>>,
    /// Text not yet passed on: a possible opener's beginning, or a call under way.
    pending: String,
    /// Whether `pending` begins with an opener.
    in_call: bool,
    /// Whitespace held back: dropped if a call follows, passed on if text does.
    space: String,
    /// Calls passed on so far.
    calls: usize,
    /// Whether the last thing passed on was a call.
    after_call: bool,
    /// Calls begun that were given back as text.
    broken: usize,
    /// Whether any text (not only whitespace) was passed on.
    passed_text: bool,
}

impl Splitter {
    /// A splitter for answers in `syntax` calling `request`'s tools. With `grammar` (the
    /// calls' grammar the answer was generated under), a call that does not follow it (written
    /// where the grammar could not hold it) is text, so every call passed on follows its
    /// tool's schema.
    pub fn new(syntax: Syntax, request: Arc<Request>, grammar: Option<Arc<Grammar>>) -> Splitter {
        Splitter {
            syntax,
            request,
            grammar,
            pending: String::new(),
            in_call: false,
            space: String::new(),
            calls: 0,
            after_call: false,
            broken: 0,
            passed_text: false,
        }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            if !self.in_call {
                let at_start = self.calls == 0 && !self.passed_text;
                match self.syntax.find_call(&self.pending, at_start) {
                    Begins::At(at) => {
                        let before: String = self.pending.drain(..at).collect();
                        self.text(&before, &mut out);
                        self.in_call = true;
                        continue;
                    }
                    Begins::Maybe(at) => {
                        let ready: String = self.pending.drain(..at).collect();
                        self.text(&ready, &mut out);
                    }
                    Begins::Nowhere => {
                        let ready = std::mem::take(&mut self.pending);
                        self.text(&ready, &mut out);
                    }
                }
                return out;
            }
            let end = match (self.syntax.end_of_call(&self.pending), &self.grammar) {
                (End::At(first), Some(grammar)) => match self.end_in_grammar(grammar) {
                    Ok(Some(len)) => End::At(len),
                    Ok(None) => End::NotYet,
                    // It already breaks the grammar: it ends where it says, and is no call.
                    Err(()) => End::At(first),
                },
                (end, _) => end,
            };
            match end {
                End::NotYet => return out,
                End::At(len) => {
                    let call: String = self.pending.drain(..len).collect();
                    self.in_call = false;
                    let follows = self.grammar.as_ref().is_none_or(|g| {
                        let mut m = Matcher::new(Arc::clone(g));
                        m.advance(call.as_bytes()) && m.is_complete()
                    });
                    match self
                        .syntax
                        .read_call(&call, &self.request)
                        .filter(|_| follows)
                    {
                        Some(c) => {
                            self.space.clear();
                            self.calls += 1;
                            self.after_call = true;
                            out.push(Delta::Call(c));
                        }
                        None => {
                            self.broken += 1;
                            self.text(&call, &mut out);
                        }
                    }
                }
                End::Broken => {
                    self.broken += 1;
                    // Passed on as text up to its opener's first character; the search for a
                    // call resumes after it.
                    let first = self.pending.chars().next().map_or(0, char::len_utf8);
                    let opened: String = self.pending.drain(..first).collect();
                    self.in_call = false;
                    self.text(&opened, &mut out);
                }
            }
        }
    }

    /// What is left when the answer has ended: an unfinished call, or a possible opener's
    /// beginning, as text.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        if self.in_call {
            self.broken += 1;
        }
        self.in_call = false;
        self.text(&rest, &mut out);
        if self.calls == 0 && !self.space.is_empty() {
            out.push(Delta::Content(std::mem::take(&mut self.space)));
        }
        out
    }

    /// With the calls' grammar, where the call under way ends: at the first closer where it is
    /// a complete call (an earlier closer is inside one of its strings), `None` while more text
    /// is needed, `Err` when it already breaks the grammar.
    fn end_in_grammar(&self, grammar: &Arc<Grammar>) -> Result<Option<usize>, ()> {
        let Some(closer) = self.syntax.closer() else {
            return Err(());
        };
        let mut matcher = Matcher::new(Arc::clone(grammar));
        let mut fed = 0;
        for (at, _) in self.pending.match_indices(closer) {
            let end = at + closer.len();
            if !matcher.advance(&self.pending.as_bytes()[fed..end]) {
                return Err(());
            }
            fed = end;
            if matcher.is_complete() {
                return Ok(Some(end));
            }
        }
        let rest = &self.pending.as_bytes()[fed..];
        if rest.is_empty() || matcher.advance(rest) {
            Ok(None)
        } else {
            Err(())
        }
    }

    /// Calls begun so far that were given back as text.
    pub fn broken(&self) -> usize {
        self.broken
    }

    /// Passes `text` on, holding its trailing whitespace back.
    fn text(&mut self, text: &str, out: &mut Vec<Delta>) {
        let body_len = text.trim_end().len();
        if body_len == 0 {
            self.space.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.space);
        let mut body = &text[..body_len];
        if self.after_call {
            // Whitespace between a call and the text after it is not content.
            piece.clear();
            body = body.trim_start();
            self.after_call = false;
        }
        piece.push_str(body);
        self.passed_text = true;
        out.push(Delta::Content(piece));
        self.space.push_str(&text[body_len..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> Arc<Request> {
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
        Arc::new(
            Request::from_fields(Some(&tools), None, None, None, None)
                .expect("valid")
                .expect("tools"),
        )
    }

    fn call(city: &str) -> Call {
        Call {
            name: "get_weather".into(),
            arguments: json!({ "city": city }).to_string(),
        }
    }

    /// `text` fed in pieces of `step` bytes (at character boundaries), the deltas merged.
    fn streamed(syntax: Syntax, text: &str, step: usize) -> Parsed {
        let mut s = Splitter::new(syntax, request(), None);
        let mut deltas = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            deltas.extend(s.push(&text[at..end]));
            at = end;
        }
        deltas.extend(s.finish());
        let mut parsed = Parsed::default();
        for d in deltas {
            match d {
                Delta::Content(t) => parsed.content.push_str(&t),
                Delta::Call(c) => parsed.calls.push(c),
            }
        }
        parsed
    }

    #[test]
    fn text_before_a_call_is_content_and_the_call_is_read_however_it_is_split() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        for step in [1, 2, 3, 7, 1000] {
            let p = streamed(Syntax::Hermes, text, step);
            assert_eq!(p.content, "Let me check.", "step {step}");
            assert_eq!(p.calls, vec![call("Oslo")], "step {step}");
        }
    }

    #[test]
    fn two_parallel_calls_are_two_calls() {
        let one = |c: &str| {
            format!(
                "<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{c}\"}}}}\n</tool_call>"
            )
        };
        let text = format!("{}\n{}\n", one("Oslo"), one("Lima"));
        for step in [1, 5, 1000] {
            let p = streamed(Syntax::Hermes, &text, step);
            assert_eq!(p.calls, vec![call("Oslo"), call("Lima")]);
            assert_eq!(p.content, "", "whitespace around calls is no content");
        }
    }

    #[test]
    fn a_malformed_call_is_given_back_as_text() {
        let broken = "Sure <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": Oslo}}\n</tool_call> done";
        assert_eq!(streamed(Syntax::Hermes, broken, 3).content, broken);
        let unknown = "<tool_call>{\"name\": \"format_disk\", \"arguments\": {}}</tool_call>";
        assert_eq!(streamed(Syntax::Hermes, unknown, 4).content, unknown);
        let cut = "Checking <tool_call>\n{\"name\": \"get_wea";
        assert_eq!(
            streamed(Syntax::Hermes, cut, 2).content,
            cut,
            "a call cut off by the limit"
        );
        let llama = "{\"name\": oops";
        assert_eq!(streamed(Syntax::Llama3, llama, 1).content, llama);
        let spaced =
            "{\n    \"name\": \"get_weather\",\n    \"parameters\": {\"city\": \"Oslo\"}\n}";
        for step in [1, 4, 1000] {
            assert_eq!(
                streamed(Syntax::Llama3, spaced, step).calls,
                vec![call("Oslo")],
                "JSON's whitespace"
            );
        }
        for text in [broken, unknown, cut] {
            assert_eq!(
                parse(Syntax::Hermes, request(), None, text).broken,
                1,
                "{text}"
            );
        }
    }

    #[test]
    fn text_without_calls_passes_unchanged_and_at_once() {
        let text = "The weather in Oslo is <b>cold</b>, about -3 °C.\n\n";
        for step in [1, 4, 1000] {
            assert_eq!(streamed(Syntax::Hermes, text, step).content, text);
        }
        let mut s = Splitter::new(Syntax::Hermes, request(), None);
        assert_eq!(s.push("Hello <tool"), vec![Delta::Content("Hello".into())]);
        assert_eq!(
            s.push("box> x"),
            vec![Delta::Content(" <toolbox> x".into())]
        );
    }

    #[test]
    fn every_family_streams_its_calls() {
        let cases = [
            (
                Syntax::QwenXml,
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
            ),
            (
                Syntax::Llama3,
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            ),
            (
                Syntax::Gemma4,
                "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>}<tool_call|>",
            ),
        ];
        for (syntax, text) in cases {
            for step in [1, 3, 1000] {
                let p = streamed(syntax, text, step);
                assert_eq!(p.calls, vec![call("Oslo")], "{syntax:?} step {step}");
                assert_eq!(p.content, "", "{syntax:?}");
            }
        }
    }

    #[test]
    fn with_its_grammar_a_call_off_the_schema_is_text() {
        let r = request();
        let grammar = Arc::new(Syntax::Hermes.grammar(&r).expect("grammar"));
        let good = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let off =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 5}}\n</tool_call>";
        let checked = parse(
            Syntax::Hermes,
            Arc::clone(&r),
            Some(Arc::clone(&grammar)),
            good,
        );
        assert_eq!(checked.calls, vec![call("Oslo")]);
        let checked = parse(Syntax::Hermes, Arc::clone(&r), Some(grammar), off);
        assert!(checked.calls.is_empty() && checked.content == off && checked.broken == 1);
        assert_eq!(
            parse(Syntax::Hermes, r, None, off).calls.len(),
            1,
            "unchecked, it parses"
        );
    }

    #[test]
    fn with_its_grammar_a_closer_inside_a_string_does_not_end_the_call() {
        let r = request();
        let grammar = Arc::new(Syntax::Hermes.grammar(&r).expect("grammar"));
        let text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a</tool_call>b\"}}</tool_call>";
        for step in [1, 5, 1000] {
            let mut s = Splitter::new(Syntax::Hermes, Arc::clone(&r), Some(Arc::clone(&grammar)));
            let mut calls = Vec::new();
            let mut at = 0;
            while at < text.len() {
                let end = (at + step).min(text.len());
                calls.extend(s.push(&text[at..end]));
                at = end;
            }
            calls.extend(s.finish());
            assert_eq!(
                calls,
                vec![Delta::Call(call("a</tool_call>b"))],
                "step {step}"
            );
        }
    }
}
