//! Whole models, not only kernels, give the same logits on every instruction set and thread
//! count: the tiny random models of every architecture and quant type (`common/tiny.rs`) run
//! once on the scalar reference and once on each SIMD path this CPU has (AVX2 here, NEON+dotprod
//! under qemu-aarch64 in CI), and on 1 to 4 threads (the Pi 5 uses 4), single steps and batched
//! passes alike, and the draft steps of Gemma 4's head and Qwen 3.5's nextn layer; every logit
//! must be the same bit for bit. A wrong kernel that the kernel tests' shapes miss shows up
//! here, before it reaches a Pi.

mod common;

use engine::kernels::Isa;
use engine::model::{DraftHead, DraftWork, KvCache, Logits, Model};
use engine::model_file::ModelFile;
use test_support::tiny::{MODELS, Tiny, gemma4_head_bytes, gguf_bytes, prompt};

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

/// Three draft steps of `head` after the prompt, their logits and hidden states as bit patterns.
fn head_logits(model: &Model<'_>, head: &DraftHead<'_>, isa: Isa, threads: usize) -> Vec<u32> {
    let tokens = prompt();
    let (last, before) = tokens.split_last().expect("a prompt");
    let mut cache = KvCache::on_threads(&model.hparams, tokens.len() + 4, threads)
        .expect("cache")
        .with_isa(isa);
    head.prepare(&mut cache);
    model
        .forward(before, 0, &mut cache, Logits::Last)
        .expect("prefill");
    let mut hidden = cache
        .hidden(0, model.hparams.n_embd)
        .expect("hidden")
        .to_vec();
    let (mut token, mut work, mut bits) = (*last, DraftWork::default(), Vec::new());
    for step in 0..3 {
        token = head
            .draft(
                model,
                &mut cache,
                token,
                &hidden,
                (before.len(), step),
                &mut work,
            )
            .expect("draft")
            .token;
        bits.extend(
            work.logits()
                .iter()
                .chain(work.hidden())
                .map(|f| f.to_bits()),
        );
        hidden = work.hidden().to_vec();
    }
    bits
}

fn loaded(t: &Tiny) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{}.gguf", t.name));
    std::fs::write(&path, gguf_bytes(t)).expect("write the model");
    if t.gemma4.is_some() {
        std::fs::write(
            head_path(&path),
            gemma4_head_bytes(t, &test_support::tiny::TINY_HEAD),
        )
        .expect("write the head");
    }
    (dir, path)
}

fn head_path(model: &std::path::Path) -> std::path::PathBuf {
    model.with_extension("head.gguf")
}

/// `model`'s draft head, where the tiny model has one.
fn head_file(t: &Tiny, model: &std::path::Path) -> Option<ModelFile> {
    t.gemma4
        .map(|_| ModelFile::open(&head_path(model)).expect("open the head"))
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
        let head_file = head_file(t, &path);
        // Gemma 4's head file, or Qwen 3.5's own nextn layer.
        let head = head_file
            .as_ref()
            .map(|f| DraftHead::load(f, &model).expect("load the head"))
            .or_else(|| DraftHead::nextn(&model));
        let head_reference = head
            .as_ref()
            .map(|h| head_logits(&model, h, Isa::Scalar, 2));
        for &isa in isas.iter().filter(|&&i| i != Isa::Scalar) {
            assert!(
                head.as_ref().map(|h| head_logits(&model, h, isa, 2)) == head_reference,
                "{}: the draft head on {isa:?} differs from the scalar reference",
                t.name
            );
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
        let head_file = head_file(t, &path);
        let head = head_file
            .as_ref()
            .map(|f| DraftHead::load(f, &model).expect("load the head"))
            .or_else(|| DraftHead::nextn(&model));
        let head_one = head.as_ref().map(|h| head_logits(&model, h, isa, 1));
        for threads in 2..=4 {
            assert!(
                head.as_ref().map(|h| head_logits(&model, h, isa, threads)) == head_one,
                "{}: the draft head on {threads} threads differs from one",
                t.name
            );
            assert!(
                logits(&model, isa, threads) == one,
                "{}: {threads} threads differ from one on {isa:?}",
                t.name
            );
        }
    }
}
