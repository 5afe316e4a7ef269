//! A/B system updates: RAUC writes a signed bundle into the slot not running, then calls the
//! supervisor as its bootloader backend ([`backend`]), which points the firmware's one-shot
//! tryboot at that slot. In the trial boot the daemon checks the new system (tuning verified,
//! weights through the gate, the engine answering a completion, the dashboard up) within
//! `[update] health_timeout_s`, and only then commits by making `config.txt` boot it. Anything
//! else — a failed check, a crash, a hang the watchdog resets, a power cut — ends on the old
//! slot, because the firmware's tryboot flag does not survive a reset; the next boot records
//! the rollback.
//!
//! The record ([`store`]) is written before every step that could end the boot, and
//! `config.txt` is the only commit point (one atomic replacement), so a power cut after any
//! write leaves a box that boots a committed slot and a record that says what happened.

pub mod backend;
pub use crate::config::update as config;
pub mod handler;
pub mod install;
pub mod rauc;
mod record;
pub mod slot;
mod store;

use serde::Serialize;

use crate::board::{Board, paths};
use crate::bootfiles;
use crate::config::Config;
pub use record::{Ended, Record, Result as UpdateResult, Trial};
use slot::Slot;

/// What the boot is, for updates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boot {
    /// Nothing to check; the message says where updates stand.
    Normal(String),
    /// The trial boot of an update to this slot: check it within the seconds left, then
    /// [`commit`] or [`roll_back`].
    Trial(Slot, u64),
    /// A reboot is under way.
    Rebooting(String),
}

fn now(board: &Board) -> u64 {
    board.now_unix()
}

/// The slot `config.txt` boots (its `os_prefix`); `None` on a boot partition without slots.
pub fn committed(board: &Board) -> Result<Option<Slot>, String> {
    Ok(slot::booted_by(&bootfiles::config_txt(board)?))
}

/// The slot running now and the one committed, or why this box cannot take updates.
fn slots(board: &Board) -> Result<(Slot, Slot), String> {
    let booted = slot::booted(board)
        .map_err(|e| e.to_string())?
        .ok_or("this boot has no A/B slot (the kernel command line names no rauc.slot=): the card was not laid out by an image with A/B slots")?;
    let committed = committed(board)?.ok_or(
        "config.txt names no slot folder (os_prefix): the card was not laid out by an image with A/B slots",
    )?;
    Ok((booted, committed))
}

/// What the daemon does first at every boot: recognise the trial boot of an update, record a
/// rollback the firmware made, finish a commit a power cut interrupted, and keep the slot
/// fragment equal to what `config.txt` boots.
pub fn on_boot(board: &Board, config: &Config) -> Result<Boot, String> {
    if slot::booted(board).map_err(|e| e.to_string())?.is_none() {
        return Ok(Boot::Normal(
            "no A/B slots on this boot; updates are off".into(),
        ));
    }
    let (booted, committed) = slots(board)?;
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    let before = record.clone();
    let version = slot::running_version(board);
    if record.slot(booted).system_version != version {
        record.slot_mut(booted).system_version = version;
    }
    let now = now(board);
    let outcome = match record.trial.clone() {
        Some(trial) if trial.slot == booted && booted != committed => {
            let limit = config.update.health_timeout_s.get();
            let boot_id = board.read_value(paths::BOOT_ID).ok();
            if let Some(since) = trial.checking_since_unix {
                let same_boot = boot_id.is_some() && trial.checking_boot_id == boot_id;
                let elapsed = now.saturating_sub(since);
                if same_boot && elapsed < limit {
                    // Restarted in this boot (a crash, a provisioning stick): the check goes on.
                    return Ok(Boot::Trial(booted, limit - elapsed));
                }
                let reason = if same_boot {
                    "the supervisor restarted during the new slot's health check and its time ran out"
                } else {
                    "the new slot's health check was cut off (the supervisor could not tell whether it restarted in the same boot)"
                };
                record.end_trial(UpdateResult::RolledBack, reason.into(), now);
                store::save(board, config, &record)?;
                bootfiles::neutralize_tryboot(board)?;
                board.reboot(false).map_err(|e| e.to_string())?;
                return Ok(Boot::Rebooting(format!(
                    "update to slot {booted}: {reason}; rebooting onto slot {committed}"
                )));
            }
            if let Some(t) = record.trial.as_mut() {
                t.checking_since_unix = Some(now);
                t.checking_boot_id = boot_id;
            }
            store::save(board, config, &record)?;
            return Ok(Boot::Trial(booted, limit));
        }
        Some(trial) if trial.slot == booted => {
            // config.txt already boots it: a power cut came between the commit and the record.
            record.end_trial(
                UpdateResult::Committed,
                "passed its health check; committed".into(),
                now,
            );
            format!("slot {booted} committed")
        }
        Some(trial) if trial.rebooted_unix.is_some() => {
            let reason = if trial.checking_since_unix.is_some() {
                "the new slot reset during its health check (a hang the watchdog ended, a crash or a power loss); the firmware fell back to the old slot"
            } else {
                "the new slot never reached its health check (it did not boot, hung, or lost power); the firmware fell back to the old slot"
            };
            record.end_trial(UpdateResult::RolledBack, reason.into(), now);
            format!("update to slot {} rolled back: {reason}", trial.slot)
        }
        Some(trial) => format!("an update to slot {} waits for its reboot", trial.slot),
        None => format!("running slot {booted}"),
    };
    if record != before {
        store::save(board, config, &record)?;
    }
    // A commit cut short between the fragment and config.txt leaves the fragment ahead.
    bootfiles::promote(board, slot::FRAGMENT_NAME, Some(committed.fragment_text()))?;
    if record.trial.is_none() {
        bootfiles::neutralize_tryboot(board)?;
    }
    Ok(Boot::Normal(outcome))
}

/// Why an update trial may not start now (another trial is pending).
fn refuse_while_overclocking(board: &Board, config: &Config) -> Result<(), String> {
    let oc = crate::overclock::status(board, config);
    if let Some(e) = oc.error {
        return Err(format!(
            "the overclock record cannot be read ({e}), so an update could collide with a trial"
        ));
    }
    if oc.record.phase == crate::overclock::Phase::Climbing {
        return Err(format!(
            "an overclock ladder is running ({}); an update waits until it ends, or `supervisor overclock abort` stops it",
            oc.record.message
        ));
    }
    Ok(())
}

/// Whether an update trial is pending (for the overclock ladder, which refuses meanwhile).
pub fn pending(board: &Board, config: &Config) -> Result<Option<Trial>, String> {
    Ok(store::load(board, config)?.trial)
}

/// RAUC made `target` primary after writing it (`set-primary`): the trial is recorded and the
/// slot's bad mark cleared. Its boot files come next ([`prepare`]).
pub fn arm(board: &Board, config: &Config, target: Slot) -> Result<String, String> {
    let (booted, _) = slots(board)?;
    if target == booted {
        return Err(format!("slot {target} is the running one; nothing to try"));
    }
    refuse_while_overclocking(board, config)?;
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    record.slot_mut(target).bad = false;
    record.slot_mut(booted).system_version = slot::running_version(board);
    record.trial = Some(Trial {
        slot: target,
        system_version: None,
        from: booted,
        from_version: slot::running_version(board),
        failing_before: crate::tune::last_pass::read(board)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.state == crate::tune::State::Failed)
            .map(|r| r.name.to_string())
            .collect(),
        armed_unix: now(board),
        prepared_unix: None,
        rebooted_unix: None,
        checking_since_unix: None,
        checking_boot_id: None,
    });
    store::save(board, config, &record)?;
    Ok(format!("slot {target} armed"))
}

/// The armed slot's boot folder is complete: its version recorded, `tryboot.txt` pointed at
/// it. Nothing boots it until [`reboot_into_trial`].
pub fn prepare(board: &Board, config: &Config, target: Slot) -> Result<String, String> {
    if let Some(why) = slot::missing_boot_files(board, target)? {
        return Err(format!("slot {target} cannot be booted: {why}"));
    }
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    let folder = slot::boot_folder(board, target).map_err(|e| e.to_string())?;
    let version = board
        .read_optional(&format!("{folder}/version"))
        .map_err(|e| e.to_string())?
        .map(|v| v.trim().to_string());
    let Some(trial) = record.trial.as_mut().filter(|t| t.slot == target) else {
        return Err(format!(
            "slot {target} was not made primary first (RAUC calls set-primary before post-install)"
        ));
    };
    trial.system_version = version.clone();
    trial.prepared_unix = Some(now(board));
    record.slot_mut(target).system_version = version;
    bootfiles::write_tryboot(
        board,
        &[(slot::FRAGMENT_NAME, Some(target.fragment_text()))],
    )?;
    store::save(board, config, &record)?;
    Ok(format!("slot {target} will be tried at the next reboot"))
}

/// Reboots once into the armed trial (tryboot), recording it first.
pub fn reboot_into_trial(board: &Board, config: &Config) -> Result<String, String> {
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    let Some(trial) = record.trial.as_mut() else {
        return Err("no update is waiting for its reboot".into());
    };
    if trial.rebooted_unix.is_some() {
        return Err(format!("the trial of slot {} already rebooted", trial.slot));
    }
    let target = trial.slot;
    if trial.prepared_unix.is_none() {
        return Err(format!(
            "slot {target} was written but its boot files were never copied (RAUC's post-install handler did not run or failed); install the bundle again"
        ));
    }
    if let Some(why) = slot::missing_boot_files(board, target)? {
        return Err(format!(
            "slot {target} cannot be booted: {why}; install the bundle again"
        ));
    }
    trial.rebooted_unix = Some(now(board));
    // Written again: an overclock result promoted since the arming belongs in it too.
    bootfiles::write_tryboot(
        board,
        &[(slot::FRAGMENT_NAME, Some(target.fragment_text()))],
    )?;
    store::save(board, config, &record)?;
    board.reboot(true).map_err(|e| e.to_string())?;
    Ok(format!("rebooting into slot {target} once (tryboot)"))
}

/// The trial boot passed its check: `config.txt` now boots this slot.
pub fn commit(board: &Board, config: &Config, healthy: &str) -> Result<String, String> {
    let (booted, _) = slots(board)?;
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    match &record.trial {
        Some(t) if t.slot == booted => {}
        _ => return Err(format!("slot {booted} is not on trial; nothing to commit")),
    }
    // The commit point: config.txt replaced whole.
    bootfiles::promote(board, slot::FRAGMENT_NAME, Some(booted.fragment_text()))?;
    bootfiles::neutralize_tryboot(board)?;
    record.end_trial(UpdateResult::Committed, healthy.to_string(), now(board));
    store::save(board, config, &record)?;
    Ok(format!("slot {booted} committed: {healthy}"))
}

/// The trial boot failed its check: recorded, then a normal reboot, on which the firmware boots
/// `config.txt`, the old slot.
pub fn roll_back(board: &Board, config: &Config, reason: &str) -> Result<String, String> {
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    let Some(trial) = record.trial.clone() else {
        return Err("no update is on trial".into());
    };
    record.end_trial(UpdateResult::RolledBack, reason.to_string(), now(board));
    store::save(board, config, &record)?;
    bootfiles::neutralize_tryboot(board)?;
    board.reboot(false).map_err(|e| e.to_string())?;
    Ok(format!(
        "slot {} failed its health check ({reason}); rebooting onto slot {}",
        trial.slot, trial.from
    ))
}

/// Calls off an armed trial before its reboot.
pub fn cancel(board: &Board, config: &Config, reason: &str) -> Result<(), String> {
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    if record
        .trial
        .as_ref()
        .is_some_and(|t| t.rebooted_unix.is_none())
    {
        record.end_trial(UpdateResult::Cancelled, reason.to_string(), now(board));
        store::save(board, config, &record)?;
        board
            .remove_file(paths::REBOOT_PARAM)
            .map_err(|e| e.to_string())?;
        bootfiles::neutralize_tryboot(board)?;
    }
    Ok(())
}

/// Marks a slot bad (`bad`) or good again.
pub fn mark(board: &Board, config: &Config, target: Slot, bad: bool) -> Result<(), String> {
    let _lock = store::lock(board, config)?;
    let mut record = store::load(board, config)?;
    record.slot_mut(target).bad = bad;
    store::save(board, config, &record)
}

/// The `update` section of `status --json`.
#[derive(Debug, Clone, Serialize)]
pub struct UpdateStatus {
    /// The slot running now.
    pub booted: Option<Slot>,
    /// The slot `config.txt` boots.
    pub committed: Option<Slot>,
    /// Both slots: version and health as recorded.
    pub slots: Vec<SlotStatus>,
    /// The update under way.
    pub trial: Option<Trial>,
    /// How the last update ended.
    pub last: Option<Ended>,
    /// Why something could not be read.
    pub error: Option<String>,
}

/// One slot in [`UpdateStatus`].
#[derive(Debug, Clone, Serialize)]
pub struct SlotStatus {
    /// A or B.
    pub slot: Slot,
    /// The system version it holds, if known.
    pub system_version: Option<String>,
    /// `good` or `bad`.
    pub state: &'static str,
    /// Whether it runs now.
    pub booted: bool,
}

/// Where updates stand, for `status` and `update status`.
pub fn status(board: &Board, config: &Config) -> UpdateStatus {
    let booted = slot::booted(board).ok().flatten();
    let (committed, mut error) = match committed(board) {
        Ok(c) => (c, None),
        Err(e) => (None, Some(e)),
    };
    let record = store::load(board, config).unwrap_or_else(|e| {
        error = Some(e);
        Record::default()
    });
    let slots = Slot::ALL
        .into_iter()
        .map(|s| {
            let r = record.slot(s);
            let system_version = if Some(s) == booted {
                slot::running_version(board).or(r.system_version)
            } else {
                r.system_version
            };
            SlotStatus {
                slot: s,
                system_version,
                state: if r.bad { "bad" } else { "good" },
                booted: Some(s) == booted,
            }
        })
        .collect();
    UpdateStatus {
        booted,
        committed,
        slots,
        trial: record.trial,
        last: record.last,
        error,
    }
}

/// Minutes after local midnight now, in the box's time zone (`/etc/localtime`; UTC when it
/// cannot be read).
fn local_minute(board: &Board) -> u16 {
    let now = i64::try_from(board.now_unix()).unwrap_or(0);
    let zone = board
        .read_bytes("/etc/localtime")
        .ok()
        .and_then(|bytes| jiff::tz::TimeZone::tzif("localtime", &bytes).ok())
        .unwrap_or(jiff::tz::TimeZone::UTC);
    jiff::Timestamp::from_second(now)
        .map(|t| {
            let local = zone.to_datetime(t);
            u16::try_from(local.hour()).unwrap_or(0) * 60
                + u16::try_from(local.minute()).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// The daemon's periodic look at an installed update: reboots into it once it is complete and
/// the reboot window (if any) is open. `Ok(None)`: nothing to do now.
pub fn reboot_when_due(board: &Board, config: &Config) -> Result<Option<String>, String> {
    let Some(trial) = pending(board, config)? else {
        return Ok(None);
    };
    if trial.prepared_unix.is_none() || trial.rebooted_unix.is_some() {
        return Ok(None);
    }
    if let Some(window) = config.update.window
        && !window.contains(local_minute(board))
    {
        return Ok(None);
    }
    reboot_into_trial(board, config).map(Some)
}
