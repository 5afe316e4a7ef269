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

#[test]
fn run_repairs_drift_on_its_reverify_schedule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("board");
    supervisor::board::sim::init(&root, supervisor::board::sim::Variant::Pi5_8gb).expect("sim");
    std::fs::write(
        root.join("etc/appliance/appliance.toml"),
        "[daemon]\nreverify_interval_s = 1\n",
    )
    .expect("config");
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_supervisor"))
        .args(["--root", root.to_str().expect("utf8"), "run"])
        .env("NOTIFY_SOCKET", &socket_path)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    receive_until(&socket, "READY=1", Duration::from_secs(20));

    // Another service resets the governor behind the supervisor's back.
    let governor = root.join("sys/devices/system/cpu/cpufreq/policy0/scaling_governor");
    std::fs::write(&governor, "ondemand\n").expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&governor).expect("read").trim() != "performance" {
        assert!(
            Instant::now() < deadline,
            "the daemon did not restore the governor"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("signal");
    assert!(child.wait().expect("wait").success());
}
