//! Whole models, not only kernels, give the same logits on every instruction set and thread
//! count: the tiny random models of every architecture and quant type (`common/tiny.rs`) run
//! once on the scalar reference and once on each SIMD path this CPU has (AVX2 here, NEON+dotprod
//! under qemu-aarch64 in CI), and on 1 to 4 threads (the Pi 5 uses 4), single steps and batched
//! passes alike; every logit must be the same bit for bit. A wrong kernel that the kernel tests'
//! shapes miss shows up here, before it reaches a Pi.

mod common;

use common::tiny::{MODELS, Tiny, gguf_bytes, prompt};
use engine::kernels::Isa;
use engine::model::{KvCache, Logits, Model};
use engine::model_file::ModelFile;

/// The logits after each prompt token, by single steps, then the same prompt's logits from one
/// batched pass of every row; both as bit patterns.
fn logits(model: &Model<'_>, isa: Isa, threads: usize) -> (Vec<u32>, Vec<u32>) {
    let tokens = prompt();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
    let fresh = || {
        KvCache::on_threads(&model.hparams, tokens.len(), threads)
            .expect("cache")
            .with_isa(isa)
    };
    let mut cache = fresh();
    let mut stepped = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        stepped.extend(bits(model.step(t, pos, &mut cache).expect("step")));
    }
    let mut cache = fresh();
    let batched = bits(
        model
            .forward(&tokens, 0, &mut cache, Logits::All)
            .expect("pass"),
    );
    (stepped, batched)
}

fn loaded(t: &Tiny) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{}.gguf", t.name));
    std::fs::write(&path, gguf_bytes(t)).expect("write the model");
    (dir, path)
}

#[test]
fn every_simd_path_gives_the_scalar_reference_s_logits_on_every_model() {
    let isas = Isa::available();
    // The CI names what this machine must have (`ENGINE_REQUIRE_ISA`, comma-separated):
    // without it this test could compare the reference with itself and prove nothing.
    let required = std::env::var("ENGINE_REQUIRE_ISA").unwrap_or_default();
    for name in required.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        assert!(
            isas.iter().any(|i| format!("{i:?}") == name),
            "{name} not among {isas:?}"
        );
    }
    for t in &MODELS {
        let (_dir, path) = loaded(t);
        let file = ModelFile::open(&path).expect("open");
        let model = Model::load(&file).expect("load");
        let reference = logits(&model, Isa::Scalar, 2);
        for &isa in isas.iter().filter(|&&i| i != Isa::Scalar) {
            let simd = logits(&model, isa, 2);
            assert!(
                simd.0 == reference.0,
                "{}: single steps on {isa:?} differ from the scalar reference",
                t.name
            );
            assert!(
                simd.1 == reference.1,
                "{}: batched passes on {isa:?} differ from the scalar reference",
                t.name
            );
        }
    }
}

#[test]
fn one_to_four_threads_give_the_same_logits_on_every_model() {
    let isa = Isa::detect();
    for t in &MODELS {
        let (_dir, path) = loaded(t);
        let file = ModelFile::open(&path).expect("open");
        let model = Model::load(&file).expect("load");
        let one = logits(&model, isa, 1);
        // Single steps and a batched pass agree too (`Model::forward`'s invariant).
        assert!(one.0 == one.1, "{}: batched rows differ from steps", t.name);
        for threads in 2..=4 {
            assert!(
                logits(&model, isa, threads) == one,
                "{}: {threads} threads differ from one on {isa:?}",
                t.name
            );
        }
    }
}
