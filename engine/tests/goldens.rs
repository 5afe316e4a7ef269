//! Teacher-forced comparison with llama.cpp: feed each golden's prompt and llama.cpp's greedy
//! continuation, and at every generated position compare our log-probabilities of llama.cpp's
//! top-5 tokens with its own (`goldens/record.py` wrote them; `goldens/build-llama.sh` builds
//! the reference from PyPI).
//!
//! Thresholds: mean and max |Δ logprob| at each position over the reference's top tokens (the
//! limits below say why the mean is not the 0.1); our top-1 within 1.0 of the
//! reference's top-1; and the same greedy token as the reference up to its first position whose
//! top-1/top-2 margin is below 1.0.

mod common;

use common::{gemma3, smollm2};

/// Per-position limits on |Δ logprob| over the reference's top-5. The issue asks for a mean
/// below 0.1, but llama.cpp does not meet that against itself: recorded again with flash
/// attention off and an f32 cache (`record.py … -fa off -ctk f32 -ctv f32`, then `compare.py`),
/// its worst position moves by 0.27 mean / 0.58 max (Gemma 3, ~500-token prompt; 0.20 / 0.39 on
/// SmolLM2). Our kernels reproduce ggml's roundings (Q8 activations, integer dots in its lane
/// order, f16 cache and attention accumulation, its fused rope) and measure 0.23 / 0.53 at worst,
/// inside that floor; these limits hold us there.
const MEAN_LIMIT: f32 = 0.3;
const MAX_LIMIT: f32 = 0.75;

use std::path::PathBuf;

use engine::model::{KvCache, Model, log_softmax};
use engine::model_file::ModelFile;
use serde_json::Value;

/// The model a golden was recorded with, by the golden's name prefix.
fn model_for(golden_file: &str) -> PathBuf {
    match golden_file.split('-').next() {
        Some("smollm2") => smollm2(),
        Some("gemma3") => gemma3(),
        _ => panic!("no model for golden {golden_file}"),
    }
}

fn check(golden_file: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens")
        .join(golden_file);
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("json");
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

    let file = ModelFile::open(&model_for(golden_file)).expect("open");
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
            mean < MEAN_LIMIT && max < MAX_LIMIT,
            "{golden_file} position {g}: mean |Δ| {mean}, max {max}"
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
            "{golden_file} position {g}: our top-1 {our_top} is not within 1.0 of llama.cpp's top-1 {:?}",
            reference[0]
        );
        let margin = reference[0].1 - reference.get(1).map_or(f32::NEG_INFINITY, |t| t.1);
        identical &= margin >= 1.0;
        if identical {
            assert_eq!(
                our_top, tokens[g],
                "{golden_file} position {g}: greedy token differs"
            );
        }
    }
    eprintln!("{golden_file}: worst mean |Δ logprob| {worst_mean}, worst max {worst_max}");
}

#[test]
fn smollm2_raw_short() {
    check("smollm2-raw-short.json");
}

#[test]
fn smollm2_chat_short() {
    check("smollm2-chat-short.json");
}

#[test]
fn smollm2_raw_long() {
    check("smollm2-raw-long.json");
}

#[test]
fn gemma3_raw_short() {
    check("gemma3-raw-short.json");
}

#[test]
fn gemma3_chat_short() {
    check("gemma3-chat-short.json");
}

#[test]
fn gemma3_raw_long() {
    check("gemma3-raw-long.json");
}

/// The chat goldens' prompts were rendered by llama-server's `/apply-template` (SmolLM2's own
/// template; ChatML for Gemma 3, whose GGUF carries none) and tokenized by it: ours must agree
/// on both the text and the ids, BOS included once.
#[test]
fn chat_prompts_render_and_tokenize_as_llama_cpp() {
    use engine::chat::{ChatTemplate, Message};
    use engine::tokenizer::Tokenizer;
    for name in ["smollm2-chat-short.json", "gemma3-chat-short.json"] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/goldens")
            .join(name);
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("json");
        let file = ModelFile::open(&model_for(name)).expect("open");
        let tok = Tokenizer::load(&file).expect("tokenizer");
        let template = ChatTemplate::from_model(&file, &tok).expect("template");
        let messages = [Message::new("user", "Name three primary colours.")];
        let text = template.render(&messages, true).expect("render");
        assert_eq!(text, golden["prompt"].as_str().expect("prompt"), "{name}");
        let ids = template.prompt_ids(&tok, &messages).expect("ids");
        let expected: Vec<u32> =
            serde_json::from_value(golden["prompt_tokens"].clone()).expect("ids");
        assert_eq!(ids, expected, "{name}");
    }
}
