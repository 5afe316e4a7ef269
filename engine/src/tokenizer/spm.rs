//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`, used by Gemma): spaces become
//! `▁`, characters are merged pairwise by the highest vocabulary score (leftmost on ties), and
//! characters outside the vocabulary fall back to `<0xXX>` byte tokens.

use std::collections::HashMap;

/// The SentencePiece space marker.
pub const SPACE: char = '\u{2581}';

/// An SPM model: token scores and the byte-fallback ids.
pub struct Spm {
    scores: Vec<f32>,
    byte_ids: Vec<Option<u32>>,
    add_space_prefix: bool,
}

impl Spm {
    /// A model from the vocabulary's scores; byte tokens are found by their `<0xXX>` names.
    pub fn new(tokens: &[String], scores: Vec<f32>, add_space_prefix: bool) -> Spm {
        Spm {
            scores,
            byte_ids: byte_fallback_ids(tokens),
            add_space_prefix,
        }
    }

    /// Appends the ids of `text` (no special tokens in it) to `out`.
    pub fn encode(&self, text: &str, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut normalized = String::with_capacity(text.len() + 3);
        if self.add_space_prefix {
            normalized.push(SPACE);
        }
        normalized.extend(text.chars().map(|c| if c == ' ' { SPACE } else { c }));
        // Highest vocabulary score first.
        let symbols = super::merge::merge(&normalized, |_, _, joined| {
            ids.get(joined)
                .map(|&id| f64::from(self.scores.get(id as usize).copied().unwrap_or(0.0)))
        });
        for symbol in symbols {
            match ids.get(symbol) {
                Some(&id) => out.push(id),
                None => out.extend(symbol.bytes().filter_map(|b| self.byte_ids[usize::from(b)])),
            }
        }
    }
}

/// The ids of the `<0xXX>` byte tokens, by byte.
pub fn byte_fallback_ids(tokens: &[String]) -> Vec<Option<u32>> {
    let mut byte_ids = vec![None; 256];
    for (id, t) in tokens.iter().enumerate() {
        if let Some(hex) = t.strip_prefix("<0x").and_then(|r| r.strip_suffix('>'))
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            byte_ids[usize::from(b)] = Some(id as u32);
        }
    }
    byte_ids
}

/// The raw bytes a token stands for: `▁` is a space, `<0xXX>` one byte.
pub fn token_bytes(token: &str) -> Vec<u8> {
    if let Some(hex) = token.strip_prefix("<0x").and_then(|r| r.strip_suffix('>'))
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        return vec![b];
    }
    token.replace(SPACE, " ").into_bytes()
}
