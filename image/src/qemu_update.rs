//! The A/B update test under QEMU. The harness plays the Pi 5 firmware ([`crate::qemu::firmware`]):
//! after each reboot it reads the kernel's reboot command on the console (`0 tryboot` asks for
//! one tryboot), then boots the slot folder `tryboot.txt` or `config.txt` names, as the
//! firmware would, and never touches the disk otherwise.
//!
//! Version 1 boots; a USB stick holding the signed version 2 bundle is plugged in; the box
//! installs it into slot B, reboots into it once, checks it and commits; it boots version 2
//! again after a power cycle; then a stick with version 3, whose engine is broken, is installed
//! into slot A, fails its health check and the box rolls back to version 2 by itself. The data
//! partition (model, provisioning) stays intact throughout.

use std::path::Path;
use std::time::{Duration, Instant};

use wire::Status;

use crate::args;
use crate::definition::Definition;
use crate::pipeline::Paths;
use crate::qemu::{self, Guest};
use crate::run::run;
use crate::stamped::{self, HOSTNAME, Stamped};

/// What the test saw.
#[derive(Debug)]
pub struct Report {
    /// Versions seen running, in order.
    pub versions: Vec<String>,
    /// From plugging in version 2 to its commit.
    pub install_to_commit: Duration,
    /// From plugging in version 3 to the box running version 2 again.
    pub install_to_rollback: Duration,
    /// Why version 3 was rolled back, as the box recorded it.
    pub rollback_reason: String,
}

/// A FAT stick labelled `APPLIANCE` holding `bundle`.
fn stick_with(bundle: &Path, dir: &Path, name: &str) -> Result<std::path::PathBuf, String> {
    let size = std::fs::metadata(bundle)
        .map_err(|e| format!("{}: {e}", bundle.display()))?
        .len();
    let stick = dir.join(name);
    let _ = std::fs::remove_file(&stick);
    let kib = (size >> 10) + (64 << 10);
    run(
        "mkfs.vfat",
        args!["-F", "32", "-n", "APPLIANCE", "-C", &stick, kib.to_string()],
    )?;
    let file = bundle
        .file_name()
        .ok_or("the bundle path has no file name")?
        .to_string_lossy()
        .into_owned();
    run("mcopy", args!["-i", &stick, bundle, format!("::/{file}")])?;
    Ok(stick)
}

/// Polls `/api/status` until `wanted` holds or the guest stops (then `Ok(None)`: it rebooted).
fn until(
    guest: &mut Guest,
    stamped: &Stamped,
    https: &str,
    deadline: Instant,
    what: &str,
    serial: &Path,
    wanted: &dyn Fn(&Status) -> bool,
) -> Result<Option<Status>, String> {
    loop {
        if let Ok(Some(_)) = guest.0.try_wait() {
            return Ok(None);
        }
        let last = match stamped::api_status(stamped, https) {
            Ok(doc) if wanted(&doc) => return Ok(Some(doc)),
            Ok(doc) => json(&doc.update),
            Err(e) => e,
        };
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: not seen in time; last: {last}; see {}",
                serial.display()
            ));
        }
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Waits for QEMU to exit (the guest rebooted; `-no-reboot` turns a reboot into an exit).
fn rebooted(
    guest: &mut Guest,
    deadline: Instant,
    what: &str,
    serial: &Path,
) -> Result<bool, String> {
    loop {
        if let Ok(Some(_)) = guest.0.try_wait() {
            return Ok(qemu::asked_for_tryboot(serial));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: the box did not reboot in time; see {}",
                serial.display()
            ));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// A part of the status document as the box wrote it, for messages.
fn json(part: &impl serde::Serialize) -> String {
    serde_json::to_string(part).unwrap_or_default()
}

fn running_version(doc: &Status) -> String {
    doc.update
        .as_ref()
        .and_then(|u| u.booted_slot())
        .and_then(|s| s.system_version.clone())
        .unwrap_or_default()
}

/// How the last update ended (`committed`, `rolled-back`, `cancelled`), if one did.
fn last_result(doc: &Status) -> Option<&str> {
    Some(doc.update.as_ref()?.last.as_ref()?.result.as_str())
}

fn data_intact(doc: &Status) -> Result<(), String> {
    if doc.model.state != "verified" {
        return Err(format!("the model is not verified: {}", json(&doc.model)));
    }
    if doc.provision.as_ref().map(|p| p.generation) != Some(1)
        || doc.board.hostname.as_deref() != Some(HOSTNAME)
    {
        return Err(format!(
            "the provisioning changed: {}",
            json(&doc.provision)
        ));
    }
    Ok(())
}

/// Runs the test on a copy of `image` (version `v1`) with the bundles `good` (`v2`) and
/// `broken` (`v3`, an engine that cannot run).
#[allow(clippy::too_many_arguments)]
pub fn update_test(
    definition: &Definition,
    paths: &Paths,
    image: &Path,
    good: &Path,
    broken: &Path,
    versions: [&str; 3],
    port: u16,
    timeout: Duration,
) -> Result<Report, String> {
    let [v1, v2, v3] = versions;
    let qemu::Prepared {
        dir,
        disk,
        stamped,
        ports,
    } = qemu::prepare(paths, "qemu-update", image, port)?;
    let https = format!("127.0.0.1:{}", ports.https);
    let mut seen = Vec::new();

    // Version 1, with the stick holding version 2 plugged in.
    let stick2 = stick_with(good, &dir, "stick-v2.img")?;
    let plugged = Instant::now();
    let deadline = plugged + timeout;
    let (mut guest, _, serial) =
        qemu::start(definition, &dir, &disk, &ports, Some(&stick2), false)?;
    let doc = until(
        &mut guest,
        &stamped,
        &https,
        deadline,
        "version 1 serving",
        &serial,
        &|d| running_version(d) == v1,
    )?;
    if let Some(doc) = doc {
        seen.push(running_version(&doc));
        data_intact(&doc)?;
    }
    let tryboot = rebooted(&mut guest, deadline, "installing version 2", &serial)?;
    if !tryboot {
        return Err(format!(
            "the box rebooted without asking for tryboot after installing version 2; see {}",
            serial.display()
        ));
    }
    drop(guest);
    let (mut guest, _, serial) = qemu::start(definition, &dir, &disk, &ports, Some(&stick2), true)?;
    let doc = until(
        &mut guest,
        &stamped,
        &https,
        deadline,
        "version 2 committed",
        &serial,
        &|d| running_version(d) == v2 && last_result(d) == Some("committed"),
    )?
    .ok_or_else(|| {
        format!(
            "the trial boot of version 2 rebooted; see {}",
            serial.display()
        )
    })?;
    let install_to_commit = plugged.elapsed();
    seen.push(running_version(&doc));
    data_intact(&doc)?;
    // A power cycle: the firmware's plain boot now runs version 2.
    drop(guest);
    let (mut guest, _, serial) = qemu::start(definition, &dir, &disk, &ports, None, false)?;
    let deadline = Instant::now() + timeout;
    let doc = until(
        &mut guest,
        &stamped,
        &https,
        deadline,
        "version 2 after a power cycle",
        &serial,
        &|d| {
            running_version(d) == v2
                && d.update.as_ref().and_then(|u| u.committed.as_deref()) == Some("B")
        },
    )?
    .ok_or_else(|| {
        format!(
            "version 2 rebooted after the power cycle; see {}",
            serial.display()
        )
    })?;
    seen.push(running_version(&doc));
    drop(guest);

    // Version 3 with a broken engine: tried in slot A, rolled back without anyone touching it.
    let stick3 = stick_with(broken, &dir, "stick-v3.img")?;
    let plugged = Instant::now();
    let deadline = plugged + timeout;
    let (mut guest, _, serial) =
        qemu::start(definition, &dir, &disk, &ports, Some(&stick3), false)?;
    let tryboot = rebooted(&mut guest, deadline, "installing version 3", &serial)?;
    if !tryboot {
        return Err(format!(
            "the box rebooted without asking for tryboot after installing version 3; see {}",
            serial.display()
        ));
    }
    drop(guest);
    let (mut guest, _, serial) = qemu::start(definition, &dir, &disk, &ports, Some(&stick3), true)?;
    let tryboot = rebooted(&mut guest, deadline, "version 3's trial boot", &serial)?;
    if tryboot {
        return Err(format!(
            "version 3's trial boot asked for another tryboot; see {}",
            serial.display()
        ));
    }
    drop(guest);
    let (mut guest, _, serial) =
        qemu::start(definition, &dir, &disk, &ports, Some(&stick3), false)?;
    let doc = until(
        &mut guest,
        &stamped,
        &https,
        deadline,
        "back on version 2",
        &serial,
        &|d| running_version(d) == v2 && last_result(d) == Some("rolled-back"),
    )?
    .ok_or_else(|| {
        format!(
            "the box rebooted again after the rollback; see {}",
            serial.display()
        )
    })?;
    let install_to_rollback = plugged.elapsed();
    seen.push(running_version(&doc));
    data_intact(&doc)?;
    let update = doc.update.clone().unwrap_or_default();
    let last = update.last.clone().unwrap_or_default();
    if last.system_version.as_deref() != Some(v3) {
        return Err(format!(
            "the rollback is recorded for another version: {}",
            json(&update.last)
        ));
    }
    let bad = update
        .slots
        .iter()
        .any(|s| s.slot == "A" && s.state == "bad");
    if !bad {
        return Err(format!("slot A is not marked bad: {}", json(&update)));
    }
    drop(guest);
    Ok(Report {
        versions: seen,
        install_to_commit,
        install_to_rollback,
        rollback_reason: last.reason,
    })
}
