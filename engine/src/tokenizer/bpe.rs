//! Byte-level BPE (GPT-2 style): pre-tokenize with the model's regexes, map bytes to printable
//! characters, then merge adjacent symbols by merge rank, lowest first and leftmost on ties.

use std::collections::HashMap;

use fancy_regex::Regex;

/// GPT-2's pre-tokenizer pattern.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's pattern (also `llama-bpe`): case-insensitive contractions, numbers in runs of up to
/// three digits, letters with one leading non-letter.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 3.5's pattern: Qwen 2's with combining marks (`\p{M}`) kept in words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE model: pre-tokenizer regexes applied in sequence, and merge ranks.
pub struct Bpe {
    splits: Vec<Regex>,
    ranks: Ranks,
}

/// Merge ranks by the joined text, each with the byte length of its left part: a lookup
/// borrows the joined symbols straight from the text, allocating nothing.
pub struct Ranks(HashMap<String, Vec<(usize, usize)>>);

impl Ranks {
    /// The ranks of `merges` (`"left right"` each), split by `split`.
    pub fn new(
        merges: &[&str],
        split: impl Fn(&str) -> Option<(&str, &str)>,
    ) -> Result<Ranks, String> {
        let mut ranks: HashMap<String, Vec<(usize, usize)>> = HashMap::with_capacity(merges.len());
        for (rank, merge) in merges.iter().enumerate() {
            let (a, b) = split(merge)
                .ok_or_else(|| format!("merge {rank} ({merge:?}) is not two symbols"))?;
            let splits = ranks.entry(format!("{a}{b}")).or_default();
            // The first listing of a pair is its rank.
            if !splits.iter().any(|&(left, _)| left == a.len()) {
                splits.push((a.len(), rank));
            }
        }
        Ok(Ranks(ranks))
    }

    /// How urgently `left` and what follows it merge into `joined`: the lower the rank, the
    /// higher (`None`: no such merge).
    pub fn priority(&self, left: &str, joined: &str) -> Option<f64> {
        self.0
            .get(joined)?
            .iter()
            .find(|&&(split, _)| split == left.len())
            .map(|&(_, rank)| -(rank as f64))
    }
}

/// GPT-2's reversible byte → character table: printable bytes map to themselves, the others to
/// code points from 256 up.
fn byte_chars() -> &'static [char; 256] {
    static TABLE: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            table[usize::from(b)] = if printable {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or('?')
            };
        }
        table
    })
}

fn byte_char(b: u8) -> char {
    byte_chars()[usize::from(b)]
}

/// The raw bytes of a byte-level token string.
pub fn unmap_bytes(token: &str) -> Vec<u8> {
    let table = byte_chars();
    token
        .chars()
        .map(|c| table.iter().position(|&t| t == c).map_or(b'?', |b| b as u8))
        .collect()
}

impl Bpe {
    /// The pre-tokenizer for `pre` (`tokenizer.ggml.pre`) and the merge list.
    pub fn new(pre: &str, merges: &[&str]) -> Result<Bpe, String> {
        let patterns: Vec<&str> = match pre {
            // SmolLM / StarCoder: digits one by one, then GPT-2.
            "smollm" | "starcoder" => vec![r"\p{N}", GPT2],
            "gpt-2" | "default" => vec![GPT2],
            "llama3" | "llama-bpe" | "llama-v3" => vec![LLAMA3],
            "qwen2" | "deepseek-r1-qwen" => vec![QWEN2],
            "qwen35" => vec![QWEN35],
            other => return Err(format!("pre-tokenizer {other} is not supported yet")),
        };
        let splits = patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let ranks = Ranks::new(merges, |m| m.split_once(' '))?;
        Ok(Bpe { splits, ranks })
    }

    /// Splits `text` by each regex in turn: matches and the text between them become pieces.
    pub fn pre_tokenize<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for re in &self.splits {
            let mut next = Vec::with_capacity(pieces.len());
            for piece in pieces {
                let mut last = 0;
                for m in re.find_iter(piece).flatten() {
                    if m.start() > last {
                        next.push(&piece[last..m.start()]);
                    }
                    next.push(m.as_str());
                    last = m.end();
                }
                if last < piece.len() {
                    next.push(&piece[last..]);
                }
            }
            pieces = next;
        }
        pieces.retain(|p| !p.is_empty());
        pieces
    }

    /// Appends the ids of one pre-tokenized `piece` to `out`.
    pub fn encode_piece(&self, piece: &str, ids: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let mapped: String = piece.bytes().map(byte_char).collect();
        // Lowest merge rank first.
        let symbols =
            super::merge::merge(&mapped, |left, _, joined| self.ranks.priority(left, joined));
        for symbol in symbols {
            match ids.get(symbol) {
                Some(&id) => out.push(id),
                None => {
                    // Every single byte character is in a byte-level vocabulary.
                    let mut one = [0u8; 4];
                    out.extend(
                        symbol
                            .chars()
                            .filter_map(|c| ids.get(&*c.encode_utf8(&mut one)).copied()),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected pieces from Python's `regex` module with the same patterns.
    #[test]
    fn llama3_and_qwen2_pre_tokenizers_split_like_the_reference_regexes() {
        let text = "Hello world 12345 DON'T\n\n  x...!\n";
        let llama3 = Bpe::new("llama-bpe", &[]).expect("llama3");
        assert_eq!(
            llama3.pre_tokenize(text),
            [
                "Hello", " world", " ", "123", "45", " DON", "'T", "\n\n", " ", " x", "...!\n"
            ]
        );
        let qwen2 = Bpe::new("qwen2", &[]).expect("qwen2");
        assert_eq!(
            qwen2.pre_tokenize(text),
            [
                "Hello", " world", " ", "1", "2", "3", "4", "5", " DON", "'T", "\n\n", " ", " x",
                "...!\n"
            ]
        );
        assert!(Bpe::new("no-such-pre", &[]).is_err());
    }
}
