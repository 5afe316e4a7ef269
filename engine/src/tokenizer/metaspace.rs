//! BPE over raw UTF-8 with SentencePiece's space marker (`tokenizer.ggml.model = gemma4`), as
//! llama.cpp 11434 runs it (`src/llama-vocab.cpp`, `LLAMA_VOCAB_PRE_TYPE_GEMMA4`): spaces become
//! `▁`; the text is split into runs of newlines and runs of everything else; a run of newlines
//! that is a token is taken whole; otherwise a run's characters are merged by merge rank (lowest
//! first, leftmost on ties), and a symbol outside the vocabulary falls back to `<0xXX>` byte
//! tokens. No byte-level mapping, no word splitting.

use std::collections::HashMap;

use super::bpe::Ranks;
use super::spm::{SPACE, byte_fallback_ids};

/// A gemma4 tokenizer: merge ranks and the byte-fallback ids.
pub struct MetaspaceBpe {
    ranks: Ranks,
    byte_ids: Vec<Option<u32>>,
}

impl MetaspaceBpe {
    /// The tokenizer of a vocabulary and its merges (each `"left right"`, split at the first
    /// space after the first byte, as llama.cpp splits them).
    pub fn new(tokens: &[String], merges: &[&str]) -> Result<MetaspaceBpe, String> {
        let ranks = Ranks::new(merges, |m| {
            let (at, _) = m.char_indices().find(|&(i, c)| i >= 1 && c == ' ')?;
            Some((&m[..at], &m[at + 1..]))
        })?;
        Ok(MetaspaceBpe {
            ranks,
            byte_ids: byte_fallback_ids(tokens),
        })
    }

    /// `text` with spaces as `▁`, split into the runs that are tokenized one by one.
    pub fn runs(text: &str) -> Vec<String> {
        let escaped: String = text
            .chars()
            .map(|c| if c == ' ' { SPACE } else { c })
            .collect();
        let mut runs: Vec<String> = Vec::new();
        for c in escaped.chars() {
            match runs.last_mut() {
                Some(run) if run.ends_with('\n') == (c == '\n') => run.push(c),
                _ => runs.push(c.to_string()),
            }
        }
        runs
    }

    /// Appends the ids of one run (from [`MetaspaceBpe::runs`]) to `out`.
    pub fn encode_run(&self, run: &str, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if run.bytes().all(|b| b == b'\n')
            && let Some(&id) = ids.get(run)
        {
            out.push(id);
            return;
        }
        let symbols = super::merge::merge(run, |left, _, joined| self.ranks.priority(left, joined));
        for symbol in symbols {
            match ids.get(symbol) {
                Some(&id) => out.push(id),
                None => out.extend(symbol.bytes().filter_map(|b| self.byte_ids[usize::from(b)])),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_newlines_from_the_rest_with_spaces_escaped() {
        assert_eq!(
            MetaspaceBpe::runs("a b\n\ncd\n"),
            ["a▁b", "\n\n", "cd", "\n"]
        );
        assert_eq!(MetaspaceBpe::runs(" "), ["▁"]);
        assert!(MetaspaceBpe::runs("").is_empty());
    }

    #[test]
    fn merges_by_rank_with_byte_fallback() {
        let tokens: Vec<String> = ["a", "b", "ab", "▁", "▁ab", "\n\n", "<0xC3>", "<0xA9>"]
            .iter()
            .map(|t| t.to_string())
            .collect();
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let m = MetaspaceBpe::new(&tokens, &["a b", "▁ ab"]).expect("merges");
        let mut out = Vec::new();
        for run in MetaspaceBpe::runs(" ab\n\né") {
            m.encode_run(&run, &ids, &mut out);
        }
        // "▁ab" by two merges, the newline run whole, "é" as its two bytes.
        assert_eq!(out, [4, 5, 6, 7]);
        assert!(MetaspaceBpe::new(&tokens, &["nospace"]).is_err());
    }
}
