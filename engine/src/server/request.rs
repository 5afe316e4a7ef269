//! Request bodies of the OpenAI-compatible and llama.cpp-native endpoints, and their checking
//! into the [`Params`] a generation runs with. A field the engine does not implement is
//! refused with a 400 naming it, never silently ignored.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::worker::Params;
use crate::chat::Message;
use crate::grammar::Grammar;
use crate::sampler::Sampling;
use crate::tokenizer::Tokenizer;

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Message content: a string, or OpenAI's list of parts (text parts are joined).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": "…"}, …]`.
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Debug, Deserialize)]
pub struct Part {
    /// Only `text` parts are supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// A chat message as sent.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ….
    pub role: String,
    /// Its content (null counts as empty).
    #[serde(default)]
    pub content: Option<Content>,
    /// Everything else a message may carry (`name`, `tool_calls`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Sampling and length fields shared by every generation endpoint.
#[derive(Debug, Default, Deserialize)]
pub struct Knobs {
    /// OpenAI's limit (also `max_completion_tokens`).
    #[serde(default, alias = "max_completion_tokens")]
    pub max_tokens: Option<i64>,
    /// llama.cpp's name for the same limit.
    #[serde(default)]
    pub n_predict: Option<i64>,
    /// Temperature (0 = greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Top-k sampling.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Min-p sampling.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Repetition penalty (llama.cpp).
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back at (llama.cpp; −1: the whole context).
    #[serde(default, alias = "penalty_last_n")]
    pub repeat_last_n: Option<i64>,
    /// OpenAI's presence penalty.
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty.
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Sampler seed (−1 or absent: the server's default).
    #[serde(default)]
    pub seed: Option<i64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Stream as server-sent events.
    #[serde(default, deserialize_with = "null_is_false")]
    pub stream: bool,
    /// `{"include_usage": true}` adds a usage chunk to a stream.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Generate past end-of-generation tokens, up to the limit (llama.cpp).
    #[serde(default, deserialize_with = "null_is_false")]
    pub ignore_eos: bool,
    /// `false`: prefill the whole prompt, not reusing a kept conversation's cache (llama.cpp).
    #[serde(default)]
    pub cache_prompt: Option<bool>,
    /// Choices to generate.
    #[serde(default)]
    pub n: Option<i64>,
    /// Chat: `true` for log-probabilities; completions: how many alternatives (a number).
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token (with `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// llama.cpp's alternatives per token.
    #[serde(default)]
    pub n_probs: Option<i64>,
    /// Report the probabilities the sampler drew from (after its filters and temperature)
    /// instead of the model's (llama.cpp's `post_sampling_probs`).
    #[serde(default, deserialize_with = "null_is_false")]
    pub post_sampling_probs: bool,
    /// Added to logits: `{"id or text": bias}` (OpenAI's, with llama.cpp's texts) or
    /// `[[id or text, bias or false], …]` (llama.cpp's).
    #[serde(default)]
    pub logit_bias: Option<Value>,
    /// `{"type": "text" | "json_object" | "json_schema", …}`.
    #[serde(default)]
    pub response_format: Option<Value>,
    /// llama.cpp: a JSON Schema the output follows.
    #[serde(default)]
    pub json_schema: Option<Value>,
    /// llama.cpp: a GBNF grammar the output follows.
    #[serde(default)]
    pub grammar: Option<String>,
    /// llama.cpp's `speculative.n_max`: tokens drafted per pass at most (0 turns it off).
    #[serde(default, rename = "speculative.n_max")]
    pub speculative_n_max: Option<i64>,
    /// llama.cpp's `speculative.n_min`: fewest drafted tokens worth a check.
    #[serde(default, rename = "speculative.n_min")]
    pub speculative_n_min: Option<i64>,
    /// The same two as an object: `{"speculative": {"n_max": 8}}`.
    #[serde(default)]
    pub speculative: Option<SpeculativeKnobs>,
    /// Prompt tokens a context shift keeps (llama.cpp's `n_keep`; −1: the whole prompt).
    #[serde(default)]
    pub n_keep: Option<i64>,
    /// llama.cpp's prefill progress events in a stream.
    #[serde(default, deserialize_with = "null_is_false")]
    pub return_progress: bool,
    /// llama.cpp's timings on every streamed piece, not only the last.
    #[serde(default, deserialize_with = "null_is_false")]
    pub timings_per_token: bool,
    /// Every other field, checked against [`UNSUPPORTED`].
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `false` for `null` too: clients that fill every field send `"stream": null`.
fn null_is_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

/// Speculation settings as an object.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeKnobs {
    /// Tokens drafted per pass at most (0: off).
    #[serde(default)]
    pub n_max: Option<i64>,
    /// Fewest drafted tokens worth a check.
    #[serde(default)]
    pub n_min: Option<i64>,
}

/// Streaming options.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with token usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Template variables (llama.cpp's field): `{"enable_thinking": true}`.
    #[serde(default)]
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// The tools the model may call (checked by [`ChatRequest::tools`]).
    #[serde(default)]
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or a named function.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Whether one answer may hold several calls.
    #[serde(default)]
    pub parallel_tool_calls: Option<Value>,
    /// Legacy `functions` (the same as `tools`, one call per answer).
    #[serde(default)]
    pub functions: Option<Value>,
    /// Legacy `function_call` (the same as `tool_choice`).
    #[serde(default)]
    pub function_call: Option<Value>,
    /// Where reasoning goes: `none`, `auto`, `deepseek`, `deepseek-legacy` (llama.cpp's).
    #[serde(default)]
    pub reasoning_format: Option<String>,
    /// OpenAI's `reasoning_effort`: given to the template; `none` turns thinking off, any
    /// other value on.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// Whether the prompt ends with the template's cue for the answer (default: yes).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Continue the last (assistant) message instead of answering: `true` or `"content"`
    /// (`"reasoning_content"` is refused).
    #[serde(default)]
    pub continue_final_message: Option<Value>,
    /// Everything else.
    #[serde(flatten)]
    pub knobs: Knobs,
}

/// The template variables a chat may set; any other is refused by name.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateKwargs {
    /// Whether a model that can reason first does (Gemma 4's template: off unless set).
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

impl ChatRequest {
    /// The variables its template is rendered with (without tools): thinking as the request
    /// asks (`enable_thinking`, else `reasoning_effort`), else as the server's default.
    pub fn vars(&self, defaults: &Defaults) -> crate::chat::Vars {
        use crate::reasoning::ThinkingDefault;
        let asked = self
            .chat_template_kwargs
            .as_ref()
            .and_then(|k| k.enable_thinking)
            .or_else(|| self.reasoning_effort.as_deref().map(|e| e != "none"));
        let by_default = match (defaults.reasoning_budget, defaults.thinking) {
            // A budget of nothing is no thinking (llama.cpp's `--reasoning-budget 0`).
            (Some(0), _) | (_, ThinkingDefault::Off) => Some(false),
            (_, ThinkingDefault::On) => Some(true),
            (_, ThinkingDefault::Auto) => None,
        };
        crate::chat::Vars {
            enable_thinking: asked.or(by_default),
            thinking_from_template: asked.is_none() && by_default.is_none(),
            reasoning_effort: self.reasoning_effort.clone(),
            tools: None,
        }
    }

    /// `reasoning_effort` checked: one of OpenAI's words (it reaches the template as is).
    pub fn check_reasoning_effort(&self) -> Result<(), ApiError> {
        match self.reasoning_effort.as_deref() {
            None | Some("none" | "minimal" | "low" | "medium" | "high") => Ok(()),
            Some(other) => Err(ApiError::bad_request(format!(
                "reasoning_effort must be none, minimal, low, medium or high, not {:?}",
                other.chars().take(32).collect::<String>()
            ))),
        }
    }

    /// Where its reasoning goes: `reasoning_format`, else the server's default.
    pub fn reasoning_format(
        &self,
        defaults: &Defaults,
    ) -> Result<crate::reasoning::Format, ApiError> {
        match &self.reasoning_format {
            None => Ok(defaults.reasoning_format),
            Some(f) => f
                .parse()
                .map_err(|e| ApiError::bad_request(format!("reasoning_format: {e}"))),
        }
    }

    /// Its tools, checked; `None` when it declares none.
    pub fn tools(&self) -> Result<Option<crate::tools::Request>, ApiError> {
        crate::tools::Request::from_fields(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls.as_ref(),
            self.functions.as_ref(),
            self.function_call.as_ref(),
        )
        .map_err(ApiError::bad_request)
    }
}

/// `POST /v1/completions` and `POST /completion`: a raw prompt.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// Text, token ids, or llama.cpp's mix of both (see [`prompt`]).
    pub prompt: Value,
    /// Everything else.
    #[serde(flatten)]
    pub knobs: Knobs,
}

/// A generation request: its fields beside the prompt or the messages.
pub trait Generating: serde::de::DeserializeOwned {
    /// The request's knobs.
    fn knobs(&self) -> &Knobs;
}

impl Generating for ChatRequest {
    fn knobs(&self) -> &Knobs {
        &self.knobs
    }
}

impl Generating for CompletionRequest {
    fn knobs(&self) -> &Knobs {
        &self.knobs
    }
}

/// A prompt as given: text (special tokens recognised) and token ids, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptPiece {
    /// Text to tokenize.
    Text(String),
    /// A token id, taken as is.
    Id(u32),
}

/// The prompts of a `/completion` request, as llama.cpp reads a list: several texts, or a list
/// holding id lists or `{"prompt_string"}` objects, is one prompt per item; a list of ids (and
/// texts among them) is one prompt.
pub fn prompts(value: &Value) -> Vec<&Value> {
    match value {
        Value::Array(items)
            if items.len() > 1
                && (items.iter().all(Value::is_string)
                    || items.iter().any(|i| i.is_array() || i.is_object())) =>
        {
            items.iter().collect()
        }
        one => vec![one],
    }
}

/// The pieces of a `prompt` field: a string; a list of ids and strings (llama.cpp); a list
/// holding one string or one list of ids (OpenAI); llama.cpp's `{"prompt_string": …}` (with no
/// `multimodal_data`: the models served take text only). Several prompts are refused here.
pub fn prompt(value: &Value, vocab: usize) -> Result<Vec<PromptPiece>, ApiError> {
    let several = || {
        ApiError::unsupported(
            "prompt",
            "one prompt per request (send several requests, or use `n` for several answers)",
        )
    };
    let pieces = match value {
        Value::String(s) => vec![PromptPiece::Text(s.clone())],
        Value::Object(fields) => {
            if fields
                .get("multimodal_data")
                .is_some_and(|m| !m.is_null() && m != &Value::Array(Vec::new()))
            {
                return Err(ApiError::unsupported(
                    "multimodal_data",
                    "the model takes text only",
                ));
            }
            match fields.get("prompt_string") {
                Some(Value::String(s)) => vec![PromptPiece::Text(s.clone())],
                _ => {
                    return Err(ApiError::bad_request(
                        "a prompt given as an object needs prompt_string (a string)",
                    ));
                }
            }
        }
        Value::Array(items) if items.iter().all(Value::is_string) => match items.as_slice() {
            [one] => return prompt(one, vocab),
            [] => Vec::new(),
            _ => return Err(several()),
        },
        Value::Array(items) if items.iter().all(Value::is_array) => match items.as_slice() {
            [one] => return prompt(one, vocab),
            _ => return Err(several()),
        },
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(PromptPiece::Text(s.clone())),
                Value::Number(n) => n
                    .as_u64()
                    .filter(|&id| id < vocab as u64)
                    .map(|id| PromptPiece::Id(id as u32))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "prompt[{i}] = {n} is not a token id (0 to {})",
                            vocab.saturating_sub(1)
                        ))
                    }),
                _ => Err(ApiError::bad_request(format!(
                    "prompt[{i}] must be a token id or a string"
                ))),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::bad_request(
                "prompt must be a string, a list of token ids, or a list holding one of those",
            ));
        }
    };
    if pieces
        .iter()
        .all(|p| matches!(p, PromptPiece::Text(t) if t.is_empty()))
    {
        return Err(ApiError::bad_request("prompt must not be empty"));
    }
    Ok(pieces)
}

/// Most prompts one `/completion` request may hold (each is a generation of its own).
pub const MAX_PROMPTS: usize = 16;

/// Most stop strings per request.
pub const MAX_STOPS: usize = 16;

/// Longest stop string.
pub const MAX_STOP_BYTES: usize = 256;

/// Most tokens one request may ask for.
pub const MAX_TOKENS_LIMIT: i64 = 1 << 20;

/// Most choices (`n`) per request: each is a full generation on the one generation thread.
pub const MAX_CHOICES: i64 = 4;

/// Most alternatives reported per token.
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// The largest bias magnitude kept: far past any logit's range, so it forces or bans as
/// well as any larger one would, and every sum and scale of it stays finite.
const MAX_BIAS: f64 = 1e6;

/// Most `logit_bias` entries.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Most bytes of text `logit_bias` may name (each text biases the tokens it is made of).
const MAX_LOGIT_BIAS_TEXT: usize = 16 * 1024;

/// Whether a field's value asks for nothing this engine lacks.
type Harmless = fn(&Value) -> bool;

/// Fields of OpenAI's and llama.cpp's APIs this engine does not implement, each with when a
/// value is harmless (the default, or a no-op) and why a real one is refused.
const UNSUPPORTED: &[(&str, Harmless, &str)] = &[
    (
        "tools",
        empty_list,
        "tool calling applies to chats (/v1/chat/completions)",
    ),
    (
        "functions",
        empty_list,
        "function calling applies to chats (/v1/chat/completions)",
    ),
    (
        "tool_choice",
        no_tools,
        "tool calling applies to chats (/v1/chat/completions)",
    ),
    (
        "function_call",
        no_tools,
        "function calling applies to chats (/v1/chat/completions)",
    ),
    ("audio", is_null, "the model has no audio output"),
    ("modalities", text_only, "the model produces text only"),
    (
        "prediction",
        is_null,
        "predicted outputs are not implemented",
    ),
    (
        "suffix",
        empty_text,
        "fill-in-the-middle is served by /v1/completions and /infill",
    ),
    ("echo", falsy, "echoing the prompt is not implemented"),
    (
        "best_of",
        at_most_one,
        "best-of sampling is not implemented (use `n`)",
    ),
    ("mirostat", zero, "mirostat sampling is not implemented"),
    (
        "typical_p",
        one,
        "locally typical sampling is not implemented",
    ),
    ("tfs_z", one, "tail-free sampling is not implemented"),
    (
        "dynatemp_range",
        zero,
        "dynamic temperature is not implemented",
    ),
    ("dry_multiplier", zero, "DRY sampling is not implemented"),
    ("xtc_probability", zero, "XTC sampling is not implemented"),
    (
        "top_n_sigma",
        not_positive,
        "top-n-sigma sampling is not implemented",
    ),
    (
        "samplers",
        is_null,
        "the sampler order is fixed: penalties, top-k, top-p, min-p, temperature",
    ),
    ("image_data", empty_list, "the model takes text only"),
    ("multimodal_data", empty_list, "the model takes text only"),
    ("lora", empty_list, "LoRA adapters are not implemented"),
    (
        "chat_template_kwargs",
        empty_object,
        "template variables apply to chats (/v1/chat/completions)",
    ),
    (
        "t_max_predict_ms",
        zero,
        "time limits are not implemented (use max_tokens)",
    ),
];

fn is_null(v: &Value) -> bool {
    v.is_null()
}
fn empty_list(v: &Value) -> bool {
    v.is_null() || v.as_array().is_some_and(Vec::is_empty)
}
fn empty_object(v: &Value) -> bool {
    v.is_null() || v.as_object().is_some_and(Map::is_empty)
}
fn empty_text(v: &Value) -> bool {
    v.is_null() || v.as_str() == Some("")
}
fn no_tools(v: &Value) -> bool {
    v.is_null() || matches!(v.as_str(), Some("none" | "auto"))
}
fn text_only(v: &Value) -> bool {
    v.is_null() || *v == serde_json::json!(["text"])
}
fn falsy(v: &Value) -> bool {
    v.is_null() || *v == Value::Bool(false)
}
fn at_most_one(v: &Value) -> bool {
    v.is_null() || v.as_f64().is_some_and(|n| n <= 1.0)
}
fn zero(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(0.0)
}
fn one(v: &Value) -> bool {
    v.is_null() || v.as_f64() == Some(1.0)
}
fn not_positive(v: &Value) -> bool {
    v.is_null() || v.as_f64().is_some_and(|n| n <= 0.0)
}

/// What the server's command line set for requests that leave a field out.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// `max_tokens` (`--n-predict`; `None`: until an end token or the context is full).
    pub max_tokens: Option<usize>,
    /// `temperature` (`--temp`).
    pub temperature: f32,
    /// `top_p` (`--top-p`).
    pub top_p: f32,
    /// `top_k` (`--top-k`; 0: off).
    pub top_k: usize,
    /// `min_p` (`--min-p`; 0: off).
    pub min_p: f32,
    /// `seed` (`--seed`; `None`: a fresh seed per request).
    pub seed: Option<u64>,
    /// Whether chats think (`--reasoning`).
    pub thinking: crate::reasoning::ThinkingDefault,
    /// Where reasoning goes (`--reasoning-format`).
    pub reasoning_format: crate::reasoning::Format,
    /// Thinking tokens at most, then the answer (`--reasoning-budget`; `None`: no bound).
    pub reasoning_budget: Option<usize>,
}

impl Default for Defaults {
    fn default() -> Defaults {
        Defaults {
            max_tokens: Some(512),
            temperature: Sampling::default().temperature,
            top_p: Sampling::default().top_p,
            top_k: Sampling::default().top_k,
            min_p: Sampling::default().min_p,
            seed: None,
            thinking: crate::reasoning::ThinkingDefault::default(),
            reasoning_format: crate::reasoning::Format::default(),
            reasoning_budget: None,
        }
    }
}

/// Which API the request came through: it decides what `logprobs` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `/v1/chat/completions`: `logprobs: bool`, `top_logprobs: n`.
    Chat,
    /// `/v1/completions`: `logprobs: n`.
    Completions,
    /// llama.cpp's `/completion`: `n_probs: n`.
    Native,
    /// llama.cpp's `/infill`: as `/completion`, with code editors' sampler list and time limit
    /// taken as advice.
    Infill,
}

impl Knobs {
    /// The checked parameters of the generation, or a 400 naming the first bad field.
    pub fn params(
        &self,
        dialect: Dialect,
        defaults: &Defaults,
        tokenizer: &Tokenizer,
    ) -> Result<Params, ApiError> {
        self.refuse_unsupported(dialect)?;
        Ok(Params {
            sampling: self.sampling(defaults)?,
            max_tokens: self.limit(defaults)?,
            stop: self.stops()?,
            ignore_eos: self.ignore_eos,
            reuse_prompt: self.cache_prompt.unwrap_or(true),
            choices: self.choices()?,
            logprobs: self.logprobs(dialect)?,
            post_sampling_probs: self.post_sampling_probs,
            logit_bias: self.logit_bias(tokenizer)?,
            grammar: self.grammar()?,
            draft_max: self.draft("n_max", crate::speculate::MAX_DRAFT)?,
            draft_min: self.draft("n_min", 0)?,
            report_progress: self.return_progress && self.stream,
            timings_per_token: self.timings_per_token,
            keep: match self.n_keep {
                None => 0,
                Some(-1) => usize::MAX,
                Some(n) => usize::try_from(n).map_err(|_| {
                    ApiError::bad_request(format!(
                        "n_keep must be -1 (the whole prompt) or a count of tokens, not {n}"
                    ))
                })?,
            },
            grammar_trigger: None,
            grammar_anchored: false,
            thinking_budget: None,
            thinking_block: None,
        })
    }

    /// `speculative.n_max` or `.n_min` (dotted, as llama.cpp names them, or nested), at most
    /// [`crate::speculate::MAX_DRAFT`].
    fn draft(&self, field: &str, default: usize) -> Result<usize, ApiError> {
        let nested = self.speculative.as_ref().and_then(|s| match field {
            "n_max" => s.n_max,
            _ => s.n_min,
        });
        let dotted = match field {
            "n_max" => self.speculative_n_max,
            _ => self.speculative_n_min,
        };
        match dotted.or(nested) {
            None => Ok(default),
            Some(n) => usize::try_from(n)
                .ok()
                .filter(|&n| n <= crate::speculate::MAX_DRAFT)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "speculative.{field} must be between 0 and {}, not {n}",
                        crate::speculate::MAX_DRAFT
                    ))
                }),
        }
    }

    fn refuse_unsupported(&self, dialect: Dialect) -> Result<(), ApiError> {
        for (field, harmless, why) in UNSUPPORTED {
            // `/v1/completions` fills the gap before a `suffix` (see `server::infill`).
            if dialect == Dialect::Completions && *field == "suffix" {
                continue;
            }
            // Editors' plugins (llama.vim, llama.vscode) send llama.cpp's sampler order with
            // its FIM sampler, and a time limit, with every request: the engine's fixed order
            // and the token limit stand.
            if dialect == Dialect::Infill && matches!(*field, "samplers" | "t_max_predict_ms") {
                continue;
            }
            if let Some(value) = self.extra.get(*field)
                && !harmless(value)
            {
                return Err(ApiError::unsupported(field, why));
            }
        }
        Ok(())
    }

    /// The token limit: `max_tokens`, else `n_predict` (−1: until the context is full), else
    /// the server's default; a 400 when out of range.
    fn limit(&self, defaults: &Defaults) -> Result<usize, ApiError> {
        match self.max_tokens.or(self.n_predict) {
            None => Ok(defaults.max_tokens.unwrap_or(usize::MAX)),
            Some(-1) => Ok(usize::MAX),
            Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(n as usize),
            Some(n) => Err(ApiError::bad_request(format!(
                "max_tokens must be between 1 and {MAX_TOKENS_LIMIT}, not {n}"
            ))),
        }
    }

    fn choices(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_CHOICES).contains(&n) => Ok(n as usize),
            Some(n) => Err(ApiError::bad_request(format!(
                "n must be between 1 and {MAX_CHOICES}, not {n} (each choice is a full generation)"
            ))),
        }
    }

    /// Alternatives per token to report (`Some(0)`: only the chosen token's), `None`: none.
    fn logprobs(&self, dialect: Dialect) -> Result<Option<usize>, ApiError> {
        let count = |field: &str, n: i64| {
            usize::try_from(n)
                .ok()
                .filter(|&n| n as i64 <= MAX_TOP_LOGPROBS)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "{field} must be between 0 and {MAX_TOP_LOGPROBS}, not {n}"
                    ))
                })
        };
        let n_probs = match self.n_probs {
            Some(n) if n != 0 => Some(count("n_probs", n)?),
            _ => None,
        };
        let asked = match (dialect, &self.logprobs) {
            (_, None | Some(Value::Null)) => None,
            (Dialect::Chat, Some(Value::Bool(false))) => None,
            (Dialect::Chat, Some(Value::Bool(true))) => {
                Some(count("top_logprobs", self.top_logprobs.unwrap_or(0))?)
            }
            (Dialect::Chat, Some(_)) => {
                return Err(ApiError::bad_request(
                    "logprobs must be true or false (the number of alternatives is top_logprobs)",
                ));
            }
            (_, Some(v)) => match v.as_i64() {
                Some(n) => Some(count("logprobs", n)?),
                None => {
                    return Err(ApiError::bad_request(
                        "logprobs must be a number of alternatives (0 to 20)",
                    ));
                }
            },
        };
        if dialect == Dialect::Chat && asked.is_none() && self.top_logprobs.is_some_and(|n| n > 0) {
            return Err(ApiError::bad_request("top_logprobs needs logprobs: true"));
        }
        Ok(asked.or(n_probs))
    }

    fn logit_bias(&self, tokenizer: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
        let vocab = tokenizer.vocab_size();
        let id = |key: &str, n: Option<u64>| {
            n.filter(|&id| id < vocab as u64)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "logit_bias: {key} is not a token id (0 to {})",
                        vocab.saturating_sub(1)
                    ))
                })
        };
        let bias = |key: &str, v: &Value| match v {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            // Beyond ±MAX_BIAS a bias only forces or bans; clamped there (as f32, 1e308
            // would be +inf and break every probability computed from the logits).
            v => v
                .as_f64()
                .filter(|b| b.is_finite())
                .map(|b| b.clamp(-MAX_BIAS, MAX_BIAS) as f32)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "logit_bias: the bias of {key} must be a number (or false to ban it)"
                    ))
                }),
        };
        // A text biases every token it is made of, as llama.cpp does; the texts are bounded
        // before any is tokenized.
        let texts: usize = match &self.logit_bias {
            Some(Value::Object(map)) => map.keys().map(String::len).sum(),
            Some(Value::Array(entries)) => entries
                .iter()
                .filter_map(|e| e.get(0).and_then(Value::as_str))
                .map(str::len)
                .sum(),
            _ => 0,
        };
        if texts > MAX_LOGIT_BIAS_TEXT {
            return Err(ApiError::bad_request(format!(
                "logit_bias names {texts} bytes of text; at most {MAX_LOGIT_BIAS_TEXT} are taken"
            )));
        }
        let text_tokens = |text: &str| -> Vec<u32> {
            tokenizer
                .encode(text, false)
                .into_iter()
                .filter(|&t| Some(t) != tokenizer.bos_id())
                .collect()
        };
        let mut out = Vec::new();
        match &self.logit_bias {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (key, value) in map {
                    let b = bias(key, value)?;
                    match key.parse::<i64>() {
                        Ok(n) => out.push((id(key, u64::try_from(n).ok())?, b)),
                        Err(_) => out.extend(text_tokens(key).into_iter().map(|t| (t, b))),
                    }
                }
            }
            Some(Value::Array(entries)) => {
                for (i, entry) in entries.iter().enumerate() {
                    let (Some(target), Some(value)) = (entry.get(0), entry.get(1)) else {
                        return Err(ApiError::bad_request(format!(
                            "logit_bias[{i}] must be [token id or text, bias]"
                        )));
                    };
                    let b = bias(&format!("logit_bias[{i}]"), value)?;
                    match target {
                        Value::String(text) => {
                            out.extend(text_tokens(text).into_iter().map(|t| (t, b)))
                        }
                        other => out.push((id(&other.to_string(), other.as_u64())?, b)),
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::bad_request(
                    "logit_bias must be an object {\"token id\": bias} or a list of [token, bias]",
                ));
            }
        }
        if out.len() > MAX_LOGIT_BIAS {
            return Err(ApiError::bad_request(format!(
                "logit_bias holds {} entries; at most {MAX_LOGIT_BIAS} are accepted",
                out.len()
            )));
        }
        Ok(out)
    }

    /// The grammar the output must follow: `response_format`, else llama.cpp's `json_schema`
    /// or `grammar`.
    fn grammar(&self) -> Result<Option<Arc<Grammar>>, ApiError> {
        let schema_error = |e: String| ApiError::bad_request(e);
        let from_format = match &self.response_format {
            None | Some(Value::Null) => None,
            Some(format) => match format.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => Some(match format.get("schema") {
                    Some(schema) => Grammar::from_json_schema(schema).map_err(schema_error)?,
                    None => Grammar::json_object(),
                }),
                Some("json_schema") => {
                    let schema = format
                        .get("json_schema")
                        .and_then(|j| j.get("schema"))
                        .or_else(|| format.get("schema"))
                        .ok_or_else(|| {
                            ApiError::bad_request(
                                "response_format of type json_schema needs json_schema.schema",
                            )
                        })?;
                    Some(Grammar::from_json_schema(schema).map_err(schema_error)?)
                }
                _ => {
                    return Err(ApiError::bad_request(
                        "response_format.type must be text, json_object or json_schema",
                    ));
                }
            },
        };
        let given = [
            from_format.is_some(),
            self.json_schema.as_ref().is_some_and(|v| !v.is_null()),
            self.grammar.as_ref().is_some_and(|g| !g.is_empty()),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(ApiError::bad_request(
                "give one of response_format, json_schema and grammar",
            ));
        }
        let grammar = match (from_format, &self.json_schema, &self.grammar) {
            (Some(g), _, _) => Some(g),
            (None, Some(schema), _) if !schema.is_null() => {
                Some(Grammar::from_json_schema(schema).map_err(schema_error)?)
            }
            (None, _, Some(text)) if !text.is_empty() => {
                Some(Grammar::from_gbnf(text).map_err(schema_error)?)
            }
            _ => None,
        };
        let Some(grammar) = grammar.map(Arc::new) else {
            return Ok(None);
        };
        // A grammar whose very start outgrows the matcher's bounds could never be followed:
        // the client hears so now, not as a failed generation.
        let start = crate::grammar::Matcher::new(Arc::clone(&grammar));
        if !start.can_continue() && !start.is_complete() {
            return Err(ApiError::bad_request(format!(
                "the grammar is too ambiguous to follow: at its start more than {} alternatives \
                 are alive at once, or one byte takes more than {} expansion steps (make its \
                 alternatives differ sooner)",
                crate::grammar::MAX_STACKS,
                crate::grammar::MAX_STEPS
            )));
        }
        Ok(Some(grammar))
    }

    /// Sampler settings: the server's defaults, then llama.cpp server's, where the request is
    /// silent.
    fn sampling(&self, defaults: &Defaults) -> Result<Sampling, ApiError> {
        let mut s = Sampling {
            temperature: defaults.temperature,
            top_p: defaults.top_p,
            top_k: defaults.top_k,
            min_p: defaults.min_p,
            ..Sampling::default()
        };
        let in_range = |field: &str, v: f32, range: std::ops::RangeInclusive<f32>| {
            if range.contains(&v) {
                Ok(v)
            } else {
                Err(ApiError::bad_request(format!(
                    "{field} must be in {}..={}, not {v}",
                    range.start(),
                    range.end()
                )))
            }
        };
        if let Some(t) = self.temperature {
            s.temperature = in_range("temperature", t, 0.0..=100.0)?;
        }
        if let Some(p) = self.top_p {
            s.top_p = in_range("top_p", p, 0.0..=1.0)?;
        }
        if let Some(p) = self.min_p {
            s.min_p = in_range("min_p", p, 0.0..=1.0)?;
        }
        if let Some(p) = self.presence_penalty {
            s.presence_penalty = in_range("presence_penalty", p, -2.0..=2.0)?;
        }
        if let Some(p) = self.frequency_penalty {
            s.frequency_penalty = in_range("frequency_penalty", p, -2.0..=2.0)?;
        }
        if let Some(k) = self.top_k {
            s.top_k = usize::try_from(k)
                .map_err(|_| ApiError::bad_request(format!("top_k must be ≥ 0, not {k}")))?;
        }
        if let Some(r) = self.repeat_penalty {
            if !(r > 0.0 && r.is_finite()) {
                return Err(ApiError::bad_request(format!(
                    "repeat_penalty must be > 0, not {r}"
                )));
            }
            s.repeat_penalty = r;
        }
        if let Some(n) = self.repeat_last_n {
            s.repeat_last_n = match n {
                -1 => usize::MAX,
                n => usize::try_from(n).map_err(|_| {
                    ApiError::bad_request(format!("repeat_last_n must be ≥ −1, not {n}"))
                })?,
            };
        }
        s.seed = match self.seed {
            Some(seed) if seed >= 0 => seed as u64,
            Some(-1) | None => defaults.seed.unwrap_or_else(fresh_seed),
            Some(seed) => {
                return Err(ApiError::bad_request(format!(
                    "seed must be ≥ 0 (or −1 for a fresh one), not {seed}"
                )));
            }
        };
        Ok(s)
    }

    /// The stop strings (at most [`MAX_STOPS`], each at most [`MAX_STOP_BYTES`]).
    fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS || stops.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::bad_request(format!(
                "stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_BYTES} bytes"
            )));
        }
        Ok(stops)
    }
}

/// A seed no other request shares, so "regenerate" regenerates.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Most messages in one chat: more than any context holds (each renders to a few tokens at
/// least), few enough that a template never spends long on them.
pub const MAX_MESSAGES: usize = 2048;

/// Longest role (`system`, `user`, `assistant`, `tool`, … are all far shorter).
pub const MAX_ROLE_BYTES: usize = 64;

/// The messages as the chat template takes them (assistants' calls and tools' results
/// included); a 400 for an empty or oversized chat, an oversized role, non-text parts or
/// malformed calls, before any work is done on them.
pub fn messages(sent: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if sent.is_empty() {
        return Err(ApiError::bad_request(
            "messages must hold at least one message",
        ));
    }
    if sent.len() > MAX_MESSAGES {
        return Err(ApiError::bad_request(format!(
            "messages holds {} messages; at most {MAX_MESSAGES} are accepted (start a new chat)",
            sent.len()
        )));
    }
    if let Some((i, m)) = sent
        .iter()
        .enumerate()
        .find(|(_, m)| m.role.len() > MAX_ROLE_BYTES || m.role.is_empty())
    {
        return Err(ApiError::bad_request(format!(
            "messages[{i}].role must be 1 to {MAX_ROLE_BYTES} bytes (system, user, assistant, …), not {} bytes",
            m.role.len()
        )));
    }
    if let [.., a, b] = sent
        && a.role == "assistant"
        && b.role == "assistant"
    {
        return Err(ApiError::bad_request(format!(
            "messages[{}] and messages[{}] are both assistant messages at the end: only the last \
             message can be continued (join them into one)",
            sent.len() - 2,
            sent.len() - 1
        )));
    }
    sent.iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}]: content parts of type {kind:?} are not supported (the model takes text only)"
                                )));
                            }
                        }
                    }
                    text
                }
            };
            // OpenAI's newer name for the system role, which chat templates do not know; the
            // legacy `function` role is a tool's result.
            let role = match m.role.as_str() {
                "developer" => "system",
                "function" => "tool",
                other => other,
            };
            let mut message = Message::new(role, &content);
            message.tool_calls = message_calls(&m.extra, i)?;
            message.tool_call_id = text_field(&m.extra, "tool_call_id", i)?;
            message.name = text_field(&m.extra, "name", i)?;
            Ok(message)
        })
        .collect()
}

/// Most calls one past assistant message may carry.
pub const MAX_MESSAGE_CALLS: usize = 128;

/// A message's `tool_calls` (or legacy `function_call`) as templates take them: each
/// `{"id", "type": "function", "function": {"name", "arguments"}}`, the arguments an object
/// where their JSON text is one.
fn message_calls(extra: &Map<String, Value>, i: usize) -> Result<Option<Vec<Value>>, ApiError> {
    let listed: Vec<Value> = match (extra.get("tool_calls"), extra.get("function_call")) {
        (Some(Value::Array(calls)), _) if !calls.is_empty() => calls.clone(),
        (None | Some(Value::Null), Some(call @ Value::Object(_))) => {
            vec![serde_json::json!({ "type": "function", "function": call })]
        }
        (None | Some(Value::Null), None | Some(Value::Null)) => return Ok(None),
        (Some(Value::Array(_)), _) => return Ok(None),
        _ => {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].tool_calls must be a list of calls"
            )));
        }
    };
    if listed.len() > MAX_MESSAGE_CALLS {
        return Err(ApiError::bad_request(format!(
            "messages[{i}].tool_calls holds {} calls; at most {MAX_MESSAGE_CALLS} are accepted",
            listed.len()
        )));
    }
    let mut calls = Vec::with_capacity(listed.len());
    for (k, call) in listed.into_iter().enumerate() {
        let at = format!("messages[{i}].tool_calls[{k}]");
        let function = call
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| ApiError::bad_request(format!("{at}.function must be an object")))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request(format!("{at}.function.name must be a string")))?;
        let arguments = match function.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(object @ Value::Object(_)) => object,
                _ => Value::String(text.clone()),
            },
            Some(other) => other.clone(),
        };
        let mut out = serde_json::json!({
            "type": "function",
            "function": { "name": name, "arguments": arguments },
        });
        if let Some(id) = call.get("id").filter(|v| !v.is_null()) {
            let id = id
                .as_str()
                .ok_or_else(|| ApiError::bad_request(format!("{at}.id must be a string")))?;
            out["id"] = Value::String(id.to_string());
        }
        calls.push(out);
    }
    Ok(Some(calls))
}

/// A message's optional text field.
fn text_field(
    extra: &Map<String, Value>,
    field: &str,
    i: usize,
) -> Result<Option<String>, ApiError> {
    match extra.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(format!(
            "messages[{i}].{field} must be a string"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompts_come_as_text_ids_or_a_mix_and_several_are_refused() {
        assert_eq!(
            prompt(&json!("hi"), 10).expect("text"),
            vec![PromptPiece::Text("hi".into())]
        );
        assert_eq!(
            prompt(&json!([1, "x", 2]), 10).expect("mix"),
            vec![
                PromptPiece::Id(1),
                PromptPiece::Text("x".into()),
                PromptPiece::Id(2)
            ]
        );
        assert_eq!(
            prompt(&json!([[3, 4]]), 10).expect("nested"),
            vec![PromptPiece::Id(3), PromptPiece::Id(4)]
        );
        assert!(prompt(&json!(["a", "b"]), 10).is_err());
        assert!(
            prompt(&json!([10]), 10).is_err(),
            "id out of the vocabulary"
        );
        assert!(prompt(&json!([-1]), 10).is_err());
        assert!(prompt(&json!(""), 10).is_err());
        assert!(prompt(&json!({"a": 1}), 10).is_err());
    }

    #[test]
    fn unsupported_fields_are_named_and_harmless_values_pass() {
        let knobs = |body: Value| serde_json::from_value::<Knobs>(body).expect("knobs");
        let refused = knobs(json!({"tools": [{"type": "function"}]}))
            .refuse_unsupported(Dialect::Completions)
            .expect_err("tools");
        assert!(
            refused.body()["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("`tools`"))
        );
        for harmless in [
            json!({"tools": []}),
            json!({"tool_choice": "none"}),
            json!({"echo": false}),
            json!({"best_of": 1}),
            json!({"user": "anyone", "cache_prompt": true}),
        ] {
            knobs(harmless.clone())
                .refuse_unsupported(Dialect::Chat)
                .unwrap_or_else(|e| panic!("{harmless}: {e:?}"));
        }
        // A suffix is a gap to fill on /v1/completions only.
        let suffix = knobs(json!({"suffix": "}"}));
        assert!(suffix.refuse_unsupported(Dialect::Completions).is_ok());
        assert!(suffix.refuse_unsupported(Dialect::Native).is_err());
        assert!(suffix.refuse_unsupported(Dialect::Chat).is_err());
    }

    #[test]
    fn logprobs_mean_what_each_dialect_says() {
        let knobs = |body: Value| serde_json::from_value::<Knobs>(body).expect("knobs");
        let chat = knobs(json!({"logprobs": true, "top_logprobs": 3}));
        assert_eq!(chat.logprobs(Dialect::Chat).expect("chat"), Some(3));
        assert!(
            knobs(json!({"top_logprobs": 3}))
                .logprobs(Dialect::Chat)
                .is_err()
        );
        assert_eq!(
            knobs(json!({"logprobs": 2}))
                .logprobs(Dialect::Completions)
                .expect("completions"),
            Some(2)
        );
        assert_eq!(
            knobs(json!({"n_probs": 5}))
                .logprobs(Dialect::Native)
                .expect("native"),
            Some(5)
        );
        assert!(
            knobs(json!({"logprobs": 99}))
                .logprobs(Dialect::Completions)
                .is_err()
        );
        assert_eq!(
            knobs(json!({})).logprobs(Dialect::Chat).expect("none"),
            None
        );
    }
}
