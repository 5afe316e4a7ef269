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

use common::{gemma3, golden, smollm2};

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
    let limits = golden::Limits {
        mean: MEAN_LIMIT,
        max: MAX_LIMIT,
    };
    golden::check(&path, &model_for(golden_file), limits);
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

/// 512 tokens of code after an 88-token chat, past Gemma 3's 512-token sliding window. Over so
/// long an answer llama.cpp moves against itself far more than over the short goldens: scored
/// teacher-forced on its own tokens in other configurations (`teacher_forced.py`: `-ub 1`,
/// `-ub 8`, `-fa off`, `-fa off -ctk f32 -ctv f32`, with and without `-ub 1`), its worst position
/// moves by up to 0.683 mean (`-ub 1`) and 1.803 max (`-ub 8`); its default configuration,
/// which re-processes the whole sequence there, by 0.554 / 1.245. We measure 0.556 / 1.539, and
/// are held to llama.cpp's spread. Which of the two is off where they part is what
/// [`gemma3_code_long_exact`] settles.
#[test]
fn gemma3_code_long() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/gemma3-code-long.json");
    let limits = golden::Limits {
        mean: 0.683,
        max: 1.803,
    };
    golden::check(&path, &gemma3(), limits);
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

/// Llama.cpp's worst position against itself on SmolLM2's 512 tokens of code (`-fa off -ctk f32
/// -ctv f32`, teacher-forced) and on Gemma 3's (`-ub 8`): no position of ours may be farther
/// than that from the exact values.
const SMOLLM2_CODE_WORST: f32 = 1.087;
const GEMMA3_CODE_WORST: f32 = 1.803;

/// The long code answers against the exact values (every weight dequantized, the rest in
/// float64: `goldens/exact_forward.py`). There the positions where we and llama.cpp differ by
/// more than a nat on a top-3 token are explained: each of us is a different sample of the same
/// rounding noise, which comes from quantizing the activations to 8 bits before every matrix
/// product (the integer dots need it; a float64 model that rounds only its activations that way
/// lands as far from the exact values as both engines, while an f16 cache and f16 attention
/// sums move them by a hundredth), and grows on alternatives 8–13 nats below a near-certain
/// top-1. At the worst of those positions llama.cpp is the one off (Gemma 3's 356: exact −9.12,
/// ours −9.36, llama.cpp −7.90). These tests hold us, position by position, to no more than
/// llama.cpp's own distance from the truth on average.
fn code_long_exact(prefix: &str, model: &std::path::Path, worst: f32) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens");
    golden::check_exact(
        &dir.join(format!("{prefix}-code-long.json")),
        &dir.join(format!("{prefix}-code-long.exact.json")),
        model,
        worst,
    );
}

#[test]
fn smollm2_code_long_exact() {
    code_long_exact("smollm2", &smollm2(), SMOLLM2_CODE_WORST);
}

#[test]
fn gemma3_code_long_exact() {
    code_long_exact("gemma3", &gemma3(), GEMMA3_CODE_WORST);
}
