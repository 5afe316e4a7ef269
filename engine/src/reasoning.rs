//! Reasoning ("thinking") in a model's answer: which syntax its template writes a thinking
//! block in ([`Thinking`]: Qwen 3 and 3.5's `<think>…</think>`, Gemma 4's
//! `<|channel>thought…<channel|>`), and the answer split into its reasoning and its text as it
//! streams ([`ThoughtSplitter`]), for llama.cpp's `reasoning_format` (`message.reasoning_content`).
//!
//! Only a block at the start of the answer is reasoning (after whitespace), or one the prompt
//! left open (a template that ends its generation cue with the opener); text later on that
//! looks like a tag is text.

/// How a template writes a thinking block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// `<think>` … `</think>` (Qwen 3 and 3.5, DeepSeek R1's distills).
    ThinkTags,
    /// `<|channel>thought` … `<channel|>` (Gemma 4).
    Channel,
}

impl Thinking {
    /// The syntax `template` writes reasoning in, if any.
    pub fn of_template(template: &str) -> Option<Thinking> {
        if template.contains("</think>") {
            Some(Thinking::ThinkTags)
        } else if template.contains("<|channel>") && template.contains("<channel|>") {
            Some(Thinking::Channel)
        } else {
            None
        }
    }

    /// The text a thinking block opens with.
    pub fn opener(self) -> &'static str {
        match self {
            Thinking::ThinkTags => "<think>",
            Thinking::Channel => "<|channel>thought",
        }
    }

    /// The text a thinking block closes with.
    pub fn closer(self) -> &'static str {
        match self {
            Thinking::ThinkTags => "</think>",
            Thinking::Channel => "<channel|>",
        }
    }

    /// Whether `prompt` ends inside an open thinking block (the answer begins as reasoning).
    pub fn open_at_end(self, prompt: &str) -> bool {
        match (prompt.rfind(self.opener()), prompt.rfind(self.closer())) {
            (Some(open), Some(close)) => open > close,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// Whether chats think when a request does not say (`--reasoning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThinkingDefault {
    /// `enable_thinking` true.
    On,
    /// `enable_thinking` false: on a Pi a thinking block costs more time than most answers.
    #[default]
    Off,
    /// Left to the template (Qwen's think by default, Gemma 4's do not).
    Auto,
}

impl std::str::FromStr for ThinkingDefault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on" => Ok(ThinkingDefault::On),
            "off" => Ok(ThinkingDefault::Off),
            "auto" => Ok(ThinkingDefault::Auto),
            other => Err(format!("expected on, off or auto, not {other:?}")),
        }
    }
}

/// Where an answer's reasoning goes (llama.cpp's `reasoning_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Left in `content`, tags and all.
    None,
    /// Into `reasoning_content` (`auto` is this too).
    #[default]
    Deepseek,
    /// Into `reasoning_content`, and `content` keeps the whole text as well.
    DeepseekLegacy,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Format::None),
            "auto" | "deepseek" => Ok(Format::Deepseek),
            "deepseek-legacy" => Ok(Format::DeepseekLegacy),
            other => Err(format!(
                "expected none, auto, deepseek or deepseek-legacy, not {other:?}"
            )),
        }
    }
}

/// A bound on an answer's thinking (`--reasoning-budget`): once this many tokens were spent
/// inside the block, the block is closed for the model and the answer follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The block's syntax.
    pub thinking: Thinking,
    /// Whether the prompt left a block open.
    pub open: bool,
    /// Thinking tokens at most.
    pub tokens: usize,
    /// The tokens that close the block (the closer, on lines of its own).
    pub closer: Vec<u32>,
}

impl Thinking {
    /// The text that closes a block cut short.
    pub fn cut(self) -> &'static str {
        match self {
            Thinking::ThinkTags => "\n</think>\n\n",
            Thinking::Channel => "<channel|>",
        }
    }
}

/// A piece of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Reasoning text.
    Reasoning(String),
    /// The answer's text.
    Text(String),
}

/// Where the splitter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    /// At the start: only whitespace so far, an opener may come.
    Start,
    /// Inside the thinking block.
    Thinking,
    /// Right after the block: the whitespace that follows it is dropped.
    AfterThought,
    /// In the answer's text.
    Text,
}

/// Splits an answer into reasoning and text as it streams.
#[derive(Debug)]
pub struct ThoughtSplitter {
    thinking: Thinking,
    at: Where,
    /// Text not yet passed on (a possible tag's beginning, or leading whitespace).
    pending: String,
    /// Whether any reasoning has been passed on (whitespace before it is dropped).
    reasoned: bool,
    /// Whitespace at the reasoning's end so far: passed on only if more reasoning follows.
    held: String,
}

impl ThoughtSplitter {
    /// A splitter for `thinking`, starting inside a block when the prompt left one open.
    pub fn new(thinking: Thinking, open: bool) -> ThoughtSplitter {
        ThoughtSplitter {
            thinking,
            at: if open { Where::Thinking } else { Where::Start },
            pending: String::new(),
            reasoned: false,
            held: String::new(),
        }
    }

    /// Whether the answer is inside its thinking block now.
    pub fn thinking(&self) -> bool {
        self.at == Where::Thinking
    }

    /// Whether what came so far may still be the opener's beginning (nothing decided yet).
    pub fn undecided(&self) -> bool {
        self.at == Where::Start
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.at {
                Where::Start => {
                    let trimmed = self.pending.trim_start();
                    let opener = self.thinking.opener();
                    if let Some(rest) = trimmed.strip_prefix(opener) {
                        self.pending = rest.to_string();
                        self.at = Where::Thinking;
                        continue;
                    }
                    if trimmed.is_empty() || opener.starts_with(trimmed) {
                        return out;
                    }
                    self.at = Where::Text;
                }
                Where::Thinking => {
                    let closer = self.thinking.closer();
                    if let Some(at) = self.pending.find(closer) {
                        let thought: String = self.pending.drain(..at).collect();
                        self.pending.drain(..closer.len());
                        self.reason(&thought, &mut out);
                        self.held.clear();
                        self.at = Where::AfterThought;
                        continue;
                    }
                    let keep = partial_tag(&self.pending, closer);
                    let ready: String = self.pending.drain(..self.pending.len() - keep).collect();
                    self.reason(&ready, &mut out);
                    return out;
                }
                Where::AfterThought => {
                    // The answer's text starts after the blank lines that follow a block.
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        self.pending.clear();
                        return out;
                    }
                    self.pending = trimmed.to_string();
                    self.at = Where::Text;
                }
                Where::Text => {
                    let text = std::mem::take(&mut self.pending);
                    push(&mut out, Part::Text(text));
                    return out;
                }
            }
        }
    }

    /// What is left when the answer has ended.
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.at {
            Where::Thinking => self.reason(&rest, &mut out),
            _ => push(&mut out, Part::Text(rest)),
        }
        out
    }

    /// Passes reasoning on without the whitespace around the block's text.
    fn reason(&mut self, text: &str, out: &mut Vec<Part>) {
        let text = if self.reasoned {
            text
        } else {
            text.trim_start()
        };
        let body = text.trim_end();
        if body.is_empty() {
            if self.reasoned {
                self.held.push_str(text);
            }
            return;
        }
        self.reasoned = true;
        let mut piece = std::mem::take(&mut self.held);
        piece.push_str(body);
        out.push(Part::Reasoning(piece));
        self.held.push_str(&text[body.len()..]);
    }
}

/// `part` unless it is empty.
fn push(out: &mut Vec<Part>, part: Part) {
    match &part {
        Part::Reasoning(t) | Part::Text(t) if t.is_empty() => {}
        _ => out.push(part),
    }
}

/// The length of the longest end of `text` that begins `tag`.
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// An answer split at once: (reasoning, text).
pub fn split(thinking: Thinking, open: bool, text: &str) -> (String, String) {
    let mut splitter = ThoughtSplitter::new(thinking, open);
    let mut parts = splitter.push(text);
    parts.extend(splitter.finish());
    let (mut reasoning, mut answer) = (String::new(), String::new());
    for part in parts {
        match part {
            Part::Reasoning(t) => reasoning.push_str(&t),
            Part::Text(t) => answer.push_str(&t),
        }
    }
    (reasoning, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(thinking: Thinking, open: bool, text: &str, step: usize) -> (String, String) {
        let mut s = ThoughtSplitter::new(thinking, open);
        let (mut reasoning, mut answer) = (String::new(), String::new());
        let mut at = 0;
        let mut parts = Vec::new();
        while at < text.len() {
            let mut end = (at + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            parts.extend(s.push(&text[at..end]));
            at = end;
        }
        parts.extend(s.finish());
        for p in parts {
            match p {
                Part::Reasoning(t) => reasoning.push_str(&t),
                Part::Text(t) => answer.push_str(&t),
            }
        }
        (reasoning, answer)
    }

    #[test]
    fn a_leading_block_is_reasoning_however_the_text_is_split() {
        let text = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nIt is 4.";
        for step in [1, 2, 5, 1000] {
            let (reasoning, answer) = streamed(Thinking::ThinkTags, false, text, step);
            assert_eq!(reasoning, "The user wants 2+2. That is 4.", "step {step}");
            assert_eq!(answer, "It is 4.", "step {step}");
        }
        let gemma = "<|channel>thought\nsimple<channel|>Four.";
        assert_eq!(
            split(Thinking::Channel, false, gemma),
            ("simple".into(), "Four.".into())
        );
    }

    #[test]
    fn an_opener_split_over_pieces_is_undecided_until_it_is_whole() {
        let mut s = ThoughtSplitter::new(Thinking::ThinkTags, false);
        for piece in ["\n", "<", "think"] {
            s.push(piece);
            assert!(s.undecided() && !s.thinking(), "after {piece:?}");
        }
        s.push(">");
        assert!(!s.undecided() && s.thinking());
        let mut s = ThoughtSplitter::new(Thinking::ThinkTags, false);
        s.push("<th");
        s.push("ere");
        assert!(!s.undecided() && !s.thinking(), "text, not an opener");
    }

    #[test]
    fn a_block_the_prompt_opened_starts_the_answer_as_reasoning() {
        let text = "Let me think. 2+2=4.\n</think>\n\nFour.";
        for step in [1, 3, 1000] {
            let (reasoning, answer) = streamed(Thinking::ThinkTags, true, text, step);
            assert_eq!(reasoning, "Let me think. 2+2=4.");
            assert_eq!(answer, "Four.");
        }
        assert!(Thinking::ThinkTags.open_at_end("<|im_start|>assistant\n<think>\n"));
        assert!(!Thinking::ThinkTags.open_at_end("<think>\n\n</think>\n\n"));
    }

    #[test]
    fn tags_later_in_the_text_are_text_and_an_unclosed_block_stays_reasoning() {
        let text = "Use <think> tags like </think> this.";
        assert_eq!(
            streamed(Thinking::ThinkTags, false, text, 2),
            (String::new(), text.into())
        );
        let cut = "<think>\nstill thinking when the limit came";
        assert_eq!(
            streamed(Thinking::ThinkTags, false, cut, 4),
            ("still thinking when the limit came".into(), String::new())
        );
        let partial = "<thi";
        assert_eq!(
            streamed(Thinking::ThinkTags, false, partial, 1),
            (String::new(), partial.into()),
            "a tag's beginning at the end is text"
        );
    }
}
