//! Kept conversation caches: the KV cache of recent conversations with the tokens each holds,
//! so a request that starts with them only prefills the rest (reported as `cache_n`).

use crate::model::{DraftHead, KvCache, Logits, Model};

/// A conversation's cache and the tokens it holds.
pub(super) struct Cached {
    pub(super) cache: KvCache,
    pub(super) tokens: Vec<u32>,
}

impl Cached {
    /// A copy of its first `shared` tokens' cache (what a branching request reuses).
    fn copy(&self, shared: usize) -> Cached {
        Cached {
            cache: self.cache.copy_prefix(shared),
            tokens: self.tokens[..shared.min(self.tokens.len())].to_vec(),
        }
    }
}

/// Kept conversation caches, least recently used first, within a memory budget; the warm
/// system-prompt cache is pinned and only ever copied.
pub(super) struct Caches {
    budget: usize,
    kept: Vec<Cached>,
    pinned: Option<Cached>,
}

impl Caches {
    pub(super) fn new(budget: usize) -> Caches {
        Caches {
            budget,
            kept: Vec::new(),
            pinned: None,
        }
    }

    pub(super) fn warm(
        &mut self,
        (model, head): (&Model<'static>, Option<&DraftHead<'static>>),
        tokens: &[u32],
        context: usize,
        threads: usize,
    ) -> Result<(), String> {
        if self.budget == 0 || tokens.is_empty() || tokens.len() >= context {
            return Ok(());
        }
        let mut cache = KvCache::on_threads(&model.hparams, context, threads)?;
        if let Some(head) = head {
            head.prepare(&mut cache);
        }
        model.forward(tokens, 0, &mut cache, Logits::None)?;
        self.pinned = Some(Cached {
            cache,
            tokens: tokens.to_vec(),
        });
        Ok(())
    }

    /// The kept cache sharing the longest prefix with `prompt`, if any shares at least one
    /// token: taken out when the prompt continues it, else copied (always for the pinned one).
    pub(super) fn best_for(&mut self, prompt: &[u32]) -> Option<Cached> {
        let (at, shared) = self
            .kept
            .iter()
            .enumerate()
            .map(|(i, c)| (i, common_prefix(&c.tokens, prompt)))
            .max_by_key(|&(i, n)| (n, i))
            .unwrap_or((0, 0));
        let pinned = self
            .pinned
            .as_ref()
            .map_or(0, |p| common_prefix(&p.tokens, prompt));
        if pinned >= shared {
            return self
                .pinned
                .as_ref()
                .filter(|_| pinned > 0)
                .map(|p| p.copy(pinned));
        }
        if shared == 0 {
            return None;
        }
        // A request that continues the conversation takes its cache; one that branches off
        // gets a copy, so the other conversation can still be picked up where it was.
        if shared == self.kept[at].tokens.len() {
            Some(self.kept.remove(at))
        } else {
            Some(self.kept[at].copy(shared))
        }
    }

    /// Keeps `cached` as the most recent, evicting the oldest beyond the budget (one always
    /// stays, unless the budget is zero: no prefix cache).
    pub(super) fn keep(&mut self, cached: Cached) {
        if self.budget == 0 {
            return;
        }
        self.kept.push(cached);
        let pinned = self.pinned.as_ref().map_or(0, |p| p.cache.bytes());
        while self.kept.len() > 1
            && pinned + self.kept.iter().map(|c| c.cache.bytes()).sum::<usize>() > self.budget
        {
            self.kept.remove(0);
        }
    }

    /// Memory held by kept caches, the pinned one included.
    pub(super) fn kept_bytes(&self) -> usize {
        let pinned = self.pinned.as_ref().map_or(0, |p| p.cache.bytes());
        pinned + self.kept.iter().map(|c| c.cache.bytes()).sum::<usize>()
    }

    /// How many caches are kept, the pinned one included.
    pub(super) fn kept_count(&self) -> usize {
        self.kept.len() + usize::from(self.pinned.is_some())
    }

    /// The oldest kept cache to recycle for a new conversation (its memory is reused).
    pub(super) fn recycle(&mut self) -> Option<Cached> {
        let total: usize = self.kept.iter().map(|c| c.cache.bytes()).sum();
        let one = self.kept.first().map_or(0, |c| c.cache.bytes());
        (total + one > self.budget && !self.kept.is_empty()).then(|| self.kept.remove(0))
    }
}

/// Length of the common prefix of `a` and `b`.
pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_pick_the_longest_shared_prefix() {
        let mut caches = Caches::new(usize::MAX);
        let empty = |tokens: Vec<u32>| Cached {
            cache: dummy_cache(),
            tokens,
        };
        caches.keep(empty(vec![1, 2, 3]));
        caches.keep(empty(vec![1, 2, 9, 9]));
        caches.keep(empty(vec![7]));
        // Branching off a conversation copies it; continuing one takes it.
        let best = caches.best_for(&[1, 2, 9, 5]).expect("shared");
        assert_eq!(best.tokens, vec![1, 2, 9], "a copy holds the shared prefix");
        assert_eq!(caches.kept.len(), 3);
        let best = caches.best_for(&[1, 2, 9, 9, 4]).expect("continued");
        assert_eq!(best.tokens, vec![1, 2, 9, 9]);
        assert_eq!(caches.kept.len(), 2);
        assert!(caches.best_for(&[5, 5]).is_none());
        caches.pinned = Some(empty(vec![7, 8, 9]));
        assert_eq!(
            caches.best_for(&[7, 8, 1]).map(|c| c.tokens),
            Some(vec![7, 8])
        );
        assert!(
            caches.pinned.is_some(),
            "the pinned cache is copied, never taken"
        );
    }

    fn dummy_cache() -> KvCache {
        let h = crate::model::Hparams {
            arch: crate::model::Arch::Llama,
            vocab: 4,
            n_embd: 8,
            n_layer: 1,
            n_head: 1,
            n_head_kv: 1,
            head_dim: 8,
            n_ff: 8,
            n_expert: 0,
            n_ff_shared: 0,
            n_expert_used: 0,
            rms_eps: 1e-5,
            rope_base: 10_000.0,
            rope_base_swa: 10_000.0,
            n_rot: 8,
            sliding_window: None,
            attn_scale: 1.0,
            train_context: 16,
            layers: Vec::new(),
            n_embd_per_layer: 0,
            logit_softcap: 0.0,
            n_embd_out: 0,
            delta: None,
            n_nextn: 0,
        };
        let h = crate::model::Hparams {
            layers: h.uniform_layers(),
            ..h
        };
        KvCache::new(&h, 4).expect("cache")
    }

    #[test]
    fn common_prefixes() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
