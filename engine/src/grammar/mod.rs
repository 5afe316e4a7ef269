//! Output constrained by a grammar: what lets a request ask for JSON (OpenAI's `response_format`
//! `json_object` / `json_schema`, llama.cpp's `json_schema`) or for any llama.cpp GBNF `grammar`,
//! and be sure that the answer matches it.
//!
//! A [`Grammar`] is a context-free grammar over **bytes**: rules, each a list of alternatives,
//! each a sequence of symbols; a symbol is a set of bytes (one byte of input) or a reference to a
//! rule. Multi-byte UTF-8 characters are sequences of byte sets, so a grammar's strings are always
//! valid UTF-8 where the source grammar asks for characters. Grammars come from
//! [`Grammar::json_object`], [`Grammar::from_json_schema`] (`json.rs`), [`Grammar::tool_calls`] (`calls.rs`) and
//! [`Grammar::from_gbnf`] (`gbnf.rs`); every constructor refuses left recursion (a rule that can reach itself without
//! consuming a byte) and bounds the grammar's size ([`MAX_RULES`], [`MAX_SYMBOLS`]).
//!
//! A [`Matcher`] (`matcher.rs`) is where generation stands: a set of pushdown stacks, advanced a
//! byte at a time and deduplicated after each byte. Stack depth ([`MAX_DEPTH`]), the number of
//! live stacks ([`MAX_STACKS`]) and the work per byte are bounded, so a hostile grammar makes a
//! byte rejected, never a hang or an unbounded allocation. [`VocabTrie`] (`trie.rs`) finds every
//! token of a vocabulary that the matcher accepts, walking a byte trie of the vocabulary with the
//! matcher's transitions cached per walk.
//!
//! The server samples normally and checks the chosen token with [`Matcher::accepts`]; only when
//! it is refused does it mask the logits with [`VocabTrie::allowed`] (end of generation allowed
//! only when [`Matcher::is_complete`]) and sample again.

mod calls;
mod gbnf;
mod json;
mod matcher;
mod trie;
mod utf8;

use std::fmt;

pub use calls::{CallPart, Calls};
pub use matcher::{MAX_STEPS, Matcher};
pub use trie::VocabTrie;

/// Most rules a compiled grammar may have (generated helper rules included).
pub const MAX_RULES: usize = 1 << 16;
/// Most symbols (byte sets and rule references, summed over all alternatives) a grammar may have.
pub const MAX_SYMBOLS: usize = 1 << 20;
/// Deepest a matcher's stack may grow, in pending rule returns; deeper nesting is not accepted.
pub const MAX_DEPTH: u32 = 512;
/// Most stacks a matcher keeps alive at once; a byte that would need more is refused.
pub const MAX_STACKS: usize = 4096;

/// A set of bytes: one terminal symbol of a grammar.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub(crate) struct ByteSet([u64; 4]);

impl ByteSet {
    /// The set holding only `b`.
    pub(crate) fn byte(b: u8) -> ByteSet {
        let mut s = ByteSet::default();
        s.insert(b);
        s
    }

    /// The set of bytes `lo..=hi`.
    pub(crate) fn range(lo: u8, hi: u8) -> ByteSet {
        let mut s = ByteSet::default();
        s.insert_range(lo, hi);
        s
    }

    /// The set of the bytes listed.
    pub(crate) fn of(bytes: &[u8]) -> ByteSet {
        let mut s = ByteSet::default();
        for &b in bytes {
            s.insert(b);
        }
        s
    }

    pub(crate) fn insert(&mut self, b: u8) {
        self.0[usize::from(b >> 6)] |= 1 << (b & 63);
    }

    pub(crate) fn insert_range(&mut self, lo: u8, hi: u8) {
        for b in lo..=hi {
            self.insert(b);
        }
    }

    #[inline]
    pub(crate) fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] >> (b & 63) & 1 == 1
    }

    pub(crate) fn union(&self, other: &ByteSet) -> ByteSet {
        let mut s = *self;
        for (a, b) in s.0.iter_mut().zip(other.0) {
            *a |= b;
        }
        s
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
}

/// One symbol of a rule's alternative while a grammar is being built.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Item {
    /// One byte from the set.
    Bytes(ByteSet),
    /// Whatever the rule matches.
    Rule(u32),
}

/// The items matching exactly `bytes`.
pub(crate) fn literal(bytes: &[u8]) -> Vec<Item> {
    bytes
        .iter()
        .map(|&b| Item::Bytes(ByteSet::byte(b)))
        .collect()
}

/// A rule under construction.
struct RuleDef {
    name: String,
    alts: Option<Vec<Vec<Item>>>,
}

/// Builds a grammar rule by rule, bounding its size, then checks and compiles it.
pub(crate) struct Builder {
    /// What errors start with: `gbnf` or `json_schema`.
    context: &'static str,
    rules: Vec<RuleDef>,
    symbols: usize,
}

impl Builder {
    pub(crate) fn new(context: &'static str) -> Builder {
        Builder {
            context,
            rules: Vec::new(),
            symbols: 0,
        }
    }

    /// A new rule, to be defined later with [`Builder::define`].
    pub(crate) fn reserve(&mut self, name: impl Into<String>) -> Result<u32, String> {
        if self.rules.len() >= MAX_RULES {
            return Err(format!(
                "{}: the grammar needs more than {MAX_RULES} rules",
                self.context
            ));
        }
        let id = self.rules.len() as u32;
        self.rules.push(RuleDef {
            name: name.into(),
            alts: None,
        });
        Ok(id)
    }

    /// Gives reserved rule `id` its alternatives.
    pub(crate) fn define(&mut self, id: u32, alts: Vec<Vec<Item>>) -> Result<(), String> {
        self.symbols += alts.iter().map(|a| a.len() + 1).sum::<usize>();
        if self.symbols > MAX_SYMBOLS {
            return Err(format!(
                "{}: the grammar needs more than {MAX_SYMBOLS} symbols",
                self.context
            ));
        }
        if let Some(rule) = self.rules.get_mut(id as usize) {
            rule.alts = Some(alts);
        }
        Ok(())
    }

    /// A new rule with these alternatives.
    pub(crate) fn rule(
        &mut self,
        name: impl Into<String>,
        alts: Vec<Vec<Item>>,
    ) -> Result<u32, String> {
        let id = self.reserve(name)?;
        self.define(id, alts)?;
        Ok(id)
    }

    pub(crate) fn is_defined(&self, id: u32) -> bool {
        self.rules
            .get(id as usize)
            .is_some_and(|r| r.alts.is_some())
    }

    /// `elem` repeated `min` to `max` times (`None`: unbounded), as a sequence of items; linear
    /// in the bounds: `elem` `min` times, then a chain of optional rules (or one looping rule).
    pub(crate) fn repeat(
        &mut self,
        name: &str,
        elem: &[Item],
        min: usize,
        max: Option<usize>,
    ) -> Result<Vec<Item>, String> {
        let mut seq = Vec::with_capacity(elem.len() * min + 1);
        for _ in 0..min {
            seq.extend_from_slice(elem);
            if seq.len() > MAX_SYMBOLS {
                return Err(format!(
                    "{}: the grammar needs more than {MAX_SYMBOLS} symbols",
                    self.context
                ));
            }
        }
        match max {
            None => {
                let star = self.reserve(format!("{name} (repeated)"))?;
                let mut more = elem.to_vec();
                more.push(Item::Rule(star));
                self.define(star, vec![more, Vec::new()])?;
                seq.push(Item::Rule(star));
            }
            Some(max) if max > min => {
                // opt_k: up to k more elements.
                let mut prev: Option<u32> = None;
                for k in 1..=max - min {
                    let id = self.reserve(format!("{name} (up to {k} more)"))?;
                    let mut more = elem.to_vec();
                    if let Some(p) = prev {
                        more.push(Item::Rule(p));
                    }
                    self.define(id, vec![more, Vec::new()])?;
                    prev = Some(id);
                }
                if let Some(p) = prev {
                    seq.push(Item::Rule(p));
                }
            }
            Some(_) => {}
        }
        Ok(seq)
    }

    /// Checks the grammar (every rule defined, no left recursion) and compiles it from `root`.
    pub(crate) fn finish(self, root: u32) -> Result<Grammar, String> {
        let ctx = self.context;
        let mut alts: Vec<&[Vec<Item>]> = Vec::with_capacity(self.rules.len());
        for r in &self.rules {
            match &r.alts {
                Some(a) => alts.push(a),
                None => return Err(format!("{ctx}: rule `{}` is not defined", r.name)),
            }
        }
        if root as usize >= alts.len() {
            return Err(format!("{ctx}: no root rule"));
        }
        let nullable = nullable_rules(&alts);
        if let Some(cycle) = left_recursion(&alts, &nullable) {
            let names: Vec<&str> = cycle
                .iter()
                .map(|&r| self.rules[r as usize].name.as_str())
                .collect();
            return Err(format!(
                "{ctx}: `{}` is left-recursive: it can reach itself without consuming input ({})",
                names[0],
                names.join(" -> ")
            ));
        }
        Ok(Grammar::compile(&self.rules, &alts, root))
    }
}

/// Which rules can match the empty string, in time linear in the grammar's size: each
/// alternative counts the references it still waits on, and a rule found nullable releases the
/// alternatives that refer to it.
fn nullable_rules(alts: &[&[Vec<Item>]]) -> Vec<bool> {
    let mut nullable = vec![false; alts.len()];
    // Per alternative: its rule and how many references are not yet known nullable.
    let mut owner: Vec<u32> = Vec::new();
    let mut waiting: Vec<usize> = Vec::new();
    let mut uses: Vec<Vec<u32>> = vec![Vec::new(); alts.len()];
    let mut queue: Vec<u32> = Vec::new();
    for (r, rule_alts) in alts.iter().enumerate() {
        for alt in rule_alts.iter() {
            if alt.iter().any(|it| matches!(it, Item::Bytes(_))) {
                continue;
            }
            let id = owner.len() as u32;
            owner.push(r as u32);
            waiting.push(alt.len());
            for it in alt {
                if let Item::Rule(x) = it
                    && let Some(u) = uses.get_mut(*x as usize)
                {
                    u.push(id);
                }
            }
            if alt.is_empty() && !nullable[r] {
                nullable[r] = true;
                queue.push(r as u32);
            }
        }
    }
    while let Some(x) = queue.pop() {
        for &a in &uses[x as usize] {
            waiting[a as usize] -= 1;
            let r = owner[a as usize] as usize;
            if waiting[a as usize] == 0 && !nullable[r] {
                nullable[r] = true;
                queue.push(r as u32);
            }
        }
    }
    nullable
}

/// A cycle of rules each reachable at the start of the previous one (through nullable
/// prefixes), if there is one: the path, starting and ending at the same rule.
fn left_recursion(alts: &[&[Vec<Item>]], nullable: &[bool]) -> Option<Vec<u32>> {
    let mut last_from = vec![u32::MAX; alts.len()];
    let edges: Vec<Vec<u32>> = alts
        .iter()
        .enumerate()
        .map(|(r, rule_alts)| {
            let mut out = Vec::new();
            for alt in rule_alts.iter() {
                for it in alt {
                    match it {
                        Item::Bytes(_) => break,
                        Item::Rule(x) => {
                            if last_from[*x as usize] != r as u32 {
                                last_from[*x as usize] = r as u32;
                                out.push(*x);
                            }
                            if !nullable[*x as usize] {
                                break;
                            }
                        }
                    }
                }
            }
            out
        })
        .collect();
    // Iterative depth-first search: 0 unvisited, 1 on the path, 2 done.
    let mut color = vec![0u8; alts.len()];
    for start in 0..alts.len() {
        if color[start] != 0 {
            continue;
        }
        let mut path: Vec<(u32, usize)> = vec![(start as u32, 0)];
        color[start] = 1;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            if let Some(&child) = edges[node as usize].get(*next) {
                *next += 1;
                match color[child as usize] {
                    0 => {
                        color[child as usize] = 1;
                        path.push((child, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(n, _)| n == child).unwrap_or(0);
                        let mut cycle: Vec<u32> = path[from..].iter().map(|&(n, _)| n).collect();
                        cycle.push(child);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                color[node as usize] = 2;
                path.pop();
            }
        }
    }
    None
}

/// One symbol of a compiled grammar.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Sym {
    /// One byte from `sets[i]`.
    Bytes(u32),
    /// Whatever rule `i` matches.
    Rule(u32),
    /// The end of an alternative.
    End,
}

/// A compiled context-free grammar over bytes.
///
/// Every alternative is stored as consecutive symbols ending in an end marker; a position in the
/// grammar is an index into that array.
pub struct Grammar {
    syms: Vec<Sym>,
    sets: Vec<ByteSet>,
    /// Start position of every alternative, grouped by rule.
    alt_starts: Vec<u32>,
    /// Each rule's range in `alt_starts`.
    rule_alts: Vec<(u32, u32)>,
    names: Vec<String>,
    root: u32,
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grammar")
            .field("rules", &self.rule_alts.len())
            .field("symbols", &self.syms.len())
            .field("byte_sets", &self.sets.len())
            .field("root", &self.names.get(self.root as usize))
            .finish()
    }
}

impl Grammar {
    /// Any JSON object (OpenAI's `json_object`): `{ ... }` with arbitrary nested JSON values.
    ///
    /// Nesting is limited to 64 levels (serde_json parses 128), numbers to 20 digits before and
    /// after the point and a two-digit exponent, whitespace between tokens to one optional newline
    /// and up to 20 spaces or tabs.
    pub fn json_object() -> Grammar {
        json::json_object()
    }

    /// Output that is valid JSON and valid against `schema`; Err(message) naming the unsupported
    /// keyword/path, e.g. "json_schema: `patternProperties` at /properties/a is not supported".
    ///
    /// See the `json` module for the supported subset of JSON Schema.
    pub fn from_json_schema(schema: &serde_json::Value) -> Result<Grammar, String> {
        json::from_schema(schema)
    }

    /// Tool calls of the given forms (`calls.rs`): a family's syntax around arguments valid
    /// against each tool's parameter schema; Err names what in a schema cannot be followed.
    pub fn tool_calls(calls: &Calls) -> Result<Grammar, String> {
        calls::grammar(calls)
    }

    /// llama.cpp GBNF text (root rule `root`); Err names the line/column and problem.
    pub fn from_gbnf(text: &str) -> Result<Grammar, String> {
        gbnf::parse(text)
    }

    fn compile(rules: &[RuleDef], alts: &[&[Vec<Item>]], root: u32) -> Grammar {
        // A reference to a rule that is one byte set is that byte set.
        let inline: Vec<Option<ByteSet>> = alts
            .iter()
            .map(|a| match a {
                [alt] => match alt.as_slice() {
                    [Item::Bytes(s)] => Some(*s),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let mut g = Grammar {
            syms: Vec::new(),
            sets: Vec::new(),
            alt_starts: Vec::new(),
            rule_alts: Vec::with_capacity(alts.len()),
            names: rules.iter().map(|r| r.name.clone()).collect(),
            root,
        };
        let mut set_ids = std::collections::HashMap::new();
        for rule_alts in alts {
            let first = g.alt_starts.len() as u32;
            for alt in rule_alts.iter() {
                let resolved: Vec<Item> = alt
                    .iter()
                    .map(|it| match it {
                        Item::Rule(r) => inline[*r as usize].map_or(*it, Item::Bytes),
                        Item::Bytes(_) => *it,
                    })
                    .collect();
                // An alternative needing a byte from an empty set can never match.
                if resolved
                    .iter()
                    .any(|it| matches!(it, Item::Bytes(s) if s.is_empty()))
                {
                    continue;
                }
                g.alt_starts.push(g.syms.len() as u32);
                for it in resolved {
                    g.syms.push(match it {
                        Item::Rule(r) => Sym::Rule(r),
                        Item::Bytes(s) => {
                            let next = g.sets.len() as u32;
                            let id = *set_ids.entry(s).or_insert(next);
                            if id == next {
                                g.sets.push(s);
                            }
                            Sym::Bytes(id)
                        }
                    });
                }
                g.syms.push(Sym::End);
            }
            g.rule_alts.push((first, g.alt_starts.len() as u32));
        }
        g
    }

    /// The symbol at position `pos`.
    #[inline]
    pub(crate) fn sym(&self, pos: u32) -> Sym {
        self.syms.get(pos as usize).copied().unwrap_or(Sym::End)
    }

    /// The byte set at `pos`, if `pos` is a [`Sym::Bytes`] position.
    #[inline]
    pub(crate) fn set_at(&self, pos: u32) -> Option<&ByteSet> {
        match self.sym(pos) {
            Sym::Bytes(i) => self.sets.get(i as usize),
            _ => None,
        }
    }

    /// The start positions of rule `r`'s alternatives.
    #[inline]
    pub(crate) fn alts(&self, r: u32) -> &[u32] {
        match self.rule_alts.get(r as usize) {
            Some(&(a, b)) => &self.alt_starts[a as usize..b as usize],
            None => &[],
        }
    }

    pub(crate) fn root(&self) -> u32 {
        self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_recursion_is_refused_with_the_cycle() {
        let mut b = Builder::new("test");
        let a = b.reserve("a").expect("rule");
        let c = b.reserve("c").expect("rule");
        b.define(
            a,
            vec![vec![Item::Rule(c), Item::Bytes(ByteSet::byte(b'x'))]],
        )
        .expect("define");
        b.define(c, vec![vec![Item::Rule(a)], literal(b"y")])
            .expect("define");
        let err = b.finish(a).expect_err("left-recursive");
        assert!(
            err.contains("left-recursive") && err.contains("a -> c -> a"),
            "{err}"
        );
    }

    #[test]
    fn left_recursion_through_a_nullable_prefix_is_refused() {
        let mut b = Builder::new("test");
        let e = b.rule("e", vec![Vec::new(), literal(b"z")]).expect("rule");
        let a = b.reserve("a").expect("rule");
        b.define(
            a,
            vec![
                vec![
                    Item::Rule(e),
                    Item::Rule(a),
                    Item::Bytes(ByteSet::byte(b'x')),
                ],
                Vec::new(),
            ],
        )
        .expect("define");
        assert!(
            b.finish(a)
                .expect_err("left-recursive")
                .contains("`a` is left-recursive")
        );
    }

    #[test]
    fn grammars_and_matchers_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Grammar>();
        shared::<Matcher>();
        shared::<VocabTrie>();
    }

    #[test]
    fn grammar_size_is_bounded() {
        let mut b = Builder::new("test");
        let err = b
            .repeat("x", &literal(b"ab"), MAX_SYMBOLS, None)
            .expect_err("too big");
        assert!(err.contains("symbols"), "{err}");
    }
}
