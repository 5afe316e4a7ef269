//! Choosing the next token: greedy, or llama.cpp's chain — repetition, presence and frequency
//! penalties, top-k, top-p, min-p, temperature — then a seeded draw. The same seed and inputs give the same tokens.

/// Sampling settings; the defaults are llama.cpp server's.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 or less means greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1 = all).
    pub top_p: f32,
    /// Drop tokens below min_p × the top probability (0 = none).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted from the logit of every recent token (OpenAI's presence penalty; 0 = off).
    pub presence_penalty: f32,
    /// Subtracted once per recent occurrence (OpenAI's frequency penalty; 0 = off).
    pub frequency_penalty: f32,
    /// Seed of the draw.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

/// A sampler with its random state.
pub struct Sampler {
    settings: Sampling,
    state: u64,
}

impl Sampler {
    /// A sampler seeded from the settings.
    pub fn new(settings: Sampling) -> Sampler {
        let state = settings.seed ^ 0x9e37_79b9_7f4a_7c15;
        Sampler { settings, state }
    }

    /// A uniform draw in [0, 1) (SplitMix64).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The logits with the repetition, presence and frequency penalties applied to the recent
    /// tokens of `history`; `None` when every penalty is off.
    fn penalised(&self, logits: &[f32], history: &[u32]) -> Option<Vec<f32>> {
        let s = &self.settings;
        if s.repeat_penalty == 1.0 && s.presence_penalty == 0.0 && s.frequency_penalty == 0.0 {
            return None;
        }
        let mut logits = logits.to_vec();
        let recent = &history[history.len().saturating_sub(s.repeat_last_n)..];
        let mut counts = std::collections::HashMap::new();
        for &t in recent {
            *counts.entry(t).or_insert(0u32) += 1;
        }
        for (t, count) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                if *l > 0.0 {
                    *l /= s.repeat_penalty;
                } else {
                    *l *= s.repeat_penalty;
                }
                *l -= count as f32 * s.frequency_penalty + s.presence_penalty;
            }
        }
        Some(logits)
    }

    /// The next token given the logits and the tokens so far.
    pub fn next(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let candidates = self.candidates(logits, history);
        self.draw(&candidates)
    }

    /// What the draw chooses among, after the whole chain: the tokens the filters keep, most
    /// likely first, each with its probability at the temperature (llama.cpp's
    /// post-sampling probabilities). Greedy leaves the most likely token alone, certain.
    pub fn candidates(&self, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
        let penalised = self.penalised(logits, history);
        let logits = penalised.as_deref().unwrap_or(logits);
        let s = &self.settings;
        if s.temperature <= 0.0 {
            return vec![(argmax(logits), 1.0)];
        }
        // Candidates, most likely first (ties by id: a total order, so selecting the top k
        // before sorting gives the same list as sorting everything, for a fraction of the cost
        // over a vocabulary of tens of thousands).
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if s.top_k > 0 && s.top_k < cands.len() {
            cands.select_nth_unstable_by(s.top_k - 1, order);
            cands.truncate(s.top_k);
        }
        cands.sort_unstable_by(order);
        let probs = |c: &[(u32, f32)], temp: f32| -> Vec<f64> {
            let max = c.first().map_or(0.0, |x| x.1);
            let e: Vec<f64> = c
                .iter()
                .map(|x| f64::from((x.1 - max) / temp).exp())
                .collect();
            let sum: f64 = e.iter().sum();
            e.into_iter().map(|v| v / sum).collect()
        };
        if s.top_p < 1.0 {
            let p = probs(&cands, 1.0);
            let mut acc = 0.0;
            let keep = p.iter().position(|&q| {
                acc += q;
                acc >= f64::from(s.top_p)
            });
            cands.truncate(keep.map_or(cands.len(), |k| k + 1));
        }
        if s.min_p > 0.0 {
            let p = probs(&cands, 1.0);
            let floor = p[0] * f64::from(s.min_p);
            let kept = p.iter().take_while(|&&q| q >= floor).count().max(1);
            cands.truncate(kept);
        }
        let p = probs(&cands, s.temperature);
        cands.iter().map(|c| c.0).zip(p).collect()
    }

    /// A seeded draw among `candidates` (as [`Sampler::candidates`] gives them); a certain
    /// one takes no draw, so greedy leaves the random state as it was.
    pub fn draw(&mut self, candidates: &[(u32, f64)]) -> u32 {
        match candidates {
            [] => 0,
            [(only, _)] if self.settings.temperature <= 0.0 => *only,
            _ => {
                let mut r = self.uniform();
                for &(id, q) in candidates {
                    if r < q {
                        return id;
                    }
                    r -= q;
                }
                candidates.last().map_or(0, |c| c.0)
            }
        }
    }
}

/// The id of the largest logit, the lowest among equals (0 for none).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate().skip(1) {
        if l.total_cmp(&logits[best]).is_gt() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            ..Sampling::default()
        }
    }

    #[test]
    fn greedy_takes_the_largest_logit_and_the_lowest_id_on_ties() {
        let mut s = Sampler::new(greedy());
        assert_eq!(s.next(&[0.1, 2.0, -1.0, 2.0], &[]), 1);
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens_and_filters_hold() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 17) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(Sampling {
                seed,
                ..Sampling::default()
            });
            (0..50).map(|_| s.next(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // top_k = 1 is greedy whatever the temperature.
        let mut s = Sampler::new(Sampling {
            top_k: 1,
            temperature: 5.0,
            ..Sampling::default()
        });
        assert!((0..20).all(|_| s.next(&logits, &[]) == 16));
        // min_p keeps only tokens near the best one: here those with the top logit.
        let mut s = Sampler::new(Sampling {
            min_p: 0.99,
            top_k: 0,
            ..Sampling::default()
        });
        assert!((0..50).all(|_| s.next(&logits, &[]) % 17 == 16));
    }

    #[test]
    fn top_k_keeps_the_k_most_likely_and_the_lowest_ids_among_equals() {
        // Ten equal logits and a smaller one: the three kept are ids 0-2, each drawn.
        let mut logits = vec![1.0f32; 10];
        logits.insert(0, 0.5);
        let mut s = Sampler::new(Sampling {
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            ..Sampling::default()
        });
        let drawn: std::collections::BTreeSet<u32> =
            (0..300).map(|_| s.next(&logits, &[])).collect();
        assert_eq!(drawn, [1, 2, 3].into_iter().collect());
        // The k largest wherever they sit, in any vocabulary order.
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32).collect();
        let mut s = Sampler::new(Sampling {
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 100.0,
            ..Sampling::default()
        });
        let best: std::collections::BTreeSet<u32> = (995..1000)
            .map(|v| logits.iter().position(|&l| l == v as f32).unwrap_or(0) as u32)
            .collect();
        let drawn: std::collections::BTreeSet<u32> =
            (0..500).map(|_| s.next(&logits, &[])).collect();
        assert_eq!(drawn, best);
    }

    #[test]
    fn candidates_are_what_the_filters_keep_with_their_probabilities_at_the_temperature() {
        let logits = [0.0f32, 2.0, 1.0, 3.0, -1.0];
        let s = Sampler::new(Sampling {
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 2.0,
            ..Sampling::default()
        });
        let c = s.candidates(&logits, &[]);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 1, 2]);
        let z: f64 = [3.0f64, 2.0, 1.0].iter().map(|l| (l / 2.0).exp()).sum();
        for (&(_, p), l) in c.iter().zip([3.0f64, 2.0, 1.0]) {
            assert!((p - (l / 2.0).exp() / z).abs() < 1e-12);
        }
        // min_p drops what is far below the best; greedy leaves the best alone, certain.
        let s = Sampler::new(Sampling {
            top_k: 0,
            min_p: 0.3,
            top_p: 1.0,
            temperature: 1.0,
            ..Sampling::default()
        });
        assert_eq!(s.candidates(&logits, &[]).len(), 2);
        let s = Sampler::new(greedy());
        assert_eq!(s.candidates(&logits, &[]), vec![(3, 1.0)]);
    }

    #[test]
    fn repetition_penalty_lowers_recent_tokens() {
        let mut s = Sampler::new(Sampling {
            repeat_penalty: 4.0,
            ..greedy()
        });
        assert_eq!(s.next(&[1.0, 3.0, 2.0], &[1]), 2);
    }

    #[test]
    fn presence_and_frequency_penalties_lower_recent_tokens_by_their_count() {
        let mut s = Sampler::new(Sampling {
            frequency_penalty: 0.6,
            ..greedy()
        });
        // Token 1 seen twice: 3.0 − 1.2 < 2.0; token 2 seen once: 2.0 − 0.6 > 1.2.
        assert_eq!(s.next(&[0.0, 3.0, 2.0], &[1, 1]), 2);
        let mut s = Sampler::new(Sampling {
            presence_penalty: 2.0,
            ..greedy()
        });
        assert_eq!(s.next(&[0.0, 3.0, 2.0], &[1, 1, 1]), 2);
        assert_eq!(s.next(&[0.0, 3.0, 2.0], &[]), 1);
    }
}
