//! Sets of Unicode scalar values as alternatives of UTF-8 byte-set sequences: how character
//! classes (GBNF `[...]`, `.`, JSON string characters) become a byte grammar.

use super::{ByteSet, Item};

/// The highest Unicode scalar value.
pub(crate) const MAX_CHAR: u32 = 0x10_FFFF;

/// Sorted, merged, surrogate-free ranges of scalar values.
pub(crate) fn normalize(mut ranges: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    ranges.retain(|&(lo, hi)| lo <= hi);
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        let hi = hi.min(MAX_CHAR);
        if lo > hi {
            continue;
        }
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    // Surrogates are not characters.
    let mut res = Vec::with_capacity(out.len() + 1);
    for (lo, hi) in out {
        if lo <= 0xDFFF && hi >= 0xD800 {
            if lo < 0xD800 {
                res.push((lo, 0xD7FF));
            }
            if hi > 0xDFFF {
                res.push((0xE000, hi));
            }
        } else {
            res.push((lo, hi));
        }
    }
    res
}

/// Every scalar value not in the (normalized) `ranges`.
pub(crate) fn complement(ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    let mut next = 0u32;
    for &(lo, hi) in ranges {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = hi.saturating_add(1);
    }
    if next <= MAX_CHAR {
        out.push((next, MAX_CHAR));
    }
    normalize(out)
}

fn encode(c: u32) -> Vec<u8> {
    char::from_u32(c)
        .map(|ch| ch.to_string().into_bytes())
        .unwrap_or_default()
}

/// Appends the byte-range sequences whose concatenations are exactly the UTF-8 encodings of
/// `lo..=hi` (no surrogates inside).
fn sequences(lo: u32, hi: u32, out: &mut Vec<Vec<(u8, u8)>>) {
    if lo > hi {
        return;
    }
    for b in [0x7F, 0x7FF, 0xFFFF] {
        if lo <= b && hi > b {
            sequences(lo, b, out);
            sequences(b + 1, hi, out);
            return;
        }
    }
    if hi <= 0x7F {
        out.push(vec![(lo as u8, hi as u8)]);
        return;
    }
    let n = encode(lo).len();
    // Split until, for each continuation byte, either the bounds agree above it or the range
    // covers every value below it: then the byte-wise ranges form an exact product.
    for i in 1..n {
        let m = (1u32 << (6 * i)) - 1;
        if lo & !m != hi & !m {
            if lo & m != 0 {
                sequences(lo, lo | m, out);
                sequences((lo | m) + 1, hi, out);
                return;
            }
            if hi & m != m {
                sequences(lo, (hi & !m) - 1, out);
                sequences(hi & !m, hi, out);
                return;
            }
        }
    }
    let (a, b) = (encode(lo), encode(hi));
    out.push(a.into_iter().zip(b).collect());
}

/// One character from the (normalized) `ranges`, as alternatives of byte-set sequences: all
/// one-byte characters in one set; longer sequences with equal tails share a first-byte set.
pub(crate) fn class_alternatives(ranges: &[(u32, u32)]) -> Vec<Vec<Item>> {
    let mut ascii = ByteSet::default();
    let mut seqs: Vec<Vec<(u8, u8)>> = Vec::new();
    for &(lo, hi) in ranges {
        if lo <= 0x7F {
            ascii.insert_range(lo as u8, hi.min(0x7F) as u8);
        }
        if hi > 0x7F {
            sequences(lo.max(0x80), hi, &mut seqs);
        }
    }
    let mut alts: Vec<Vec<ByteSet>> = Vec::new();
    if !ascii.is_empty() {
        alts.push(vec![ascii]);
    }
    for seq in seqs {
        let sets: Vec<ByteSet> = seq.iter().map(|&(lo, hi)| ByteSet::range(lo, hi)).collect();
        match alts
            .iter_mut()
            .find(|a| a.len() == sets.len() && a.len() > 1 && a[1..] == sets[1..])
        {
            Some(a) => a[0] = a[0].union(&sets[0]),
            None => alts.push(sets),
        }
    }
    alts.into_iter()
        .map(|a| a.into_iter().map(Item::Bytes).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(alts: &[Vec<Item>], bytes: &[u8]) -> bool {
        alts.iter().any(|alt| {
            alt.len() == bytes.len()
                && alt
                    .iter()
                    .zip(bytes)
                    .all(|(it, &b)| matches!(it, Item::Bytes(s) if s.contains(b)))
        })
    }

    #[test]
    fn classes_match_exactly_their_characters_encodings() {
        let cases = [
            vec![(0x41, 0x5A)],
            vec![(0x80, 0x10FFFF)],
            vec![(0x3B1, 0x3C9), (0x4E00, 0x9FFF)],
            vec![(0x7F, 0x801), (0xFFF0, 0x10010)],
            vec![(0, MAX_CHAR)],
        ];
        for ranges in cases {
            let ranges = normalize(ranges);
            let alts = class_alternatives(&ranges);
            let inside = |c: u32| ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
            for c in (0..=MAX_CHAR)
                .step_by(7)
                .chain([0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, MAX_CHAR])
            {
                let Some(ch) = char::from_u32(c) else {
                    continue;
                };
                assert_eq!(
                    matches(&alts, ch.to_string().as_bytes()),
                    inside(c),
                    "U+{c:04X} in {ranges:x?}"
                );
            }
            // Surrogates and overlong forms are never matched.
            for bad in [
                &[0xED, 0xA0, 0x80][..],
                &[0xC0, 0x80],
                &[0xE0, 0x80, 0x80],
                &[0xF4, 0x90, 0x80, 0x80],
            ] {
                assert!(!matches(&alts, bad));
            }
        }
    }

    #[test]
    fn complement_excludes_the_class() {
        let c = complement(&normalize(vec![(0x22, 0x22), (0x5C, 0x5C)]));
        assert_eq!(c[0], (0, 0x21));
        assert_eq!(c[1], (0x23, 0x5B));
        assert_eq!(c[2], (0x5D, 0xD7FF));
        assert_eq!(c[3], (0xE000, MAX_CHAR));
    }
}
