//! The update bundle as `appliance-image build` makes it ([`appliance_image::bundle::make`]),
//! checked with the real `rauc` (the same tool RAUC on the box is): a bundle signed by the
//! image's key is accepted with its compatible and version; one checked against another key,
//! one signed by another key and one whose signed manifest was changed are refused.

use std::path::Path;
use std::process::{Command, Output};

use appliance_image::bundle::{self, Signing};
use appliance_image::definition::Definition;

fn definition() -> Definition {
    Definition::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("appliance-rpi5.toml"))
        .expect("definition")
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed (scripts/test installs it): {e}"))
}

fn pair(dir: &Path, name: &str) -> Signing {
    let (key, cert) = test_support::signing_pair(dir, name);
    Signing { key, cert }
}

fn info(bundle: &Path, keyring: &Path) -> Output {
    run(
        "rauc",
        &[
            "info",
            "--keyring",
            keyring.to_str().expect("utf8"),
            bundle.to_str().expect("utf8"),
        ],
    )
}

#[test]
fn bundles_verify_only_against_the_key_that_signed_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, theirs) = (pair(dir.path(), "ours"), pair(dir.path(), "theirs"));
    // A small root filesystem image stands in for the system's.
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("usr/share/appliance")).expect("tree");
    std::fs::write(tree.join("usr/share/appliance/version"), "7\n").expect("version");
    // Incompressible content: RAUC refuses a payload of a single block.
    let noise: Vec<u8> = (0..65_536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(tree.join("usr/share/appliance/noise"), noise).expect("noise");
    let image = dir.path().join("root-a.fs");
    let out = run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-d",
            tree.to_str().expect("utf8"),
            image.to_str().expect("utf8"),
            "8M",
        ],
    );
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out_dir = dir.path().join("out");
    std::fs::create_dir_all(&out_dir).expect("out");
    let made_from = dir.path().join("root-a.copy.fs");
    std::fs::copy(&image, &made_from).expect("copy");
    let made =
        bundle::make(&definition(), &out_dir, dir.path(), &image, "7", &ours).expect("bundle");
    assert_eq!(made, out_dir.join("appliance-rpi5-7.raucb"));

    let accepted = info(&made, &ours.cert);
    let said = String::from_utf8_lossy(&accepted.stdout).into_owned();
    assert!(
        accepted.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    assert!(said.contains("Compatible: \t'appliance-rpi5'"), "{said}");
    assert!(said.contains("Version:    \t'7'"), "{said}");
    assert!(said.contains("verity"), "{said}");

    let stranger = info(&made, &theirs.cert);
    assert!(
        !stranger.status.success(),
        "another key's keyring accepted it"
    );

    // The same system signed by another key: refused by our keyring.
    let again = dir.path().join("root-b.fs");
    std::fs::copy(&made_from, &again).expect("copy");
    let theirs_dir = dir.path().join("theirs");
    std::fs::create_dir_all(&theirs_dir).expect("dir");
    let foreign =
        bundle::make(&definition(), &theirs_dir, dir.path(), &again, "7", &theirs).expect("bundle");
    assert!(info(&foreign, &theirs.cert).status.success());
    assert!(
        !info(&foreign, &ours.cert).status.success(),
        "a bundle signed by another key passed"
    );

    // A changed manifest (the signed part at the end: compatible, version, the payload's
    // verity root hash) is refused here; a changed payload block is refused by dm-verity when
    // the box reads it during the install.
    let mut bytes = std::fs::read(&made).expect("bundle");
    let signed = bytes.len() - 600;
    bytes[signed] ^= 0x40;
    let tampered = out_dir.join("tampered.raucb");
    std::fs::write(&tampered, bytes).expect("tampered");
    assert!(
        !info(&tampered, &ours.cert).status.success(),
        "a tampered bundle passed"
    );
}
