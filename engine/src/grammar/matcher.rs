//! The pushdown matcher: where generation stands in a grammar.
//!
//! A stack is a position in the grammar (always a byte-set symbol: "the next byte must be in
//! this set") plus the positions to return to when the current rules end. Return frames live in
//! an arena of hash-consed nodes `(position, parent)`, so equal stacks have equal ids and the set
//! of live stacks is deduplicated exactly by comparing `(position, node)` pairs. A byte moves
//! every stack whose set holds it one symbol on, then expands rule references and rule ends
//! until every stack is again at a byte set (a stack that reaches the end of the root rule makes
//! the text so far complete). References in tail position push no frame, so right recursion (the
//! way repetition is compiled) runs in constant depth.
//!
//! Bounds: [`MAX_DEPTH`] frames per stack (a deeper branch dies), [`MAX_STACKS`] live stacks and
//! [`MAX_STEPS`] expansion steps per byte (a byte needing more is refused), [`MAX_NODES`] arena
//! nodes. Left recursion is refused when a grammar is built, which is what makes expansion finite.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::{Grammar, MAX_DEPTH, MAX_STACKS, Sym};

/// Most expansion steps one byte may take.
pub const MAX_STEPS: usize = 1 << 16;
/// Most return frames a matcher may hold (shared between stacks).
pub(crate) const MAX_NODES: usize = 1 << 20;
/// The empty return stack.
pub(crate) const EMPTY: u32 = u32::MAX;

/// A small multiplicative hasher for the matcher's integer keys.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        let h = self.0;
        h ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// One live stack: the byte-set position it waits at and its return frames.
pub(crate) type Top = (u32, u32);

fn key(pos: u32, parent: u32) -> u64 {
    u64::from(pos) << 32 | u64::from(parent)
}

/// A return frame: continue at `pos`, then return to `parent`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pos: u32,
    parent: u32,
    depth: u32,
}

/// Hash-consed return frames.
#[derive(Clone, Default, Debug)]
pub(crate) struct Arena {
    nodes: Vec<Node>,
    index: FastMap<u64, u32>,
}

impl Arena {
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// A copy holding only the frames reachable from `states`, whose tops are rewritten to it.
    pub(crate) fn compact(&self, states: &mut [&mut Vec<Top>]) -> Arena {
        let mut live = vec![false; self.nodes.len()];
        for tops in states.iter() {
            for &(_, mut n) in tops.iter() {
                while n != EMPTY && !live[n as usize] {
                    live[n as usize] = true;
                    n = self.nodes[n as usize].parent;
                }
            }
        }
        let mut map = vec![EMPTY; self.nodes.len()];
        let mut out = Arena::default();
        // A parent is always older (smaller id) than its children.
        for (id, node) in self.nodes.iter().enumerate() {
            if live[id] {
                let parent = if node.parent == EMPTY {
                    EMPTY
                } else {
                    map[node.parent as usize]
                };
                let new = out.nodes.len() as u32;
                out.nodes.push(Node {
                    pos: node.pos,
                    parent,
                    depth: node.depth,
                });
                out.index.insert(key(node.pos, parent), new);
                map[id] = new;
            }
        }
        for tops in states.iter_mut() {
            for top in tops.iter_mut() {
                if top.1 != EMPTY {
                    top.1 = map[top.1 as usize];
                }
            }
        }
        out
    }
}

/// Where return frames are read and made.
pub(crate) trait Store {
    fn node(&self, id: u32) -> Node;
    /// The frame `(pos, parent)`; `None` past the depth or size bound.
    fn push(&mut self, pos: u32, parent: u32) -> Option<u32>;
}

impl Store for Arena {
    fn node(&self, id: u32) -> Node {
        self.nodes[id as usize]
    }
    fn push(&mut self, pos: u32, parent: u32) -> Option<u32> {
        if let Some(&id) = self.index.get(&key(pos, parent)) {
            return Some(id);
        }
        let depth = if parent == EMPTY {
            1
        } else {
            self.nodes[parent as usize].depth + 1
        };
        if depth > MAX_DEPTH || self.nodes.len() >= MAX_NODES {
            return None;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node { pos, parent, depth });
        self.index.insert(key(pos, parent), id);
        Some(id)
    }
}

/// New frames on top of a matcher's arena, left out of it unless committed.
struct Overlay<'a> {
    base: &'a Arena,
    extra: Vec<Node>,
    index: FastMap<u64, u32>,
}

impl Store for Overlay<'_> {
    fn node(&self, id: u32) -> Node {
        let base = self.base.nodes.len();
        if (id as usize) < base {
            self.base.nodes[id as usize]
        } else {
            self.extra[id as usize - base]
        }
    }
    fn push(&mut self, pos: u32, parent: u32) -> Option<u32> {
        let k = key(pos, parent);
        if let Some(&id) = self.base.index.get(&k).or_else(|| self.index.get(&k)) {
            return Some(id);
        }
        let depth = if parent == EMPTY {
            1
        } else {
            self.node(parent).depth + 1
        };
        let id = self.base.nodes.len() + self.extra.len();
        if depth > MAX_DEPTH || id >= MAX_NODES {
            return None;
        }
        self.extra.push(Node { pos, parent, depth });
        self.index.insert(k, id as u32);
        Some(id as u32)
    }
}

/// A set of `(position, frame)` pairs: a scan while small, hashed beyond.
#[derive(Default)]
struct Seen {
    small: Vec<u64>,
    big: Option<std::collections::HashSet<u64, BuildHasherDefault<FastHasher>>>,
}

impl Seen {
    fn clear(&mut self) {
        self.small.clear();
        self.big = None;
    }
    /// Whether `k` was new.
    fn insert(&mut self, k: u64) -> bool {
        if let Some(big) = &mut self.big {
            return big.insert(k);
        }
        if self.small.contains(&k) {
            return false;
        }
        self.small.push(k);
        if self.small.len() > 24 {
            self.big = Some(self.small.drain(..).collect());
        }
        true
    }
}

/// Buffers reused from byte to byte.
#[derive(Default)]
pub(crate) struct Scratch {
    work: Vec<Top>,
    seen: Seen,
    /// The stacks after the last step.
    pub(crate) out: Vec<Top>,
    /// Expansion steps taken by the last step.
    pub(crate) steps: usize,
}

/// Expands `sc.work` until every stack waits at a byte set (those land in `sc.out`). `Some(complete)`,
/// or `None` when a bound was exceeded.
fn expand<S: Store>(g: &Grammar, store: &mut S, sc: &mut Scratch) -> Option<bool> {
    sc.seen.clear();
    sc.out.clear();
    sc.steps = 0;
    let mut complete = false;
    while let Some((pos, rest)) = sc.work.pop() {
        sc.steps += 1;
        if sc.steps > MAX_STEPS {
            sc.work.clear();
            return None;
        }
        if !sc.seen.insert(key(pos, rest)) {
            continue;
        }
        match g.sym(pos) {
            Sym::End => {
                if rest == EMPTY {
                    complete = true;
                } else {
                    let n = store.node(rest);
                    sc.work.push((n.pos, n.parent));
                }
            }
            Sym::Bytes(_) => {
                sc.out.push((pos, rest));
                if sc.out.len() > MAX_STACKS {
                    sc.work.clear();
                    return None;
                }
            }
            Sym::Rule(r) => {
                let ret = pos + 1;
                let frame = if g.sym(ret) == Sym::End {
                    rest
                } else {
                    match store.push(ret, rest) {
                        Some(id) => id,
                        None => continue,
                    }
                };
                for &alt in g.alts(r).iter().rev() {
                    sc.work.push((alt, frame));
                }
            }
        }
    }
    Some(complete)
}

/// The stacks after `byte` (in `sc.out`) and whether the text is then complete; `None` if
/// `byte` cannot come next.
pub(crate) fn step<S: Store>(
    g: &Grammar,
    store: &mut S,
    sc: &mut Scratch,
    tops: &[Top],
    byte: u8,
) -> Option<bool> {
    sc.work.clear();
    for &(pos, rest) in tops.iter().rev() {
        if g.set_at(pos).is_some_and(|s| s.contains(byte)) {
            sc.work.push((pos + 1, rest));
        }
    }
    if sc.work.is_empty() {
        sc.steps = 0;
        return None;
    }
    let complete = expand(g, store, sc)?;
    if sc.out.is_empty() && !complete {
        return None;
    }
    Some(complete)
}

/// A matcher's state after some bytes, not yet committed.
struct Pending {
    /// Frames new since the matcher's arena (ids continue its own).
    extra: Vec<Node>,
    index: FastMap<u64, u32>,
    tops: Vec<Top>,
    complete: bool,
}

/// Where generation stands in a grammar. Clone is cheap enough to clone per token check.
#[derive(Clone)]
pub struct Matcher {
    pub(crate) grammar: Arc<Grammar>,
    pub(crate) arena: Arena,
    pub(crate) tops: Vec<Top>,
    pub(crate) complete: bool,
    /// Arena size at which frames no longer reachable are dropped.
    gc_at: usize,
}

impl fmt::Debug for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Matcher")
            .field("stacks", &self.tops.len())
            .field("frames", &self.arena.len())
            .field("complete", &self.complete)
            .finish()
    }
}

impl Matcher {
    /// At the start of the grammar. A grammar whose start already exceeds the matcher's bounds
    /// gives a matcher that accepts nothing and is not complete.
    pub fn new(grammar: Arc<Grammar>) -> Matcher {
        let mut arena = Arena::default();
        let mut sc = Scratch::default();
        for &alt in grammar.alts(grammar.root()).iter().rev() {
            sc.work.push((alt, EMPTY));
        }
        let (tops, complete) = match expand(&grammar, &mut arena, &mut sc) {
            Some(complete) => (std::mem::take(&mut sc.out), complete),
            None => (Vec::new(), false),
        };
        Matcher {
            grammar,
            arena,
            tops,
            complete,
            gc_at: 1024,
        }
    }

    /// The stacks and new frames after `bytes`, if they can all come next.
    fn run(&self, bytes: &[u8]) -> Option<Pending> {
        if bytes.is_empty() {
            return None;
        }
        let mut store = Overlay {
            base: &self.arena,
            extra: Vec::new(),
            index: FastMap::default(),
        };
        let mut sc = Scratch::default();
        let mut tops: Vec<Top> = Vec::new();
        let mut complete = self.complete;
        for (i, &b) in bytes.iter().enumerate() {
            let current = if i == 0 { &self.tops } else { &tops };
            complete = step(&self.grammar, &mut store, &mut sc, current, b)?;
            std::mem::swap(&mut tops, &mut sc.out);
            if tops.is_empty() && i + 1 < bytes.len() {
                return None;
            }
        }
        Some(Pending {
            extra: store.extra,
            index: store.index,
            tops,
            complete,
        })
    }

    /// Whether `bytes` (one token's bytes) can come next (without changing state). Empty
    /// `bytes` are never accepted.
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        self.run(bytes).is_some()
    }

    /// Consumes `bytes`; false (state unchanged) if they cannot come next.
    pub fn advance(&mut self, bytes: &[u8]) -> bool {
        let Some(Pending {
            extra,
            index,
            tops,
            complete,
        }) = self.run(bytes)
        else {
            return false;
        };
        self.arena.nodes.extend(extra);
        self.arena.index.extend(index);
        self.tops = tops;
        self.complete = complete;
        if self.arena.len() > self.gc_at {
            self.arena = self.arena.compact(&mut [&mut self.tops]);
            self.gc_at = (2 * self.arena.len()).max(1024);
        }
        true
    }

    /// The text so far is a complete sentence of the grammar (end-of-generation may come now).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Some non-empty continuation exists (false: only ending is possible).
    pub fn can_continue(&self) -> bool {
        !self.tops.is_empty()
    }

    /// Every byte some stack waits for (a byte outside it is never accepted).
    #[cfg(test)]
    pub(crate) fn next_bytes(&self) -> super::ByteSet {
        self.tops
            .iter()
            .fold(super::ByteSet::default(), |acc, &(pos, _)| {
                match self.grammar.set_at(pos) {
                    Some(s) => acc.union(s),
                    None => acc,
                }
            })
    }

    /// How many stacks are live.
    #[cfg(test)]
    pub(crate) fn stacks(&self) -> usize {
        self.tops.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gbnf(text: &str) -> Arc<Grammar> {
        Arc::new(Grammar::from_gbnf(text).expect("grammar"))
    }

    #[test]
    fn accepts_leaves_state_and_advance_refuses_without_change() {
        let mut m = Matcher::new(gbnf(r#"root ::= "ab" "c"*"#));
        assert!(m.accepts(b"a") && m.accepts(b"ab") && m.accepts(b"abccc"));
        assert!(!m.accepts(b"b") && !m.accepts(b"") && !m.accepts(b"abd"));
        assert!(!m.is_complete());
        assert!(!m.advance(b"ax"));
        assert!(m.advance(b"a") && !m.is_complete());
        assert!(m.advance(b"b") && m.is_complete() && m.can_continue());
        assert!(m.advance(b"cc") && m.is_complete());
    }

    #[test]
    fn only_ending_is_possible_after_a_fixed_sentence() {
        let mut m = Matcher::new(gbnf(r#"root ::= "yes" | "no""#));
        assert!(m.advance(b"yes"));
        assert!(m.is_complete() && !m.can_continue());
        assert!(!m.accepts(b"s"));
    }

    #[test]
    fn deep_nesting_is_bounded_by_the_stack_depth() {
        let mut m = Matcher::new(gbnf(r#"root ::= "(" root ")" | "x""#));
        let mut depth = 0;
        while m.advance(b"(") {
            depth += 1;
            assert!(depth <= MAX_DEPTH as usize + 1, "no bound");
        }
        assert!(depth >= 500, "{depth}");
        assert!(m.advance(b"x"));
        for _ in 0..depth {
            assert!(m.advance(b")"));
        }
        assert!(m.is_complete());
    }

    #[test]
    fn ambiguous_grammars_stay_bounded() {
        // Every choice of "a"/"b" frames is a distinct stack: 2^n after n bytes.
        let g = gbnf(r#"root ::= "x" root "a" | "x" root "b" | """#);
        let mut m = Matcher::new(g);
        let start = std::time::Instant::now();
        let mut n = 0;
        while m.advance(b"x") {
            n += 1;
            assert!(m.stacks() <= MAX_STACKS);
        }
        assert!(n < 16, "{n}");
        assert!(start.elapsed().as_secs() < 5);
        // Many nullable stars: stacks stay few (deduplicated).
        let stars = vec![r#""x"*"#; 40].join(" ");
        let mut m = Matcher::new(gbnf(&format!("root ::= {stars}")));
        for _ in 0..1000 {
            assert!(m.advance(b"x"));
        }
        assert!(m.stacks() <= 40 && m.is_complete());
    }

    #[test]
    fn frames_are_collected_over_a_long_generation() {
        let mut m = Matcher::new(Arc::new(Grammar::json_object()));
        assert!(m.advance(b"{\"a\":["));
        for _ in 0..20_000 {
            assert!(m.advance(b"[1,{\"b\":[]}],"));
        }
        assert!(m.arena.len() < 4096, "{}", m.arena.len());
        assert!(m.advance(b"0]}") && m.is_complete());
    }
}
