//! Draft sources (multi-token prediction) against llama.cpp 11434: the tiny random Gemma 4 head
//! of `common/tiny.rs` drafts, from the same target states, the tokens llama.cpp's
//! `--spec-type draft-mtp` drafted (its top-3 candidates and their probabilities over the
//! head's top 10, step by step), and so does the tiny Qwen 3.5's own nextn layer; and drafting
//! from the head changes no generated token, greedy or seeded (`nextn.rs` for the layer).
//!
//! Recording: `engine/tests/goldens/record-tiny.sh` (runs `record_mtp.py` on the pair and on
//! the Qwen 3.5 model).

mod common;

use std::path::PathBuf;

use engine::model::{DraftHead, DraftWork, KvCache, Logits, Model};
use engine::model_file::ModelFile;
use sha2::{Digest, Sha256};
use test_support::tiny::{MODELS, Tiny, gemma4_head_bytes, gguf_bytes};

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn target() -> &'static Tiny {
    MODELS
        .iter()
        .find(|t| t.name == "tiny-gemma4-q4_k_m")
        .expect("the tiny Gemma 4")
}

/// The tiny target and its head, written to a temporary directory.
struct Pair {
    _dir: tempfile::TempDir,
    target: PathBuf,
    head: PathBuf,
}

fn pair() -> (Pair, Vec<u8>, Vec<u8>) {
    let t = target();
    let (target_bytes, head_bytes) = (
        gguf_bytes(t),
        gemma4_head_bytes(t, &test_support::tiny::TINY_HEAD),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = Pair {
        target: dir.path().join("target.gguf"),
        head: dir.path().join("head.gguf"),
        _dir: dir,
    };
    std::fs::write(&pair.target, &target_bytes).expect("write the target");
    std::fs::write(&pair.head, &head_bytes).expect("write the head");
    (pair, target_bytes, head_bytes)
}

/// Probabilities of the head's 10 likeliest tokens, renormalised among them (what llama.cpp's
/// top-k 10 draft sampler reports), by token.
fn top10(logits: &[f32]) -> Vec<(u32, f64)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(10);
    let max = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i]) - max).exp())
        .collect();
    let sum: f64 = weights.iter().sum();
    order
        .iter()
        .zip(weights)
        .map(|(&i, w)| (i as u32, w / sum))
        .collect()
}

/// How far a draft probability may be from llama.cpp's: the head drafts from the target's
/// hidden state, which differs from llama.cpp's by the target's own spread (a few hundredths
/// of a nat per log-probability); the worst measured is well inside.
const P_TOLERANCE: f64 = 0.03;

#[test]
fn head_drafts_what_llama_cpp_drafts() {
    let (files, target_bytes, head_bytes) = pair();
    let target_file = ModelFile::open(&files.target).expect("open the target");
    let model = Model::load(&target_file).expect("load the target");
    let head_file = ModelFile::open(&files.head).expect("open the head");
    let head = DraftHead::load(&head_file, &model).expect("load the head");
    drafts_match(
        "tiny-gemma4-q4_k_m-mtp.json",
        &model,
        &head,
        [
            ("model_sha256", &target_bytes),
            ("head_sha256", &head_bytes),
        ],
    );
}

/// Qwen 3.5's nextn layer drafts what llama.cpp's `--spec-type draft-mtp` drafts from it
/// (its own keys and values mirroring the target's passes).
#[test]
fn nextn_layer_drafts_what_llama_cpp_drafts() {
    let t = MODELS
        .iter()
        .find(|t| t.name == "tiny-qwen35-q4_k_m")
        .expect("the tiny Qwen 3.5");
    let bytes = gguf_bytes(t);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("qwen35.gguf");
    std::fs::write(&path, &bytes).expect("write");
    let file = ModelFile::open(&path).expect("open");
    let model = Model::load(&file).expect("load");
    let head = DraftHead::nextn(&model).expect("its nextn layer");
    drafts_match(
        "tiny-qwen35-q4_k_m-mtp.json",
        &model,
        &head,
        [("model_sha256", &bytes), ("head_sha256", &bytes)],
    );
}

/// Each draft call recorded in `golden` (what llama.cpp's draft source drafted, step by step,
/// after the prompt and the continuation before the call's place), drafted again by `head`:
/// the same argmax (but for near ties) and every recorded candidate's probability within
/// [`P_TOLERANCE`].
fn drafts_match(
    golden: &str,
    model: &Model<'_>,
    head: &DraftHead<'_>,
    files: [(&str, &Vec<u8>); 2],
) {
    let golden_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens")
        .join(golden);
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&golden_path).expect("golden"))
            .expect("json");
    for (key, bytes) in files {
        assert_eq!(
            golden[key].as_str(),
            Some(hex(bytes).as_str()),
            "the generator no longer writes the files llama.cpp ran; record again \
             (engine/tests/goldens/record-tiny.sh)"
        );
    }
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect()
    };
    let prompt = ids(&golden["prompt_tokens"]);
    let tokens = ids(&golden["tokens"]);
    let e = model.hparams.n_embd;
    let (mut worst, mut steps_checked, mut firsts_agreeing) = (0f64, 0, 0);
    let calls = golden["calls"].as_array().expect("calls");
    assert!(calls.len() >= 10, "too few draft calls recorded");
    for call in calls {
        let at = call["at"].as_u64().expect("at") as usize;
        // The target holds the prompt and the continuation before token `at`, whose logits
        // chose it: their last hidden state is where the head starts.
        let mut history = prompt.clone();
        history.extend_from_slice(&tokens[..at]);
        let mut cache = KvCache::on_threads(&model.hparams, 512, 2).expect("cache");
        head.prepare(&mut cache);
        model
            .forward(&history, 0, &mut cache, Logits::Last)
            .expect("prefill");
        let mut hidden = cache.hidden(0, e).expect("hidden state").to_vec();
        let mut token = tokens[at];
        // The head's position holds a rejected draft's keys and values, as in decoding: the
        // head must not see them.
        let rejected = (token + 1) % model.hparams.vocab as u32;
        model
            .forward(&[rejected], history.len(), &mut cache, Logits::None)
            .expect("a rejected draft");
        let mut work = DraftWork::default();
        for (step, expected) in call["steps"].as_array().expect("steps").iter().enumerate() {
            let drafted = head
                .draft(
                    model,
                    &mut cache,
                    token,
                    &hidden,
                    (history.len(), step),
                    &mut work,
                )
                .expect("draft");
            let ours = top10(work.logits());
            let theirs: Vec<(u32, f64)> = expected
                .as_array()
                .expect("candidates")
                .iter()
                .map(|c| (c[0].as_u64().expect("id") as u32, c[1].as_f64().expect("p")))
                .collect();
            for &(id, p) in &theirs {
                let mine = ours.iter().find(|(t, _)| *t == id).map_or(0.0, |(_, p)| *p);
                worst = worst.max((mine - p).abs());
                assert!(
                    (mine - p).abs() <= P_TOLERANCE,
                    "call at {at}, step {step}: token {id} has p {mine:.3} here, {p:.3} in \
                     llama.cpp (ours: {:?})",
                    &ours[..3]
                );
            }
            // The argmax is llama.cpp's unless its first two candidates are a near tie.
            let near_tie = theirs.len() > 1 && theirs[0].1 - theirs[1].1 <= P_TOLERANCE;
            assert!(
                drafted.token == theirs[0].0 || near_tie,
                "call at {at}, step {step}: drafted {} where llama.cpp drafted {}",
                drafted.token,
                theirs[0].0
            );
            firsts_agreeing += usize::from(drafted.token == theirs[0].0);
            steps_checked += 1;
            // The next step goes on from llama.cpp's draft, so one near tie does not shift
            // every step after it.
            token = theirs[0].0;
            hidden.clear();
            hidden.extend_from_slice(work.hidden());
        }
    }
    eprintln!(
        "{golden_path:?}: {steps_checked} draft steps: {firsts_agreeing} argmaxes equal, worst \
         probability difference {worst:.4}"
    );
}

/// Greedy and seeded generation give the same tokens with the head drafting as without, and
/// the head drafts.
#[test]
fn drafting_from_the_head_changes_no_token() {
    let (files, _, _) = pair();
    let target_file = ModelFile::open(&files.target).expect("open the target");
    let model = Model::load(&target_file).expect("load the target");
    let head_file = ModelFile::open(&files.head).expect("open the head");
    let head = DraftHead::load(&head_file, &model).expect("load the head");
    common::drafts::change_no_token(&model, &head, "Gemma 4's head");
}

/// `engine serve --model-draft` drafts from the head by default, says so in `/health`, and
/// answers the same with drafting on and off; a head that does not fit the model is refused
/// before the server is ready.
#[test]
fn the_server_drafts_from_the_head() {
    use common::serve::{get_json, post, start_model};
    use serde_json::json;
    let (files, _, _) = pair();
    let head = files.head.to_str().expect("utf8");
    let server = start_model(&files.target, &["--model-draft", head], &[]);
    assert_eq!(get_json(&server, "/health")["speculation"], "mtp");
    let body = |n_max: i64| {
        json!({ "prompt": test_support::tiny::prompt(), "n_predict": 24, "temperature": 0,
                "speculative.n_max": n_max })
    };
    let (status, on) = post(&server, "/completion", &body(3));
    assert_eq!(status, 200, "{on}");
    let (_, off) = post(&server, "/completion", &body(0));
    let text = on["content"].as_str().expect("content");
    assert!(!text.is_empty(), "{on}");
    assert_eq!(on["content"], off["content"], "the same text either way");
    assert!(
        on["timings"]["draft_n"].as_u64().expect("draft_n") > 0,
        "{on}"
    );
    assert_eq!(off["timings"]["draft_n"], 0);
    // The head of another model: refused with what to do.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["generate", "-m"])
        .arg(common::smollm2())
        .args(["--model-draft", head, "-p", "Hi", "-n", "2"])
        .output()
        .expect("engine generate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("drafts for a Gemma 4 model"),
        "{stderr}"
    );
}
