//! Qwen 3.5's built-in multi-token-prediction layer (nextn) as a draft source, on the tiny
//! random `qwen35` and `qwen35moe` models (each with its nextn layer after the trunk): drafting
//! from it changes no generated token, greedy or seeded; its keys and values mirror every pass,
//! so a cache that went through rejected drafts drafts exactly what a cache that never drafted
//! does; and the server drafts from it when asked (`--spec mtp`, no head file).

mod common;

use engine::model::{DraftHead, DraftWork, KvCache, Logits, Model};
use engine::model_file::ModelFile;
use test_support::tiny::{MODELS, Tiny, gguf_bytes};

fn qwen35_models() -> impl Iterator<Item = &'static Tiny> {
    MODELS.iter().filter(|t| t.arch.starts_with("qwen35"))
}

/// `t` written to a temporary directory.
fn written(t: &Tiny) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{}.gguf", t.name));
    std::fs::write(&path, gguf_bytes(t)).expect("write the model");
    (dir, path)
}

#[test]
fn drafting_from_the_nextn_layer_changes_no_token() {
    for t in qwen35_models() {
        let (_dir, path) = written(t);
        let file = ModelFile::open(&path).expect("open");
        let model = Model::load(&file).expect("load");
        let head = DraftHead::nextn(&model).expect("the file holds a nextn layer");
        common::drafts::change_no_token(&model, &head, t.name);
    }
}

/// The draft (token and logits) after `history`, from a cache that took all but its last
/// token as `passes` (each run from where the last ended; a pass given with rejected drafts
/// runs them too and is then resumed back to its kept tokens), then the last token alone, with
/// the mirror on or off.
fn draft_after(
    model: &Model<'_>,
    head: &DraftHead<'_>,
    history: &[u32],
    passes: &[(usize, &[u32])],
    mirror: bool,
) -> (u32, Vec<f32>) {
    let mut cache = KvCache::on_threads(&model.hparams, 128, 2).expect("cache");
    if mirror {
        head.prepare(&mut cache);
    }
    let mut at = 0;
    for &(kept, rejected) in passes {
        let mut input = history[at..at + kept].to_vec();
        input.extend_from_slice(rejected);
        if !rejected.is_empty() {
            cache.mark();
        }
        model
            .forward(&input, at, &mut cache, Logits::Last)
            .expect("pass");
        at += kept;
        assert_eq!(cache.resume(at), at, "the cache resumes at the kept tokens");
    }
    assert_eq!(at, history.len() - 1);
    model
        .forward(&history[at..], at, &mut cache, Logits::Last)
        .expect("the last token");
    let hidden = cache
        .hidden(0, model.hparams.n_embd)
        .expect("hidden")
        .to_vec();
    let mut work = DraftWork::default();
    let draft = head
        .draft(
            model,
            &mut cache,
            17,
            &hidden,
            (history.len(), 0),
            &mut work,
        )
        .expect("draft");
    (draft.token, work.logits().to_vec())
}

#[test]
fn rejected_drafts_leave_the_layer_drafting_what_it_would_have() {
    for t in qwen35_models() {
        let (_dir, path) = written(t);
        let file = ModelFile::open(&path).expect("open");
        let model = Model::load(&file).expect("load");
        let head = DraftHead::nextn(&model).expect("nextn");
        let history: Vec<u32> = test_support::tiny::prompt()
            .iter()
            .copied()
            .chain([40, 41, 42, 43, 44, 45, 46])
            .collect();
        let n = history.len();
        let clean = draft_after(&model, &head, &history, &[(n - 1, &[])], true);
        // A prompt, then verify passes whose drafts were partly rejected.
        let bumpy: [(usize, &[u32]); 4] = [(n - 7, &[]), (2, &[9, 9, 9]), (1, &[3]), (3, &[5, 6])];
        let drafted = draft_after(&model, &head, &history, &bumpy, true);
        assert_eq!(drafted.0, clean.0, "{}", t.name);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&drafted.1) == bits(&clean.1),
            "{}: draft logits",
            t.name
        );
        // Without the mirror the layer attends to nothing it should: other logits.
        let blind = draft_after(&model, &head, &history, &[(n - 1, &[])], false);
        assert!(
            bits(&blind.1) != bits(&clean.1),
            "{}: the mirror matters",
            t.name
        );
    }
}

/// `engine serve --spec mtp` on a model with a nextn layer drafts from it (no head file) and
/// answers as without drafting; a model without one is refused with what to do.
#[test]
fn the_server_drafts_from_the_nextn_layer() {
    use common::serve::{get_json, post, start_model};
    use serde_json::json;
    let t = qwen35_models().next().expect("tiny qwen35");
    let (_dir, path) = written(t);
    let server = start_model(&path, &["--spec", "mtp"], &[]);
    assert_eq!(get_json(&server, "/health")["speculation"], "mtp");
    let body = |n_max: i64| {
        json!({ "prompt": test_support::tiny::prompt(), "n_predict": 24, "temperature": 0,
                "speculative.n_max": n_max })
    };
    let (status, on) = post(&server, "/completion", &body(3));
    assert_eq!(status, 200, "{on}");
    let (_, off) = post(&server, "/completion", &body(0));
    assert!(!on["content"].as_str().expect("content").is_empty(), "{on}");
    assert_eq!(on["content"], off["content"], "the same text either way");
    assert!(
        on["timings"]["draft_n"].as_u64().expect("draft_n") > 0,
        "{on}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["generate", "-m"])
        .arg(common::smollm2())
        .args(["--spec", "mtp", "-p", "Hi", "-n", "2"])
        .output()
        .expect("engine generate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("nextn layer"),
        "{stderr}"
    );
}
