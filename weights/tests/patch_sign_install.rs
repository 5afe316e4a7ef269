//! Patches apply only to the bytes they were written for; installs are all or nothing; the
//! gate lets only verified weights through; signatures are enforced.

mod common;

use std::io::Write;

use common::*;
use gguf::{Header, Value};
use weights::gate::{self, Reverify};
use weights::install::{self, Approval, CURRENT, install};
use weights::sign::{self, Signed, Trust};
use weights::{ErrorKind, Patch, patch};

#[test]
fn a_metadata_patch_rewrites_the_header_and_keeps_tensor_data() {
    let bytes = gguf_file(10_000);
    let manifest = manifest_for(&bytes, EOT_PATCH);
    let mut out = Vec::new();
    patch::apply(&bytes, &manifest.patches[0], &mut out).expect("apply");
    let before = Header::parse(&bytes).expect("before");
    let after = Header::parse(&out).expect("after");
    assert_eq!(
        after.get("tokenizer.ggml.eot_token_id"),
        Some(&Value::U32(2))
    );
    assert_eq!(
        after.get("tokenizer.ggml.eos_token_id"),
        Some(&Value::U32(1))
    );
    assert_eq!(&out[after.data_start..], &bytes[before.data_start..]);
    assert_eq!(after.data_start % after.alignment as usize, 0);
}

fn bytes_patch(offset: u64, old: &[u8], new: &[u8]) -> Patch {
    Patch::Bytes {
        why: "test".into(),
        input_sha256: String::new(),
        output_sha256: String::new(),
        offset,
        old_sha256: weights::hash::to_hex(&weights::hash::sha256(old)),
        new_hex: hex::encode(new),
    }
}

#[test]
fn a_byte_patch_checks_its_range_and_the_old_bytes() {
    let bytes = gguf_file(1000);
    let at = bytes.len() - 8;
    let mut out = Vec::new();
    patch::apply(
        &bytes,
        &bytes_patch(at as u64, &bytes[at..at + 4], b"\x01\x02\x03\x04"),
        &mut out,
    )
    .expect("apply");
    assert_eq!(&out[at..at + 4], b"\x01\x02\x03\x04");
    assert_eq!(out.len(), bytes.len());

    let err = patch::apply(
        &bytes,
        &bytes_patch(at as u64 + 6, b"zz", b"abcd"),
        &mut Vec::new(),
    )
    .expect_err("range");
    assert!(err.message.contains("outside"), "{err}");
    let err = patch::apply(&bytes, &bytes_patch(u64::MAX, b"", b"ab"), &mut Vec::new())
        .expect_err("overflow");
    assert_eq!(err.kind, ErrorKind::Patch);
    let err = patch::apply(
        &bytes,
        &bytes_patch(0, b"not these", b"abcd"),
        &mut Vec::new(),
    )
    .expect_err("old bytes");
    assert!(err.message.contains("the patch was written for"), "{err}");
}

/// A writer that fails like a full disk after `room` bytes.
struct FullDisk {
    room: usize,
}

impl Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.room == 0 {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        let n = buf.len().min(self.room);
        self.room -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_full_disk_during_patching_is_an_io_error() {
    let bytes = gguf_file(10_000);
    let manifest = manifest_for(&bytes, EOT_PATCH);
    let err =
        patch::apply(&bytes, &manifest.patches[0], &mut FullDisk { room: 100 }).expect_err("full");
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(err.message.contains("No space left"), "{err}");
}

#[test]
fn install_patches_verifies_and_switches_atomically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bytes = gguf_file(100_000);
    let src = write(dir.path(), "published.gguf", &bytes);
    let manifest = manifest_for(&bytes, EOT_PATCH);
    let installed = install(&src, &approval(&manifest), &data).expect("install");
    assert!(!installed.already_installed);
    weights::verify::verify_file(&installed.path, &manifest).expect("installed file verifies");
    let again = install(&src, &approval(&manifest), &data).expect("again");
    assert!(again.already_installed);
    assert_eq!(again.path, installed.path);

    let ok = gate::check(&data, "test-model", Reverify::Full, &open_trust(), 100).expect("gate");
    assert_eq!(ok.path, installed.path);
    // Nothing but the current version remains: no staging or intermediate files.
    let model = install::model_dir(&data, "test-model");
    let version = install::current_version(&model)
        .expect("read")
        .expect("current");
    let files = tree(&model);
    let mut expected = vec![
        ".lock".to_string(),
        CURRENT.to_string(),
        version.clone(),
        format!("{version}/installed.toml"),
        format!("{version}/manifest.toml"),
        format!("{version}/model.gguf"),
    ];
    expected.sort();
    assert_eq!(files, expected);
}

#[test]
fn wrong_inputs_leave_nothing_new_and_the_old_model_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bytes = gguf_file(100_000);
    let manifest = manifest_for(&bytes, EOT_PATCH);
    let good = write(dir.path(), "published.gguf", &bytes);
    let old = install(&good, &approval(&manifest), &data).expect("first install");
    let model = install::model_dir(&data, "test-model");
    let before = tree(&model);

    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 1;
    let cases = [
        (
            "truncated",
            bytes[..bytes.len() - 100].to_vec(),
            ErrorKind::Mismatch,
        ),
        ("flipped", flipped, ErrorKind::Mismatch),
        ("empty", Vec::new(), ErrorKind::Mismatch),
    ];
    for (name, content, kind) in cases {
        let src = write(dir.path(), name, &content);
        let err = install(&src, &approval(&manifest), &data).expect_err(name);
        assert_eq!(err.kind, kind, "{name}: {err}");
        assert_eq!(tree(&model), before, "{name} left something behind");
    }

    // A manifest whose patch promises another output: the patch's output check stops it.
    let mut lying = manifest.clone();
    let wrong = "cd".repeat(32);
    let input = lying.patches[0].input_sha256().to_string();
    lying.patches[0].set_hashes(input, wrong.clone());
    lying.sha256 = wrong;
    let err = install(&good, &approval(&lying), &data).expect_err("lying patch");
    assert_eq!(err.kind, ErrorKind::Patch, "{err}");
    assert_eq!(tree(&model), before);

    // A patch written for other bytes: the input check stops it.
    let other = manifest_for(&gguf_file(99_999), EOT_PATCH);
    let err = install(&good, &approval(&other), &data).expect_err("other source");
    assert_eq!(err.kind, ErrorKind::Mismatch, "{err}");

    let still = gate::check(&data, "test-model", Reverify::Full, &open_trust(), 100)
        .expect("old model still good");
    assert_eq!(still.path, old.path);
}

#[test]
fn a_full_disk_during_install_keeps_the_old_model() {
    if !nix_is_root() {
        panic!("this test mounts a small tmpfs and must run as root (CI does)");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&data)
        .status()
        .expect("mount");
    assert!(status.success(), "mount tmpfs");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(data.clone());

    let small = gguf_file(50_000); // ~200 KB: fits
    let small_manifest = manifest_for(&small, "");
    let old = install(
        &write(dir.path(), "small", &small),
        &approval(&small_manifest),
        &data,
    )
    .expect("fits");
    let model = install::model_dir(&data, "test-model");
    let before = tree(&model);

    let big = gguf_file(400_000); // ~1.6 MB: cannot fit next to the old one
    let big_manifest = manifest_for(&big, EOT_PATCH);
    let err = install(
        &write(dir.path(), "big", &big),
        &approval(&big_manifest),
        &data,
    )
    .expect_err("disk full");
    assert_eq!(err.kind, ErrorKind::Io, "{err}");
    assert!(err.message.contains("No space left"), "{err}");
    assert_eq!(tree(&model), before, "the failed install left files behind");
    let still =
        gate::check(&data, "test-model", Reverify::Full, &open_trust(), 100).expect("old model");
    assert_eq!(still.path, old.path);
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn the_gate_catches_tampering_fast_by_stat_and_full_by_hash() {
    let Fixture {
        dir: _dir,
        data,
        manifest: _,
        installed,
    } = fixture(100_000);
    let fast = Reverify::Fast { full_every_s: 1000 };
    let ok = gate::check(
        &data,
        "test-model",
        fast,
        &open_trust(),
        install::now_unix(),
    )
    .expect("fast");
    assert!(ok.checked.starts_with("fast"), "{}", ok.checked);

    // A bit flips on the card: the content changes, and with it the mtime.
    let mut content = std::fs::read(&installed.path).expect("read");
    content[1000] ^= 4;
    std::fs::write(&installed.path, &content).expect("write");
    let err = gate::check(
        &data,
        "test-model",
        fast,
        &open_trust(),
        install::now_unix(),
    )
    .expect_err("caught");
    assert_eq!(err.kind, ErrorKind::Mismatch);
    assert_eq!(err.bad_chunk.map(|c| c.0), Some(0));

    let err =
        gate::check(&data, "other-model", Reverify::Full, &open_trust(), 0).expect_err("absent");
    assert_eq!(err.kind, ErrorKind::NotInstalled);
}

/// Runs `f` on another thread and fails instead of hanging the test run when it blocks.
fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the gate hung")
}

#[test]
fn the_gate_refuses_a_fifo_manifest_quickly() {
    let Fixture {
        dir: _dir,
        data,
        manifest: _,
        installed,
    } = fixture(1000);
    let manifest = installed.path.with_file_name(install::MANIFEST);
    std::fs::remove_file(&manifest).expect("rm");
    nix::unistd::mkfifo(&manifest, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .expect("mkfifo");
    let err =
        within_10s(move || gate::check(&data, "test-model", Reverify::Full, &open_trust(), 0))
            .expect_err("a FIFO is no manifest");
    assert_eq!(err.kind, ErrorKind::BadManifest);
    assert!(
        err.message
            .contains("manifest.toml is a FIFO (named pipe), not a regular file"),
        "{}",
        err.message
    );
}

#[test]
fn the_gate_refuses_a_huge_current_without_reading_it() {
    let Fixture {
        dir: _dir,
        data,
        manifest: _,
        installed: _,
    } = fixture(1000);
    let current = install::model_dir(&data, "test-model").join(CURRENT);
    std::fs::write(&current, vec![b'a'; 2 << 20]).expect("write");
    let err = gate::check(&data, "test-model", Reverify::Full, &open_trust(), 0)
        .expect_err("2 MB is no pointer");
    assert_eq!(err.kind, ErrorKind::Io);
    assert!(
        err.message.contains("current is larger than 4096 bytes"),
        "{}",
        err.message
    );
    // Short enough to print: the text of the file is not in it.
    assert!(err.message.len() < 500, "{}", err.message);
}

#[test]
fn signatures_are_enforced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = gguf_file(1000);
    let text = manifest_for(&bytes, "").to_toml().expect("toml");
    let m = write(dir.path(), "m.toml", text.as_bytes());
    let (secret, public) = sign::keygen().expect("keygen");
    let (other_secret, _) = sign::keygen().expect("keygen");
    let trusting = Trust::new(std::slice::from_ref(&public), true).expect("trust");
    let lax = Trust::new(std::slice::from_ref(&public), false).expect("trust");

    let err = Approval::load(&m, &trusting).expect_err("unsigned");
    assert_eq!(err.kind, ErrorKind::Signature);
    assert!(
        Approval::load(&m, &lax).is_ok(),
        "unsigned is fine unless required"
    );

    std::fs::write(
        install::sig_path(&m),
        sign::sign(text.as_bytes(), &secret).expect("sign"),
    )
    .expect("write sig");
    assert_eq!(
        Approval::load(&m, &trusting).expect("signed").signed,
        Signed::By(public)
    );

    std::fs::write(&m, text.replace("Test", "Tost")).expect("tamper");
    let err = Approval::load(&m, &lax).expect_err("tampered");
    assert!(err.message.contains("does not match"), "{err}");

    std::fs::write(&m, &text).expect("restore");
    std::fs::write(
        install::sig_path(&m),
        sign::sign(text.as_bytes(), &other_secret).expect("sign"),
    )
    .expect("write sig");
    let err = Approval::load(&m, &lax).expect_err("untrusted signer");
    assert!(
        err.message.contains("not among the box's trusted keys"),
        "{err}"
    );

    std::fs::write(install::sig_path(&m), "ed25519 zz zz").expect("garbage");
    assert_eq!(
        Approval::load(&m, &lax).expect_err("garbage").kind,
        ErrorKind::Signature
    );
    assert!(Trust::new(&["12".into()], false).is_err());
}

#[test]
fn bit_rot_with_the_mtime_put_back_is_still_caught() {
    let Fixture {
        dir: _dir,
        data,
        manifest: _,
        installed,
    } = fixture(100_000);
    let mtime = std::fs::metadata(&installed.path)
        .expect("stat")
        .modified()
        .expect("mtime");
    let mut content = std::fs::read(&installed.path).expect("read");
    content[5 * CHUNK as usize + 3] ^= 0x80;
    std::fs::write(&installed.path, &content).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&installed.path)
        .and_then(|f| f.set_modified(mtime))
        .expect("put the mtime back");
    let now = install::now_unix();
    for how in [
        Reverify::Full,
        Reverify::Fast {
            full_every_s: 1_000_000,
        },
    ] {
        let err = gate::check(&data, "test-model", how, &open_trust(), now).expect_err("caught");
        assert_eq!(err.bad_chunk.map(|c| c.0), Some(5), "{how:?}: {err}");
    }
}

#[test]
fn fast_mode_verifies_in_full_when_due_or_when_the_clock_went_back() {
    let Fixture {
        dir: _dir, data, ..
    } = fixture(10_000);
    let installed_at = install::now_unix();
    let fast = Reverify::Fast { full_every_s: 3600 };
    let checked = |now| {
        gate::check(&data, "test-model", fast, &open_trust(), now)
            .expect("ok")
            .checked
    };
    assert!(checked(installed_at + 10).starts_with("fast"));
    assert!(
        checked(installed_at + 7200).starts_with("full"),
        "due after the interval"
    );
    assert!(
        checked(installed_at + 7300).starts_with("fast"),
        "the full check was recorded"
    );
    assert!(
        checked(1000).starts_with("full"),
        "a clock behind the last check makes it due"
    );
}

#[test]
fn a_crash_leftover_does_not_block_the_next_install() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bytes = gguf_file(10_000);
    let manifest = manifest_for(&bytes, "");
    let model = install::model_dir(&data, "test-model");
    let leftover = model.join(".staging-deadbeef");
    std::fs::create_dir_all(&leftover).expect("mkdir");
    std::fs::write(leftover.join("model.gguf"), vec![0u8; 50_000]).expect("write");
    install(&write(dir.path(), "m", &bytes), &approval(&manifest), &data).expect("install");
    assert!(!leftover.exists(), "the crash leftover was cleaned up");
}

#[test]
fn one_install_at_a_time_per_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bytes = gguf_file(10_000);
    let manifest = manifest_for(&bytes, "");
    let model = install::model_dir(&data, "test-model");
    std::fs::create_dir_all(&model).expect("mkdir");
    let held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(model.join(".lock"))
        .expect("open");
    let _held = nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockExclusive).expect("lock");
    let err =
        install(&write(dir.path(), "m", &bytes), &approval(&manifest), &data).expect_err("locked");
    assert!(err.message.contains("another install"), "{err}");
}

#[test]
fn bookkeeping_names_cannot_be_model_files() {
    let bytes = gguf_file(1000);
    for name in ["manifest.toml", "installed.toml", "manifest.toml.sig"] {
        let mut m = manifest_for(&bytes, "");
        m.file = name.into();
        assert!(m.check().is_err(), "{name}");
    }
}

#[test]
fn a_manifest_signed_after_install_is_installed_again_with_its_signature() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bytes = gguf_file(10_000);
    let src = write(dir.path(), "m", &bytes);
    let text = manifest_for(&bytes, "").to_toml().expect("toml");
    let m = write(dir.path(), "m.toml", text.as_bytes());
    let (secret, public) = sign::keygen().expect("keygen");
    let lax = Trust::new(std::slice::from_ref(&public), false).expect("trust");
    let strict = Trust::new(std::slice::from_ref(&public), true).expect("trust");
    install(&src, &Approval::load(&m, &lax).expect("unsigned ok"), &data).expect("install");
    assert!(
        gate::check(&data, "test-model", Reverify::Full, &strict, 0).is_err(),
        "unsigned under require"
    );

    std::fs::write(
        install::sig_path(&m),
        sign::sign(text.as_bytes(), &secret).expect("sign"),
    )
    .expect("sig");
    let again =
        install(&src, &Approval::load(&m, &strict).expect("signed"), &data).expect("reinstall");
    assert!(
        !again.already_installed,
        "the signature must be installed too"
    );
    let ok =
        gate::check(&data, "test-model", Reverify::Full, &strict, 0).expect("signed model passes");
    assert_eq!(ok.signed, Signed::By(public));
}
