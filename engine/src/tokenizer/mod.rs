//! Tokenizers built from GGUF metadata: byte-level BPE (`tokenizer.ggml.model = gpt2`, with the
//! `smollm`, `gpt-2` and default pre-tokenizers), SentencePiece-style (`llama`, Gemma 3) and
//! Gemma 4's BPE over raw UTF-8 with `▁` for spaces (`gemma4`), with special tokens recognised in
//! templated prompts.

mod bpe;
mod fim;
mod merge;
mod metaspace;
mod protect;
mod spm;
mod stream;

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use aho_corasick::{AhoCorasick, MatchKind};
use gguf::arrays;

pub use bpe::Bpe;
pub use fim::Fim;
pub use metaspace::MetaspaceBpe;
pub use spm::Spm;
pub use stream::TextStream;

/// Why tokenizing stopped before the end of the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The text holds more than the budget's tokens.
    TooLong {
        /// The budget that was exceeded.
        max_tokens: usize,
    },
    /// The caller no longer wants the answer (its client went away).
    Cancelled,
}

/// Limits on one tokenization, checked as it goes: a text far longer than the context is
/// refused after `max_tokens`, not after all of it.
pub struct Budget<'a> {
    /// Tokens at most.
    pub max_tokens: usize,
    /// Asked between pieces; `true` stops the work.
    pub cancelled: &'a dyn Fn() -> bool,
}

impl Budget<'_> {
    /// No limit: nothing stops the work.
    pub const UNLIMITED: Budget<'static> = Budget {
        max_tokens: usize::MAX,
        cancelled: &|| false,
    };

    fn check(&self, tokens: usize) -> Result<(), Stopped> {
        if tokens > self.max_tokens {
            return Err(Stopped::TooLong {
                max_tokens: self.max_tokens,
            });
        }
        if (self.cancelled)() {
            return Err(Stopped::Cancelled);
        }
        Ok(())
    }
}

/// Some of the special tokens, found leftmost and then longest first (as llama.cpp partitions
/// a text), in one pass over the text however many there are.
struct SpecialSet {
    automaton: AhoCorasick,
    /// Pattern i is `specials[index[i]]`.
    index: Vec<usize>,
}

impl SpecialSet {
    fn new(specials: &[(String, u32, bool)], keep: fn(bool) -> bool) -> Result<SpecialSet, String> {
        let index: Vec<usize> = (0..specials.len())
            .filter(|&i| keep(specials[i].2))
            .collect();
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(index.iter().map(|&i| specials[i].0.as_str()))
            .map_err(|e| format!("special tokens: {e}"))?;
        Ok(SpecialSet { automaton, index })
    }
}

/// The algorithm a vocabulary uses.
enum Algorithm {
    Bpe(Bpe),
    Spm(Spm),
    /// Gemma 4's BPE over raw UTF-8 with `▁` for spaces.
    Metaspace(MetaspaceBpe),
}

use crate::model_file::ModelFile;

/// A tokenizer loaded from a model file.
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// Special tokens: text, id and whether it is a control token. User-defined ones are
    /// matched verbatim in every text (as llama.cpp does), control ones only when asked.
    specials: Vec<(String, u32, bool)>,
    /// Finds every special token.
    all_specials: SpecialSet,
    /// User-defined tokens only.
    user_specials: SpecialSet,
    /// Control tokens only: what a chat message's text is protected from.
    control_specials: SpecialSet,
    algorithm: Algorithm,
    add_bos: Option<u32>,
    fim: Option<Fim>,
}

const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

impl Tokenizer {
    /// Reads the vocabulary, merges and token types from the model's metadata.
    pub fn load(file: &ModelFile) -> Result<Tokenizer, String> {
        let h = file.header();
        let entry = |k: &str| h.entry(k).ok_or_else(|| format!("{k} is missing"));
        let kind = match h.get("tokenizer.ggml.model") {
            Some(gguf::Value::String(s)) => s.clone(),
            _ => return Err("tokenizer.ggml.model is missing".into()),
        };
        let pre = match h.get("tokenizer.ggml.pre") {
            Some(gguf::Value::String(s)) => s.clone(),
            _ => "default".to_string(),
        };
        let bytes = file.bytes();
        let tokens: Vec<String> = arrays::strings(bytes, entry("tokenizer.ggml.tokens")?)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(str::to_string)
            .collect();
        let types = match h.entry("tokenizer.ggml.token_type") {
            Some(kv) => arrays::i32s(bytes, kv).map_err(|e| e.to_string())?,
            None => vec![1; tokens.len()],
        };
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let specials: Vec<(String, u32, bool)> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, ty))| **ty == CONTROL || **ty == USER_DEFINED)
            .map(|(i, (t, ty))| (t.clone(), i as u32, *ty == CONTROL))
            .filter(|(t, _, _)| !t.is_empty())
            .collect();
        let all_specials = SpecialSet::new(&specials, |_| true)?;
        let user_specials = SpecialSet::new(&specials, |control| !control)?;
        let control_specials = SpecialSet::new(&specials, |control| control)?;
        let add_bos = match (
            h.get("tokenizer.ggml.add_bos_token"),
            h.get("tokenizer.ggml.bos_token_id"),
        ) {
            (Some(gguf::Value::Bool(true)), Some(v)) => v.as_u64().map(|b| b as u32),
            // llama.cpp always adds Gemma 4's BOS (whatever the file says).
            (_, Some(v)) if kind == "gemma4" => v.as_u64().map(|b| b as u32),
            _ => None,
        };
        let algorithm = match kind.as_str() {
            "gpt2" => {
                let merges = arrays::strings(bytes, entry("tokenizer.ggml.merges")?)
                    .map_err(|e| e.to_string())?;
                Algorithm::Bpe(Bpe::new(&pre, &merges)?)
            }
            "llama" => {
                let scores = arrays::f32s(bytes, entry("tokenizer.ggml.scores")?)
                    .map_err(|e| e.to_string())?;
                let add_space_prefix = !matches!(
                    h.get("tokenizer.ggml.add_space_prefix"),
                    Some(gguf::Value::Bool(false))
                );
                Algorithm::Spm(Spm::new(&tokens, scores, add_space_prefix))
            }
            "gemma4" => {
                let merges = arrays::strings(bytes, entry("tokenizer.ggml.merges")?)
                    .map_err(|e| e.to_string())?;
                Algorithm::Metaspace(MetaspaceBpe::new(&tokens, &merges)?)
            }
            other => {
                return Err(format!(
                    "tokenizer model {other} is not supported (gpt2, llama, gemma4)"
                ));
            }
        };
        let fim = Fim::find(
            |key| {
                h.get(&format!("tokenizer.ggml.{key}_token_id"))
                    .and_then(gguf::Value::as_u64)
                    .and_then(|id| u32::try_from(id).ok())
                    .filter(|&id| (id as usize) < tokens.len())
            },
            &ids,
        );
        Ok(Tokenizer {
            fim,
            tokens,
            ids,
            specials,
            all_specials,
            user_specials,
            control_specials,
            algorithm,
            add_bos,
        })
    }

    /// Token ids of `text`; with `special`, control tokens written in the text become their ids
    /// (user-defined tokens always do).
    pub fn encode(&self, text: &str, special: bool) -> Vec<u32> {
        // Without a budget nothing can stop it.
        self.encode_within(text, special, &Budget::UNLIMITED)
            .unwrap_or_default()
    }

    /// [`Tokenizer::encode`] within `budget`.
    pub fn encode_within(
        &self,
        text: &str,
        special: bool,
        budget: &Budget<'_>,
    ) -> Result<Vec<u32>, Stopped> {
        self.encode_parts(text, special, &[], budget)
    }

    /// A chat message's `text` made safe to render into a template: control-token texts in it
    /// stay text when the rendering is read by [`Tokenizer::encode_rendered`].
    pub fn protect<'t>(&self, text: &'t str) -> Cow<'t, str> {
        protect::wrap(text, &self.control_specials.automaton)
    }

    /// Token ids of a rendered chat template: its control tokens recognised, except inside
    /// what [`Tokenizer::protect`] wrapped, which is tokenized as the plain text it is.
    pub fn encode_rendered(
        &self,
        rendered: &str,
        budget: &Budget<'_>,
    ) -> Result<Vec<u32>, Stopped> {
        let (text, protected) = protect::unwrap(rendered);
        self.encode_parts(&text, true, &protected, budget)
    }

    /// Splits `text` at special tokens (none starting or ending inside a `protected` range,
    /// unless it is a user-defined token wholly inside one) and encodes the text between them.
    fn encode_parts(
        &self,
        text: &str,
        special: bool,
        protected: &[Range<usize>],
        budget: &Budget<'_>,
    ) -> Result<Vec<u32>, Stopped> {
        let automaton = if special {
            &self.all_specials
        } else {
            &self.user_specials
        };
        let mut out: Vec<u32> = self.add_bos.into_iter().collect();
        let (mut plain_from, mut search_from) = (0, 0);
        while search_from < text.len() {
            let input = aho_corasick::Input::new(text).span(search_from..text.len());
            let Some(m) = automaton.automaton.find(input) else {
                break;
            };
            let (_, id, control) = &self.specials[automaton.index[m.pattern().as_usize()]];
            if !honoured(m.range(), *control, protected) {
                // Look again from the next character: a shorter token may start there.
                search_from =
                    m.start() + text[m.start()..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            self.encode_plain(&text[plain_from..m.start()], &mut out, budget)?;
            out.push(*id);
            budget.check(out.len())?;
            (plain_from, search_from) = (m.end(), m.end());
        }
        self.encode_plain(&text[plain_from..], &mut out, budget)?;
        Ok(out)
    }

    fn encode_plain(
        &self,
        text: &str,
        out: &mut Vec<u32>,
        budget: &Budget<'_>,
    ) -> Result<(), Stopped> {
        if text.is_empty() {
            return Ok(());
        }
        match &self.algorithm {
            Algorithm::Bpe(bpe) => {
                for piece in bpe.pre_tokenize(text) {
                    bpe.encode_piece(piece, &self.ids, out);
                    budget.check(out.len())?;
                }
            }
            Algorithm::Spm(spm) => {
                spm.encode(text, &self.ids, out);
                budget.check(out.len())?;
            }
            Algorithm::Metaspace(m) => {
                for run in MetaspaceBpe::runs(text) {
                    m.encode_run(&run, &self.ids, out);
                    budget.check(out.len())?;
                }
            }
        }
        Ok(())
    }

    /// End-of-generation ids: EOS and EOT when the model names them, and (as llama.cpp does)
    /// the special tokens that end a turn in the common chat formats, for files that do not
    /// name their end-of-turn token.
    pub fn end_ids(&self, file: &ModelFile) -> Vec<u32> {
        const END_OF_TURN: [&str; 8] = [
            "<turn|>",
            "<|tool_response>",
            "<|im_end|>",
            "<|eot_id|>",
            "<end_of_turn>",
            "<|end|>",
            "<|endoftext|>",
            "<|end_of_text|>",
        ];
        let mut ids: Vec<u32> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
            .iter()
            .filter_map(|k| file.header().get(k).and_then(gguf::Value::as_u64))
            .map(|v| v as u32)
            .collect();
        for (text, id, control) in &self.specials {
            if *control && END_OF_TURN.contains(&text.as_str()) && !ids.contains(id) {
                ids.push(*id);
            }
        }
        ids
    }

    /// The text of token ids: their bytes joined, then decoded (an incomplete UTF-8 tail is
    /// replaced, never split).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| self.token_bytes(id)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A token's vocabulary entry as written (special tokens are their literal text).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The BOS id [`Tokenizer::encode`] starts every text with, if it adds one.
    pub fn bos_id(&self) -> Option<u32> {
        self.add_bos
    }

    /// How many tokens the vocabulary holds (ids are below this).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The control tokens' ids (`<|im_end|>`, `<bos>`, …): never part of a text's bytes, so
    /// never allowed where output must follow a grammar.
    pub fn control_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.specials
            .iter()
            .filter(|(_, _, control)| *control)
            .map(|(_, id, _)| *id)
    }

    /// The vocabulary's fill-in-the-middle tokens, when it has them.
    pub fn fim(&self) -> Option<Fim> {
        self.fim
    }

    /// Whether [`Tokenizer::encode`] starts every text with the BOS token.
    pub fn adds_bos(&self) -> bool {
        self.add_bos.is_some()
    }

    /// The text of a token id, decoded from byte-level form to raw bytes.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(token) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        match self.algorithm {
            Algorithm::Bpe(_) => bpe::unmap_bytes(token),
            Algorithm::Spm(_) | Algorithm::Metaspace(_) => spm::token_bytes(token),
        }
    }
}

/// Whether a special-token match at `range` counts as the token: never when it touches text a
/// chat message brought, except a user-defined token (read in every text) wholly inside it.
fn honoured(range: Range<usize>, control: bool, protected: &[Range<usize>]) -> bool {
    // The first protected range that ends after the match starts is the only one to check
    // against its start; any later one that begins before the match ends overlaps too.
    let first = protected.partition_point(|p| p.end <= range.start);
    let Some(p) = protected.get(first) else {
        return true;
    };
    if p.start >= range.end {
        return true;
    }
    !control && p.start <= range.start && range.end <= p.end
}
