//! Overclock trials on a simulated board whose firmware honours tryboot for exactly one boot
//! (`supervisor sim boot`), with injected faults: a hang the watchdog resets, a CPU that
//! computes wrong answers, a temperature spike, a capped clock, and a power cut after any
//! durable write. In every case the box must end on a known-good, complete `config.txt`, never
//! retry a failed step, and the record must say what happened.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_supervisor");
const BOOT: &str = "boot/firmware";

struct Sim {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Sim {
    /// A board with `steps` as the ladder, one-second checks and no engine comparison.
    fn new(steps: &[u32], faults: &str) -> Sim {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("board");
        board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
        let config = dir.path().join("appliance.toml");
        let steps: Vec<String> = steps
            .iter()
            .map(|f| format!("{{ arm_freq = {f} }}"))
            .collect();
        std::fs::write(
            &config,
            format!(
                "[overclock]\nenabled = true\ncheck_seconds = 1\nengine_check = false\nsteps = [{}]\n",
                steps.join(", ")
            ),
        )
        .expect("config");
        std::fs::write(root.join(".appliance-sim-faults.toml"), faults).expect("faults");
        Sim {
            _dir: dir,
            root,
            config,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--root")
            .arg(&self.root)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("supervisor")
    }

    /// Runs a subcommand that must succeed (the message shows what it printed).
    fn run_ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        out
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }

    fn reboot_requested(&self) -> bool {
        self.root.join(".appliance-sim-reboot").exists()
    }

    /// The firmware's next boot; returns what it did.
    fn boot(&self) -> String {
        let out = Command::new(BIN)
            .args(["sim", "boot"])
            .arg(&self.root)
            .output()
            .expect("sim boot");
        assert!(out.status.success(), "sim boot: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// Boots and runs what the daemon runs first, for as long as the board keeps rebooting.
    fn settle(&self) {
        for _ in 0..40 {
            if !self.reboot_requested() {
                return;
            }
            self.boot();
            self.run_ok(&["overclock", "boot"]);
            self.assert_config_complete();
        }
        panic!("still rebooting after 40 boots:\n{}", self.boot_log());
    }

    fn record(&self) -> Value {
        let out = self.run_ok(&["overclock", "status", "--json"]);
        serde_json::from_slice(&out.stdout).expect("json")
    }

    fn boot_log(&self) -> String {
        self.read(".appliance-sim-boots.log").unwrap_or_default()
    }

    fn config_txt(&self) -> String {
        self.read(&format!("{BOOT}/config.txt"))
            .expect("config.txt")
    }

    /// `config.txt` is exactly the assembly of the fragments beside it.
    fn assert_config_complete(&self) {
        let dir = self.root.join(BOOT).join("config.txt.d");
        let fragments = config_txt::read_dir(&dir).expect("fragments");
        let assembled = config_txt::assemble(&fragments, "config.txt.d").expect("assemble");
        assert_eq!(
            self.config_txt(),
            assembled,
            "config.txt is not its fragments' assembly"
        );
    }

    /// `config.txt` is a whole assembly, possibly of the fragments as they were before the
    /// last write: what a power cut between the fragment and `config.txt` leaves.
    fn assert_config_whole(&self) {
        let config = self.config_txt();
        let mut sections = config.split("\n# --- ");
        assert_eq!(
            sections.next(),
            Some("# Assembled from config.txt.d/; do not edit here.\n"),
            "{config}"
        );
        let dir = self.root.join(BOOT).join("config.txt.d");
        for section in sections {
            let (name, body) = section.split_once(" ---\n").expect("section header");
            if name == "50-overclock.txt" {
                let clock = config_txt::setting(body, "arm_freq").expect("arm_freq");
                assert!(clock.parse::<u32>().is_ok_and(|c| c > 2400), "{config}");
            } else {
                let fragment = std::fs::read_to_string(dir.join(name)).expect("fragment");
                assert_eq!(body.trim_end(), fragment.trim_end(), "{config}");
            }
        }
        assert!(config.ends_with('\n'));
    }

    fn arm_freq(&self) -> Option<String> {
        config_txt::setting(&self.config_txt(), "arm_freq").map(str::to_string)
    }

    /// `supervisor run` on this board, as systemd starts it at every boot.
    fn daemon(&self) -> test_support::Owned {
        test_support::Owned::spawn(
            Command::new(BIN)
                .arg("--root")
                .arg(&self.root)
                .arg("--config")
                .arg(&self.config)
                .arg("run"),
            "supervisor run",
        )
    }

    /// Runs `overclock COMMAND`, which must fail with exit status 1 and say `needle`.
    fn refused(&self, command: &str, needle: &str) {
        let out = self.run(&["overclock", command]);
        assert_eq!(out.status.code(), Some(1), "{command}");
        assert!(
            text(&out.stderr).contains(needle),
            "{command}: {}",
            text(&out.stderr)
        );
    }

    fn start(&self) {
        self.run_ok(&["overclock", "start"]);
    }
}

fn trials(record: &Value) -> Vec<(u64, u64, String, String)> {
    record["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .map(|t| {
            (
                t["run"].as_u64().expect("run"),
                t["candidate"]["arm_freq"].as_u64().expect("clock"),
                t["status"].as_str().expect("status").to_string(),
                t["reason"].as_str().expect("reason").to_string(),
            )
        })
        .collect()
}

fn statuses(record: &Value) -> Vec<(u64, String)> {
    trials(record)
        .into_iter()
        .map(|(_, f, s, _)| (f, s))
        .collect()
}

fn pairs(list: &[(u64, &str)]) -> Vec<(u64, String)> {
    list.iter().map(|(f, s)| (*f, s.to_string())).collect()
}

#[test]
fn a_clean_climb_keeps_the_best_step_minus_the_margin() {
    let sim = Sim::new(&[2600, 2700, 2800], "");
    sim.start();
    assert!(sim.reboot_requested(), "the first trial reboots");
    assert_eq!(
        sim.read("run/systemd/reboot-param").as_deref(),
        Some("0 tryboot")
    );
    let tryboot = sim
        .read(&format!("{BOOT}/tryboot.txt"))
        .expect("tryboot.txt");
    assert_eq!(config_txt::setting(&tryboot, "arm_freq"), Some("2600"));
    assert!(
        tryboot.contains("kernel=vmlinuz"),
        "tryboot.txt is the whole config: {tryboot}"
    );
    sim.settle();

    let record = sim.record();
    assert_eq!(record["phase"], "done", "{record:#}");
    assert_eq!(record["result"]["arm_freq"], 2700);
    assert_eq!(
        statuses(&record),
        pairs(&[(2600, "passed"), (2700, "passed"), (2800, "passed")])
    );
    let reference = &record["reference"];
    assert_eq!(reference["passed"], true, "{reference:#}");
    assert!(reference["units"].as_u64().expect("units") > 0);
    let first = &record["trials"][0]["checks"];
    assert_eq!(first["wrong_units"], 0);
    assert_eq!(first["clock_mhz"], 2600, "checked at the trial's clock");
    // Three tryboot boots, each of one trial, then a normal boot with the margin applied.
    let log = sim.boot_log();
    assert_eq!(log.matches("(tryboot)").count(), 3, "{log}");
    assert!(
        log.trim_end().ends_with("booted config.txt at 2700 MHz"),
        "{log}"
    );
    assert_eq!(sim.arm_freq().as_deref(), Some("2700"));
    assert_eq!(
        sim.read(&format!("{BOOT}/tryboot.txt")),
        Some(sim.config_txt()),
        "a stray tryboot boots the kept config"
    );
    // The status document carries the history too.
    let out = sim.run(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status");
    assert_eq!(status["overclock"]["result"]["arm_freq"], 2700);
    // Later boots change nothing.
    let before = sim.config_txt();
    sim.run_ok(&["overclock", "boot"]);
    assert!(!sim.reboot_requested());
    assert_eq!(sim.config_txt(), before);
}

#[test]
fn a_hang_is_reset_by_the_watchdog_and_never_tried_again() {
    let sim = Sim::new(&[2600, 2700, 2800, 2900], "hang_from_mhz = 2800\n");
    sim.start();
    sim.settle();
    let record = sim.record();
    assert_eq!(
        statuses(&record),
        pairs(&[(2600, "passed"), (2700, "passed"), (2800, "failed")])
    );
    let reason = &trials(&record)[2].3;
    assert!(reason.contains("hung or reset"), "{reason}");
    assert_eq!(record["result"]["arm_freq"], 2600);
    assert_eq!(sim.arm_freq().as_deref(), Some("2600"));
    assert_eq!(sim.boot_log().matches("hung").count(), 1);

    // A second run re-tests what passed but stops below the failure.
    sim.start();
    sim.settle();
    let record = sim.record();
    let second: Vec<(u64, String)> = trials(&record)
        .into_iter()
        .filter(|t| t.0 == 2)
        .map(|t| (t.1, t.2))
        .collect();
    assert_eq!(second, pairs(&[(2600, "passed"), (2700, "passed")]));
    assert_eq!(
        sim.boot_log().matches("hung").count(),
        1,
        "2800 never tried again"
    );
    assert_eq!(record["result"]["arm_freq"], 2600);
}

#[test]
fn a_wrong_computation_fails_the_trial() {
    let sim = Sim::new(&[2600, 2700, 2800], "miscompute_from_mhz = 2700\n");
    sim.start();
    sim.settle();
    let record = sim.record();
    assert_eq!(
        statuses(&record),
        pairs(&[(2600, "passed"), (2700, "failed")])
    );
    let failed = &record["trials"][1];
    assert!(
        failed["reason"]
            .as_str()
            .expect("reason")
            .contains("wrong answer"),
        "{failed:#}"
    );
    assert!(failed["checks"]["wrong_units"].as_u64().expect("wrong") > 0);
    assert_eq!(record["result"]["arm_freq"], 2500);
    // The box rebooted off the failed clock onto the kept one.
    assert!(
        sim.boot_log()
            .trim_end()
            .ends_with("booted config.txt at 2500 MHz")
    );
}

#[test]
fn heat_or_a_capped_clock_fails_the_trial() {
    let sim = Sim::new(&[2600, 2700], "hot_from_mhz = 2600\n");
    sim.start();
    sim.settle();
    let record = sim.record();
    assert_eq!(statuses(&record), pairs(&[(2600, "failed")]));
    let reason = &trials(&record)[0].3;
    assert!(reason.contains("over the 80 °C limit"), "{reason}");
    assert_eq!(record["result"], Value::Null);
    assert_eq!(sim.arm_freq(), None, "stock clock kept");
    assert!(
        sim.boot_log()
            .trim_end()
            .ends_with("booted config.txt at 2400 MHz")
    );

    let sim = Sim::new(&[2600, 2700], "throttle_from_mhz = 2700\n");
    sim.start();
    sim.settle();
    let record = sim.record();
    assert_eq!(
        statuses(&record),
        pairs(&[(2600, "passed"), (2700, "failed")])
    );
    let reason = &trials(&record)[1].3;
    assert!(reason.contains("arm-frequency-capped"), "{reason}");
}

#[test]
fn a_power_cut_after_any_write_leaves_a_known_good_config() {
    // The same climb without cuts, for comparison: 2600 passes, 2700 hangs, 2500 kept.
    let ladder = [2600, 2700];
    let faults = "hang_from_mhz = 2700\n";
    let mut cut_at = 1;
    loop {
        let sim = Sim::new(&ladder, faults);
        std::fs::write(
            sim.root.join(".appliance-sim-power-cut"),
            format!("{cut_at}\n"),
        )
        .expect("cut");
        let out = sim.run(&["overclock", "start"]);
        let mut cut = out.status.code() == Some(137);
        assert!(cut || out.status.success(), "start: {}", text(&out.stderr));
        for _ in 0..20 {
            if !cut && !sim.reboot_requested() {
                break;
            }
            // Power comes back (or the reboot completes); the daemon's first act runs.
            sim.boot();
            sim.assert_config_whole();
            let out = sim.run(&["overclock", "boot"]);
            cut = out.status.code() == Some(137);
            assert!(
                cut || out.status.success(),
                "cut after write {cut_at}: overclock boot: {}",
                text(&out.stderr)
            );
            if cut {
                sim.assert_config_whole();
            } else {
                sim.assert_config_complete();
            }
        }
        let fired = !sim.root.join(".appliance-sim-power-cut").exists();
        let record = sim.record();
        let log = sim.boot_log();
        if !fired {
            // Past the last write of the climb: every earlier cut point has been tried.
            assert!(cut_at > 8, "only {cut_at} durable writes in a whole climb?");
            break;
        }
        // However it went, the record is finished, says what happened, and the box runs a
        // config that passed (or stock), and at most one boot hung.
        let trial_list = trials(&record);
        let phase = record["phase"].as_str().expect("phase");
        assert!(
            phase == "done" || phase == "climbing" && trial_list.is_empty(),
            "cut after write {cut_at}: phase {phase}: {record:#}\n{log}"
        );
        if phase == "climbing" {
            // The cut fell before the first trial was armed; starting again finishes the job.
            sim.start();
            sim.settle();
        }
        let record = sim.record();
        assert_eq!(
            record["phase"], "done",
            "cut after write {cut_at}: {record:#}"
        );
        let kept = record["result"]["arm_freq"].as_u64();
        for (_, clock, status, reason) in trials(&record) {
            assert!(
                status == "passed" || status == "failed",
                "cut after write {cut_at}: {clock} {status}"
            );
            assert!(clock != 2700 || status == "failed", "{reason}");
        }
        assert!(
            kept.is_none() || kept == Some(2500),
            "cut after write {cut_at}: kept {kept:?}"
        );
        assert_eq!(
            sim.arm_freq().map(|f| f.parse::<u64>().expect("clock")),
            kept,
            "cut after write {cut_at}: config.txt does not carry the kept clock"
        );
        assert!(
            sim.boot_log().matches("hung").count() <= 1,
            "{}",
            sim.boot_log()
        );
        cut_at += 1;
    }
}

#[test]
fn abort_returns_to_stock_and_the_pending_tryboot_boots_stock() {
    let sim = Sim::new(&[2600, 2700], "");
    let out = sim.run(&["overclock", "abort"]);
    assert_eq!(out.status.code(), Some(1), "nothing to abort yet");
    sim.start();
    assert!(sim.reboot_requested());
    let again = sim.run(&["overclock", "start"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again.stderr).contains("already being climbed"));

    let out = sim.run(&["overclock", "abort"]);
    assert!(out.status.success(), "abort: {}", text(&out.stderr));
    assert_eq!(
        sim.read(&format!("{BOOT}/tryboot.txt")),
        Some(sim.config_txt())
    );
    assert!(
        sim.read("run/systemd/reboot-param").is_none(),
        "the tryboot request is withdrawn"
    );
    // The reboot that was already under way boots the normal config.
    let story = sim.boot();
    assert!(story.contains("booted config.txt at 2400 MHz"), "{story}");
    sim.run_ok(&["overclock", "boot"]);
    assert!(!sim.reboot_requested());
    let record = sim.record();
    assert_eq!(record["phase"], "aborted");
    assert_eq!(statuses(&record), pairs(&[(2600, "aborted")]));
    assert_eq!(sim.arm_freq(), None);
}

#[test]
fn unsafe_or_unclear_states_are_refused_and_left_alone() {
    let sim = Sim::new(&[2600], "");
    // Off unless enabled.
    std::fs::write(&sim.config, "[overclock]\nengine_check = false\n").expect("config");
    sim.refused("start", "enabled = true");

    // No armed watchdog: no trial.
    let sim = Sim::new(&[2600], "");
    std::fs::write(
        sim.root.join("sys/class/watchdog/watchdog0/state"),
        "inactive\n",
    )
    .expect("watchdog");
    sim.refused("start", "watchdog is not armed");
    assert!(!sim.reboot_requested());

    // A board that throttles at stock cannot vouch for any clock: the ladder stops at once.
    let sim = Sim::new(&[2600], "");
    std::fs::write(
        sim.root
            .join("sys/devices/platform/soc@107c000000/soc@107c000000:firmware/get_throttled"),
        "50005\n",
    )
    .expect("throttled");
    sim.refused("start", "fails at stock clock");
    assert!(!sim.reboot_requested());
    let record = sim.record();
    assert_eq!(record["phase"], "aborted");
    assert_eq!(record["reference"]["passed"], false);
    assert_eq!(sim.arm_freq(), None);

    // A broken record is reported, never overwritten.
    let sim = Sim::new(&[2600], "");
    let record = sim.root.join("var/lib/appliance/overclock.json");
    std::fs::create_dir_all(record.parent().expect("dir")).expect("dir");
    std::fs::write(&record, "{ not json").expect("record");
    let out = sim.run(&["overclock", "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("move it aside"),
        "{}",
        text(&out.stdout)
    );
    for command in ["start", "boot"] {
        let out = sim.run(&["overclock", command]);
        assert_eq!(out.status.code(), Some(1), "{command}");
        assert!(
            text(&out.stderr).contains("overclock.json"),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        std::fs::read_to_string(&record).expect("record"),
        "{ not json"
    );

    // An arm_freq set outside the ladder's fragment (in any section) is not the ladder's to
    // take over: refused before anything is recorded.
    let sim = Sim::new(&[2600], "");
    std::fs::write(
        sim.root.join(BOOT).join("config.txt.d/30-custom.txt"),
        "[pi5]\narm_freq=2800\n",
    )
    .expect("fragment");
    sim.refused("start", "config.txt.d/30-custom.txt sets arm_freq=2800");
    assert_eq!(sim.record()["phase"], "idle", "nothing recorded");
    assert!(!sim.reboot_requested());
}

#[test]
fn the_daemon_checks_a_trial_before_anything_else() {
    let sim = Sim::new(&[2600, 2700], "");
    sim.start();
    sim.boot();
    // `supervisor run` on the trial boot: checks 2600, promotes it and reboots into 2700.
    let mut daemon = sim.daemon();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sim.reboot_requested() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(
        sim.reboot_requested(),
        "the daemon never rebooted into the next trial"
    );
    let record = sim.record();
    assert_eq!(
        statuses(&record),
        pairs(&[(2600, "passed"), (2700, "running")])
    );
    assert_eq!(sim.arm_freq().as_deref(), Some("2600"), "2600 promoted");
    // Tuning and the engine wait for the trial: nothing was tuned on this boot.
    let governor = sim
        .read("sys/devices/system/cpu/cpufreq/policy0/scaling_governor")
        .expect("governor");
    assert_eq!(governor.trim(), "ondemand");
}

#[test]
fn an_abort_during_a_trial_check_stops_it_and_reboots_onto_stock() {
    let sim = Sim::new(&[2600, 2700], "");
    sim.start();
    sim.boot();
    let config = std::fs::read_to_string(&sim.config).expect("config");
    std::fs::write(
        &sim.config,
        config.replace("check_seconds = 1", "check_seconds = 600"),
    )
    .expect("config");
    let mut daemon = sim.daemon();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while sim.record()["trials"][0]["checking_since_unix"].is_null() {
        assert!(
            std::time::Instant::now() < deadline,
            "the check never began"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = sim.run(&["overclock", "abort"]);
    assert!(out.status.success(), "abort: {}", text(&out.stderr));
    // The check notices within a sample and the board leaves the trial clock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !sim.reboot_requested() {
        assert!(
            std::time::Instant::now() < deadline,
            "no reboot after the abort"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let record = sim.record();
    assert_eq!(record["phase"], "aborted");
    assert_eq!(statuses(&record), pairs(&[(2600, "aborted")]));
    assert_eq!(sim.arm_freq(), None);
    let story = sim.boot();
    assert!(story.contains("booted config.txt at 2400 MHz"), "{story}");
}

#[test]
fn a_trial_boot_that_cannot_be_confirmed_is_not_passed() {
    // The first trial's boot, changed by `tamper` before the daemon's first act: the trial
    // must fail for `why` and the board leave that boot at once.
    let trial_boot_fails = |tamper: &dyn Fn(&Sim), why: &str| -> Sim {
        let sim = Sim::new(&[2600, 2700], "");
        sim.start();
        sim.boot();
        tamper(&sim);
        sim.run_ok(&["overclock", "boot"]);
        let record = sim.record();
        assert_eq!(statuses(&record), pairs(&[(2600, "failed")]));
        assert!(trials(&record)[0].3.contains(why), "{record:#}");
        assert!(sim.reboot_requested(), "off the trial's boot at once");
        assert_eq!(sim.arm_freq(), None);
        sim
    };
    // The firmware clamped the clock: the check ran, but not at the candidate's clock.
    trial_boot_fails(
        &|sim| {
            let max = "sys/devices/system/cpu/cpufreq/policy0/cpuinfo_max_freq";
            std::fs::write(sim.root.join(max), "2400000\n").expect("clamp");
        },
        "ran at 2400 MHz",
    );
    // The tryboot flag cannot be read: which config booted is unknown, so the trial fails
    // and the board reboots onto config.txt.
    let sim = trial_boot_fails(
        &|sim| {
            let flag = "sys/firmware/devicetree/base/chosen/bootloader/tryboot";
            std::fs::remove_file(sim.root.join(flag)).expect("flag");
        },
        "cannot be read",
    );
    // And no new run starts while the flag stays unreadable.
    let out = sim.run(&["overclock", "start"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot tell how this boot started"));
}
