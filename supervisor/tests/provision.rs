//! `supervisor provision apply` on simulated boards: a good file is applied whole and its
//! secrets leave the boot partition, a bad file applies nothing and says why, a generation is
//! applied once, and a power cut at any write leaves the old or the new state.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BOOT_FILE: &str = "boot/firmware/appliance-provision.toml";
const COMMITTED: &str = "var/lib/appliance/provision/applied.toml";
const RECORD: &str = "var/lib/appliance/provision.json";
const TOKEN_DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const PSK: &str = "4a4f2b1ec1f9e8a8c37f1d0a5e6a4e7b3e29ac0f1c5b1a38a4b7e9f9d2c6b0aa";
const SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl it@clinic";

struct Board {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Board {
    fn new() -> Board {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("board");
        let out = run(&["sim", "init", root.to_str().expect("utf8")]);
        assert!(out.status.success(), "sim init: {}", stderr(&out));
        Board { _dir: dir, root }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    fn stamp(&self, text: &str) {
        std::fs::write(self.path(BOOT_FILE), text).expect("write provisioning file");
    }

    fn apply(&self) -> Output {
        run(&[
            "--root",
            self.root.to_str().expect("utf8"),
            "provision",
            "apply",
        ])
    }

    /// `provision apply --from DIR`: a USB stick mounted at `DIR`.
    fn apply_from(&self, dir: &str) -> Output {
        run(&[
            "--root",
            self.root.to_str().expect("utf8"),
            "provision",
            "apply",
            "--from",
            dir,
        ])
    }

    fn record(&self) -> Value {
        serde_json::from_str(&self.read(RECORD)).expect("provision.json")
    }

    fn boot(&self) {
        let out = run(&["sim", "boot", self.root.to_str().expect("utf8")]);
        assert!(out.status.success(), "sim boot: {}", stderr(&out));
    }

    fn hostname(&self) -> String {
        self.read("proc/sys/kernel/hostname").trim().to_string()
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(common::BIN)
        .args(args)
        .output()
        .expect("supervisor")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn password_hash() -> String {
    common::supervisor_with_stdin(&["dashboard", "hash-password"], "front-desk")
        .trim()
        .to_string()
}

/// A one-box file as `appliance stamp` writes it, with every kind of setting.
fn one_box(generation: u64, hostname: &str, hash: &str) -> String {
    format!(
        r#"[fleet]
name = "clinics"
generation = {generation}

[[box]]
name = "{hostname}"
timezone = "Europe/Berlin"
ntp = ["ntp.clinic.lan", "10.0.0.1"]
password_hash = "{hash}"
api_token_sha256 = ["{TOKEN_DIGEST}"]
ssh_authorized_keys = ["{SSH_KEY}"]
model = "smollm2-135m-instruct-q4_1"
overclock = false

[box.network]
address = "192.168.10.20/24"
gateway = "192.168.10.1"
dns = ["192.168.10.1"]

[box.network.wifi]
ssid = "Clinic"
psk = "{PSK}"
"#
    )
}

fn assert_no_secret_on_boot_partition(board: &Board, hash: &str) {
    let text = board.read(BOOT_FILE);
    for secret in [hash, TOKEN_DIGEST, PSK] {
        assert!(
            !text.contains(secret),
            "a secret is left on the boot partition:\n{text}"
        );
    }
}

#[test]
fn a_good_file_is_applied_whole_and_its_secrets_leave_the_boot_partition() {
    let board = Board::new();
    let hash = password_hash();
    board.stamp(&one_box(1, "north-1", &hash));
    // A second name for the stamped file's own blocks: what a rename leaves on the medium.
    let blocks = board.root.join("stamped-blocks");
    std::fs::hard_link(board.path(BOOT_FILE), &blocks).expect("link");
    let out = board.apply();
    assert!(out.status.success(), "apply: {}", stderr(&out));
    // The secrets were overwritten where they were written, and what is left there is still
    // a valid file (what a power cut between the overwrite and the rename leaves).
    let old = std::fs::read_to_string(&blocks).expect("the old blocks");
    for secret in [hash.as_str(), TOKEN_DIGEST, PSK] {
        assert!(
            !old.contains(secret),
            "a secret is left in the old blocks:\n{old}"
        );
    }
    provision::FleetFile::parse(&old, "old blocks").expect("still a provisioning file");

    assert_eq!(board.hostname(), "north-1");
    let wired = board.read("run/systemd/network/10-appliance-wired.network");
    assert!(wired.contains("Type=ether"), "{wired}");
    assert!(wired.contains("Address=192.168.10.20/24"), "{wired}");
    assert!(wired.contains("Gateway=192.168.10.1"), "{wired}");
    assert!(
        !wired.contains("DHCP"),
        "a static address is not DHCP: {wired}"
    );
    assert!(
        board
            .read("run/systemd/network/10-appliance-wifi.network")
            .contains("Type=wlan")
    );
    assert!(
        board
            .read("run/systemd/timesyncd.conf.d/50-appliance.conf")
            .contains("NTP=ntp.clinic.lan 10.0.0.1")
    );
    assert_eq!(
        std::fs::read_link(board.path("run/appliance/localtime")).expect("localtime link"),
        Path::new("/usr/share/zoneinfo/Europe/Berlin")
    );
    let wpa = board.read("run/appliance/wpa_supplicant.conf");
    assert!(wpa.contains(&format!("psk={PSK}")), "{wpa}");
    assert!(wpa.contains(&format!("ssid={}", hex_of("Clinic"))), "{wpa}");
    assert_eq!(
        board.read("run/appliance/ssh/authorized_keys").trim(),
        SSH_KEY
    );

    for private in [
        COMMITTED,
        "var/lib/appliance/provision/device.key",
        "var/lib/appliance/provision/tls-key.der",
        "run/appliance/wpa_supplicant.conf",
    ] {
        let mode = std::fs::metadata(board.path(private))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{private} is readable by others");
    }

    assert_no_secret_on_boot_partition(&board, &hash);
    let scrubbed = board.read(BOOT_FILE);
    assert!(scrubbed.contains("north-1") && scrubbed.contains("generation = 1"));

    let record = board.record();
    assert_eq!(record["state"], "provisioned");
    assert_eq!(record["name"], "north-1");
    assert_eq!(record["generation"], 1);
    assert_eq!(record["hostname"], "north-1");
    assert_eq!(record["serial"], "10000000a5a5a5a5");
    assert_eq!(record["device_public_key"].as_str().map(str::len), Some(64));
    assert_eq!(
        record["certificate_sha256"].as_str().map(str::len),
        Some(64)
    );
    assert!(record["last_error"].is_null());

    let status = run(&[
        "--root",
        board.root.to_str().expect("utf8"),
        "status",
        "--json",
    ]);
    let status: Value = serde_json::from_slice(&status.stdout).expect("status json");
    assert_eq!(status["provision"], record, "status shows the record");
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_generation_is_applied_once_and_a_higher_one_reprovisions() {
    let board = Board::new();
    let hash = password_hash();
    board.stamp(&one_box(2, "north-1", &hash));
    assert!(board.apply().status.success());
    let committed = board.read(COMMITTED);
    let record = board.record();

    // Next boot: /run is empty again; the same generation is not applied again, the running
    // system is set up again from what was committed.
    board.boot();
    assert!(
        !board
            .path("run/systemd/network/10-appliance-wired.network")
            .exists()
    );
    let out = board.apply();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("already applied"), "{}", stderr(&out));
    assert_eq!(board.read(COMMITTED), committed);
    assert_eq!(board.record(), record, "nothing about the record changed");
    assert!(
        board
            .path("run/systemd/network/10-appliance-wired.network")
            .exists()
    );

    // An older file changes nothing either.
    board.stamp(&one_box(1, "old-name", &hash));
    let out = board.apply();
    assert!(out.status.success());
    assert!(stderr(&out).contains("older"), "{}", stderr(&out));
    assert_eq!(board.hostname(), "north-1");
    assert_no_secret_on_boot_partition(&board, &hash);

    // A higher generation re-provisions; settings it drops are removed.
    board.stamp("[fleet]\nname = \"clinics\"\ngeneration = 3\n\n[[box]]\nname = \"north-2\"\n");
    assert!(board.apply().status.success());
    assert_eq!(board.hostname(), "north-2");
    let record = board.record();
    assert_eq!(record["generation"], 3);
    assert!(
        !board
            .path("run/systemd/network/10-appliance-wired.network")
            .exists()
    );
    assert!(!board.path("run/appliance/ssh/authorized_keys").exists());
    assert_eq!(
        std::fs::read_link(board.path("run/appliance/localtime")).expect("link"),
        Path::new("/usr/share/zoneinfo/UTC")
    );
}

#[test]
fn a_bad_file_applies_nothing_and_says_why() {
    let hash = password_hash();
    let good = one_box(1, "north-1", &hash);
    let cases: Vec<(&str, String, &str)> = vec![
        ("syntax", "[fleet\nname = 1".into(), "line 1"),
        (
            "unknown key",
            good.replace("overclock = false", "overclok = false"),
            "overclok",
        ),
        (
            "bad host name",
            good.replace("name = \"north-1\"", "name = \"north_1\""),
            "invalid host name",
        ),
        (
            "gateway outside the address",
            good.replace("gateway = \"192.168.10.1\"", "gateway = \"10.0.0.1\""),
            "outside",
        ),
        (
            "zone not in the image",
            good.replace("Europe/Berlin", "Europe/Atlantis"),
            "Europe/Atlantis",
        ),
        (
            "generation 0",
            good.replace("generation = 1", "generation = 0"),
            "generation",
        ),
        (
            "another board's serial",
            good.replace(
                "name = \"north-1\"",
                "name = \"north-1\"\nserial = \"10000000deadbeef\"",
            ),
            "10000000a5a5a5a5",
        ),
        (
            "a password that is not an Argon2 hash",
            good.replace(&hash, "front-desk"),
            "password",
        ),
    ];
    for (what, text, reason) in cases {
        // A box already provisioned keeps that state.
        let board = Board::new();
        board.stamp(&one_box(1, "before", &hash));
        assert!(board.apply().status.success());
        let committed = board.read(COMMITTED);

        let mut text = text.clone();
        if what != "syntax" {
            text = text.replace("generation = 1", "generation = 2");
        }
        board.stamp(&text);
        let out = board.apply();
        assert_eq!(out.status.code(), Some(1), "{what}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(reason),
            "{what}: the error names {reason:?}: {err}"
        );
        assert!(
            err.contains("appliance-provision.toml"),
            "{what}: names the file: {err}"
        );
        assert_eq!(board.read(COMMITTED), committed, "{what}: nothing applied");
        assert_eq!(board.hostname(), "before", "{what}");
        assert_eq!(
            board.read(BOOT_FILE),
            text,
            "{what}: the operator's file is kept"
        );
        let record = board.record();
        assert_eq!(record["generation"], 1, "{what}");
        assert!(
            record["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(reason)),
            "{what}: status says why: {record}"
        );
    }

    // On a box never provisioned it stays unprovisioned.
    let board = Board::new();
    board.stamp("[fleet]\nname = \"x\"\n");
    assert_eq!(board.apply().status.code(), Some(1));
    assert!(!board.path(COMMITTED).exists());
    assert_eq!(board.record()["state"], "unprovisioned");
    assert_eq!(board.hostname(), "appliance");
}

#[test]
fn one_file_for_the_whole_fleet_gives_each_board_its_entry_by_serial() {
    let board = Board::new();
    let hash = password_hash();
    let fleet = format!(
        r#"[fleet]
name = "clinics"
generation = 1

[fleet.defaults]
password_hash = "{hash}"
timezone = "America/New_York"

[[box]]
name = "east-1"
serial = "10000000deadbeef"

[[box]]
name = "east-2"
serial = "10000000A5A5A5A5"
hostname = "reception"
"#
    );
    board.stamp(&fleet);
    let out = board.apply();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(board.hostname(), "reception");
    assert_eq!(board.record()["name"], "east-2");
    assert!(
        board.read(COMMITTED).contains(&hash),
        "the fleet default reached the box"
    );
    assert!(
        !board.read(COMMITTED).contains("east-1"),
        "only this box's entry is kept"
    );
    assert_no_secret_on_boot_partition(&board, &hash);
    assert!(
        board.read(BOOT_FILE).contains("east-1"),
        "the other entries stay for the operator"
    );
}

#[test]
fn a_power_cut_at_any_write_leaves_the_old_or_the_new_state() {
    let hash = password_hash();
    let file = one_box(1, "north-1", &hash);
    let mut cut_at = 1;
    loop {
        let board = Board::new();
        board.stamp(&file);
        std::fs::write(
            board.path(".appliance-sim-power-cut"),
            format!("{cut_at}\n"),
        )
        .expect("inject");
        let out = board.apply();
        if out.status.success() {
            break;
        }
        assert_eq!(
            out.status.code(),
            Some(137),
            "cut {cut_at}: {}",
            stderr(&out)
        );

        // Whatever was on disk at the cut is a whole version.
        let committed = board.read(COMMITTED);
        assert!(
            committed.is_empty() || committed.contains(&hash),
            "cut {cut_at}: a partial commit: {committed}"
        );
        let boot_file = board.read(BOOT_FILE);
        assert!(
            boot_file == file || (boot_file.contains("north-1") && !boot_file.contains(&hash)),
            "cut {cut_at}: the boot file is neither old nor new: {boot_file}"
        );
        if !committed.is_empty() {
            assert!(boot_file == file || !boot_file.contains(&hash));
        }

        // The next boot finishes the job.
        board.boot();
        let out = board.apply();
        assert!(
            out.status.success(),
            "cut {cut_at}, next boot: {}",
            stderr(&out)
        );
        assert_eq!(board.hostname(), "north-1", "cut {cut_at}");
        assert!(board.read(COMMITTED).contains(&hash), "cut {cut_at}");
        assert_no_secret_on_boot_partition(&board, &hash);
        assert_eq!(board.record()["generation"], 1, "cut {cut_at}");
        cut_at += 1;
        assert!(cut_at < 50, "provisioning never finished");
    }
    assert!(cut_at > 3, "the cut reached every write ({cut_at})");
}

#[test]
fn a_usb_file_counts_only_when_the_trusted_fleet_key_signed_it() {
    let (fleet_secret, fleet_public) = weights::sign::keygen().expect("fleet key");
    let (stranger_secret, _) = weights::sign::keygen().expect("another key");
    let hash = password_hash();
    let board = Board::new();
    board.stamp(&format!(
        "[fleet]\nname = \"clinics\"\ngeneration = 1\n\n[[box]]\nname = \"north-1\"\nfleet_key = \"{fleet_public}\"\n"
    ));
    assert!(board.apply().status.success());
    let boot_file = board.read(BOOT_FILE);

    let stick = board.path("run/appliance-usb/sda1");
    std::fs::create_dir_all(&stick).expect("stick");
    let file = stick.join("appliance-provision.toml");
    let sig = stick.join("appliance-provision.toml.sig");
    let reprovision = format!(
        "[fleet]\nname = \"clinics\"\ngeneration = 2\n\n[[box]]\nname = \"north-1\"\nhostname = \"moved\"\npassword_hash = \"{hash}\"\nfleet_key = \"{fleet_public}\"\n"
    );
    let from_stick = || board.apply_from("/run/appliance-usb/sda1");
    let refused = |what: &str, reason: &str| {
        let out = from_stick();
        assert_eq!(out.status.code(), Some(1), "{what}: {}", stderr(&out));
        assert!(stderr(&out).contains(reason), "{what}: {}", stderr(&out));
        assert_eq!(board.hostname(), "north-1", "{what}: nothing applied");
        assert_eq!(board.record()["generation"], 1, "{what}");
    };

    std::fs::write(&file, &reprovision).expect("write");
    refused("unsigned", "not signed");

    let by_stranger = weights::sign::sign(reprovision.as_bytes(), &stranger_secret).expect("sign");
    std::fs::write(&sig, by_stranger).expect("write");
    refused("signed by a stranger", "not among the box's trusted keys");

    let signature = weights::sign::sign(reprovision.as_bytes(), &fleet_secret).expect("sign");
    std::fs::write(&sig, &signature).expect("write");
    std::fs::write(&file, reprovision.replace("moved", "hijacked")).expect("tamper");
    refused("changed after signing", "does not match");

    std::fs::write(&file, &reprovision).expect("write");
    let out = from_stick();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(board.hostname(), "moved");
    assert_eq!(board.record()["generation"], 2);
    assert_eq!(
        std::fs::read_to_string(&file).expect("stick file"),
        reprovision,
        "the stick is never written"
    );
    assert_eq!(
        board.read(BOOT_FILE),
        boot_file,
        "the boot partition is not touched"
    );

    // A box that trusts no fleet key takes nothing from a stick.
    let other = Board::new();
    other.stamp("[fleet]\nname = \"clinics\"\ngeneration = 1\n\n[[box]]\nname = \"south-1\"\n");
    assert!(other.apply().status.success());
    let stick = other.path("run/appliance-usb/sda1");
    std::fs::create_dir_all(&stick).expect("stick");
    std::fs::write(stick.join("appliance-provision.toml"), &reprovision).expect("write");
    std::fs::write(stick.join("appliance-provision.toml.sig"), &signature).expect("write");
    let out = other.apply_from("/run/appliance-usb/sda1");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("trusts no fleet key"),
        "{}",
        stderr(&out)
    );
    assert_eq!(other.hostname(), "south-1");
}

#[test]
fn the_clock_never_starts_before_the_build_or_the_last_known_time() {
    let board = Board::new();
    let clock = ".appliance-sim-clock";
    let set = |rel: &str, value: &str| {
        let path = board.path(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, value).expect("write");
    };
    let status = || -> Value {
        let out = run(&[
            "--root",
            board.root.to_str().expect("utf8"),
            "status",
            "--json",
        ]);
        serde_json::from_slice::<Value>(&out.stdout).expect("status")["clock"].clone()
    };
    set("usr/share/appliance/build-time", "1790000000\n");
    set(clock, "86400\n"); // a dead RTC battery: 1970

    let out = board.apply();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1970-01-02"),
        "says what it changed: {}",
        stderr(&out)
    );
    assert_eq!(board.read(clock).trim(), "1790000000");
    assert_eq!(board.read("var/lib/appliance/clock").trim(), "1790000000");
    let c = status();
    assert_eq!(c["synchronized"], false, "{c}");
    assert_eq!(c["floor_unix"], 1_790_000_000u64, "{c}");

    // Network time moved it on; the next boot without network starts from there.
    set(clock, "1800000000\n");
    set("run/systemd/timesync/synchronized", "");
    assert_eq!(status()["synchronized"], true);
    assert!(board.apply().status.success());
    board.boot();
    set(clock, "86400\n");
    assert!(board.apply().status.success());
    assert_eq!(board.read(clock).trim(), "1800000000");
    assert_eq!(
        status()["synchronized"],
        false,
        "a new boot is not synchronised yet"
    );

    // A clock ahead of the floor is left alone.
    set(clock, "1900000000\n");
    let out = board.apply();
    assert!(!stderr(&out).contains("the clock read"), "{}", stderr(&out));
    assert_eq!(board.read(clock).trim(), "1900000000");
}
