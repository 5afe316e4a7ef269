//! llama.cpp as the independent reference for every architecture: tiny random models
//! (`common/tiny.rs`: llama with grouped-query attention and Llama 3 rope factors, qwen2 with
//! QKV biases, qwen3 with q/k norms and wide heads, qwen3moe with routed experts, gemma3 with local and
//! global layers, gemma4 with shared key-value layers and per-layer inputs; Q4_K_M,
//! Q5_K_M, Q8_0, Q4_0, Q4_1, F16 and a Q5_0/Q5_1/IQ4_NL/Q8_0 mix) are rebuilt here byte for byte as
//! llama.cpp read them (their SHA-256 is in each golden), and the engine's log-probabilities
//! are compared with llama.cpp's position by position.
//!
//! Recording: `engine/tests/goldens/record-tiny.sh` (writes the models with the ignored test
//! below, then runs `record.py --tiny` on each).

mod common;

use std::path::PathBuf;

use common::golden::{self, Limits};
use sha2::{Digest, Sha256};
use test_support::tiny::{MODELS, MOE_BENCH, Tiny, gguf_bytes};

/// llama.cpp's own spread on these models: recorded again with flash attention off and an f32
/// cache (`record.py … --tiny -fa off -ctk f32 -ctv f32`, then `compare.py`), its worst position
/// moves by 0.089 mean / 0.170 max (tiny-llama-q4_k_m). We measure 0.040 / 0.069 at worst
/// (tiny-gemma3-q4_k_m, tiny-llama-q4_k_m), and are held to llama.cpp's spread.
const LIMITS: Limits = Limits {
    mean: 0.089,
    max: 0.17,
};

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn check(t: &Tiny) {
    check_within(t, LIMITS);
}

fn check_within(t: &Tiny, limits: Limits) {
    let golden_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens")
        .join(format!("{}.json", t.name));
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&golden_path).expect("golden"))
            .expect("json");
    let bytes = gguf_bytes(t);
    assert_eq!(
        recorded["model_sha256"].as_str(),
        Some(hex(&bytes).as_str()),
        "{}: the generator no longer writes the file llama.cpp was run on; record again \
         (engine/tests/goldens/record-tiny.sh)",
        t.name
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join(format!("{}.gguf", t.name));
    std::fs::write(&model, bytes).expect("write the model");
    golden::check(&golden_path, &model, limits);
}

fn model(name: &str) -> &'static Tiny {
    MODELS
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tiny model {name}"))
}

#[test]
fn llama_q4_k_m_with_grouped_query_attention_and_llama3_rope_matches_llama_cpp() {
    check(model("tiny-llama-q4_k_m"));
}

#[test]
fn llama_q8_0_matches_llama_cpp() {
    check(model("tiny-llama-q8_0"));
}

#[test]
fn llama_q4_0_matches_llama_cpp() {
    check(model("tiny-llama-q4_0"));
}

#[test]
fn llama_q4_1_matches_llama_cpp() {
    check(model("tiny-llama-q4_1"));
}

#[test]
fn qwen2_with_biases_in_legacy_quants_matches_llama_cpp() {
    check(model("tiny-qwen2-legacy-mixed"));
}

#[test]
fn qwen3_q5_k_m_with_wide_heads_matches_llama_cpp() {
    check(model("tiny-qwen3-q5_k_m"));
}

#[test]
fn qwen3_f16_matches_llama_cpp() {
    check(model("tiny-qwen3-f16"));
}

#[test]
fn gemma3_q4_k_m_with_local_and_global_layers_matches_llama_cpp() {
    check(model("tiny-gemma3-q4_k_m"));
}

#[test]
fn qwen3moe_q4_k_m_with_routed_experts_matches_llama_cpp() {
    check(model("tiny-qwen3moe-q4_k_m"));
}

#[test]
fn gemma4_q4_k_m_with_shared_kv_and_per_layer_inputs_matches_llama_cpp() {
    check(model("tiny-gemma4-q4_k_m"));
}

/// The tiny Gemma 4 against its float64 scores (`goldens/exact_forward.py`, which transcribes
/// llama.cpp's gemma4 graph independently of the engine): on average no farther from the exact
/// values than llama.cpp (0.061 nats here; we measure 0.065), and no position more than twice
/// llama.cpp's worst distance from them (0.229).
#[test]
fn gemma4_q4_k_m_against_exact_values() {
    against_exact("tiny-gemma4-q4_k_m", 0.46);
}

/// Gemma 4's layers as llama.cpp maps them: head widths by layer type, FFN widths per layer,
/// the shared layers reading the last sliding (2) or full (3) layer's keys and values, a cache
/// for the four layers that keep them only, and the per-layer table not counted as resident.
#[test]
fn gemma4_layers_share_keys_and_values_as_llama_cpp_maps_them() {
    let t = model("tiny-gemma4-q4_k_m");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, gguf_bytes(t)).expect("write");
    let file = engine::model_file::ModelFile::open(&path).expect("open");
    let model = engine::model::Model::load(&file).expect("load");
    let h = &model.hparams;
    let kv_from: Vec<usize> = h.layers.iter().map(|l| l.kv_from).collect();
    assert_eq!(kv_from, [0, 1, 2, 3, 2, 2, 3]);
    let heads: Vec<usize> = h.layers.iter().map(|l| l.head_dim).collect();
    assert_eq!(heads, [64, 64, 64, 128, 64, 64, 128]);
    let ff: Vec<usize> = h.layers.iter().map(|l| l.n_ff).collect();
    assert_eq!(ff, [512, 512, 512, 512, 1024, 1024, 1024]);
    // Keys and values of one position: three sliding layers of 64 and one full of 128, f16.
    assert_eq!(h.kv_bytes_per_position(), (3 * 64 + 128) * 2 * 2);
    let cache = engine::model::KvCache::new(h, 16).expect("cache");
    assert_eq!(cache.bytes(), 16 * h.kv_bytes_per_position());
    let table = file
        .header()
        .tensors
        .iter()
        .find(|t| t.name == "per_layer_token_embd.weight")
        .expect("table")
        .size as usize;
    assert_eq!(model.row_read_bytes(), table);
    let size = std::fs::metadata(&path).expect("size").len();
    let need = engine::memory::Need::of(&model, size, 16, 0).expect("need");
    assert!(
        need.weights <= size - table as u64,
        "the table counted as resident: {need:?}"
    );
}

/// Qwen 3.5's hybrid: Gated DeltaNet layers whose state carries over a 300-token prompt (five
/// passes) and 40 generated tokens, gated attention layers with a partial rope.
#[test]
fn qwen35_q4_k_m_with_gated_delta_net_and_gated_attention_matches_llama_cpp() {
    check(model("tiny-qwen35-q4_k_m"));
}

/// Qwen 3.5 MoE: the hybrid's layers with routed experts (2 of 8) and a shared expert gated
/// per token by a sigmoid. Here the two implementations part more than llama.cpp parts from
/// itself, at a few positions and in turn: at the three where we differ by more than 0.1
/// nats, one of us is within 0.09 of the float64 values and the other not — llama.cpp at
/// generated position 4, we at 18 and 31 (the exact scores' test below) — the routed FFN
/// amplifying its own roundings. So the limit is that worst parting (at 18, where llama.cpp
/// is the one off: 0.243 mean, 0.584 max), 0.25 / 0.6;
/// the mean over all positions is held by the exact test.
#[test]
fn qwen35moe_q4_k_m_with_routed_and_shared_experts_matches_llama_cpp() {
    let parting = Limits {
        mean: 0.25,
        max: 0.6,
    };
    check_within(model("tiny-qwen35moe-q4_k_m"), parting);
}

/// The tiny Qwen 3.5 against its float64 scores (`goldens/exact_forward.py`'s transcription of
/// llama.cpp's qwen35 graph and fused delta-rule op): on average no farther from the exact
/// values than llama.cpp, and no position more than twice llama.cpp's worst distance from
/// them (0.401).
#[test]
fn qwen35_q4_k_m_against_exact_values() {
    against_exact("tiny-qwen35-q4_k_m", 0.8);
}

/// The same for Qwen 3.5 MoE: both land about 0.2 nats from the exact values on average,
/// llama.cpp's worst position 0.847 from them.
#[test]
fn qwen35moe_q4_k_m_against_exact_values() {
    against_exact("tiny-qwen35moe-q4_k_m", 1.7);
}

fn against_exact(name: &str, worst: f32) {
    let t = model(name);
    let goldens = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{}.gguf", t.name));
    std::fs::write(&path, gguf_bytes(t)).expect("write the model");
    golden::check_exact(
        &goldens.join(format!("{}.json", t.name)),
        &goldens.join(format!("{}.exact.json", t.name)),
        &path,
        worst,
    );
}

/// Writes every tiny model into `$TINY_MODELS_DIR`, and the prompt's ids as `prompt.json` (a
/// recurrent model's longer one as `NAME.prompt.json`), for `record-tiny.sh`.
#[test]
#[ignore]
fn write_tiny_models() {
    let dir = PathBuf::from(std::env::var("TINY_MODELS_DIR").expect("TINY_MODELS_DIR"));
    std::fs::create_dir_all(&dir).expect("create the directory");
    for t in &MODELS {
        std::fs::write(dir.join(format!("{}.gguf", t.name)), gguf_bytes(t)).expect("write");
        if t.qwen35.is_some() {
            let ids = serde_json::to_string(&test_support::tiny::long_prompt()).expect("json");
            std::fs::write(dir.join(format!("{}.prompt.json", t.name)), ids).expect("write");
        }
        if t.gemma4.is_some() {
            let head = test_support::tiny::gemma4_head_bytes(t, &test_support::tiny::TINY_HEAD);
            std::fs::write(dir.join(format!("{}-head.gguf", t.name)), head).expect("write");
        }
    }
    let ids = serde_json::to_string(&test_support::tiny::prompt()).expect("json");
    std::fs::write(dir.join("prompt.json"), ids).expect("write the prompt");
}

/// Writes a random model of Gemma 4 E2B's shapes and its draft head into `$TINY_MODELS_DIR`,
/// for `bench/engine-vs-llama.sh --e2b`.
#[test]
#[ignore]
fn write_e2b_bench_model() {
    use test_support::tiny::{E2B_BENCH, E2B_HEAD, gemma4_head_bytes};
    let dir = PathBuf::from(std::env::var("TINY_MODELS_DIR").expect("TINY_MODELS_DIR"));
    std::fs::create_dir_all(&dir).expect("create the directory");
    for (name, bytes) in [
        (E2B_BENCH.name.to_string(), gguf_bytes(&E2B_BENCH)),
        (
            format!("{}-head", E2B_BENCH.name),
            gemma4_head_bytes(&E2B_BENCH, &E2B_HEAD),
        ),
    ] {
        let path = dir.join(format!("{name}.gguf"));
        let temporary = path.with_extension("gguf.partial");
        std::fs::write(&temporary, bytes).expect("write");
        std::fs::rename(&temporary, &path).expect("rename");
    }
}

/// Writes a random model of Qwen 3.5 4B's shapes into `$TINY_MODELS_DIR`, for
/// `bench/engine-vs-llama.sh --qwen35`.
#[test]
#[ignore]
fn write_qwen35_bench_model() {
    use test_support::tiny::QWEN35_4B_BENCH;
    let dir = PathBuf::from(std::env::var("TINY_MODELS_DIR").expect("TINY_MODELS_DIR"));
    std::fs::create_dir_all(&dir).expect("create the directory");
    let path = dir.join(format!("{}.gguf", QWEN35_4B_BENCH.name));
    std::fs::write(path, gguf_bytes(&QWEN35_4B_BENCH)).expect("write");
}

/// Writes the synthetic MoE benchmark model into `$TINY_MODELS_DIR`, for
/// `bench/engine-vs-llama.sh --moe`.
#[test]
#[ignore]
fn write_moe_bench_model() {
    let dir = PathBuf::from(std::env::var("TINY_MODELS_DIR").expect("TINY_MODELS_DIR"));
    std::fs::create_dir_all(&dir).expect("create the directory");
    let path = dir.join(format!("{}.gguf", MOE_BENCH.name));
    let temporary = path.with_extension("gguf.partial");
    std::fs::write(&temporary, gguf_bytes(&MOE_BENCH)).expect("write");
    std::fs::rename(&temporary, &path).expect("rename");
}
