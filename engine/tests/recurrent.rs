//! A recurrent state (Qwen 3.5's Gated DeltaNet layers) cannot be cut back to an earlier
//! position as keys and values can: these check that going back never changes a logit.
//! A conversation resumed from a checkpoint, a verify pass whose drafts are rejected (the
//! state rebuilt from the mark's record, or from the mark itself where the record does not
//! reach) and a copy of a kept cache all continue exactly as a cold run, bit for bit; and
//! speculative decoding gives the tokens plain decoding gives.

mod common;

use engine::generate::{Budget, generate};
use engine::model::{KvCache, Logits, Model};
use engine::model_file::ModelFile;
use engine::sampler::{Sampler, Sampling};
use engine::speculate::{Costs, MAX_DRAFT, Speculation};
use test_support::tiny::{QWEN35, gguf_bytes, long_prompt};

fn open() -> (tempfile::TempDir, ModelFile) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("qwen35.gguf");
    std::fs::write(&path, gguf_bytes(&QWEN35)).expect("write the model");
    let file = ModelFile::open(&path).expect("open");
    (dir, file)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// A cache on one thread for `model` (the logits do not depend on it; fewer threads keep the
/// test light).
fn cache(model: &Model<'_>) -> KvCache {
    KvCache::on_threads(&model.hparams, 512, 1).expect("cache")
}

/// Every logit of `tokens` run from position `at` of `cache`.
fn all(model: &Model<'_>, cache: &mut KvCache, tokens: &[u32], at: usize) -> Vec<u32> {
    bits(
        model
            .forward(tokens, at, cache, Logits::All)
            .expect("a pass"),
    )
}

#[test]
fn rejected_drafts_leave_the_state_as_if_never_drafted() {
    let (_dir, file) = open();
    let model = Model::load(&file).expect("load");
    let tokens = long_prompt();
    let (prompt, rest) = tokens.split_at(100);
    // Drafted: rest[0..5], of which the first two are kept; then the model goes on with
    // other tokens.
    let after: Vec<u32> = rest[10..20].to_vec();
    let mut cold = cache(&model);
    model
        .forward(prompt, 0, &mut cold, Logits::None)
        .expect("prefill");
    let kept = all(&model, &mut cold, &rest[..2], 100);
    let expected = all(&model, &mut cold, &after, 102);

    let mut drafted = cache(&model);
    model
        .forward(prompt, 0, &mut drafted, Logits::None)
        .expect("prefill");
    drafted.mark();
    let checked = all(&model, &mut drafted, &rest[..5], 100);
    assert_eq!(
        checked[..kept.len()],
        kept[..],
        "a verify pass's rows are the steps' logits"
    );
    assert_eq!(drafted.resume(102), 102, "the mark's record reaches it");
    assert_eq!(
        all(&model, &mut drafted, &after, 102),
        expected,
        "after a rollback the state is the one that never saw the rejected drafts"
    );
    // A pass at a position the state is not at is refused, not silently wrong.
    let err = model
        .forward(&after, 50, &mut drafted, Logits::Last)
        .expect_err("the state is at 112");
    assert!(err.contains("resume"), "{err}");
}

#[test]
fn a_conversation_resumes_from_its_checkpoint_as_a_cold_run() {
    let (_dir, file) = open();
    let model = Model::load(&file).expect("load");
    let tokens = long_prompt();
    // Turn one: 150 tokens, a checkpoint, 50 more (answer and the rest of a long turn: more
    // than a mark records). Turn two shares the first 150 and goes elsewhere.
    let mut kept = cache(&model);
    model
        .forward(&tokens[..150], 0, &mut kept, Logits::None)
        .expect("turn one");
    kept.checkpoint();
    model
        .forward(&tokens[150..200], 150, &mut kept, Logits::None)
        .expect("turn one's answer");
    let follow_up: Vec<u32> = tokens[..150]
        .iter()
        .chain(&tokens[220..300])
        .copied()
        .collect();
    let mut cold = cache(&model);
    let expected = all(&model, &mut cold, &follow_up, 0);

    let mut copy = kept.copy_prefix(170);
    assert_eq!(
        copy.held(),
        150,
        "a copy is cut at the checkpoint before 170"
    );
    assert_eq!(
        all(&model, &mut copy, &follow_up[150..], 150),
        expected[150 * model.hparams.vocab..],
        "resumed from the checkpoint: the cold run's logits"
    );
    assert_eq!(kept.resume(160), 150);
    assert_eq!(
        all(&model, &mut kept, &follow_up[150..], 150),
        expected[150 * model.hparams.vocab..]
    );
    // Without a checkpoint before the shared prefix's end, it starts afresh.
    assert_eq!(kept.resume(100), 0);
    assert_eq!(all(&model, &mut kept, &follow_up, 0), expected);
}

#[test]
fn a_rollback_past_the_mark_s_record_goes_back_to_the_mark() {
    let (_dir, file) = open();
    let model = Model::load(&file).expect("load");
    let tokens = long_prompt();
    let mut state = cache(&model);
    model
        .forward(&tokens[..40], 0, &mut state, Logits::None)
        .expect("prefill");
    state.mark();
    // A pass longer than a mark records: the record stops, the mark's base stays.
    model
        .forward(&tokens[40..80], 40, &mut state, Logits::None)
        .expect("a long pass");
    assert_eq!(
        state.resume(60),
        40,
        "back to the mark, the tokens after it run again"
    );
    let mut cold = cache(&model);
    model
        .forward(&tokens[..40], 0, &mut cold, Logits::None)
        .expect("prefill");
    assert_eq!(
        all(&model, &mut state, &tokens[40..70], 40),
        all(&model, &mut cold, &tokens[40..70], 40)
    );
}

/// Tokens generated after `prompt`, and the drafts made and accepted.
fn generated(
    model: &Model<'_>,
    prompt: &[u32],
    sampling: &Sampling,
    speculation: Option<Speculation>,
) -> (Vec<u32>, usize, usize) {
    let mut sampler = Sampler::new(sampling.clone());
    let mut speculation = speculation;
    let budget = Budget {
        limit: 64,
        context: 512,
        threads: 1,
    };
    let (tokens, _) = generate(
        model,
        prompt,
        budget,
        &mut sampler,
        &[],
        speculation.as_mut(),
        None,
        &mut |_| {},
    )
    .expect("generate");
    let (drafted, accepted) = speculation.map_or((0, 0), |s| s.drafts());
    (tokens, drafted, accepted)
}

#[test]
fn speculation_on_a_recurrent_model_changes_no_token() {
    let (_dir, file) = open();
    let model = Model::load(&file).expect("load");
    let tokens = long_prompt();
    // Batches nearly free: whatever an n-gram matches is drafted, and many drafts miss.
    let cheap = Costs::from_seconds(
        &(0..=MAX_DRAFT)
            .map(|m| 1.0 + 0.01 * m as f64)
            .collect::<Vec<_>>(),
    );
    let samplings = [
        Sampling {
            temperature: 0.0,
            ..Sampling::default()
        },
        Sampling {
            seed: 11,
            ..Sampling::default()
        },
    ];
    // The prompt, then what the model says after it, then the prompt again: after the second
    // copy the n-grams of the first propose the model's own earlier answer, which it partly
    // repeats.
    let greedy = &samplings[0];
    let echo = |prompt: &[u32]| -> Vec<u32> {
        let (said, _, _) = generated(&model, prompt, greedy, None);
        [prompt, &said[..], prompt].concat()
    };
    let prompts = [
        echo(&tokens[..40]),
        echo(&tokens[100..110]),
        tokens[200..260].to_vec(),
    ];
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in &prompts {
        for sampling in &samplings {
            let (plain, _, _) = generated(&model, prompt, sampling, None);
            let speculation = Speculation::new(MAX_DRAFT, 0, cheap.clone());
            let (fast, d, a) = generated(&model, prompt, sampling, Some(speculation));
            assert_eq!(fast, plain, "{sampling:?}: speculation changed the output");
            (drafted, accepted) = (drafted + d, accepted + a);
        }
    }
    assert!(
        accepted > 0 && drafted > accepted,
        "drafts were kept and rejected: {drafted} drafted, {accepted} accepted"
    );
}

/// Served with Qwen 3.5's own chat template: a later turn of a chat resumes from the
/// checkpoint at the end of the earlier turn (the template writes the past answer without
/// the thinking block its cue opened, so the prompts part there), and so does the same chat
/// asked again; both answer as a cold prefill does.
#[test]
fn a_later_turn_resumes_from_the_checkpoint_at_the_last_turn_s_end() {
    use common::serve::{post, start_model};
    use serde_json::json;
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("qwen35.gguf");
    std::fs::write(&model, gguf_bytes(&QWEN35)).expect("write the model");
    let template = common::llama_cpp_file("models/templates/Qwen3.5-4B.jinja");
    let server = start_model(
        &model,
        &["--chat-template-file", template.to_str().expect("utf8")],
        &[],
    );
    let ask = |messages: serde_json::Value, cache: bool| {
        let body = json!({
            "messages": messages, "max_tokens": 8, "temperature": 0, "cache_prompt": cache,
        });
        let (status, answer) = post(&server, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{answer}");
        answer
    };
    let first = json!([{"role": "user", "content": "Name three primary colours."}]);
    let one = ask(first.clone(), true);
    let said = one["choices"][0]["message"]["content"].clone();
    let again = ask(first, true);
    let prompt_n = |a: &serde_json::Value| a["timings"]["prompt_n"].as_u64().expect("prompt_n");
    let cache_n = |a: &serde_json::Value| a["timings"]["cache_n"].as_u64().expect("cache_n");
    assert!(
        cache_n(&again) > 0 && prompt_n(&again) < prompt_n(&one),
        "the same chat runs only its answer's cue again: {again}"
    );
    assert_eq!(again["choices"][0]["message"]["content"], said);
    let later = json!([
        {"role": "user", "content": "Name three primary colours."},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "And three secondary ones?"},
    ]);
    let resumed = ask(later.clone(), true);
    let cold = ask(later, false);
    assert!(
        cache_n(&resumed) >= cache_n(&again),
        "resumed from the first turn's end at least: {resumed}"
    );
    assert_eq!(cache_n(&cold), 0);
    assert_eq!(
        resumed["choices"][0]["message"]["content"],
        cold["choices"][0]["message"]["content"]
    );
}

#[test]
fn a_pass_gives_the_steps_logits() {
    let (_dir, file) = open();
    let model = Model::load(&file).expect("load");
    let tokens = long_prompt();
    for n in [2, 3, 8] {
        let mut stepped = cache(&model);
        let mut steps = Vec::new();
        for (pos, &t) in tokens[..n].iter().enumerate() {
            steps.extend(bits(model.step(t, pos, &mut stepped).expect("step")));
        }
        let mut passed = cache(&model);
        assert_eq!(
            all(&model, &mut passed, &tokens[..n], 0),
            steps,
            "{n} tokens"
        );
    }
}
