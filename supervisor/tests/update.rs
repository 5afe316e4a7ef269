//! A/B updates on a simulated board whose firmware honours tryboot for exactly one boot and
//! boots the slot folder `config.txt` (or `tryboot.txt`) names (`supervisor sim boot`). RAUC's
//! part is played by calling the supervisor as RAUC calls it (`update backend`, `update
//! post-install` with RAUC's environment) after `sim write-slot` stands in for RAUC writing the
//! new root filesystem. A good update commits; one whose engine never becomes healthy rolls
//! back by itself; a hang rolls back through the watchdog; a power cut after every durable
//! write leaves a box that boots a committed slot; overclock trials and updates exclude each
//! other.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{BIN, engine_binary, free_port};
use test_support::Owned;

const BOOT: &str = "boot/firmware";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

struct Sim {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Sim {
    fn new() -> Sim {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("board");
        board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
        Sim { _dir: dir, root }
    }

    fn configure(&self, text: &str) {
        std::fs::write(self.root.join("etc/appliance/appliance.toml"), text).expect("config");
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command.arg("--root").arg(&self.root).args(args);
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("supervisor")
    }

    fn run_ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    fn sim(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("sim")
            .args(args)
            .output()
            .expect("supervisor sim")
    }

    fn boot(&self) -> String {
        let out = self.sim(&["boot", self.root.to_str().expect("utf8")]);
        assert!(out.status.success(), "sim boot: {}", text(&out.stderr));
        text(&out.stdout)
    }

    fn write_slot(&self, slot: &str, version: &str) {
        let out = self.sim(&[
            "write-slot",
            self.root.to_str().expect("utf8"),
            slot,
            version,
        ]);
        assert!(
            out.status.success(),
            "sim write-slot: {}",
            text(&out.stderr)
        );
    }

    /// What RAUC's post-install handler is given for writing slot B.
    fn post_install(&self) -> Output {
        self.command(&["update", "post-install"])
            .env("RAUC_SLOTS", "1 2")
            .env("RAUC_TARGET_SLOTS", "2")
            .env("RAUC_SLOT_BOOTNAME_1", "A")
            .env("RAUC_SLOT_DEVICE_1", "/.appliance-sim-slots/A")
            .env("RAUC_SLOT_BOOTNAME_2", "B")
            .env("RAUC_SLOT_DEVICE_2", "/.appliance-sim-slots/B")
            .output()
            .expect("post-install")
    }

    /// RAUC installing `version` into slot B: marked bad, written, made primary, post-install.
    fn rauc_install(&self, version: &str) {
        self.run_ok(&["update", "backend", "set-state", "B", "bad"]);
        self.write_slot("B", version);
        self.run_ok(&["update", "backend", "set-primary", "B"]);
        let out = self.post_install();
        assert!(out.status.success(), "post-install: {}", text(&out.stderr));
    }

    fn status(&self) -> Value {
        let out = self.run_ok(&["update", "status", "--json"]);
        serde_json::from_str(&out).expect("json")
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap_or_default()
    }

    fn committed_prefix(&self) -> String {
        config_txt::setting(&self.read(&format!("{BOOT}/config.txt")), "os_prefix")
            .unwrap_or("")
            .to_string()
    }

    fn booted(&self) -> String {
        self.status()["booted"].as_str().unwrap_or("").to_string()
    }

    fn reboot_requested(&self) -> bool {
        self.root.join(".appliance-sim-reboot").exists()
    }

    /// The daemon with the real engine on the real default model.
    fn daemon(&self, extra: &str) -> Owned {
        let config = format!(
            "[daemon]\nreverify_interval_s = 0\n\n[engine]\nbinary = \"{}\"\nport = {}\nhealth_interval_s = 1\nrestart_backoff_ms = 100\nmax_restarts = 1\n\n[dashboard]\nlisten = \"127.0.0.1:{}\"\n\n{extra}",
            engine_binary().display(),
            free_port(),
            free_port()
        );
        self.configure(&config);
        Owned::spawn(
            self.command(&["run"])
                .env_remove("NOTIFY_SOCKET")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "supervisor run",
        )
    }

    /// Waits until the update record has a last outcome, then stops the daemon.
    fn wait_for_verdict(&self, mut daemon: Owned, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let status = self.status();
            if status["trial"].is_null() && !status["last"].is_null() {
                let _ = daemon.kill();
                let _ = daemon.wait();
                return status;
            }
            if Instant::now() > deadline {
                let _ = daemon.kill();
                let _ = daemon.wait();
                panic!("no verdict within {within:?}: {status:#}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

#[test]
fn a_healthy_update_is_committed_and_boots_from_then_on() {
    let sim = Sim::new();
    common::install_default_model(&sim.root);
    assert_eq!(sim.booted(), "A");
    assert_eq!(sim.committed_prefix(), "slot-a/");
    sim.rauc_install("2");
    // Installed, not yet tried: config.txt still boots A, tryboot.txt points at B.
    assert_eq!(sim.committed_prefix(), "slot-a/");
    let tryboot = sim.read(&format!("{BOOT}/tryboot.txt"));
    assert_eq!(config_txt::setting(&tryboot, "os_prefix"), Some("slot-b/"));
    assert!(
        sim.read(&format!("{BOOT}/slot-b/cmdline.txt"))
            .contains("root=PARTUUID=feed0001-03")
    );
    assert!(
        sim.read(&format!("{BOOT}/slot-b/cmdline.txt"))
            .contains("rauc.slot=B")
    );
    assert_eq!(sim.status()["trial"]["system_version"], "2");
    sim.run_ok(&["update", "reboot"]);
    let story = sim.boot();
    assert!(story.contains("tryboot.txt (tryboot)"), "{story}");
    assert_eq!(sim.booted(), "B");
    let status = sim.wait_for_verdict(sim.daemon(""), Duration::from_secs(120));
    assert_eq!(status["last"]["result"], "committed", "{status:#}");
    assert_eq!(status["last"]["system_version"], "2");
    assert_eq!(status["last"]["from_version"], "1");
    assert_eq!(sim.committed_prefix(), "slot-b/");
    // From now on a plain boot (no tryboot) runs B.
    let story = sim.boot();
    assert!(story.contains("booted config.txt at"), "{story}");
    assert_eq!(sim.booted(), "B");
    sim.run_ok(&["update", "boot"]);
    let status = sim.status();
    let slots = status["slots"].as_array().expect("slots");
    assert_eq!(slots[1]["system_version"], "2");
    assert_eq!(slots[1]["booted"], true);
    assert_eq!(slots[0]["system_version"], "1");
    assert_eq!(status["committed"], "B");
    // And `status --json` carries the same section.
    let full: Value = serde_json::from_str(&sim.run_ok(&["status", "--json"])).expect("json");
    assert_eq!(full["update"]["committed"], "B");
}

#[test]
fn an_update_whose_engine_never_becomes_healthy_rolls_back_by_itself() {
    let sim = Sim::new();
    common::install_default_model(&sim.root);
    sim.rauc_install("3");
    sim.run_ok(&["update", "reboot"]);
    sim.boot();
    assert_eq!(sim.booted(), "B");
    // The new system's engine cannot run.
    let broken = sim.root.join("broken-engine");
    std::fs::write(&broken, "#!/bin/sh\nexit 1\n").expect("script");
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let mut daemon = sim.daemon("[update]\nhealth_timeout_s = 60\n");
    // Killed once its check has begun; its config then points at the broken engine.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sim.status()["trial"]["checking_since_unix"].is_null() {
        assert!(Instant::now() < deadline, "the check never began");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let config = sim.read("etc/appliance/appliance.toml").replace(
        &engine_binary().display().to_string(),
        &broken.display().to_string(),
    );
    sim.configure(&config);
    // A supervisor restarted in the same boot (a crash, a provisioning stick's restart) goes on
    // checking, its time still counted from the first start.
    let out = sim.run_ok(&["update", "boot"]);
    assert!(out.contains("this boot tries slot B"), "{out}");
    assert!(!sim.reboot_requested());
    // Now with the broken engine: the supervision gives up on it and the slot is rolled back.
    let daemon = Owned::spawn(
        sim.command(&["run"])
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "supervisor run",
    );
    let status = sim.wait_for_verdict(daemon, Duration::from_secs(120));
    assert_eq!(status["last"]["result"], "rolled-back", "{status:#}");
    assert!(
        status["last"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("engine"),
        "{status:#}"
    );
    assert_eq!(status["slots"][1]["state"], "bad");
    assert!(sim.reboot_requested(), "the rollback reboots");
    assert_eq!(sim.committed_prefix(), "slot-a/");
    let story = sim.boot();
    assert!(story.contains("booted config.txt"), "{story}");
    assert_eq!(sim.booted(), "A");
    sim.run_ok(&["update", "boot"]);
    assert_eq!(sim.status()["slots"][0]["system_version"], "1");
}

#[test]
fn a_check_whose_time_ran_out_across_restarts_rolls_back() {
    let sim = Sim::new();
    sim.rauc_install("2");
    sim.run_ok(&["update", "reboot"]);
    sim.boot();
    let out = sim.run_ok(&["update", "boot"]);
    assert!(out.contains("900 s left"), "{out}");
    // The supervisor keeps crashing; the box's clock passes the default 900 s.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    std::fs::write(
        sim.root.join(".appliance-sim-clock"),
        format!("{}\n", now + 1000),
    )
    .expect("clock");
    let out = sim.run_ok(&["update", "boot"]);
    assert!(out.contains("time ran out"), "{out}");
    assert!(sim.reboot_requested());
    sim.boot();
    assert_eq!(sim.booted(), "A");
    // A trial boot whose check began in another boot (the id changed) is not resumed either.
    sim.rauc_install("2");
    sim.run_ok(&["update", "reboot"]);
    sim.boot();
    sim.run_ok(&["update", "boot"]);
    board_sim::firmware::write_boot_id(&sim.root).expect("boot id");
    let out = sim.run_ok(&["update", "boot"]);
    assert!(out.contains("cut off"), "{out}");
}

#[test]
fn a_slot_that_hangs_rolls_back_through_the_watchdog() {
    let sim = Sim::new();
    std::fs::write(
        sim.root.join(".appliance-sim-faults.toml"),
        "hang_slots = [\"B\"]\n",
    )
    .expect("faults");
    sim.rauc_install("2");
    sim.run_ok(&["update", "reboot"]);
    let story = sim.boot();
    assert!(
        story.contains("hangs, the watchdog reset the board"),
        "{story}"
    );
    assert_eq!(sim.booted(), "A");
    let out = sim.run_ok(&["update", "boot"]);
    assert!(out.contains("rolled back"), "{out}");
    let status = sim.status();
    assert_eq!(status["last"]["result"], "rolled-back");
    assert!(
        status["last"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("never reached its health check"),
        "{status:#}"
    );
    assert_eq!(status["slots"][1]["state"], "bad");
    assert_eq!(sim.committed_prefix(), "slot-a/");
    // The next plain boot runs A and leaves nothing armed.
    sim.boot();
    assert_eq!(sim.booted(), "A");
    let tryboot = sim.read(&format!("{BOOT}/tryboot.txt"));
    assert_eq!(tryboot, sim.read(&format!("{BOOT}/config.txt")));
}

#[test]
fn a_power_cut_after_any_write_leaves_a_committed_slot_booting() {
    // The whole update through RAUC's calls and a commit by mark-good; the power fails after
    // the Nth durable write, for every N until the sequence runs through.
    let steps: [&[&str]; 5] = [
        &["update", "backend", "set-state", "B", "bad"],
        &["update", "backend", "set-primary", "B"],
        &["post-install"],
        &["update", "reboot"],
        &["update", "backend", "set-state", "B", "good"],
    ];
    let mut cut_at = 1;
    loop {
        let sim = Sim::new();
        std::fs::write(
            sim.root.join(".appliance-sim-power-cut"),
            format!("{cut_at}\n"),
        )
        .expect("power cut");
        let mut cut = false;
        for (i, step) in steps.iter().enumerate() {
            if i == 2 {
                sim.write_slot("B", "2");
            }
            let out = if step[0] == "post-install" {
                sim.post_install()
            } else {
                sim.run(step)
            };
            if out.status.code() == Some(137) {
                cut = true;
                break;
            }
            assert!(out.status.success(), "{step:?}: {}", text(&out.stderr));
            if step.get(1) == Some(&"reboot") {
                sim.boot();
                let out = sim.run(&["update", "boot"]);
                if out.status.code() == Some(137) {
                    cut = true;
                    break;
                }
                assert!(out.status.success(), "update boot: {}", text(&out.stderr));
            }
        }
        // Power back on: whatever was cut, the box boots a slot config.txt commits to.
        sim.boot();
        let out = sim.run(&["update", "boot"]);
        assert!(
            out.status.success(),
            "cut at {cut_at}: {}",
            text(&out.stderr)
        );
        if sim.reboot_requested() {
            sim.boot();
            sim.run_ok(&["update", "boot"]);
        }
        let booted = sim.booted();
        let prefix = sim.committed_prefix();
        assert_eq!(
            prefix,
            format!("slot-{}/", booted.to_lowercase()),
            "cut at {cut_at}: booted {booted} but config.txt boots {prefix}"
        );
        let status = sim.status();
        assert!(status["error"].is_null(), "cut at {cut_at}: {status:#}");
        if booted == "B" {
            assert_eq!(status["slots"][1]["system_version"], "2", "cut at {cut_at}");
        }
        if !cut {
            assert_eq!(booted, "B", "the uninterrupted update commits");
            assert_eq!(status["last"]["result"], "committed");
            assert!(
                cut_at > 10,
                "only {cut_at} writes: the sequence was not exercised"
            );
            break;
        }
        cut_at += 1;
        assert!(cut_at < 100, "the sequence never ran through");
    }
}

#[test]
fn overclock_trials_and_updates_never_run_at_once() {
    let sim = Sim::new();
    sim.configure("[overclock]\nenabled = true\ncheck_seconds = 1\nengine_check = false\nsteps = [{ arm_freq = 2600 }]\n");
    sim.rauc_install("2");
    let out = sim.run(&["overclock", "start"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("an update to slot B is pending"),
        "{}",
        text(&out.stderr)
    );
    sim.run_ok(&["update", "cancel"]);
    assert_eq!(sim.status()["last"]["result"], "cancelled");
    // A ladder under way refuses an update's arming (RAUC's install then fails).
    let out = sim.run(&["overclock", "start"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = sim.run(&["update", "backend", "set-primary", "B"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("overclock ladder is running"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_slot_without_its_boot_files_is_never_rebooted_into() {
    let sim = Sim::new();
    sim.run_ok(&["update", "backend", "set-state", "B", "bad"]);
    sim.run_ok(&["update", "backend", "set-primary", "B"]);
    // RAUC wrote a root filesystem without the boot folder (not one of our bundles).
    std::fs::create_dir_all(sim.root.join(".appliance-sim-slots/B/usr")).expect("dir");
    let out = sim.post_install();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("usr/lib/appliance/boot"),
        "{}",
        text(&out.stderr)
    );
    let out = sim.run(&["update", "reboot"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("boot files were never copied"),
        "{}",
        text(&out.stderr)
    );
    assert!(!sim.reboot_requested());
    // RAUC's view stays sane: the running slot is good, primary is the armed one until called off.
    assert_eq!(
        sim.run_ok(&["update", "backend", "get-current"]).trim(),
        "A"
    );
    assert_eq!(
        sim.run_ok(&["update", "backend", "get-state", "A"]).trim(),
        "good"
    );
    sim.run_ok(&["update", "backend", "set-primary", "A"]);
    assert_eq!(
        sim.run_ok(&["update", "backend", "get-primary"]).trim(),
        "A"
    );
    let out = sim.run(&["update", "backend", "set-state", "A", "bad"]);
    assert!(
        !out.status.success(),
        "the running, committed slot cannot be marked bad"
    );
}
