//! Speculative decoding is lossless: on both real models, over quoting and novel prompts,
//! greedy and seeded sampling give the same tokens (compared by SHA-256) with drafts checked
//! in batched passes as with plain decoding; drafts are made and accepted where the answer
//! repeats its input; and `engine serve` reports them as llama.cpp does.

mod common;

use std::path::Path;

use common::serve::{get_json, post, start};
use engine::generate::{Budget, generate};
use engine::model::Model;
use engine::model_file::ModelFile;
use engine::sampler::{Sampler, Sampling};
use engine::speculate::{Costs, MAX_DRAFT, Speculation};
use engine::tokenizer::Tokenizer;
use serde_json::json;
use sha2::{Digest, Sha256};

const PROMPTS: [&str; 6] = [
    "Copy this text exactly: The patient, John Smith, born 1970-03-02, was seen on 2026-11-30 \
     for a follow-up of his type 2 diabetes. His HbA1c was 7.2%. Copy: The patient, John Smith,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Name: Anna Berg\nDate: 2026-12-01\nReason: cough\n\nName: Anna Berg\nDate:",
    "Why is the sky blue?",
    "Write a short poem about the sea.",
    "List three uses of copper.",
];

/// Tokens generated for `prompt`, and the drafts made / accepted.
fn run(
    model: &Model<'_>,
    tokenizer: &Tokenizer,
    end: &[u32],
    prompt: &str,
    sampling: &Sampling,
    speculation: Option<Speculation>,
) -> (String, usize, usize) {
    let ids = tokenizer.encode(prompt, true);
    let mut sampler = Sampler::new(sampling.clone());
    let mut speculation = speculation;
    let (tokens, _) = generate(
        model,
        &ids,
        Budget {
            limit: 48,
            context: 512,
            threads: 2,
        },
        &mut sampler,
        end,
        speculation.as_mut(),
        None,
        &mut |_| {},
    )
    .expect("generate");
    let digest: String = Sha256::digest(format!("{tokens:?}").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (drafted, accepted) = speculation.map_or((0, 0), |s| s.drafts());
    (digest, drafted, accepted)
}

fn lossless_on(path: &Path) {
    let file = ModelFile::open(path).expect("open");
    let model = Model::load(&file).expect("load");
    let tokenizer = Tokenizer::load(&file).expect("tokenizer");
    let end = tokenizer.end_ids(&file);
    // Nearly free batches, so drafting happens wherever something matches; and the prior
    // costs a server starts from.
    let cheap = Costs::from_seconds(
        &(0..=MAX_DRAFT)
            .map(|m| 1.0 + 0.01 * m as f64)
            .collect::<Vec<_>>(),
    );
    let prior = Costs::prior();
    let samplings = [
        Sampling {
            temperature: 0.0,
            ..Sampling::default()
        },
        Sampling {
            seed: 7,
            repeat_penalty: 1.1,
            ..Sampling::default()
        },
    ];
    let mut quoted = (0, 0);
    for (p, prompt) in PROMPTS.iter().enumerate() {
        for sampling in &samplings {
            let (plain, _, _) = run(&model, &tokenizer, &end, prompt, sampling, None);
            for costs in [&cheap, &prior] {
                let speculation = Speculation::new(MAX_DRAFT, 0, costs.clone());
                let (fast, drafted, accepted) = run(
                    &model,
                    &tokenizer,
                    &end,
                    prompt,
                    sampling,
                    Some(speculation),
                );
                assert_eq!(
                    fast,
                    plain,
                    "{}: prompt {p} with {sampling:?}: speculation changed the output",
                    path.display()
                );
                if p < 3 && std::ptr::eq(costs, &cheap) {
                    quoted = (quoted.0 + drafted, quoted.1 + accepted);
                }
            }
        }
    }
    assert!(
        quoted.1 > 0 && quoted.1 * 2 >= quoted.0,
        "quoting prompts: {} drafted, {} accepted",
        quoted.0,
        quoted.1
    );
}

#[test]
fn speculation_is_lossless_on_smollm2() {
    lossless_on(&common::smollm2());
}

#[test]
fn speculation_is_lossless_on_gemma3() {
    lossless_on(&common::gemma3());
}

#[test]
fn the_server_reports_drafts_and_a_request_can_turn_them_off() {
    let server = start(&[]);
    let body = |n_max: i64| json!({ "prompt": PROMPTS[0], "n_predict": 40, "temperature": 0, "speculative.n_max": n_max });
    let (status, on) = post(&server, "/completion", &body(16));
    assert_eq!(status, 200, "{on}");
    let (_, off) = post(&server, "/completion", &body(0));
    assert_eq!(on["content"], off["content"], "the same text either way");
    assert_eq!(off["timings"]["draft_n"], 0);
    // The prompt asks for a quotation and the server starts from its prior costs, the same on
    // every machine: drafts are made and mostly accepted.
    let drafted = on["timings"]["draft_n"].as_u64().expect("draft_n");
    let accepted = on["timings"]["draft_n_accepted"]
        .as_u64()
        .expect("accepted");
    assert!(
        drafted > 0 && accepted * 2 >= drafted,
        "{drafted} drafted, {accepted} accepted: {on}"
    );
    // What those passes cost is learned and shown.
    let health = get_json(&server, "/health");
    let costs = &health["pass_costs"];
    assert!(
        costs["widths_timed"].as_u64().expect("widths") > 0,
        "{health}"
    );
    assert_eq!(
        costs["relative"].as_array().map(Vec::len),
        Some(17),
        "{health}"
    );
    let (status, bad) = post(&server, "/completion", &body(99));
    assert_eq!(status, 400, "{bad}");
    let plain = start(&["--spec", "none"]);
    let (_, none) = post(&plain, "/completion", &body(16));
    assert_eq!(none["content"], on["content"]);
    assert_eq!(none["timings"]["draft_n"], 0);
}

#[test]
fn bench_compares_greedy_decoding_with_and_without_drafts() {
    let model = common::smollm2();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engine"))
        .args([
            "bench",
            "-m",
            model.to_str().expect("utf8"),
            "-p",
            "0",
            "-n",
            "32",
        ])
        .args(["-t", "1", "-r", "1", "--spec", "ngram", "--json"])
        .output()
        .expect("run engine bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json rows");
    let rows = rows.as_array().expect("a list of rows");
    let greedy: Vec<_> = rows
        .iter()
        .filter(|r| r["speculative"].is_boolean())
        .collect();
    assert_eq!(greedy.len(), 2, "{rows:?}");
    assert_eq!(greedy[0]["speculative"], false);
    assert_eq!(greedy[1]["speculative"], true);
    assert!(greedy[0].get("drafts").is_none());
    // The built-in prompt asks for a quotation, and the first repetition starts from the prior
    // pass costs (the same on every machine): drafts are made and mostly accepted.
    let (drafted, accepted) = (
        greedy[1]["drafts"][0].as_u64().expect("drafted"),
        greedy[1]["drafts"][1].as_u64().expect("accepted"),
    );
    assert!(
        drafted > 0 && accepted <= drafted && accepted * 2 >= drafted,
        "{drafted} drafted, {accepted} accepted"
    );
    for row in &greedy {
        assert_eq!(row["n_gen"], 32);
        assert!(row["avg_ts"].as_f64().expect("t/s") > 0.0);
    }
    // The passes each row ran: the first token comes from the prompt's pass, each later one
    // from a pass of its own in plain decoding; with drafts, a pass of 1 + k tokens yields its
    // accepted drafts and one more token, so the passes' tokens exceed 31 by the rejected ones.
    let passes = |row: &serde_json::Value| -> Vec<(u64, u64, f64)> {
        row["passes"]
            .as_array()
            .expect("passes")
            .iter()
            .map(|p| {
                let ms = p["avg_ms"].as_f64().expect("ms");
                assert!(ms > 0.0, "{p}");
                (
                    p["tokens"].as_u64().expect("tokens"),
                    p["count"].as_u64().expect("count"),
                    ms,
                )
            })
            .collect()
    };
    let plain = passes(greedy[0]);
    assert_eq!(plain.len(), 1, "{plain:?}");
    assert_eq!((plain[0].0, plain[0].1), (1, 31));
    let spec = passes(greedy[1]);
    let tokens: u64 = spec.iter().map(|(t, c, _)| t * c).sum();
    assert_eq!(tokens, 31 + drafted - accepted, "{spec:?}");
    let wide: u64 = spec
        .iter()
        .filter(|(t, ..)| *t > 1)
        .map(|(_, c, _)| c)
        .sum();
    assert_eq!(wide > 0, drafted > 0, "{spec:?}");
}
