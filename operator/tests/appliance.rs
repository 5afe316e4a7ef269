//! The `appliance` binary on disk images built here: an MBR with a FAT boot partition and a
//! second partition, as the Appliance image has.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use operator::disk::{PartitionFile, boot_partition};
use provision::values::Serial;
use provision::{FleetFile, PROVISION_FILE};

const BIN: &str = env!("CARGO_BIN_EXE_appliance");
const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../provision/fleet.example.toml"
);
/// The documented example copied into `dir` (stamping keeps the fleet's secret beside it).
fn fleet_file(dir: &Path) -> String {
    let path = dir.join("fleet.toml");
    fs::copy(EXAMPLE, &path).expect("copy the example");
    path.to_str().expect("utf8").to_string()
}

const MIB: u64 = 1 << 20;

/// A 48 MiB image: partition 1 FAT (32 MiB at 1 MiB) holding `config.txt`, partition 2 filled
/// with a pattern that must survive stamping.
fn image(dir: &Path) -> PathBuf {
    let path = dir.join("appliance.img");
    let mut file = fs::File::create(&path).expect("create");
    file.set_len(48 * MIB).expect("size");
    let mut mbr = [0u8; 512];
    let entry = |mbr: &mut [u8; 512], at: usize, kind: u8, start: u32, sectors: u32| {
        mbr[at + 4] = kind;
        mbr[at + 8..at + 12].copy_from_slice(&start.to_le_bytes());
        mbr[at + 12..at + 16].copy_from_slice(&sectors.to_le_bytes());
    };
    entry(&mut mbr, 446, 0x0c, 2048, 65536);
    entry(&mut mbr, 462, 0x83, 2048 + 65536, 16384);
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    file.write_all(&mbr).expect("mbr");
    file.seek(SeekFrom::Start(33 * MIB)).expect("seek");
    file.write_all(&pattern()).expect("rootfs");
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let part = boot_partition(&mut file, 48 * MIB).expect("partition");
    let mut slice = PartitionFile::new(&mut file, part);
    fatfs::format_volume(&mut slice, fatfs::FormatVolumeOptions::new()).expect("format");
    let fs = fatfs::FileSystem::new(slice, fatfs::FsOptions::new()).expect("mount");
    fs.root_dir()
        .create_file("config.txt")
        .expect("config.txt")
        .write_all(b"arm_64bit=1\n")
        .expect("write");
    fs.unmount().expect("unmount");
    path
}

fn hex_decode(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn pattern() -> Vec<u8> {
    (0..MIB).map(|i| (i % 251) as u8).collect()
}

fn appliance(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("appliance")
}

/// `appliance stamp --fleet FLEET WHOM... IMAGE -o OUT`.
fn stamp(fleet: &str, whom: &[&str], image: &Path, out: &Path) -> Output {
    let mut args = vec!["stamp", "--fleet", fleet];
    args.extend_from_slice(whom);
    args.extend([
        image.to_str().expect("utf8"),
        "-o",
        out.to_str().expect("utf8"),
    ]);
    appliance(&args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn boot_file(disk: &Path, name: &str) -> Option<String> {
    operator::stamp::read_boot_file(disk, name)
        .expect("read boot partition")
        .map(|b| String::from_utf8(b).expect("utf8"))
}

fn outside_boot_partition(disk: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut file = fs::File::open(disk).expect("open");
    file.seek(SeekFrom::Start(33 * MIB)).expect("seek");
    file.read_to_end(&mut bytes).expect("read");
    bytes
}

#[test]
fn stamping_writes_one_box_into_a_copy_and_leaves_the_image_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fleet = fleet_file(dir.path());
    let img = image(dir.path());
    let original = fs::read(&img).expect("read image");
    let out = dir.path().join("reception.img");
    let run = stamp(&fleet, &["--box", "reception"], &img, &out);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(
        fs::read(&img).expect("image"),
        original,
        "the image is untouched"
    );

    let text = boot_file(&out, PROVISION_FILE).expect("the provisioning file is on the card");
    let secret = fs::read_to_string(dir.path().join("fleet.secret")).expect("the fleet's secret");
    let mode = fs::metadata(dir.path().join("fleet.secret")).expect("stat");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o077,
        0,
        "the fleet's secret is the operator's only"
    );
    let token = provision::enroll::derive_token(
        &hex_decode(secret.trim()),
        "riverside-clinics",
        "reception",
        1,
    );
    assert!(
        text.contains(&token),
        "the box's enrolment token is on its card"
    );
    let stamped = FleetFile::parse(&text, "stamped").expect("the box can read it");
    assert_eq!(stamped.boxes.len(), 1, "only this box");
    let serial: Serial = "10000000a5a5a5a5".parse().expect("serial");
    let entry = stamped.entry_for(Some(&serial)).expect("entry");
    assert!(
        stamped.entry_for(None).is_err(),
        "an entry with a serial is for that board only"
    );
    assert_eq!(entry.name.as_ref().map(|n| n.as_str()), Some("reception"));
    assert!(entry.password_hash.is_some(), "fleet defaults folded in");
    assert_eq!(
        entry
            .network
            .as_ref()
            .and_then(|n| n.address)
            .map(|a| a.to_string()),
        Some("192.168.10.20/24".into())
    );
    assert!(!text.contains("radiology"), "no other box's settings");
    assert_eq!(
        boot_file(&out, "config.txt").as_deref(),
        Some("arm_64bit=1\n")
    );
    assert_eq!(outside_boot_partition(&out)[..MIB as usize], pattern()[..]);

    // Stamping the stamped copy again for another box replaces the file.
    let again = dir.path().join("radiology.img");
    let run = stamp(&fleet, &["--box", "radiology"], &out, &again);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = boot_file(&again, PROVISION_FILE).expect("file");
    assert!(
        text.contains("radiology") && !text.contains("reception"),
        "{text}"
    );
    let leftovers: Vec<_> = fs::read_dir(dir.path())
        .expect("list")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file left behind");
}

#[test]
fn one_card_for_the_whole_fleet_lets_each_board_find_itself_by_serial() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fleet = fleet_file(dir.path());
    let img = image(dir.path());
    let out = dir.path().join("fleet.img");
    let run = stamp(&fleet, &["--all"], &img, &out);
    assert!(run.status.success(), "{}", stderr(&run));
    let file =
        FleetFile::parse(&boot_file(&out, PROVISION_FILE).expect("file"), "card").expect("parse");
    let serial: Serial = "10000000b6b6b6b6".parse().expect("serial");
    let entry = file.entry_for(Some(&serial)).expect("radiology's entry");
    assert_eq!(
        entry.effective_hostname().map(|h| h.as_str()),
        Some("radiology-llm")
    );
}

#[test]
fn bad_requests_are_refused_and_leave_no_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fleet = fleet_file(dir.path());
    let img = image(dir.path());
    let out = dir.path().join("out.img");

    let run = stamp(&fleet, &["--box", "nobody"], &img, &out);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        stderr(&run).contains("reception, radiology"),
        "{}",
        stderr(&run)
    );

    let broken = dir.path().join("broken.toml");
    fs::write(
        &broken,
        fs::read_to_string(&fleet)
            .expect("example")
            .replace("timezone", "time_zone"),
    )
    .expect("write");
    let run = stamp(
        broken.to_str().expect("utf8"),
        &["--box", "reception"],
        &img,
        &out,
    );
    assert_eq!(run.status.code(), Some(2));
    assert!(
        stderr(&run).contains("time_zone") && stderr(&run).contains("line"),
        "{}",
        stderr(&run)
    );

    let no_serials = dir.path().join("no-serials.toml");
    fs::write(
        &no_serials,
        "[fleet]\nname = \"f\"\ngeneration = 1\n[[box]]\nname = \"a\"\n[[box]]\nname = \"b\"\n",
    )
    .expect("write");
    let run = stamp(no_serials.to_str().expect("utf8"), &["--all"], &img, &out);
    assert_eq!(run.status.code(), Some(2));
    assert!(stderr(&run).contains("serial"), "{}", stderr(&run));

    let not_an_image = dir.path().join("notes.txt");
    fs::write(&not_an_image, vec![b'x'; 4096]).expect("write");
    let run = stamp(&fleet, &["--box", "reception"], &not_an_image, &out);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("partition table"), "{}", stderr(&run));
    assert!(!out.exists(), "no output from a refused stamp");
}

#[test]
fn flashing_writes_reads_back_and_stamps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fleet = fleet_file(dir.path());
    let img = image(dir.path());
    // A stand-in for the card: a file holding an older, different image.
    let card = dir.path().join("card");
    fs::write(&card, vec![0xa5u8; (64 * MIB) as usize]).expect("card");
    let run = appliance(&[
        "flash",
        "--fleet",
        &fleet,
        "--box",
        "reception",
        img.to_str().expect("utf8"),
        card.to_str().expect("utf8"),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("read back"), "{stdout}");
    assert!(
        stderr(&run).contains("checking"),
        "progress is shown: {}",
        stderr(&run)
    );
    assert_eq!(
        fs::metadata(&card).expect("card").len(),
        48 * MIB,
        "exactly the image"
    );
    assert!(
        boot_file(&card, PROVISION_FILE)
            .expect("stamped")
            .contains("reception")
    );
    assert_eq!(outside_boot_partition(&card)[..MIB as usize], pattern()[..]);
}

#[test]
fn the_wifi_psk_is_the_standard_derivation() {
    // IEEE 802.11i-2004, annex H.4.
    let mut child = Command::new(BIN)
        .args(["wifi-psk", "--ssid", "IEEE"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"password\n")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "f42c6fc52df0ebef9ebb4b90b38a5f902e83fe1b135a70e23aed762e9710a12e"
    );
}

#[test]
fn the_documented_example_checks() {
    let run = appliance(&["check", EXAMPLE]);
    assert!(run.status.success(), "{}", stderr(&run));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("2 boxes") && stdout.contains("radiology-llm"),
        "{stdout}"
    );
}

#[test]
fn a_usb_stick_gets_the_file_and_the_fleet_keys_signature() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fleet = fleet_file(dir.path());
    let (secret, public) = weights::sign::keygen().expect("key");
    let key = dir.path().join("fleet-key");
    fs::write(&key, secret).expect("key file");
    let stick = dir.path().join("stick");
    fs::create_dir(&stick).expect("stick");
    let run = appliance(&[
        "usb",
        "--fleet",
        &fleet,
        "--box",
        "radiology",
        "--key",
        key.to_str().expect("utf8"),
        stick.to_str().expect("utf8"),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = fs::read(stick.join(PROVISION_FILE)).expect("file");
    let sig = fs::read_to_string(stick.join(format!("{PROVISION_FILE}.sig"))).expect("sig");
    let trust = weights::sign::Trust::new(&[public], true).expect("trust");
    trust
        .check(&text, Some(&sig))
        .expect("signed by the fleet key");
    assert!(String::from_utf8_lossy(&text).contains("radiology-llm"));

    let run = appliance(&[
        "usb",
        "--fleet",
        &fleet,
        "--box",
        "radiology",
        "--key",
        &fleet,
        stick.to_str().expect("utf8"),
    ]);
    assert_eq!(run.status.code(), Some(2), "a fleet file is not a key");
    assert!(stderr(&run).contains("secret key"), "{}", stderr(&run));
}
