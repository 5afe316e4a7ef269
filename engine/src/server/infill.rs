//! Fill-in-the-middle: llama.cpp's `/infill` (what code editors' completion plugins send: the
//! text before and after the cursor, other files for context, and what is typed so far) and
//! `suffix` on `/v1/completions`. The prompt is laid out with the vocabulary's FIM tokens the
//! way llama.cpp lays it out (the repository-level pattern): the other files first, then the
//! prefix, what is typed, the suffix, and the middle token the answer follows.

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::request::{Generating, Knobs};
use crate::tokenizer::{Budget, Fim, Stopped, Tokenizer};

/// `POST /infill`.
#[derive(Debug, Deserialize)]
pub struct InfillRequest {
    /// The text before the gap (required).
    #[serde(default)]
    pub input_prefix: Option<Value>,
    /// The text after the gap (required).
    #[serde(default)]
    pub input_suffix: Option<Value>,
    /// Other files: `[{"filename": …, "text": …}]`.
    #[serde(default)]
    pub input_extra: Option<Value>,
    /// What is typed so far, right before the gap.
    #[serde(default)]
    pub prompt: Option<Value>,
    /// Everything else.
    #[serde(flatten)]
    pub knobs: Knobs,
}

impl Generating for InfillRequest {
    fn knobs(&self) -> &Knobs {
        &self.knobs
    }
}

/// A gap to fill, its fields checked.
#[derive(Debug, Clone, Default)]
pub struct Gap {
    /// The text before it.
    pub prefix: String,
    /// The text after it.
    pub suffix: String,
    /// Other files, as (name, text).
    pub extra: Vec<(String, String)>,
    /// What is typed right before it.
    pub prompt: String,
}

/// The most files one request may bring.
const MAX_EXTRA: usize = 256;

impl Gap {
    /// The gap an `/infill` request describes, or a 400 naming the field, as llama-server
    /// checks them.
    pub fn of(request: &InfillRequest) -> Result<Gap, ApiError> {
        let text = |value: &Option<Value>, field: &str, required: bool| match value {
            Some(Value::String(s)) => Ok(s.clone()),
            None if !required => Ok(String::new()),
            None => Err(ApiError::bad_request(format!("\"{field}\" is required"))),
            Some(_) => Err(ApiError::bad_request(format!(
                "\"{field}\" must be a string"
            ))),
        };
        let extra = match &request.input_extra {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(chunks)) if chunks.len() <= MAX_EXTRA => chunks
                .iter()
                .enumerate()
                .map(|(i, chunk)| {
                    let text = match chunk.get("text") {
                        Some(Value::String(t)) => t.clone(),
                        _ => {
                            return Err(ApiError::bad_request(format!(
                                "input_extra[{i}] must have a \"text\" field with a string value"
                            )));
                        }
                    };
                    let filename = match chunk.get("filename") {
                        None => "tmp".to_string(),
                        Some(Value::String(f)) => f.clone(),
                        Some(_) => {
                            return Err(ApiError::bad_request(format!(
                                "input_extra[{i}]'s \"filename\" must be a string"
                            )));
                        }
                    };
                    Ok((filename, text))
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Array(_)) => {
                return Err(ApiError::bad_request(format!(
                    "input_extra holds more than {MAX_EXTRA} files"
                )));
            }
            Some(_) => {
                return Err(ApiError::bad_request(
                    "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
                ));
            }
        };
        Ok(Gap {
            prefix: text(&request.input_prefix, "input_prefix", true)?,
            suffix: text(&request.input_suffix, "input_suffix", true)?,
            prompt: text(&request.prompt, "prompt", false)?,
            extra,
        })
    }

    /// Its text in bytes (what tokenizing it costs).
    pub fn bytes(&self) -> usize {
        let extra: usize = self.extra.iter().map(|(f, t)| f.len() + t.len()).sum();
        self.prefix.len() + self.suffix.len() + self.prompt.len() + extra
    }
}

/// What `/infill` answers a model whose vocabulary has no FIM tokens (llama-server's 501).
pub fn unsupported() -> ApiError {
    ApiError::not_supported(
        "Infill is not supported by this model: its vocabulary has no fill-in-the-middle \
         (prefix, suffix, middle) tokens; use a code model that has them",
    )
}

/// The prompt's ids: `[BOS] [files…] PRE prefix prompt SUF suffix MID`. As llama.cpp does, the
/// prefix keeps its last three quarters of a window and the suffix its first quarter less what
/// is typed; the files fill what the context has left beside the window and room for the
/// answer (`max_tokens`, at most a quarter of the context), keeping their end. llama.cpp's
/// window is its batch (2048), which leaves no room for files in a context of 2048 or less;
/// here it is half the context, at most 2048. Special-token texts in the files and around the
/// gap are taken as text, in what is typed as tokens (as llama.cpp does). BOS comes first
/// (llama.cpp puts the files before it).
pub fn layout(
    tokenizer: &Tokenizer,
    fim: Fim,
    gap: &Gap,
    context: usize,
    max_tokens: usize,
    budget: &Budget<'_>,
) -> Result<Vec<u32>, Stopped> {
    let bos = tokenizer.bos_id();
    let text = |s: &str| -> Result<Vec<u32>, Stopped> {
        let mut ids = tokenizer.encode_within(s, false, budget)?;
        if bos.is_some() && ids.first() == bos.as_ref() {
            ids.remove(0);
        }
        Ok(ids)
    };
    let mut files = Vec::new();
    if let Some(repo) = fim.repo {
        files.push(repo);
        files.extend(text("myproject\n")?);
    }
    for (name, body) in &gap.extra {
        match fim.file_sep {
            Some(sep) => {
                files.push(sep);
                files.extend(text(&format!("{name}\n"))?);
            }
            None => files.extend(text("\n\n--- snippet ---\n\n")?),
        }
        files.extend(text(body)?);
    }
    if let Some(sep) = fim.file_sep {
        files.push(sep);
        files.extend(text("filename\n")?);
    }
    let window = (context / 2).min(2048);
    // What is typed may hold special tokens' texts, as llama.cpp reads it.
    let typed = {
        let mut ids = tokenizer.encode_within(&gap.prompt, true, budget)?;
        if bos.is_some() && ids.first() == bos.as_ref() {
            ids.remove(0);
        }
        ids
    };
    let prefix = text(&gap.prefix)?;
    let suffix = text(&gap.suffix)?;
    let prefix_take = prefix.len().min(3 * (window / 4));
    let suffix_take = suffix
        .len()
        .min((window / 4).saturating_sub(2 + typed.len()));
    let answer_room = max_tokens.min(context / 4);
    // BOS and the three markers take their places too.
    let files_take = files.len().min(
        context
            .saturating_sub(window)
            .saturating_sub(answer_room)
            .saturating_sub(4),
    );
    let mut ids: Vec<u32> = bos.into_iter().collect();
    ids.extend_from_slice(&files[files.len() - files_take..]);
    ids.push(fim.prefix);
    ids.extend_from_slice(&prefix[prefix.len() - prefix_take..]);
    ids.extend_from_slice(&typed);
    ids.push(fim.suffix);
    ids.extend_from_slice(&suffix[..suffix_take]);
    ids.push(fim.middle);
    Ok(ids)
}
