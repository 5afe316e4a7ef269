//! Teacher-forced comparison with a golden llama.cpp recorded (`goldens/record.py`): feed the
//! golden's prompt and llama.cpp's greedy continuation, and at every generated position compare
//! our log-probabilities of llama.cpp's top-5 tokens with its own.

use std::path::Path;

use engine::model::{KvCache, Model, log_softmax};
use engine::model_file::ModelFile;
use serde_json::Value;

/// Per-position limits on |Δ logprob| over the reference's top tokens.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub mean: f32,
    pub max: f32,
}

/// A recording: the prompt, llama.cpp's greedy continuation and, at each generated position,
/// its top tokens with their log-probabilities.
pub struct Golden {
    pub name: String,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub top: Vec<Vec<(u32, f32)>>,
}

impl Golden {
    pub fn load(path: &Path) -> Golden {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("golden")).expect("json");
        let ids = |v: &Value| -> Vec<u32> {
            v.as_array()
                .expect("array")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect()
        };
        let top = golden["top"]
            .as_array()
            .expect("top")
            .iter()
            .map(|p| {
                p.as_array()
                    .expect("pos")
                    .iter()
                    .map(|t| {
                        (
                            t[0].as_u64().expect("id") as u32,
                            t[1].as_f64().expect("lp") as f32,
                        )
                    })
                    .collect()
            })
            .collect();
        Golden {
            name,
            prompt: ids(&golden["prompt_tokens"]),
            tokens: ids(&golden["tokens"]),
            top,
        }
    }

    /// Runs the prompt and the golden's tokens through `model` step by step and calls `each`
    /// with every generated position and our log-probabilities there.
    pub fn teacher_forced(&self, model: &Path, mut each: impl FnMut(usize, &[f32])) {
        let file = ModelFile::open(model).expect("open");
        let model = Model::load(&file).expect("load");
        let sequence: Vec<u32> = self.prompt.iter().chain(&self.tokens).copied().collect();
        let mut cache = KvCache::new(&model.hparams, sequence.len()).expect("cache");
        for (pos, &token) in sequence[..sequence.len() - 1].iter().enumerate() {
            let logits = model.step(token, pos, &mut cache).expect("step");
            if let Some(g) = (pos + 1).checked_sub(self.prompt.len()) {
                each(g, &log_softmax(logits));
            }
        }
    }
}

/// Largest |Δ logprob| over a position's reference tokens.
fn worst_delta(reference: &[(u32, f32)], value: impl Fn(u32) -> f32) -> f32 {
    reference
        .iter()
        .map(|&(id, lp)| (value(id) - lp).abs())
        .fold(0.0, f32::max)
}

/// The golden `golden` against the same sequence scored in float64 (`exact`, written by
/// `goldens/exact_forward.py`): at every position, the largest distance from the exact values
/// over llama.cpp's top tokens, ours and llama.cpp's. Ours may be no farther on average than
/// llama.cpp's beyond chance (the mean of the paired differences at most two standard errors
/// above zero) and no position farther than `worst`.
pub fn check_exact(golden: &Path, exact: &Path, model: &Path, worst: f32) {
    let golden = Golden::load(golden);
    let exact = Golden::load(exact);
    assert_eq!(
        (&exact.prompt, &exact.tokens),
        (&golden.prompt, &golden.tokens),
        "{}: the exact scores are of another sequence",
        golden.name
    );
    let mut differences = Vec::with_capacity(golden.tokens.len());
    let (mut ours_total, mut llama_total) = (0f64, 0f64);
    golden.teacher_forced(model, |g, ours| {
        let truth = &exact.top[g];
        let llama = worst_delta(truth, |id| {
            golden.top[g]
                .iter()
                .find(|t| t.0 == id)
                .expect("same ids")
                .1
        });
        let mine = worst_delta(truth, |id| ours[id as usize]);
        assert!(
            mine < worst,
            "{} position {g}: {mine} nats from the exact value (llama.cpp: {llama})",
            golden.name
        );
        ours_total += f64::from(mine);
        llama_total += f64::from(llama);
        differences.push(f64::from(mine - llama));
    });
    let n = differences.len() as f64;
    let mean = differences.iter().sum::<f64>() / n;
    let variance = differences.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let standard_error = (variance / n).sqrt();
    let (ours, llama) = (ours_total / n, llama_total / n);
    eprintln!(
        "{}: mean distance from the exact values {ours:.4} (llama.cpp {llama:.4}), paired \
         difference {mean:+.4} ± {standard_error:.4}",
        golden.name
    );
    assert!(
        mean <= 2.0 * standard_error,
        "{}: farther from the exact values than llama.cpp: {ours:.4} against {llama:.4} on average",
        golden.name
    );
}

/// The golden at `golden` (a JSON file) against `model`: mean and max |Δ logprob| at each
/// position within `limits`; our top-1 within 1.0 of the reference's top-1; and the same greedy
/// token as the reference up to its first position whose top-1/top-2 margin is below 1.0.
/// Returns the worst mean and max seen.
pub fn check(golden: &Path, model: &Path, limits: Limits) -> (f32, f32) {
    let golden = Golden::load(golden);
    let name = &golden.name;
    let mut identical = true;
    let mut worst_mean = 0f32;
    let mut worst_max = 0f32;
    golden.teacher_forced(model, |g, ours| {
        let reference = &golden.top[g];
        let deltas: Vec<f32> = reference
            .iter()
            .map(|&(id, lp)| (ours[id as usize] - lp).abs())
            .collect();
        let mean = deltas.iter().sum::<f32>() / deltas.len() as f32;
        let max = deltas.iter().copied().fold(0.0, f32::max);
        worst_mean = worst_mean.max(mean);
        worst_max = worst_max.max(max);
        assert!(
            mean < limits.mean && max < limits.max,
            "{name} position {g}: mean |Δ| {mean}, max {max}"
        );
        let our_top = ours
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .expect("top");
        let ref_lp_of_ours = reference.iter().find(|(id, _)| *id == our_top).map(|t| t.1);
        assert!(
            ref_lp_of_ours.is_some_and(|lp| lp >= reference[0].1 - 1.0),
            "{name} position {g}: our top-1 {our_top} is not within 1.0 of llama.cpp's top-1 {:?}",
            reference[0]
        );
        let margin = reference[0].1 - reference.get(1).map_or(f32::NEG_INFINITY, |t| t.1);
        identical &= margin >= 1.0;
        if identical {
            assert_eq!(
                our_top, golden.tokens[g],
                "{name} position {g}: greedy token differs"
            );
        }
    });
    eprintln!("{name}: worst mean |Δ logprob| {worst_mean}, worst max {worst_max}");
    (worst_mean, worst_max)
}
