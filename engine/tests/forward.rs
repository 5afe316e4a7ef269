//! The forward pass on the real models: a factual completion comes out on top, and the result is
//! bit-identical whatever the thread count.

mod common;

use common::{gemma3, smollm2};

use engine::model::{KvCache, Model, log_softmax};
use engine::model_file::ModelFile;

/// Token ids of whole vocabulary entries (no tokenizer needed for these plain words).
fn ids(file: &ModelFile, pieces: &[&str]) -> Vec<u32> {
    let kv = file
        .header()
        .entry("tokenizer.ggml.tokens")
        .expect("tokens");
    let vocab = gguf::arrays::strings(file.bytes(), kv).expect("strings");
    pieces
        .iter()
        .map(|p| {
            vocab
                .iter()
                .position(|t| t == p)
                .unwrap_or_else(|| panic!("no token {p:?}")) as u32
        })
        .collect()
}

fn next_token(file: &ModelFile, prompt: &[u32]) -> (String, Vec<f32>) {
    next_token_on(file, prompt, 2)
}

fn next_token_on(file: &ModelFile, prompt: &[u32], threads: usize) -> (String, Vec<f32>) {
    let model = Model::load(file).expect("load");
    let mut cache = KvCache::on_threads(&model.hparams, 64, threads).expect("cache");
    let mut logits = Vec::new();
    for (pos, &t) in prompt.iter().enumerate() {
        logits = model.step(t, pos, &mut cache).expect("step").to_vec();
    }
    let best = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .expect("logits");
    let kv = file
        .header()
        .entry("tokenizer.ggml.tokens")
        .expect("tokens");
    let vocab = gguf::arrays::strings(file.bytes(), kv).expect("strings");
    (vocab[best].to_string(), logits)
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    let file = ModelFile::open(&smollm2()).expect("open");
    let prompt = ids(&file, &["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]);
    let (best, logits) = next_token(&file, &prompt);
    assert_eq!(best, "ĠParis");
    let lp = log_softmax(&logits);
    let total: f64 = lp.iter().map(|&l| f64::from(l).exp()).sum();
    assert!((total - 1.0).abs() < 1e-4, "log-softmax sums to {total}");
}

#[test]
fn gemma3_knows_the_capital_of_france() {
    let file = ModelFile::open(&gemma3()).expect("open");
    let mut prompt = vec![2]; // <bos>
    prompt.extend(ids(&file, &["The", "▁capital", "▁of", "▁France", "▁is"]));
    // The 270M base model ranks "the" (as in "the city of Paris") just above "Paris"; the
    // llama.cpp goldens pin the exact distribution. Here: Paris is a top-3 continuation.
    let (_, logits) = next_token(&file, &prompt);
    let paris = ids(&file, &["▁Paris"])[0] as usize;
    let better = logits.iter().filter(|&&l| l > logits[paris]).count();
    assert!(better < 3, "{better} tokens rank above Paris");
}

#[test]
fn logits_are_bit_identical_across_thread_counts() {
    let file = ModelFile::open(&smollm2()).expect("open");
    let prompt = ids(&file, &["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]);
    let run = |threads: usize| next_token_on(&file, &prompt, threads).1;
    let one = run(1);
    let two = run(2);
    // `zip` stops at the shorter sequence: without these, a truncated (or empty) result on
    // either side would compare equal.
    let vocab = Model::load(&file).expect("load").hparams.vocab;
    assert_eq!(one.len(), vocab, "one thread: a logit per vocabulary entry");
    assert_eq!(two.len(), one.len(), "two threads: as many logits as one");
    assert!(
        one.iter()
            .zip(&two)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

/// A prompt run as batched passes (longer than one pass, so two of them) gives every position
/// exactly the logits that stepping token by token gives, on one thread and on two.
#[test]
fn batched_passes_equal_token_by_token_steps_bit_for_bit() {
    use engine::model::{Logits, MAX_BATCH};
    for path in [smollm2(), gemma3()] {
        let file = ModelFile::open(&path).expect("open");
        let model = Model::load(&file).expect("load");
        let n = MAX_BATCH + 7;
        let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 13) % 5000 + 10).collect();
        let mut stepped = Vec::new();
        let mut cache = KvCache::new(&model.hparams, n).expect("cache");
        for (pos, &t) in tokens.iter().enumerate() {
            stepped.extend_from_slice(model.step(t, pos, &mut cache).expect("step"));
        }
        assert_eq!(stepped.len(), n * model.hparams.vocab, "a row per position");
        for threads in [1, 2] {
            let mut cache = KvCache::new(&model.hparams, n)
                .expect("cache")
                .with_threads(threads);
            let batched = model
                .forward(&tokens, 0, &mut cache, Logits::All)
                .expect("forward");
            assert_eq!(batched.len(), stepped.len());
            let differing = batched
                .iter()
                .zip(&stepped)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differing, 0, "{} on {threads} threads", path.display());
            // Only the last row when that is all that is asked for.
            let mut cache = KvCache::new(&model.hparams, n).expect("cache");
            let last = model
                .forward(&tokens, 0, &mut cache, Logits::Last)
                .expect("forward");
            assert_eq!(last, &stepped[(n - 1) * model.hparams.vocab..]);
        }
    }
}

/// A context shift's cache answers as if the dropped positions had never been. In one layer a
/// token's keys and values depend on the token and its position only, so there the shifted
/// cache (keys moved down and rotated back) must give the next token the logits of a fresh
/// cache that took only the kept tokens, but for the f16 rounding of the rotated keys. On a
/// Llama (adjacent pairs, rope
/// factors), Qwen 3 (NEOX pairs, normed keys) and Gemma 3 (a sliding layer whose window
/// reaches the kept head). Deeper, kept tokens remember the dropped ones, as in llama.cpp.
#[test]
fn a_shifted_cache_answers_as_one_without_the_dropped_positions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let names = [
        "tiny-llama-q4_k_m",
        "tiny-qwen3-q5_k_m",
        "tiny-gemma3-q4_k_m",
    ];
    for tiny in test_support::tiny::MODELS
        .iter()
        .filter(|t| names.contains(&t.name))
    {
        let one_layer = test_support::tiny::Tiny { layers: 1, ..*tiny };
        let path = dir.path().join(format!("{}.gguf", tiny.name));
        std::fs::write(&path, test_support::tiny::gguf_bytes(&one_layer)).expect("write");
        let file = ModelFile::open(&path).expect("open");
        let model = Model::load(&file).expect("load");
        let tokens: Vec<u32> = (0..16).map(|i| 40 + 7 * i).collect();
        let (keep, discard, n) = (3, 6, 15);
        let run = |cache: &mut KvCache, tokens: &[u32], start: usize| {
            model
                .forward(tokens, start, cache, engine::model::Logits::Last)
                .expect("forward")
                .to_vec()
        };
        let fresh = || KvCache::on_threads(&model.hparams, 64, 2).expect("cache");
        let mut shifted = fresh();
        run(&mut shifted, &tokens[..n], 0);
        model.shift(&mut shifted, keep, discard).expect("shift");
        assert_eq!(shifted.held(), n - discard);
        let after = run(&mut shifted, &tokens[n..], n - discard);
        let kept: Vec<u32> = tokens[..keep]
            .iter()
            .chain(&tokens[keep + discard..])
            .copied()
            .collect();
        let expected = run(&mut fresh(), &kept, 0);
        let differ = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max)
        };
        let worst = differ(&after, &expected);
        let spread = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        eprintln!("{}: shifted {worst} of {spread}", tiny.name);
        // Measured: 0, 0.055 and 0.047; with the keys left unrotated, 2.3, 1.3 and 0.86.
        assert!(worst < 0.15, "{}: {worst}", tiny.name);
    }
}
