//! A/B updates: what RAUC on the card needs (its `system.conf` for this layout and the keyring
//! it checks bundles against) and the signed update bundle of the same build
//! (`out/<name>-<version>.raucb`, RAUC's `verity` format holding the root filesystem image).
//!
//! Bundles are signed with the fleet's X.509 key and certificate (`--signing-key`,
//! `--signing-cert`). Without them a development pair is made once in `out/keys/` (never in the
//! repository) and reused, so every build of this checkout can update the others.

use std::fs;
use std::path::{Path, PathBuf};

use crate::args;
use crate::definition::Definition;
use crate::layout;
use crate::run::run;

/// Host tools the bundle needs.
pub const HOST_TOOLS: [(&str, &str); 3] = [
    ("rauc", "rauc"),
    ("mksquashfs", "squashfs-tools"),
    ("openssl", "openssl"),
];

/// The key and certificate bundles are signed with.
#[derive(Debug, Clone)]
pub struct Signing {
    /// PEM private key.
    pub key: PathBuf,
    /// PEM X.509 certificate; also the keyring the image trusts.
    pub cert: PathBuf,
}

/// The given pair, or the checkout's development pair (made on first use).
pub fn signing(given: Option<Signing>, out: &Path) -> Result<Signing, String> {
    if let Some(s) = given {
        for path in [&s.key, &s.cert] {
            if !path.is_file() {
                return Err(format!("signing file {} does not exist", path.display()));
            }
        }
        return Ok(s);
    }
    let dir = out.join("keys");
    let pair = Signing {
        key: dir.join("development.key.pem"),
        cert: dir.join("development.cert.pem"),
    };
    if pair.key.is_file() && pair.cert.is_file() {
        return Ok(pair);
    }
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    eprintln!(
        "warning: no --signing-key/--signing-cert given: making a development signing pair in {} (boxes built with it accept only bundles signed by it; a fleet uses its own key)",
        dir.display()
    );
    let partial_key = dir.join("development.key.pem.partial");
    run(
        "openssl",
        args![
            "req",
            "-x509",
            "-newkey",
            "rsa:4096",
            "-nodes",
            "-keyout",
            &partial_key,
            "-out",
            &pair.cert,
            "-days",
            "3650",
            "-subj",
            "/O=Appliance/CN=Appliance development update signing"
        ],
    )?;
    fs::rename(&partial_key, &pair.key).map_err(|e| format!("placing the key: {e}"))?;
    Ok(pair)
}

/// RAUC's `system.conf` for this image: both root slots by partition, the supervisor as the
/// bootloader backend and post-install handler, state on the data partition, signed `verity`
/// bundles only.
pub fn system_conf(d: &Definition) -> String {
    let id = d.layout.disk_id;
    format!(
        "# RAUC on the Appliance (written by appliance-image build). The supervisor is the bootloader\n\
         # backend: it speaks the Pi 5 firmware's tryboot through config.txt.d/15-slot.txt.\n\
         [system]\n\
         compatible={name}\n\
         bootloader=custom\n\
         bundle-formats=-plain\n\
         data-directory=/var/lib/appliance/rauc\n\
         \n\
         [keyring]\n\
         path=/etc/rauc/keyring.pem\n\
         \n\
         [handlers]\n\
         bootloader-custom-backend=/usr/libexec/appliance/rauc-backend\n\
         post-install=/usr/libexec/appliance/rauc-post-install\n\
         \n\
         [slot.rootfs.0]\n\
         device=/dev/disk/by-partuuid/{a}\n\
         type=ext4\n\
         bootname=A\n\
         \n\
         [slot.rootfs.1]\n\
         device=/dev/disk/by-partuuid/{b}\n\
         type=ext4\n\
         bootname=B\n",
        name = d.name,
        a = layout::partuuid(id, 2),
        b = layout::partuuid(id, 3),
    )
}

/// Makes `out/<name>-<version>.raucb` from the root filesystem image `rootfs` (consumed).
pub fn make(
    d: &Definition,
    out: &Path,
    work: &Path,
    rootfs: &Path,
    version: &str,
    signing: &Signing,
) -> Result<PathBuf, String> {
    let content = work.join("bundle");
    if content.exists() {
        fs::remove_dir_all(&content).map_err(|e| format!("clearing {}: {e}", content.display()))?;
    }
    fs::create_dir_all(&content).map_err(|e| format!("creating {}: {e}", content.display()))?;
    fs::rename(rootfs, content.join("rootfs.ext4"))
        .map_err(|e| format!("moving the root filesystem into the bundle: {e}"))?;
    let manifest = format!(
        "[update]\ncompatible={}\nversion={version}\n\n[bundle]\nformat=verity\n\n[image.rootfs]\nfilename=rootfs.ext4\n",
        d.name
    );
    fs::write(content.join("manifest.raucm"), manifest)
        .map_err(|e| format!("writing the bundle manifest: {e}"))?;
    let bundle = out.join(format!("{}-{version}.raucb", d.name));
    let partial = out.join(format!(".{}-{version}.partial.raucb", d.name));
    let _ = fs::remove_file(&partial);
    run(
        "rauc",
        args![
            "bundle",
            "--cert",
            &signing.cert,
            "--key",
            &signing.key,
            "--keyring",
            &signing.cert,
            &content,
            &partial
        ],
    )?;
    fs::rename(&partial, &bundle).map_err(|e| format!("placing {}: {e}", bundle.display()))?;
    fs::remove_dir_all(&content).map_err(|e| format!("clearing {}: {e}", content.display()))?;
    Ok(bundle)
}

/// A version that orders after every earlier build: the build time, UTC, as
/// `YYYY.MM.DD.HHMMSS`.
pub fn version_from_time(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map_or_else(
            || "0".to_string(),
            |t| t.strftime("%Y.%m.%d.%H%M%S").to_string(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_time_versions_are_calendar_dates() {
        assert_eq!(version_from_time(0), "1970.01.01.000000");
        assert_eq!(version_from_time(1_796_194_650), "2026.12.02.065730");
        assert_eq!(version_from_time(951_782_400), "2000.02.29.000000");
    }

    #[test]
    fn system_conf_names_both_slots_by_partition() {
        let d =
            Definition::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("appliance-rpi5.toml"))
                .expect("definition");
        let conf = system_conf(&d);
        assert!(conf.contains("compatible=appliance-rpi5\n"));
        assert!(conf.contains("device=/dev/disk/by-partuuid/a9911a0c-02\ntype=ext4\nbootname=A"));
        assert!(conf.contains("device=/dev/disk/by-partuuid/a9911a0c-03\ntype=ext4\nbootname=B"));
    }
}
