//! The `supervisor` binary end to end on simulated boards: exit codes, messages, what lands in the
//! board tree, and that a second run changes nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::supervisor_within;

const BIN: &str = env!("CARGO_BIN_EXE_supervisor");

struct Sim {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Sim {
    fn new(variant: &str) -> Sim {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("board");
        let out = supervisor(&[
            "sim",
            "init",
            root.to_str().expect("utf8"),
            "--variant",
            variant,
        ]);
        assert!(out.status.success(), "sim init: {}", text(&out.stderr));
        Sim { dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel))
            .expect("read")
            .trim()
            .to_string()
    }

    fn write(&self, rel: &str, contents: &str) {
        std::fs::write(self.path(rel), contents).expect("write");
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["--root", self.root.to_str().expect("utf8")];
        all.extend_from_slice(args);
        supervisor(&all)
    }

    fn apply(&self) -> Output {
        self.run(&["apply"])
    }

    fn status(&self) -> Value {
        let out = self.run(&["status", "--json"]);
        assert!(out.status.success(), "status: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status is JSON")
    }

    /// Every entry of the tree (files, directories, symlinks) with the traces any write leaves,
    /// to prove a run wrote nothing. Returns only once the filesystem's clock has moved past
    /// every time in it, so a write right after it cannot carry the same timestamp.
    fn snapshot(&self) -> Snapshot {
        fn walk(path: &Path, out: &mut Snapshot) {
            let meta = std::fs::symlink_metadata(path).expect("lstat");
            let bytes = if meta.is_symlink() {
                std::fs::read_link(path)
                    .expect("link")
                    .into_os_string()
                    .into_encoded_bytes()
            } else if meta.is_file() {
                std::fs::read(path).expect("read")
            } else {
                Vec::new()
            };
            out.insert(path.to_path_buf(), Entry::of(&meta, bytes));
            if meta.is_dir() {
                for entry in std::fs::read_dir(path).expect("list") {
                    walk(&entry.expect("entry").path(), out);
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.root, &mut out);
        self.let_the_clock_pass(&out);
        out
    }

    /// Waits until a file written now gets a modification time later than every time in
    /// `snapshot`: the kernel stamps files from a clock that advances only every few
    /// milliseconds, so without this a rewrite soon after the snapshot could look untouched.
    fn let_the_clock_pass(&self, snapshot: &Snapshot) {
        let latest = snapshot
            .values()
            .map(|e| e.modified.max(e.changed))
            .max()
            .unwrap_or_default();
        // Beside the board's tree, on the same filesystem, so it is stamped by the same clock.
        let probe = self.dir.path().join("clock-probe");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            std::fs::write(&probe, b"tick").expect("probe");
            let meta = std::fs::metadata(&probe).expect("probe");
            if (meta.mtime(), meta.mtime_nsec()) > latest {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the filesystem clock did not move past {latest:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// An entry of the board's tree as far as a write can tell.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    /// A file's contents, a symlink's target.
    bytes: Vec<u8>,
    /// Type and permissions.
    mode: u32,
    /// Device and inode: an atomic replacement (temporary file + rename) is a new inode even
    /// with the same bytes.
    inode: (u64, u64),
    size: u64,
    links: u64,
    /// Seconds and nanoseconds: any write moves it, even of the same bytes (a directory's
    /// when an entry is created, renamed or removed in it).
    modified: (i64, i64),
    /// Seconds and nanoseconds: moved by writes and by metadata changes (mode, owner, links).
    changed: (i64, i64),
}

impl Entry {
    fn of(meta: &std::fs::Metadata, bytes: Vec<u8>) -> Entry {
        Entry {
            bytes,
            mode: meta.mode(),
            inode: (meta.dev(), meta.ino()),
            size: meta.size(),
            links: meta.nlink(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

impl Entry {
    /// What differs from `other`, in words (the bytes themselves would drown the message).
    fn differences(&self, other: &Entry) -> String {
        let mut out = Vec::new();
        if self.bytes != other.bytes {
            out.push("contents".to_string());
        }
        let pairs = [
            ("mode", self.mode.to_string(), other.mode.to_string()),
            (
                "inode",
                format!("{:?}", self.inode),
                format!("{:?}", other.inode),
            ),
            ("size", self.size.to_string(), other.size.to_string()),
            ("links", self.links.to_string(), other.links.to_string()),
            (
                "mtime",
                format!("{:?}", self.modified),
                format!("{:?}", other.modified),
            ),
            (
                "ctime",
                format!("{:?}", self.changed),
                format!("{:?}", other.changed),
            ),
        ];
        for (name, was, is) in pairs {
            if was != is {
                out.push(format!("{name} {was} -> {is}"));
            }
        }
        out.join(", ")
    }
}

type Snapshot = BTreeMap<PathBuf, Entry>;

/// Fails naming every path that was created, removed or touched between two snapshots.
fn assert_unchanged(before: &Snapshot, after: &Snapshot, what: &str) {
    let paths: std::collections::BTreeSet<&PathBuf> = before.keys().chain(after.keys()).collect();
    let touched: Vec<String> = paths
        .into_iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .map(|p| match (before.get(p), after.get(p)) {
            (Some(_), None) => format!("removed {}", p.display()),
            (None, Some(_)) => format!("created {}", p.display()),
            (Some(b), Some(a)) => format!("touched {}: {}", p.display(), b.differences(a)),
            (None, None) => unreachable!("a path from one of the snapshots"),
        })
        .collect();
    assert!(touched.is_empty(), "{what}:\n{}", touched.join("\n"));
}

fn supervisor(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("run supervisor")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn step<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name}"))
}

fn state<'a>(status: &'a Value, name: &str) -> &'a str {
    step(status, name)["state"].as_str().expect("state")
}

fn assert_applied_then_idempotent(sim: &Sim) {
    let out = sim.apply();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let before = sim.snapshot();
    let again = sim.apply();
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stdout));
    assert!(
        !text(&again.stdout).contains(" applied "),
        "second run changed something:\n{}",
        text(&again.stdout)
    );
    assert_unchanged(&before, &sim.snapshot(), "second run wrote to the board");
}

#[test]
fn a_fresh_board_is_tuned_and_a_second_run_changes_nothing() {
    let sim = Sim::new("pi5-8gb");
    let fresh = sim.status();
    assert_eq!(state(&fresh, "governor"), "needs-apply");
    assert_eq!(state(&fresh, "cgroup.cpu_weight"), "needs-apply");

    assert_applied_then_idempotent(&sim);

    assert_eq!(
        sim.read("sys/devices/system/cpu/cpufreq/policy0/scaling_governor"),
        "performance"
    );
    let engine = "sys/fs/cgroup/appliance.slice/appliance-engine.slice";
    assert_eq!(sim.read(&format!("{engine}/cpu.weight")), "10000");
    // Siblings compete at every level: the parent slice must carry the weight too, or the
    // engine shares the CPU with system.slice and user.slice at 100 each.
    assert_eq!(
        sim.read("sys/fs/cgroup/appliance.slice/cpu.weight"),
        "10000"
    );
    assert_eq!(sim.read("sys/fs/cgroup/system.slice/cpu.weight"), "100");
    assert_eq!(sim.read(&format!("{engine}/memory.swap.max")), "0");
    // 8051 MiB of RAM minus the default 1024 MiB reserve.
    assert_eq!(
        sim.read(&format!("{engine}/memory.max")),
        (7027u64 * 1024 * 1024).to_string()
    );
    assert!(
        sim.read("sys/fs/cgroup/appliance.slice/cgroup.subtree_control")
            .contains("memory")
    );

    let tuned = sim.status();
    for name in [
        "governor",
        "cgroup.slice",
        "cgroup.cpu_weight",
        "cgroup.memory_max",
        "cgroup.memory_swap_max",
        "bootloader.sdram_banklow",
    ] {
        assert_eq!(
            state(&tuned, name),
            "in-place",
            "{name}: {}",
            step(&tuned, name)
        );
    }
    // The bootloader was already right: nothing may be staged for it.
    assert!(!sim.path("boot/firmware/pieeprom.upd").exists());
}

#[test]
fn dry_run_reports_the_plan_and_writes_nothing() {
    let sim = Sim::new("no-numa");
    let before = sim.snapshot();
    let out = sim.run(&["apply", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("would write performance"), "{stdout}");
    assert!(
        stdout.contains("would stage a bootloader update"),
        "{stdout}"
    );
    assert_unchanged(&before, &sim.snapshot(), "dry run wrote to the board");
}

#[test]
fn status_json_has_the_documented_keys_and_board_facts() {
    let sim = Sim::new("hot");
    let status = sim.status();
    assert_eq!(status["schema_version"], 1);
    assert_eq!(status["simulated"], true);
    let board = &status["board"];
    assert_eq!(board["model"], "Raspberry Pi 5 Model B Rev 1.0");
    assert_eq!(board["temperature_c"].as_f64(), Some(80.6));
    let now: Vec<&str> = board["throttle"]["now"]
        .as_array()
        .expect("now")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        now,
        vec![
            "arm-frequency-capped",
            "throttled",
            "soft-temperature-limit"
        ]
    );
    assert_eq!(board["cpu_mhz"], 1500);
    assert_eq!(board["governors"][0], "policy0=ondemand");
    assert_eq!(board["memory_total_mib"], 8051);
    assert_eq!(board["numa_nodes"], 8);
    assert_eq!(board["boot"]["tryboot"], false);
    for s in status["steps"].as_array().expect("steps") {
        for key in ["name", "desired", "effective", "state", "reason"] {
            assert!(s.get(key).is_some(), "step lacks {key}: {s}");
        }
    }
}

#[test]
fn without_the_memory_controller_cgroup_enable_is_staged_once() {
    let sim = Sim::new("no-memcg");
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // The running slot's command line (A's), which is what the firmware hands the kernel.
    let cmdline = sim.read("boot/firmware/slot-a/cmdline.txt");
    assert!(
        cmdline.ends_with(" ro rootwait rauc.slot=A cgroup_enable=memory"),
        "{cmdline}"
    );
    assert_eq!(cmdline.lines().count(), 1);
    let status = sim.status();
    assert_eq!(state(&status, "kernel.memory_cgroup"), "pending-reboot");
    assert_eq!(state(&status, "cgroup.memory_max"), "pending-reboot");
    assert_eq!(state(&status, "cgroup.cpu_weight"), "in-place");
    // Idempotent: the argument is not appended twice.
    sim.apply();
    assert_eq!(
        sim.read("boot/firmware/slot-a/cmdline.txt")
            .matches("cgroup_enable=memory")
            .count(),
        1
    );
}

fn staged_config(sim: &Sim) -> String {
    let image = std::fs::read(sim.path("boot/firmware/pieeprom.upd")).expect("staged image");
    let sig = sim.read("boot/firmware/pieeprom.sig");
    let sha = Command::new("sha256sum")
        .arg(sim.path("boot/firmware/pieeprom.upd"))
        .output()
        .expect("sha256sum");
    let sha = text(&sha.stdout);
    assert_eq!(
        sig.lines().next(),
        sha.split_whitespace().next(),
        "signature names the image's SHA-256"
    );
    assert!(sig.lines().any(|l| l.starts_with("ts: ")));
    assert_eq!(image.len(), 2 * 1024 * 1024);
    let image = supervisor_core::bootloader::image::Image::parse(image).expect("valid image");
    image.config().expect("config")
}

#[test]
fn a_kernel_without_numa_emulation_gets_banklow_3_staged_for_the_next_boot() {
    let sim = Sim::new("no-numa");
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("pending-reboot"));
    let config = staged_config(&sim);
    assert!(config.contains("SDRAM_BANKLOW=3"), "{config}");
    assert!(
        config.contains("BOOT_ORDER=0xf461"),
        "the rest of the config is kept: {config}"
    );
    let staged = sim.snapshot();
    assert_eq!(
        state(&sim.status(), "bootloader.sdram_banklow"),
        "pending-reboot"
    );
    sim.apply();
    assert_unchanged(
        &staged,
        &sim.snapshot(),
        "a staged update is not staged again",
    );
}

#[test]
fn a_wrong_interleave_is_corrected_in_place_of_the_old_value() {
    let sim = Sim::new("wrong-interleave");
    let status = sim.status();
    assert_eq!(step(&status, "bootloader.sdram_banklow")["effective"], "3");
    sim.apply();
    let config = staged_config(&sim);
    assert!(
        config.contains("SDRAM_BANKLOW=1") && !config.contains("SDRAM_BANKLOW=3"),
        "{config}"
    );
}

#[test]
fn banklow_keep_never_touches_the_bootloader() {
    let sim = Sim::new("no-numa");
    let config = sim.path("keep.toml");
    std::fs::write(&config, "[tuning]\nsdram_banklow = \"keep\"\n").expect("write");
    let out = sim.run(&["--config", config.to_str().expect("utf8"), "apply"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!sim.path("boot/firmware/pieeprom.upd").exists());
}

#[test]
fn zram_is_turned_off_when_configured_and_verified_in_proc_swaps() {
    let sim = Sim::new("zram");
    assert_eq!(state(&sim.status(), "swap.system"), "not-applicable");
    std::fs::write(
        sim.path("etc/appliance/appliance.toml"),
        "[tuning]\nsystem_swap = \"off\"\n",
    )
    .expect("write");
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(!sim.read("proc/swaps").contains("zram0"));
    let status = sim.status();
    assert_eq!(state(&status, "swap.system"), "in-place");
    assert!(status["board"]["swap"].as_array().expect("swap").is_empty());
}

#[test]
fn the_boot_partition_override_wins_over_the_system_file() {
    let sim = Sim::new("pi5-8gb");
    sim.write(
        "etc/appliance/appliance.toml",
        "[tuning.engine]\ncpu_weight = 500\n",
    );
    sim.write(
        "boot/firmware/appliance.toml",
        "[tuning.engine]\ncpu_weight = 9000\n",
    );
    assert_eq!(sim.apply().status.code(), Some(0));
    assert_eq!(
        sim.read("sys/fs/cgroup/appliance.slice/appliance-engine.slice/cpu.weight"),
        "9000"
    );
}

#[test]
fn memory_low_reports_the_protection_the_ancestors_actually_grant() {
    let sim = Sim::new("pi5-8gb");
    sim.write(
        "etc/appliance/appliance.toml",
        "[tuning.engine]\nmemory_low_mib = 1024\n",
    );
    assert_applied_then_idempotent(&sim);
    assert_eq!(
        step(&sim.status(), "cgroup.memory_low")["effective"],
        "1024 MiB"
    );
    // Someone lowers the parent slice: the engine's own value stands but protects nothing.
    sim.write("sys/fs/cgroup/appliance.slice/memory.low", "0\n");
    let status = sim.status();
    let low = step(&status, "cgroup.memory_low");
    assert_eq!(low["state"], "needs-apply");
    assert_eq!(
        low["effective"],
        "0 MiB (appliance.slice = 0 MiB, appliance-engine.slice = 1024 MiB)"
    );
    assert_eq!(sim.apply().status.code(), Some(0));
    assert_eq!(
        step(&sim.status(), "cgroup.memory_low")["effective"],
        "1024 MiB"
    );
}

#[test]
fn drift_by_another_service_is_seen_and_repaired() {
    let sim = Sim::new("pi5-8gb");
    sim.apply();
    sim.write(
        "sys/devices/system/cpu/cpufreq/policy0/scaling_governor",
        "ondemand\n",
    );
    let status = sim.status();
    assert_eq!(state(&status, "governor"), "needs-apply");
    assert_eq!(step(&status, "governor")["effective"], "policy0=ondemand");
    sim.apply();
    assert_eq!(state(&sim.status(), "governor"), "in-place");
}

#[test]
fn a_read_only_attribute_fails_the_step_and_the_run() {
    use std::os::unix::fs::PermissionsExt;
    let sim = Sim::new("pi5-8gb");
    let governor = sim.path("sys/devices/system/cpu/cpufreq/policy0/scaling_governor");
    std::fs::set_permissions(&governor, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("governor"))
        .expect("governor line");
    assert!(line.contains("failed"), "{stdout}");
    assert!(stdout.contains("read-only attribute"), "{stdout}");
    // Other steps still ran.
    assert_eq!(
        sim.read("sys/fs/cgroup/appliance.slice/appliance-engine.slice/cpu.weight"),
        "10000"
    );
}

#[test]
fn a_missing_file_names_itself() {
    let sim = Sim::new("pi5-8gb");
    std::fs::remove_file(sim.path("proc/meminfo")).expect("rm");
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(1));
    let status = sim.status();
    let max = step(&status, "cgroup.memory_max");
    assert_eq!(max["state"], "failed");
    assert!(
        max["reason"]
            .as_str()
            .expect("reason")
            .contains("/proc/meminfo"),
        "{max}"
    );
    assert_eq!(status["board"]["memory_total_mib"], Value::Null);
}

#[test]
fn an_impossible_reserve_is_a_failure_not_a_zero_limit() {
    let sim = Sim::new("pi5-4gb");
    sim.write(
        "etc/appliance/appliance.toml",
        "[tuning.engine]\nmemory_reserve_mib = 4096\n",
    );
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("memory_reserve_mib = 4096 leaves nothing"));
    assert_eq!(
        sim.read("sys/fs/cgroup/appliance.slice/appliance-engine.slice/memory.max"),
        "max"
    );
}

#[test]
fn bad_config_files_exit_2_naming_file_key_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("appliance.toml");
    std::fs::write(
        &file,
        "[tuning]\ngovernor = \"performance\"\n\n[tuning.engine]\ncpu_weight = 0\n",
    )
    .expect("write");
    let out = supervisor(&["config", "check", file.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(file.to_str().expect("utf8")), "{stderr}");
    assert!(
        stderr.contains("line 5") && stderr.contains("cpu_weight") && stderr.contains("1-10000"),
        "{stderr}"
    );

    std::fs::write(&file, "[tuning]\ngovernor = \"performance\"\nturbo = 1\n").expect("write");
    let sim = Sim::new("pi5-8gb");
    let before = sim.snapshot();
    let out = sim.run(&["--config", file.to_str().expect("utf8"), "apply"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("turbo"));
    assert_unchanged(
        &before,
        &sim.snapshot(),
        "nothing is applied with a bad configuration",
    );

    std::fs::write(&file, "[tuning\n").expect("write");
    let out = supervisor(&["config", "check", file.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("line 1"));

    // A thread count no machine has: refused before any engine is started with it.
    std::fs::write(&file, "[engine]\nport = 8080\nthreads = 4294967296\n").expect("write");
    let out = supervisor(&["config", "check", file.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(file.to_str().expect("utf8"))
            && stderr.contains("line 3")
            && stderr.contains("invalid threads 4294967296: allowed is 0"),
        "{stderr}"
    );

    let documented = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../overlays/rootfs/etc/appliance/appliance.toml"
    );
    assert_eq!(
        supervisor(&["config", "check", documented]).status.code(),
        Some(0)
    );
}

#[test]
fn sim_init_refuses_to_overwrite_a_directory_that_is_not_a_simulation() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("precious"), "data").expect("write");
    let out = supervisor(&["sim", "init", dir.path().to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("precious")).expect("kept"),
        "data"
    );
    let out = supervisor(&[
        "sim",
        "init",
        dir.path().join("x").to_str().expect("utf8"),
        "--variant",
        "pi3",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no-memcg"), "lists the variants");
}

#[test]
fn a_missing_root_is_bad_input() {
    let out = supervisor(&["--root", "/nonexistent/board", "status"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent/board"));
}

#[test]
fn an_old_bootloader_gets_the_shipped_image_staged_with_its_own_config() {
    let sim = Sim::new("old-bootloader");
    assert!(!sim.read("proc/cmdline").contains("numa=fake"));
    assert_eq!(sim.apply().status.code(), Some(0));
    let status = sim.status();
    let banklow = step(&status, "bootloader.sdram_banklow");
    assert_eq!(banklow["state"], "not-applicable");
    assert!(
        banklow["reason"]
            .as_str()
            .expect("reason")
            .contains("update the bootloader"),
        "{banklow}"
    );
    // Tryboot (updates, overclock trials) needs a recent bootloader: the newest shipped image
    // is staged, its configuration left as the running bootloader has it.
    let current = step(&status, "bootloader.current");
    assert_eq!(current["state"], "pending-reboot", "{current}");
    let staged = staged_config(&sim);
    assert!(staged.contains("BOOT_ORDER=0xf461"), "{staged}");
    assert!(!staged.contains("SDRAM_BANKLOW"), "{staged}");
    // Once staged, never staged again.
    let before = std::fs::read(sim.path("boot/firmware/pieeprom.upd")).expect("staged");
    assert_eq!(sim.apply().status.code(), Some(0));
    assert_eq!(
        std::fs::read(sim.path("boot/firmware/pieeprom.upd")).expect("staged"),
        before
    );
}

#[test]
fn a_missing_boot_partition_fails_only_the_steps_that_need_it() {
    let sim = Sim::new("pi5-8gb");
    std::fs::remove_dir_all(sim.path("boot/firmware")).expect("rm");
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(1));
    let status = sim.status();
    assert_eq!(state(&status, "kernel.memory_cgroup"), "failed");
    assert!(
        step(&status, "kernel.memory_cgroup")["reason"]
            .as_str()
            .expect("reason")
            .contains("boot partition")
    );
    for name in [
        "governor",
        "cgroup.cpu_weight",
        "cgroup.memory_max",
        "cgroup.memory_swap_max",
    ] {
        assert_eq!(
            state(&status, name),
            "in-place",
            "{name}: {}",
            step(&status, name)
        );
    }
}

#[test]
fn steps_turned_off_read_nothing_and_cannot_fail() {
    let sim = Sim::new("pi5-8gb");
    std::fs::remove_file(sim.path("sys/firmware/devicetree/base/aliases/blconfig")).expect("rm");
    std::fs::remove_file(sim.path("proc/swaps")).expect("rm");
    assert_eq!(
        sim.apply().status.code(),
        Some(1),
        "the bootloader step needs blconfig"
    );
    sim.write(
        "etc/appliance/appliance.toml",
        "[tuning]\nsdram_banklow = \"keep\"\n",
    );
    let out = sim.apply();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(
        sim.status()["board"]["swap"],
        Value::Null,
        "an unreadable swap list is null, not off"
    );
}

/// A FIFO or an outsized file where the supervisor reads a file (its configuration, a record on
/// the data partition) is an error, never a hang or an out-of-memory abort.
#[test]
fn fifos_and_huge_files_in_place_of_files_are_errors_not_hangs() {
    let limit = std::time::Duration::from_secs(20);
    let fifo = |path: &Path| {
        let _ = std::fs::remove_file(path);
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("appliance.toml");
    fifo(&config);
    let out = supervisor_within(&["config", "check", config.to_str().expect("utf8")], limit);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("FIFO"), "{}", text(&out.stderr));

    let sim = Sim::new("pi5-8gb");
    std::fs::create_dir_all(sim.path("var/lib/appliance")).expect("data dir");
    for make in [&|p: &Path| fifo(p) as _, &|p: &Path| {
        std::fs::write(p, vec![b'7'; 40 << 20]).expect("huge") as _
    }] as [&dyn Fn(&Path); 2]
    {
        let clock = sim.path("var/lib/appliance/clock");
        let _ = std::fs::remove_file(&clock);
        make(&clock);
        let root = sim.root.to_str().expect("utf8").to_string();
        let out = supervisor_within(&["--root", &root, "status", "--json"], limit);
        assert!(out.status.success(), "status: {}", text(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).expect("status is JSON");
    }
}
