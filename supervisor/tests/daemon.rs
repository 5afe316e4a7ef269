//! `supervisor run` under a stand-in for systemd's notify socket: it tunes, reports READY,
//! feeds the watchdog, and stops cleanly on SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn receive_until(socket: &UnixDatagram, wanted: &str, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            let message = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = message.lines().any(|l| l == wanted);
            seen.push(message);
            if done {
                return seen;
            }
        }
    }
    panic!("no {wanted} within {timeout:?}; got {seen:?}");
}

#[test]
fn run_notifies_ready_pings_the_watchdog_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("board");
    supervisor::board::sim::init(&root, supervisor::board::sim::Variant::Pi5_8gb).expect("sim");
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");

    let mut child = Command::new(env!("CARGO_BIN_EXE_supervisor"))
        .args(["--root", root.to_str().expect("utf8"), "run"])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");

    let ready = receive_until(&socket, "READY=1", Duration::from_secs(20));
    // READY comes after tuning, so the board is already tuned.
    let governor = std::fs::read_to_string(
        root.join("sys/devices/system/cpu/cpufreq/policy0/scaling_governor"),
    )
    .expect("read");
    assert_eq!(governor.trim(), "performance");
    assert!(ready.concat().contains("STATUS=tuning:"), "{ready:?}");
    receive_until(&socket, "WATCHDOG=1", Duration::from_secs(5));

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("signal");
    receive_until(&socket, "STOPPING=1", Duration::from_secs(5));
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
}
