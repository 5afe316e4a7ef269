//! A vocabulary's fill-in-the-middle tokens: the ids the file names
//! (`tokenizer.ggml.fim_pre_token_id`, …), else the tokens whose text is one of the spellings
//! model families use, as llama.cpp finds them.

use std::collections::HashMap;

/// The tokens that lay out a fill-in-the-middle prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fim {
    /// Before the text ahead of the gap (`<|fim_prefix|>`).
    pub prefix: u32,
    /// Before the text after the gap (`<|fim_suffix|>`).
    pub suffix: u32,
    /// Where the gap's text begins (`<|fim_middle|>`).
    pub middle: u32,
    /// Before a repository's name (`<|repo_name|>`), for context from several files.
    pub repo: Option<u32>,
    /// Before each file's name (`<|file_sep|>`).
    pub file_sep: Option<u32>,
}

const PREFIX: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const SUFFIX: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const MIDDLE: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const REPO: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FILE_SEP: &[&str] = &["<|file_sep|>"];

impl Fim {
    /// The vocabulary's FIM tokens: `named(key)` reads `tokenizer.ggml.<key>_token_id`, `ids`
    /// maps token texts to ids. `None` unless prefix, suffix and middle are all there.
    pub fn find(named: impl Fn(&str) -> Option<u32>, ids: &HashMap<String, u32>) -> Option<Fim> {
        let token = |key: &str, spellings: &[&str]| {
            named(key).or_else(|| spellings.iter().find_map(|s| ids.get(*s).copied()))
        };
        Some(Fim {
            prefix: token("fim_pre", PREFIX)?,
            suffix: token("fim_suf", SUFFIX)?,
            middle: token("fim_mid", MIDDLE)?,
            repo: token("fim_rep", REPO),
            file_sep: token("fim_sep", FILE_SEP),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(texts: &[&str]) -> HashMap<String, u32> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect()
    }

    #[test]
    fn found_by_spelling_or_by_the_file_s_keys_and_only_whole() {
        let qwen = ids(&[
            "a",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|repo_name|>",
            "<|file_sep|>",
        ]);
        assert_eq!(
            Fim::find(|_| None, &qwen),
            Some(Fim {
                prefix: 1,
                suffix: 3,
                middle: 2,
                repo: Some(4),
                file_sep: Some(5)
            })
        );
        let codellama = ids(&["▁<PRE>", "▁<SUF>", "▁<MID>"]);
        assert_eq!(
            Fim::find(|_| None, &codellama),
            Some(Fim {
                prefix: 0,
                suffix: 1,
                middle: 2,
                repo: None,
                file_sep: None
            })
        );
        // The file's keys come first.
        let named = |key: &str| match key {
            "fim_pre" => Some(10),
            "fim_suf" => Some(11),
            "fim_mid" => Some(12),
            _ => None,
        };
        assert_eq!(Fim::find(named, &qwen).map(|f| f.prefix), Some(10));
        // A repository token alone (SmolLM2's `<reponame>`) is no FIM vocabulary.
        assert_eq!(
            Fim::find(|_| None, &ids(&["<reponame>", "<file_sep>"])),
            None
        );
    }
}
