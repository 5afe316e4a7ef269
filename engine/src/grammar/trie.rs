//! Which tokens of a vocabulary a matcher accepts, found in one walk of a byte trie.
//!
//! The trie is stored in pre-order (a node's byte, its depth, the index just past its subtree,
//! its token ids), so the walk is a forward scan that jumps over the subtree of every prefix the
//! matcher refuses. Matcher states met during a walk are interned (equal stacks are equal
//! because frames are hash-consed) and each state's transitions are cached in a 256-entry
//! table, so a prefix shared by many tokens (or a state met again, as inside a JSON string) costs
//! one table lookup. The walk uses the same step function as [`Matcher::accepts`], so it reports
//! exactly the tokens `accepts` accepts; a walk that would exceed [`WALK_STEPS`] expansion steps
//! (only a hostile grammar can) stops early, having reported only accepted tokens.

use std::fmt;

use super::Grammar;
use super::matcher::{Arena, FastMap, Matcher, Scratch, Top, step};

/// Most expansion steps one [`VocabTrie::allowed`] walk may take.
pub(crate) const WALK_STEPS: usize = 1 << 25;
/// States cached per walk before the cache is rebuilt from the current path.
const WALK_STATES: usize = 1 << 13;
/// Frames a walk may accumulate before the cache is rebuilt from the current path.
const WALK_FRAMES: usize = 1 << 18;
const UNKNOWN: u32 = u32::MAX;
/// The state that accepts nothing.
const DEAD: u32 = 0;

/// The vocabulary's token byte strings arranged for fast masking (built once per model).
pub struct VocabTrie {
    bytes: Vec<u8>,
    depth: Vec<u16>,
    /// The index just past each node's subtree.
    skip: Vec<u32>,
    /// Node `i`'s tokens are `ids[ids_start[i]..ids_start[i + 1]]`.
    ids_start: Vec<u32>,
    ids: Vec<u32>,
    max_depth: usize,
}

impl fmt::Debug for VocabTrie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VocabTrie")
            .field("nodes", &self.bytes.len())
            .field("tokens", &self.ids.len())
            .finish()
    }
}

impl VocabTrie {
    /// The trie of `tokens` (index = token id); empty byte strings are never allowed, nor are
    /// tokens longer than 65,535 bytes.
    pub fn new(tokens: &[Vec<u8>]) -> VocabTrie {
        let mut order: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&i| {
                !tokens[i as usize].is_empty() && tokens[i as usize].len() <= usize::from(u16::MAX)
            })
            .collect();
        order.sort_by(|&a, &b| tokens[a as usize].cmp(&tokens[b as usize]));
        let mut t = VocabTrie {
            bytes: Vec::new(),
            depth: Vec::new(),
            skip: Vec::new(),
            ids_start: Vec::new(),
            ids: Vec::with_capacity(order.len()),
            max_depth: 0,
        };
        let mut prev: &[u8] = &[];
        for &id in &order {
            let tok = tokens[id as usize].as_slice();
            let common = prev.iter().zip(tok).take_while(|(a, b)| a == b).count();
            // In sorted order a token's last node is always the newest one (a duplicate
            // shares it), so each node's ids are contiguous.
            for (d, &b) in tok.iter().enumerate().skip(common) {
                t.bytes.push(b);
                t.depth.push(d as u16);
                t.ids_start.push(t.ids.len() as u32);
            }
            t.ids.push(id);
            t.max_depth = t.max_depth.max(tok.len());
            prev = tok;
        }
        t.ids_start.push(t.ids.len() as u32);
        let n = t.bytes.len();
        t.skip = vec![n as u32; n];
        let mut open: Vec<usize> = Vec::new();
        for i in 0..n {
            while let Some(&top) = open.last() {
                if t.depth[top] < t.depth[i] {
                    break;
                }
                t.skip[top] = i as u32;
                open.pop();
            }
            open.push(i);
        }
        t
    }

    /// Calls `allow(id)` for every token whose bytes the matcher accepts (walks a byte trie so
    /// shared prefixes are matched once).
    pub fn allowed(&self, matcher: &Matcher, mut allow: impl FnMut(u32)) {
        if self.bytes.is_empty() {
            return;
        }
        let mut walk = Walk {
            grammar: &matcher.grammar,
            arena: matcher.arena.clone(),
            states: Vec::new(),
            index: FastMap::default(),
            sc: Scratch::default(),
            budget: WALK_STEPS,
        };
        walk.reset();
        let mut path = vec![DEAD; self.max_depth + 1];
        path[0] = walk.intern(matcher.tops.clone(), matcher.complete);
        if walk.states[path[0] as usize].tops.is_empty() {
            return;
        }
        let n = self.bytes.len();
        let mut i = 0;
        while i < n {
            let d = usize::from(self.depth[i]);
            if walk.states.len() > WALK_STATES || walk.arena.len() > WALK_FRAMES {
                walk.rebuild(&mut path[..=d]);
            }
            let Some(next) = walk.transition(path[d], self.bytes[i]) else {
                return;
            };
            if next == DEAD {
                i = self.skip[i] as usize;
                continue;
            }
            for &id in &self.ids[self.ids_start[i] as usize..self.ids_start[i + 1] as usize] {
                allow(id);
            }
            if walk.states[next as usize].tops.is_empty() {
                i = self.skip[i] as usize;
            } else {
                path[d + 1] = next;
                i += 1;
            }
        }
    }
}

struct State {
    tops: Vec<Top>,
    complete: bool,
    next: Option<Box<[u32; 256]>>,
}

/// One walk's interned states over its own copy of the matcher's frames.
struct Walk<'g> {
    grammar: &'g Grammar,
    arena: Arena,
    states: Vec<State>,
    index: FastMap<(Vec<Top>, bool), u32>,
    sc: Scratch,
    budget: usize,
}

impl Walk<'_> {
    /// Only the dead state.
    fn reset(&mut self) {
        self.states.clear();
        self.index.clear();
        self.states.push(State {
            tops: Vec::new(),
            complete: false,
            next: None,
        });
    }

    fn intern(&mut self, tops: Vec<Top>, complete: bool) -> u32 {
        if tops.is_empty() && !complete {
            return DEAD;
        }
        let key = (tops, complete);
        if let Some(&id) = self.index.get(&key) {
            return id;
        }
        let id = self.states.len() as u32;
        self.states.push(State {
            tops: key.0.clone(),
            complete,
            next: None,
        });
        self.index.insert(key, id);
        id
    }

    /// The state after `byte`, or `None` once the walk's budget is spent.
    fn transition(&mut self, s: u32, byte: u8) -> Option<u32> {
        if let Some(table) = &self.states[s as usize].next {
            let t = table[usize::from(byte)];
            if t != UNKNOWN {
                return Some(t);
            }
        }
        let state = &self.states[s as usize];
        let result = step(
            self.grammar,
            &mut self.arena,
            &mut self.sc,
            &state.tops,
            byte,
        );
        self.budget = self.budget.checked_sub(self.sc.steps)?;
        let t = match result {
            Some(complete) => {
                let tops = std::mem::take(&mut self.sc.out);
                self.intern(tops, complete)
            }
            None => DEAD,
        };
        self.states[s as usize]
            .next
            .get_or_insert_with(|| Box::new([UNKNOWN; 256]))[usize::from(byte)] = t;
        Some(t)
    }

    /// Drops every cached state and frame not on `path`.
    fn rebuild(&mut self, path: &mut [u32]) {
        let mut kept: Vec<(Vec<Top>, bool)> = path
            .iter()
            .map(|&s| {
                (
                    self.states[s as usize].tops.clone(),
                    self.states[s as usize].complete,
                )
            })
            .collect();
        let mut refs: Vec<&mut Vec<Top>> = kept.iter_mut().map(|(t, _)| t).collect();
        self.arena = self.arena.compact(&mut refs);
        self.reset();
        for (slot, (tops, complete)) in path.iter_mut().zip(kept) {
            *slot = self.intern(tops, complete);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn synthetic_vocab() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = vec![Vec::new()];
        for a in 0..=255u8 {
            v.push(vec![a]);
            for b in 0..=255u8 {
                v.push(vec![a, b]);
            }
        }
        for w in [
            "\"",
            "\":",
            "\": \"",
            "\",",
            "\"}",
            "{\"",
            "{\n",
            "  \"name",
            "name",
            "\"name\"",
            "true",
            "false",
            "null",
            "nul",
            "123",
            "-0",
            "0.5e",
            "e+1",
            "}}",
            "]}",
            "[]",
            "\\u00e9",
            "\\n",
            "é",
            "日本",
            "\u{1F600}",
            "  ",
            "\n  ",
            "\":[",
            ",\"",
            "\"a\":1}",
            "\"b\"",
            "café",
            "\\\"",
            "\\uD83D\\uDE00",
        ] {
            v.push(w.as_bytes().to_vec());
            v.push(w.as_bytes().to_vec()); // duplicates get both ids
        }
        v.push(vec![0xE6, 0x97]); // a character's first bytes
        v.push(vec![0xFF, 0xFE, 0xFD]);
        v
    }

    fn brute(m: &Matcher, vocab: &[Vec<u8>]) -> Vec<u32> {
        (0..vocab.len() as u32)
            .filter(|&i| m.accepts(&vocab[i as usize]))
            .collect()
    }

    fn walked(t: &VocabTrie, m: &Matcher) -> Vec<u32> {
        let mut out = Vec::new();
        t.allowed(m, |id| out.push(id));
        out.sort_unstable();
        out
    }

    #[test]
    fn allowed_equals_the_brute_force_filter() {
        let vocab = synthetic_vocab();
        let trie = VocabTrie::new(&vocab);
        let grammars = [
            Grammar::json_object(),
            Grammar::from_gbnf(r#"root ::= ("a" | "ab" | "abc")+ "!"?"#).expect("gbnf"),
            Grammar::from_json_schema(&serde_json::json!({
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 3}, "b": {"enum": [1, "x", null]}},
                "required": ["name"]
            }))
            .expect("schema"),
        ];
        let grammars = grammars.into_iter().chain([Grammar::from_gbnf(
            r#"root ::= "x" root "a" | "x" root "b" | [a-z]*"#,
        )
        .expect("gbnf")]);
        let prefixes: [&[&str]; 4] = [
            &[
                "",
                "{",
                "{\"",
                "{\"k\":",
                "{\"k\": \"caf",
                "{\"k\":[1",
                "{\"k\":[1]}",
                "{\"k\":\"\\",
                "{\"k\":\"\\u00",
            ],
            &["", "a", "ab", "abc", "abca!"],
            &[
                "",
                "{",
                "{\"name\":\"",
                "{\"name\":\"abc",
                "{\"name\":\"ab\",",
                "{\"name\":\"ab\",\"b\":",
            ],
            &["", "xxx", "xxxxxx", "xxab"],
        ];
        for (g, prefixes) in grammars.into_iter().zip(prefixes) {
            let g = Arc::new(g);
            for p in prefixes {
                let mut m = Matcher::new(g.clone());
                assert!(p.is_empty() || m.advance(p.as_bytes()), "{p}");
                let want = brute(&m, &vocab);
                assert_eq!(walked(&trie, &m), want, "after {p:?}");
            }
        }
    }

    #[test]
    fn rebuilding_the_cache_mid_walk_changes_nothing() {
        // Nesting depth makes every prefix a new state: far more than the cache holds.
        let vocab: Vec<Vec<u8>> = (1..=12_000)
            .map(|n| b"(".repeat(n % 600 + 1))
            .chain([b"x".to_vec()])
            .collect();
        let trie = VocabTrie::new(&vocab);
        let g = Arc::new(Grammar::from_gbnf(r#"root ::= "(" root ")" | "x""#).expect("gbnf"));
        let m = Matcher::new(g);
        assert_eq!(walked(&trie, &m), brute(&m, &vocab));
    }

    #[test]
    fn empty_tokens_are_never_allowed() {
        let trie = VocabTrie::new(&[Vec::new(), b"{".to_vec()]);
        let m = Matcher::new(Arc::new(Grammar::json_object()));
        assert_eq!(walked(&trie, &m), vec![1]);
    }

    /// `cargo test -p engine --lib grammar::trie::tests::speed -- --ignored --nocapture`;
    /// `GRAMMAR_VOCAB_GGUF` may name a GGUF file whose vocabulary to use instead of a synthetic one.
    #[test]
    #[ignore]
    fn speed() {
        let vocab: Vec<Vec<u8>> = match std::env::var("GRAMMAR_VOCAB_GGUF") {
            Ok(path) => {
                let file = crate::model_file::ModelFile::open(std::path::Path::new(&path))
                    .expect("model file");
                match crate::tokenizer::Tokenizer::load(&file) {
                    Ok(tok) => (0..tok.vocab_size() as u32)
                        .map(|id| tok.token_bytes(id))
                        .collect(),
                    // A tokenizer the engine does not run yet: SentencePiece-style pieces.
                    Err(_) => {
                        let entry = file
                            .header()
                            .entry("tokenizer.ggml.tokens")
                            .expect("tokens");
                        let pieces =
                            gguf::arrays::strings(file.bytes(), entry).expect("token strings");
                        pieces
                            .iter()
                            .map(|p| {
                                match p.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                                    Some(h) if h.len() == 2 => u8::from_str_radix(h, 16)
                                        .map(|b| vec![b])
                                        .unwrap_or_default(),
                                    _ => p.replace('\u{2581}', " ").into_bytes(),
                                }
                            })
                            .collect()
                    }
                }
            }
            Err(_) => gemma_like_vocab(262_144),
        };
        let start = std::time::Instant::now();
        let trie = VocabTrie::new(&vocab);
        println!(
            "{} tokens, {} trie nodes, built in {:?}",
            vocab.len(),
            trie.bytes.len(),
            start.elapsed()
        );
        let start = std::time::Instant::now();
        let json = Arc::new(Grammar::json_object());
        println!("json_object() compiled in {:?}: {json:?}", start.elapsed());
        let schema = Arc::new(
            Grammar::from_json_schema(&serde_json::json!({
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 40}, "n": {"enum": [1, 2, 3]}},
                "required": ["name", "n"]
            }))
            .expect("schema"),
        );
        // Every mix of "a"/"b" frames is a distinct stack: 3069 of them after 8 x's.
        let hostile = Arc::new(
            Grammar::from_gbnf(r#"root ::= "x" root "a" | "x" root "b" | [a-z]*"#).expect("gbnf"),
        );
        for (g, prefix) in [
            (&json, "{\"answer\": \"The capital"),
            (&json, "{\"a\": [1, 2"),
            (&json, "{"),
            (&json, "{\"a\": {\"b\": tr"),
            (&schema, "{\"name\": \"Ada"),
            (&hostile, "xxxxxxxx"),
        ] {
            let mut m = Matcher::new(g.clone());
            assert!(m.advance(prefix.as_bytes()));
            let mut n = 0;
            let start = std::time::Instant::now();
            let runs = 5;
            for _ in 0..runs {
                n = 0;
                trie.allowed(&m, |_| n += 1);
            }
            let per = start.elapsed() / runs;
            let start = std::time::Instant::now();
            let mut ok = 0;
            for tok in vocab.iter().take(10_000) {
                ok += usize::from(m.accepts(tok));
            }
            let acc = start.elapsed() / 10_000;
            println!(
                "after {prefix:?}: allowed {n} tokens in {per:?}; accepts {acc:?} per token ({ok} of 10000)"
            );
        }
    }

    /// A vocabulary shaped like a large SentencePiece one: words with and without a leading
    /// space, punctuation runs, digits, whitespace runs, CJK and other multi-byte text, bytes.
    fn gemma_like_vocab(n: usize) -> Vec<Vec<u8>> {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let letters = b"etaoinshrdlcumwfgypbvkjxqz";
        let pieces = [
            "\"", "\",", "\":", "{", "}", "[", "]", ",", ".", "\\n", "\\", "()", "=>", "://",
            "...", "--",
        ];
        while v.len() < n {
            let r = rnd();
            let mut t = Vec::new();
            match r % 10 {
                0..=5 => {
                    if r & 16 != 0 {
                        t.push(b' ');
                    }
                    let len = 1 + (rnd() % 10) as usize;
                    for k in 0..len {
                        let c = letters[((rnd() % 26) * (rnd() % 26) / 26) as usize];
                        t.push(if k == 0 && r & 32 != 0 {
                            c.to_ascii_uppercase()
                        } else {
                            c
                        });
                    }
                }
                6 => t.extend(pieces[(rnd() % pieces.len() as u64) as usize].as_bytes()),
                7 => t.extend((rnd() % 100_000).to_string().as_bytes()),
                8 => t.extend(std::iter::repeat_n(b' ', 1 + (rnd() % 31) as usize)),
                _ => {
                    for _ in 0..1 + rnd() % 3 {
                        let c = char::from_u32(0x4E00 + (rnd() % 0x5000) as u32).unwrap_or('é');
                        t.extend(c.to_string().as_bytes());
                    }
                }
            }
            v.push(t);
        }
        v
    }
}
