//! Chat prompts: a model's Jinja chat template (GGUF `tokenizer.chat_template`) rendered as
//! Hugging Face's transformers renders it — `trim_blocks` and `lstrip_blocks`, `raise_exception`,
//! Python string methods, `tojson` formatted like Python's `json.dumps` — or ChatML when the model
//! carries no template, which is llama.cpp's fallback too, so one conversation gives both engines
//! the same prompt.

use std::fmt::Write as _;

use minijinja::{Environment, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

use crate::model_file::ModelFile;
use crate::tokenizer::{Budget, Stopped, Tokenizer};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool` (or whatever else the template understands).
    pub role: String,
    /// The turn's text.
    pub content: String,
    /// An assistant's calls, as templates take them: `[{"id", "type": "function",
    /// "function": {"name", "arguments": {…}}}]` (arguments an object where they parse as one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool result's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message from `role` saying `content`.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// Variables a request sets in the template beside the messages (llama.cpp's
/// `chat_template_kwargs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars {
    /// `enable_thinking`: whether a model that can reason first (Gemma 4, Qwen 3 and 3.5)
    /// does. Unset, it is off: on a Pi a thinking block costs more time than most answers
    /// (Qwen's templates would think by default; Gemma 4's would not).
    pub enable_thinking: Option<bool>,
    /// Leave `enable_thinking` undefined when it is `None`, so the template's own default
    /// applies (`--reasoning auto`); otherwise `None` is false.
    pub thinking_from_template: bool,
    /// `reasoning_effort`, for templates that map it.
    pub reasoning_effort: Option<String>,
    /// `tools`: the tools the template describes to the model (`{"type": "function",
    /// "function": {…}}` each), for templates that take them.
    pub tools: Option<Vec<serde_json::Value>>,
}

/// The fallback for models without a template (llama.cpp's `chatml`).
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + \
message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ \
'<|im_start|>assistant\n' }}{% endif %}";

/// A compiled chat template with the special-token texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// Whether this is the model's own template rather than the ChatML fallback.
    pub from_model: bool,
    /// The template's Jinja text.
    pub source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("from_model", &self.from_model)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template of `file` (ChatML when it has none); BOS and EOS texts from `tokenizer`.
    pub fn from_model(file: &ModelFile, tokenizer: &Tokenizer) -> Result<ChatTemplate, String> {
        ChatTemplate::for_model(file, tokenizer, None)
    }

    /// `source` when given (e.g. `--chat-template-file`), else the model's template, else
    /// ChatML; BOS and EOS texts from `tokenizer`.
    pub fn for_model(
        file: &ModelFile,
        tokenizer: &Tokenizer,
        source: Option<String>,
    ) -> Result<ChatTemplate, String> {
        let source = match (source, file.header().get("tokenizer.chat_template")) {
            (Some(given), _) => Some(given),
            (None, Some(gguf::Value::String(s))) => Some(s.clone()),
            (None, Some(_)) => return Err("tokenizer.chat_template is not a string".into()),
            (None, None) => None,
        };
        let text_of = |key: &str| {
            file.header()
                .get(key)
                .and_then(gguf::Value::as_u64)
                .and_then(|id| tokenizer.token_text(id as u32))
                .unwrap_or_default()
                .to_string()
        };
        ChatTemplate::new(
            source,
            text_of("tokenizer.ggml.bos_token_id"),
            text_of("tokenizer.ggml.eos_token_id"),
        )
    }

    /// Compiles `source` (ChatML when `None`); a syntax error names the template's line.
    pub fn new(source: Option<String>, bos: String, eos: String) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        let from_model = source.is_some();
        let source = source.unwrap_or_else(|| CHATML.to_string());
        env.add_template_owned("chat", source.clone())
            .map_err(|e| format!("the chat template does not compile: {e:#}"))?;
        Ok(ChatTemplate {
            env,
            bos,
            eos,
            from_model,
            source,
        })
    }

    /// The prompt text of `messages`, ending with the assistant's cue when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: &Vars,
    ) -> Result<String, String> {
        if messages.is_empty() {
            return Err("a chat needs at least one message".into());
        }
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| format!("chat template: {e:#}"))?;
        let today = Today::now();
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
                enable_thinking => match vars.enable_thinking {
                    None if vars.thinking_from_template => Value::UNDEFINED,
                    thinking => Value::from(thinking.unwrap_or(false)),
                },
                reasoning_effort => vars.reasoning_effort,
                tools => vars.tools,
                // Variables some templates use without checking them (Llama 3.x's date,
                // FireFunction's `datetime` and `functions`), given as llama.cpp gives them.
                date_string => today.date_string(),
                datetime => today.datetime(),
                functions => vars.tools.as_ref().map_or_else(String::new, |t| {
                    serde_json::to_string_pretty(t).unwrap_or_default()
                }),
            })
            .map_err(|e| format!("the chat template refused these messages: {e:#}"))
    }

    /// The syntax the template writes tool calls in, when it takes tools and writes them in a
    /// syntax the engine reads (`None`: the fallback of `tools::describe`).
    pub fn tool_syntax(&self) -> Option<crate::tools::Syntax> {
        crate::tools::Syntax::of_template(&self.source)
    }

    /// The syntax the template writes a thinking block in, if any.
    pub fn thinking(&self) -> Option<crate::reasoning::Thinking> {
        crate::reasoning::Thinking::of_template(&self.source)
    }

    /// Whether the prompt of `messages` (answered, or its last message continued) leaves a
    /// thinking block open, so the answer begins as reasoning.
    pub fn opens_thinking(
        &self,
        messages: &[Message],
        vars: &Vars,
        thinking: crate::reasoning::Thinking,
        continued: bool,
    ) -> bool {
        if continued {
            return self
                .render_continuation(messages, vars)
                .is_ok_and(|text| thinking.open_at_end(&text));
        }
        // Only what the generation cue adds counts: a tag a user wrote in a message does not.
        let (Ok(asked), Ok(cued)) = (
            self.render(messages, false, vars),
            self.render(messages, true, vars),
        ) else {
            return false;
        };
        let cue = cued.strip_prefix(asked.as_str()).unwrap_or(&cued);
        thinking.open_at_end(cue)
    }

    /// The BOS and EOS texts the template is given.
    pub fn bos_eos(&self) -> (&str, &str) {
        (&self.bos, &self.eos)
    }

    /// `text` without the BOS text the template wrote at its start, so a tokenizer that adds
    /// BOS itself does not begin the prompt with two.
    pub fn strip_bos<'a>(&self, text: &'a str) -> &'a str {
        if self.bos.is_empty() {
            return text;
        }
        text.strip_prefix(self.bos.as_str()).unwrap_or(text)
    }

    /// The token ids of `messages` rendered with the generation cue: the template's special
    /// tokens are recognised, the messages' text is only text, and BOS appears once whoever
    /// writes it.
    pub fn prompt_ids(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
    ) -> Result<Vec<u32>, String> {
        self.ids(tokenizer, messages, true)
    }

    /// The token ids of `messages` rendered with or without the generation cue (without: the
    /// prefix that a later conversation starting with these messages shares).
    pub fn ids(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, String> {
        self.ids_within(
            tokenizer,
            messages,
            add_generation_prompt,
            &Vars::default(),
            &Budget::UNLIMITED,
        )
        .map_err(|e| e.to_string())
    }

    /// [`ChatTemplate::ids`] within `budget`.
    pub fn ids_within(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: &Vars,
        budget: &Budget<'_>,
    ) -> Result<Vec<u32>, PromptError> {
        let protected = protect(tokenizer, messages);
        let vars = protect_vars(tokenizer, vars);
        let text = self
            .render(&protected, add_generation_prompt, &vars)
            .map_err(PromptError::Template)?;
        self.encode(tokenizer, &text, budget)
    }

    /// The token ids of `messages` whose last one (an assistant's, the answer's beginning) is
    /// continued rather than answered: rendered without the generation cue and cut right after
    /// that message's text, so its end-of-turn never reaches the model (transformers'
    /// `continue_final_message`).
    pub fn continuation_ids_within(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        vars: &Vars,
        budget: &Budget<'_>,
    ) -> Result<Vec<u32>, PromptError> {
        let protected = protect(tokenizer, messages);
        let vars = protect_vars(tokenizer, vars);
        let text = self
            .render_continuation(&protected, &vars)
            .map_err(PromptError::Template)?;
        self.encode(tokenizer, &text, budget)
    }

    /// The prompt text of `messages` with the last one continued (see
    /// [`ChatTemplate::continuation_ids_within`]).
    pub fn render_continuation(&self, messages: &[Message], vars: &Vars) -> Result<String, String> {
        // Templates often trim a message; its end is where its last non-space character is.
        let begun = messages.last().map_or("", |m| m.content.trim_end());
        if let [before @ .., _] = messages
            && begun.trim_start().is_empty()
        {
            // Nothing begun: the answer starts where the message's text would, after the cue.
            return self.render(before, true, vars);
        }
        let mut text = self.render(messages, false, vars)?;
        let cut = text
            .rfind(begun)
            .filter(|_| !begun.is_empty())
            .map(|at| at + begun.len())
            .ok_or_else(|| {
                "the chat template does not write the last assistant message as given, so it \
                 cannot be continued (drop it, or end the chat with a user message)"
                    .to_string()
            })?;
        text.truncate(cut);
        Ok(text)
    }

    /// A rendering's token ids, BOS once.
    fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        budget: &Budget<'_>,
    ) -> Result<Vec<u32>, PromptError> {
        let text = if tokenizer.adds_bos() {
            self.strip_bos(text)
        } else {
            text
        };
        tokenizer
            .encode_rendered(text, budget)
            .map_err(PromptError::Stopped)
    }
}

/// A message that writes `<|im_end|>` must not end its turn: its text stays text.
fn protect(tokenizer: &Tokenizer, messages: &[Message]) -> Vec<Message> {
    let text = |t: &str| tokenizer.protect(t).into_owned();
    messages
        .iter()
        .map(|m| Message {
            role: text(&m.role),
            content: text(&m.content),
            tool_calls: m
                .tool_calls
                .as_ref()
                .map(|calls| calls.iter().map(|c| protect_value(tokenizer, c)).collect()),
            tool_call_id: m.tool_call_id.as_deref().map(text),
            name: m.name.as_deref().map(text),
        })
        .collect()
}

/// `vars` with the client's tool descriptions protected like message text.
fn protect_vars(tokenizer: &Tokenizer, vars: &Vars) -> Vars {
    Vars {
        tools: vars
            .tools
            .as_ref()
            .map(|tools| tools.iter().map(|t| protect_value(tokenizer, t)).collect()),
        ..vars.clone()
    }
}

/// Every string (and key) in `value` protected: a client's JSON is text, never control tokens.
fn protect_value(tokenizer: &Tokenizer, value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        J::String(s) => J::String(tokenizer.protect(s).into_owned()),
        J::Array(a) => J::Array(a.iter().map(|v| protect_value(tokenizer, v)).collect()),
        J::Object(o) => J::Object(
            o.iter()
                .map(|(k, v)| {
                    (
                        tokenizer.protect(k).into_owned(),
                        protect_value(tokenizer, v),
                    )
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Why a chat's prompt could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptError {
    /// The template refused the messages (or failed).
    Template(String),
    /// Tokenizing stopped early.
    Stopped(Stopped),
}

impl std::fmt::Display for PromptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromptError::Template(e) => f.write_str(e),
            PromptError::Stopped(Stopped::TooLong { max_tokens }) => {
                write!(f, "the prompt is longer than {max_tokens} tokens")
            }
            PromptError::Stopped(Stopped::Cancelled) => f.write_str("cancelled"),
        }
    }
}

/// The date (UTC) a chat is rendered on, for templates that print it.
struct Today {
    year: i64,
    month: u32,
    day: u32,
}

impl Today {
    fn now() -> Today {
        Today::at(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        )
    }

    /// The UTC date `secs` after the Unix epoch.
    fn at(secs: u64) -> Today {
        // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
        let z = (secs / 86_400) as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        Today { year, month, day }
    }

    /// `26 Jul 2024` (llama.cpp's `date_string`, as Llama 3.x's templates print it).
    fn date_string(&self) -> String {
        format!("{:02} {} {}", self.day, self.month_name(), self.year)
    }

    /// `Jul 26 2024` (llama.cpp's `datetime`).
    fn datetime(&self) -> String {
        format!("{} {:02} {}", self.month_name(), self.day, self.year)
    }

    fn month_name(&self) -> &'static str {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        MONTHS[(self.month as usize).saturating_sub(1) % 12]
    }
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as transformers defines it: `json.dumps(value, ensure_ascii=False, indent=indent)`,
/// so separators and escapes match what the model saw in training.
fn tojson(
    value: &Value,
    indent: Option<usize>,
    kwargs: minijinja::value::Kwargs,
) -> Result<Value, minijinja::Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON")
            .with_source(e)
    })?;
    let mut out = String::new();
    python_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn python_json(value: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let (open_sep, item_sep, close_sep) = match indent {
        Some(n) => (
            format!("\n{}", " ".repeat(n * (depth + 1))),
            format!(",\n{}", " ".repeat(n * (depth + 1))),
            format!("\n{}", " ".repeat(n * depth)),
        ),
        None => (String::new(), ", ".to_string(), String::new()),
    };
    match value {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            out.push_str(&open_sep);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                python_json(item, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            out.push_str(&open_sep);
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                let _ = write!(out, "{}: ", J::String(key.clone()));
                python_json(item, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push('}');
        }
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_printed_as_llama_cpp_prints_them() {
        let epoch = Today::at(0);
        assert_eq!(epoch.date_string(), "01 Jan 1970");
        let leap = Today::at(1_709_164_800 + 86_399);
        assert_eq!(leap.date_string(), "29 Feb 2024");
        assert_eq!(leap.datetime(), "Feb 29 2024");
        assert_eq!(Today::at(1_735_689_600).date_string(), "01 Jan 2025");
    }

    #[test]
    fn chatml_fallback_matches_llama_cpp() {
        let t = ChatTemplate::new(None, String::new(), String::new()).expect("chatml");
        let text = t
            .render(&[Message::new("user", "Hi")], true, &Vars::default())
            .expect("render");
        assert_eq!(
            text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!t.from_model);
    }

    #[test]
    fn templates_get_hugging_face_semantics() {
        let source = "{{ bos_token }}{% for m in messages %}\n  {% if true %}{{ m['role'] | upper }}: {{ m['content'].strip() }}{% endif %}\n{% endfor %}";
        let t =
            ChatTemplate::new(Some(source.into()), "<s>".into(), "</s>".into()).expect("compile");
        let text = t
            .render(
                &[Message::new("user", "  hello  ")],
                false,
                &Vars::default(),
            )
            .expect("render");
        // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
        assert_eq!(text, "<s>USER: hello");
        assert_eq!(t.strip_bos(&text), "USER: hello");
    }

    #[test]
    fn raise_exception_becomes_a_clear_error() {
        let source = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}";
        let t =
            ChatTemplate::new(Some(source.into()), String::new(), String::new()).expect("compile");
        let err = t
            .render(&[Message::new("assistant", "x")], true, &Vars::default())
            .expect_err("refused");
        assert!(err.contains("first must be user"), "{err}");
        assert!(t.render(&[], true, &Vars::default()).is_err());
    }

    #[test]
    fn tojson_formats_like_python_json_dumps() {
        let t = ChatTemplate::new(
            Some("{{ {'a': [1, 'é<'], 'b': {}} | tojson }}|{{ [1] | tojson(indent=2) }}".into()),
            String::new(),
            String::new(),
        )
        .expect("compile");
        let text = t
            .render(&[Message::new("user", "")], false, &Vars::default())
            .expect("render");
        assert_eq!(text, "{\"a\": [1, \"é<\"], \"b\": {}}|[\n  1\n]");
    }

    #[test]
    fn a_broken_template_is_an_error_not_a_panic() {
        let err = ChatTemplate::new(Some("{% for %}".into()), String::new(), String::new())
            .expect_err("syntax error");
        assert!(err.contains("chat template"), "{err}");
    }
}
