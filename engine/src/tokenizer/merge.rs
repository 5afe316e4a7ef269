//! Pairwise symbol merging, as both BPE and SentencePiece merge: while any adjacent pair has a
//! priority, the highest-priority pair is joined, the leftmost on ties.
//!
//! Symbols are byte ranges of one text, kept as a linked list, and candidate pairs wait in a
//! heap; a candidate made stale by an earlier merge is recognised by its length and skipped.
//! That is O(n log n) in the text's length: a prompt of one character repeated 65,536 times
//! must not cost minutes (rescanning every pair after each merge is quadratic).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One symbol: `text[start..end]`, with its neighbours' indices.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    end: usize,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

/// A pair that may be merged: the left symbol and the joined length when it was proposed.
struct Candidate {
    priority: f64,
    left: usize,
    joined_len: usize,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest priority first; on ties the leftmost (the smaller index) wins.
        self.priority
            .total_cmp(&other.priority)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// Merges the characters of `text` pairwise and returns the final symbols in order.
/// `priority(left, right, joined)` says how urgently two adjacent symbols merge (`None`: never).
pub fn merge(text: &str, priority: impl Fn(&str, &str, &str) -> Option<f64>) -> Vec<&str> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let count = bounds.len() - 1;
    let mut symbols: Vec<Symbol> = (0..count)
        .map(|i| Symbol {
            start: bounds[i],
            end: bounds[i + 1],
            prev: i.checked_sub(1),
            next: (i + 1 < count).then_some(i + 1),
            alive: true,
        })
        .collect();
    let mut heap = BinaryHeap::new();
    let propose = |heap: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize| {
        let l = symbols[left];
        let Some(right) = l.next else { return };
        let r = symbols[right];
        if let Some(priority) = priority(
            &text[l.start..l.end],
            &text[r.start..r.end],
            &text[l.start..r.end],
        ) {
            heap.push(Candidate {
                priority,
                left,
                joined_len: r.end - l.start,
            });
        }
    };
    for left in 0..count {
        propose(&mut heap, &symbols, left);
    }
    while let Some(candidate) = heap.pop() {
        let l = symbols[candidate.left];
        let Some(right) = l.next.filter(|_| l.alive) else {
            continue;
        };
        let r = symbols[right];
        // The left symbol's start never moves, so an unchanged joined length means neither
        // symbol has merged with anything since the pair was proposed.
        if r.end - l.start != candidate.joined_len {
            continue;
        }
        symbols[candidate.left].end = r.end;
        symbols[candidate.left].next = r.next;
        symbols[right].alive = false;
        if let Some(after) = r.next {
            symbols[after].prev = Some(candidate.left);
        }
        if let Some(before) = l.prev {
            propose(&mut heap, &symbols, before);
        }
        propose(&mut heap, &symbols, candidate.left);
    }
    let mut out = Vec::new();
    let mut at = (count > 0).then_some(0);
    while let Some(i) = at {
        out.push(&text[symbols[i].start..symbols[i].end]);
        at = symbols[i].next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain definition: rescan every pair after each merge (quadratic, obviously right).
    fn merge_by_rescanning(
        text: &str,
        priority: impl Fn(&str, &str, &str) -> Option<f64>,
    ) -> Vec<String> {
        let mut symbols: Vec<String> = text.chars().map(String::from).collect();
        loop {
            let mut best: Option<(f64, usize)> = None;
            for i in 0..symbols.len().saturating_sub(1) {
                let joined = format!("{}{}", symbols[i], symbols[i + 1]);
                if let Some(p) = priority(&symbols[i], &symbols[i + 1], &joined)
                    && best.is_none_or(|(q, _)| p > q)
                {
                    best = Some((p, i));
                }
            }
            let Some((_, i)) = best else {
                return symbols;
            };
            let right = symbols.remove(i + 1);
            symbols[i].push_str(&right);
        }
    }

    /// A toy vocabulary where ties, chains and overlapping candidates all occur.
    fn toy(_: &str, _: &str, joined: &str) -> Option<f64> {
        match joined {
            "ab" | "ba" => Some(3.0),
            "aa" => Some(2.0),
            "aaaa" => Some(2.5),
            "aab" | "abab" => Some(1.0),
            "bb" => Some(3.0),
            "éa" | "aé" => Some(0.5),
            _ => None,
        }
    }

    #[test]
    fn the_heap_merges_exactly_like_rescanning() {
        let texts = [
            "",
            "a",
            "ab",
            "aaaaaaa",
            "abababab",
            "aabbaabbaaab",
            "baaabaaaab",
            "éaéaaéb",
            "xyz",
        ];
        for text in texts {
            let fast: Vec<String> = merge(text, toy).into_iter().map(String::from).collect();
            assert_eq!(fast, merge_by_rescanning(text, toy), "{text:?}");
        }
        // Pseudo-random strings over the toy alphabet.
        let mut state = 0x2545_f491_u64;
        for len in 0..200 {
            let text: String = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ['a', 'b', 'é', 'a'][(state % 4) as usize]
                })
                .collect();
            let fast: Vec<String> = merge(&text, toy).into_iter().map(String::from).collect();
            assert_eq!(fast, merge_by_rescanning(&text, toy), "{text:?}");
        }
    }

    #[test]
    fn a_long_run_of_one_character_merges_into_the_longest_symbols() {
        // The run that made quadratic merging take minutes.
        let text = "a".repeat(1 << 16);
        let symbols = merge(&text, toy);
        assert_eq!(symbols.concat(), text);
        assert!(symbols.iter().all(|s| *s == "aaaa"), "{:?}", &symbols[..4]);
    }
}
