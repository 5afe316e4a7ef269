//! Tokenizers built from GGUF metadata: byte-level BPE (`tokenizer.ggml.model = gpt2`, with the
//! `smollm`, `gpt-2` and default pre-tokenizers) and SentencePiece-style (`llama`, Gemma), with
//! special tokens recognised in templated prompts.

mod bpe;
mod spm;
mod stream;

use std::collections::HashMap;

use gguf::arrays;

pub use bpe::Bpe;
pub use spm::Spm;
pub use stream::TextStream;

/// Merges adjacent symbols while any pair has a priority, highest priority first and the
/// leftmost pair on ties (how both BPE and SentencePiece merge).
fn merge_pairs(symbols: &mut Vec<String>, priority: impl Fn(&str, &str) -> Option<f64>) {
    loop {
        let mut best: Option<(f64, usize)> = None;
        for i in 0..symbols.len().saturating_sub(1) {
            if let Some(p) = priority(&symbols[i], &symbols[i + 1]) {
                if best.is_none_or(|(q, _)| p > q) {
                    best = Some((p, i));
                }
            }
        }
        let Some((_, i)) = best else { return };
        let right = symbols.remove(i + 1);
        symbols[i].push_str(&right);
    }
}

/// The algorithm a vocabulary uses.
enum Algorithm {
    Bpe(Bpe),
    Spm(Spm),
}

use crate::model_file::ModelFile;

/// A tokenizer loaded from a model file.
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// Tokens matched verbatim in the text, longest first: user-defined ones always (as
    /// llama.cpp does), control ones only when `special` is on. The flag marks control tokens.
    specials: Vec<(String, u32, bool)>,
    algorithm: Algorithm,
    add_bos: Option<u32>,
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
        let mut specials: Vec<(String, u32, bool)> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, ty))| **ty == CONTROL || **ty == USER_DEFINED)
            .map(|(i, (t, ty))| (t.clone(), i as u32, *ty == CONTROL))
            .filter(|(t, _, _)| !t.is_empty())
            .collect();
        specials.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        let add_bos = match (
            h.get("tokenizer.ggml.add_bos_token"),
            h.get("tokenizer.ggml.bos_token_id"),
        ) {
            (Some(gguf::Value::Bool(true)), Some(v)) => v.as_u64().map(|b| b as u32),
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
            other => {
                return Err(format!(
                    "tokenizer model {other} is not supported (gpt2, llama)"
                ));
            }
        };
        Ok(Tokenizer {
            tokens,
            ids,
            specials,
            algorithm,
            add_bos,
        })
    }

    /// Token ids of `text`; with `special`, control tokens written in the text become their ids
    /// (user-defined tokens always do).
    pub fn encode(&self, text: &str, special: bool) -> Vec<u32> {
        let mut out: Vec<u32> = self.add_bos.into_iter().collect();
        let mut rest = text;
        while !rest.is_empty() {
            let next = self
                .specials
                .iter()
                .filter(|(_, _, control)| special || !control)
                .filter_map(|(s, id, _)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
                .min_by_key(|&(at, len, _)| (at, usize::MAX - len));
            let (plain, tail) = match next {
                Some((at, len, id)) => {
                    let (plain, after) = rest.split_at(at);
                    self.encode_plain(plain, &mut out);
                    out.push(id);
                    ("", &after[len..])
                }
                None => (rest, ""),
            };
            self.encode_plain(plain, &mut out);
            rest = tail;
        }
        out
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        match &self.algorithm {
            Algorithm::Bpe(bpe) => bpe.encode(text, &self.ids, out),
            Algorithm::Spm(spm) => spm.encode(text, &self.ids, out),
        }
    }

    /// End-of-generation ids: EOS and EOT when the model names them, and (as llama.cpp does)
    /// the special tokens that end a turn in the common chat formats, for files that do not
    /// name their end-of-turn token.
    pub fn end_ids(&self, file: &ModelFile) -> Vec<u32> {
        const END_OF_TURN: [&str; 6] = [
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
            Algorithm::Spm(_) => spm::token_bytes(token),
        }
    }
}
