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

/// The golden at `golden` (a JSON file) against `model`: mean and max |Δ logprob| at each
/// position within `limits`; our top-1 within 1.0 of the reference's top-1; and the same greedy
/// token as the reference up to its first position whose top-1/top-2 margin is below 1.0.
/// Returns the worst mean and max seen.
pub fn check(golden: &Path, model: &Path, limits: Limits) -> (f32, f32) {
    let name = golden
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(golden).expect("golden")).expect("json");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    let prompt = ids(&golden["prompt_tokens"]);
    let tokens = ids(&golden["tokens"]);
    let tops: Vec<Vec<(u32, f32)>> = golden["top"]
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

    let file = ModelFile::open(model).expect("open");
    let model = Model::load(&file).expect("load");
    let sequence: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
    let mut cache = KvCache::new(&model.hparams, sequence.len()).expect("cache");
    let mut identical = true;
    let mut worst_mean = 0f32;
    let mut worst_max = 0f32;
    for (pos, &token) in sequence[..sequence.len() - 1].iter().enumerate() {
        let logits = model.step(token, pos, &mut cache).expect("step");
        let g = match (pos + 1).checked_sub(prompt.len()) {
            Some(g) => g,
            None => continue,
        };
        let ours = log_softmax(logits);
        let reference = &tops[g];
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
                our_top, tokens[g],
                "{name} position {g}: greedy token differs"
            );
        }
    }
    eprintln!("{name}: worst mean |Δ logprob| {worst_mean}, worst max {worst_max}");
    (worst_mean, worst_max)
}
