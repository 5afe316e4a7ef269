//! The `engine` binary: generate, tokenize and score on the default model; bad paths fail cleanly.

mod common;

use std::process::{Command, Output};

use common::smollm2;
use serde_json::Value;

fn engine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(args)
        .output()
        .expect("run engine")
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

#[test]
fn greedy_generation_is_identical_across_threads_and_runs() {
    let model = smollm2();
    let m = model.to_str().expect("utf8");
    let run = |t: &str| {
        json(&engine(&[
            "generate",
            "-m",
            m,
            "-p",
            "The capital of France is",
            "-n",
            "8",
            "--temp",
            "0",
            "-t",
            t,
            "--json",
        ]))
    };
    let one = run("1");
    assert_eq!(one, run("2"));
    assert_eq!(one, run("2"));
    assert!(
        one["text"].as_str().expect("text").starts_with(" Paris"),
        "{one}"
    );
    assert_eq!(one["stop"], "limit");
    assert_eq!(one["tokens"].as_array().expect("tokens").len(), 8);
}

#[test]
fn tokenize_and_score_agree_with_generation() {
    let model = smollm2();
    let m = model.to_str().expect("utf8");
    let ids = json(&engine(&[
        "tokenize",
        "-m",
        m,
        "The capital of France is",
        "--json",
    ]));
    let generated = json(&engine(&[
        "generate",
        "-m",
        m,
        "-p",
        "The capital of France is",
        "-n",
        "3",
        "--temp",
        "0",
        "--json",
    ]));
    assert_eq!(ids, generated["prompt_tokens"]);
    let mut all: Vec<Value> = ids.as_array().expect("ids").clone();
    all.extend(
        generated["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .cloned(),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ids.json");
    std::fs::write(&file, serde_json::to_string(&all).expect("json")).expect("write");
    let from = ids.as_array().expect("ids").len();
    let scored = json(&engine(&[
        "score",
        "-m",
        m,
        "--ids",
        file.to_str().expect("utf8"),
        "--from",
        &from.to_string(),
        "--top",
        "3",
        "--json",
    ]));
    let positions = scored["positions"].as_array().expect("positions");
    assert_eq!(positions.len(), 3);
    // Greedy generation picks exactly the top-1 of each teacher-forced position.
    for (p, token) in positions
        .iter()
        .zip(generated["tokens"].as_array().expect("tokens"))
    {
        assert_eq!(&p["top"][0][0], token);
    }
}

#[test]
fn bad_models_exit_nonzero_with_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"this is not a model at all, not even close").expect("write");
    // A context the model cannot hold is refused before anything is allocated for it.
    let model = smollm2();
    let out = engine(&[
        "generate",
        "-m",
        model.to_str().expect("utf8"),
        "-p",
        "hi",
        "-c",
        "100000000000",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trained for 1 to 8192"));
    for path in [junk.to_str().expect("utf8"), "/nonexistent/model.gguf"] {
        let out = engine(&["generate", "-m", path, "-p", "hi"]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(path), "{stderr}");
    }
}

/// `--chat` sends the prompt through the model's template; plain output streams the same text
/// that `--json` reports.
#[test]
fn chat_generation_uses_the_template_and_streams_the_text() {
    let model = smollm2();
    let m = model.to_str().expect("utf8");
    let args = |json: bool| {
        let mut a = vec![
            "generate",
            "-m",
            m,
            "-p",
            "What is 2+2?",
            "-n",
            "6",
            "--temp",
            "0",
            "--chat",
        ];
        if json {
            a.push("--json");
        }
        engine(&a)
    };
    let reported = json(&args(true));
    let ids = json(&engine(&[
        "tokenize",
        "-m",
        m,
        "--special",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "--json",
    ]));
    assert_eq!(reported["prompt_tokens"], ids);
    let plain = args(false);
    assert!(plain.status.success());
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout).trim_end_matches('\n'),
        reported["text"].as_str().expect("text")
    );
}

/// `--installed` runs what the supervisor installed (found through `DATA/models/<id>/current`)
/// exactly as `-m` runs the same file, and says how to install when nothing is.
#[test]
fn generate_runs_the_installed_model() {
    let data = tempfile::tempdir().expect("tempdir");
    let d = data.path().to_str().expect("utf8");
    let out = engine(&["generate", "--installed", "--data", d, "-p", "hi"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("supervisor weights fetch-default"),
        "{stderr}"
    );
    assert!(stderr.contains(d), "{stderr}");

    let manifest_text = include_str!("../../models/smollm2-135m-instruct-q4_1.toml");
    let trust = weights::sign::Trust::new(&[], false).expect("trust");
    let signed = trust
        .check(manifest_text.as_bytes(), None)
        .expect("unsigned");
    let approval = weights::install::Approval {
        manifest: weights::Manifest::parse(manifest_text, "manifest").expect("manifest"),
        text: manifest_text.to_string(),
        signature: None,
        signed,
    };
    let installed = weights::install::install(&smollm2(), &approval, data.path()).expect("install");
    let generate = |model: &[&str]| {
        let mut args = vec!["generate"];
        args.extend_from_slice(model);
        args.extend_from_slice(&[
            "-p",
            "The capital of France is",
            "-n",
            "4",
            "--temp",
            "0",
            "--json",
        ]);
        json(&engine(&args))
    };
    let by_path = generate(&["-m", installed.path.to_str().expect("utf8")]);
    assert_eq!(generate(&["--installed", "--data", d]), by_path);
    assert_eq!(
        generate(&["--installed", &approval.manifest.id, "--data", d]),
        by_path
    );
    let out = engine(&[
        "generate",
        "--installed",
        "gemma3-270m-q4_k_m",
        "--data",
        d,
        "-p",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gemma3-270m-q4_k_m is not installed"),
        "{stderr}"
    );
}

#[test]
fn a_model_that_cannot_fit_the_memory_limit_is_refused_with_what_would_fit() {
    let model = smollm2();
    let m = model.to_str().expect("utf8");
    let generate = |ctx: &str, limit: &str| {
        engine(&[
            "generate",
            "-m",
            m,
            "-p",
            "Hi",
            "-n",
            "2",
            "--temp",
            "0",
            "-c",
            ctx,
            "--memory-limit",
            limit,
            "--json",
        ])
    };
    // SmolLM2's KV cache takes 22.5 KiB a token: 8192 tokens are 180 MiB beside 92 MiB of
    // weights, more than 200 MiB.
    let refused = generate("8192", "200");
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("not enough memory") && message.contains("200 MiB (--memory-limit)"),
        "{message}"
    );
    let fits: usize = message
        .split("-c ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no context suggested: {message}"));
    assert!((1000..8192).contains(&fits), "{message}");
    // The context it suggests does fit, and so does the same model with no limit checked.
    let ok = json(&generate(&fits.to_string(), "200"));
    assert_eq!(ok["tokens"].as_array().expect("tokens").len(), 2);
    json(&generate("8192", "0"));
    // The weights alone over the limit: the server refuses before it serves anything.
    let served = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["serve", "-m", m, "--port", "0", "--memory-limit", "100"])
        .output()
        .expect("run engine serve");
    assert!(!served.status.success());
    let message = String::from_utf8_lossy(&served.stderr);
    assert!(
        message.contains("the model alone does not fit"),
        "{message}"
    );
}

/// `engine fit` (what `appliance model manifest` asks): the model loads, and the longest
/// context each board size holds is the one `generate` itself accepts under that limit.
#[test]
fn fit_reports_the_context_each_board_size_holds() {
    let model = smollm2();
    let m = model.to_str().expect("utf8");
    // A "1 GB" board keeping 824 MiB for the system leaves the engine 200 MiB.
    let report = json(&engine(&[
        "fit",
        "-m",
        m,
        "-c",
        "8192",
        "--cache-mib",
        "0",
        "--boards",
        "1,16",
        "--reserve-mib",
        "824",
    ]));
    assert_eq!(report["trained_context"], 8192, "{report:#}");
    let (small, big) = (&report["boards"][0], &report["boards"][1]);
    assert_eq!(small["limit_bytes"], 200u64 << 20, "{report:#}");
    assert_eq!(small["fits"], false, "{report:#}");
    assert_eq!(
        (big["fits"].clone(), big["max_context"].clone()),
        (true.into(), 8192.into())
    );
    let most = small["max_context"].as_u64().expect("max_context");
    assert!((1000..8192).contains(&most), "{report:#}");
    let generate = |ctx: u64| {
        engine(&[
            "generate",
            "-m",
            m,
            "-p",
            "Hi",
            "-n",
            "1",
            "--temp",
            "0",
            "-c",
            &ctx.to_string(),
            "--memory-limit",
            "200",
            "--json",
        ])
    };
    assert!(generate(most).status.success(), "the reported context fits");
    assert!(
        !generate(most + 1).status.success(),
        "one more token does not"
    );
    // A file that is no model: no report, one line saying why.
    let dir = tempfile::tempdir().expect("dir");
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF not a model").expect("junk");
    let out = engine(&["fit", "-m", junk.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}
