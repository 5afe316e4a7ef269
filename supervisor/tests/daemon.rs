//! `supervisor run` under a stand-in for systemd's notify socket: it tunes, reports READY,
//! feeds the watchdog, repairs drift without holding up the dashboard however slow the board's
//! writes, and stops cleanly on SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use test_support::Owned;

mod common;

/// A simulated board, a notify socket, and `supervisor run` on them.
struct Daemon {
    _dir: tempfile::TempDir,
    root: PathBuf,
    socket: UnixDatagram,
    child: Owned,
}

fn start(config: &str, watchdog_usec: Option<&str>) -> Daemon {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("board");
    board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
    std::fs::write(root.join("etc/appliance/appliance.toml"), config).expect("config");
    let socket_path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&socket_path).expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut command = Command::new(env!("CARGO_BIN_EXE_supervisor"));
    command
        .args(["--root", root.to_str().expect("utf8"), "run"])
        .env("NOTIFY_SOCKET", &socket_path)
        .env_remove("WATCHDOG_PID")
        .env_remove("WATCHDOG_USEC")
        .stderr(Stdio::null());
    if let Some(usec) = watchdog_usec {
        command.env("WATCHDOG_USEC", usec);
    }
    let child = Owned::spawn(&mut command, "supervisor run");
    Daemon {
        _dir: dir,
        root,
        socket,
        child,
    }
}

impl Daemon {
    fn receive_until(&self, wanted: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.socket.recv(&mut buf) {
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

    fn governor(&self) -> PathBuf {
        self.root
            .join("sys/devices/system/cpu/cpufreq/policy0/scaling_governor")
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).expect("signal");
        self.child.wait().expect("wait")
    }
}

#[test]
fn run_notifies_ready_pings_the_watchdog_and_stops_on_sigterm() {
    let daemon = start("", Some("400000"));
    let ready = daemon.receive_until("READY=1", Duration::from_secs(20));
    // READY comes after tuning, so the board is already tuned.
    let governor = std::fs::read_to_string(daemon.governor()).expect("read");
    assert_eq!(governor.trim(), "performance");
    let status = ready.concat();
    assert!(status.contains("STATUS=tuning:"), "{ready:?}");
    // No model is installed on this board: READY still comes, and the status says so.
    assert!(status.contains("refused"), "{ready:?}");
    daemon.receive_until("WATCHDOG=1", Duration::from_secs(5));

    kill(Pid::from_raw(daemon.child.id() as i32), Signal::SIGTERM).expect("signal");
    daemon.receive_until("STOPPING=1", Duration::from_secs(5));
    let mut daemon = daemon;
    assert!(daemon.child.wait().expect("wait").success());
}

#[test]
fn run_repairs_drift_on_its_reverify_schedule() {
    let daemon = start("[daemon]\nreverify_interval_s = 1\n", None);
    daemon.receive_until("READY=1", Duration::from_secs(20));

    // Another service resets the governor behind the supervisor's back.
    std::fs::write(daemon.governor(), "ondemand\n").expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(daemon.governor())
        .expect("read")
        .trim()
        != "performance"
    {
        assert!(
            Instant::now() < deadline,
            "the daemon did not restore the governor"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(daemon.terminate().success());
}

#[test]
fn slow_board_writes_while_drift_is_repaired_do_not_hold_up_the_dashboard() {
    let port = common::free_port();
    let daemon = start(
        &format!(
            "[daemon]\nreverify_interval_s = 1\n\n[dashboard]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
        None,
    );
    daemon.receive_until("READY=1", Duration::from_secs(20));
    // No model is installed: once the engine is published as blocked it writes nothing more,
    // so every slow write below is the re-verification's.
    let engine = daemon.root.join("run/appliance/engine.json");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let asset = format!("http://127.0.0.1:{port}/assets/style.css");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&engine).is_ok_and(|s| s.contains("\"blocked\""))
        || agent.get(&asset).call().is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the engine never blocked or the dashboard never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let stall = Duration::from_secs(3);
    std::fs::write(
        daemon.root.join(".appliance-sim-slow-writes"),
        stall.as_millis().to_string(),
    )
    .expect("slow writes");
    std::fs::write(daemon.governor(), "ondemand\n").expect("drift");
    let drifted = Instant::now();
    let mut slowest = Duration::ZERO;
    while std::fs::read_to_string(daemon.governor())
        .expect("read")
        .trim()
        != "performance"
    {
        assert!(
            drifted.elapsed() < Duration::from_secs(30),
            "the daemon did not restore the governor"
        );
        let asked = Instant::now();
        agent.get(&asset).call().expect("the dashboard answers");
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The repair's write took the stall, so the dashboard was asked all through it.
    assert!(drifted.elapsed() >= stall, "{:?}", drifted.elapsed());
    assert!(
        slowest < Duration::from_secs(1),
        "the dashboard took {slowest:?} to answer while the board was slow"
    );
    std::fs::remove_file(daemon.root.join(".appliance-sim-slow-writes")).expect("fast again");
    assert!(daemon.terminate().success());
}
