//! Safe overclock trials: the ladder of candidate clocks, each tried once through the
//! firmware's tryboot under the hardware watchdog, kept only if a verified compute load, the
//! temperature, the throttle bits and the engine's output all pass.
//!
//! The record on the data partition ([`store`]) is written before every step that could end
//! the boot, so at each boot [`on_boot`] knows what was happening: a trial still `running` in a
//! tryboot boot is checked now; one still `running` in a normal boot hung or reset (the firmware
//! fell back to `config.txt`) and fails for good. `config.txt` only ever changes by atomic
//! replacement with the assembly of `config.txt.d/` ([`bootfiles`]), and every boot converges
//! the boot files on what the record says, so a power cut between any two writes leaves a
//! known-good, complete config and a record that says what happened.

mod bootfiles;
mod check;
pub use crate::config::overclock as config;
mod load;
mod record;
mod store;

use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::board::{Board, paths};
use crate::config::Config;
pub use check::CheckReport;
use config::STOCK_ARM_FREQ;
pub use record::{Phase, Record, Trial, TrialStatus};

/// What a call left the board doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The boot goes on; the message says where the ladder stands.
    Continue(String),
    /// A reboot is under way; nothing more of consequence should run.
    Rebooting(String),
    /// The ladder stopped on a problem with the board (recorded, stock clocks kept).
    Stopped(String),
}

/// The `overclock` section of `status --json`.
#[derive(Debug, Clone, Serialize)]
pub struct OverclockStatus {
    /// Whether `[overclock] enabled` allows starting a ladder.
    pub enabled: bool,
    /// Why the record could not be read, if it could not.
    pub error: Option<String>,
    /// The record (a fresh one when no ladder was ever started).
    #[serde(flatten)]
    pub record: Record,
}

/// The ladder's state for `status`.
pub fn status(board: &Board, config: &Config) -> OverclockStatus {
    let (record, error) = match store::load(board, config) {
        Ok(record) => (record.unwrap_or_default(), None),
        Err(e) => (Record::default(), Some(e)),
    };
    OverclockStatus {
        enabled: config.overclock.enabled,
        error,
        record,
    }
}

/// Set when the daemon is asked to stop: a running check ends within a sample and records
/// nothing (the next boot then sees the trial interrupted).
static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// Asks a running check to stop because the system is going down.
pub fn request_shutdown() {
    SHUTDOWN.store(true, Ordering::Relaxed);
}

fn shutting_down() -> bool {
    SHUTDOWN.load(Ordering::Relaxed)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn watchdog_armed(board: &Board) -> Result<(), String> {
    match board.watchdog() {
        Ok((true, timeout)) => {
            tracing::info!("hardware watchdog armed, {timeout} s timeout");
            Ok(())
        }
        Ok((false, _)) => Err(
            "the hardware watchdog is not armed (nothing holds /dev/watchdog open): set RuntimeWatchdogSec in systemd's system.conf"
                .into(),
        ),
        Err(e) => Err(format!("cannot tell whether the hardware watchdog is armed: {e}")),
    }
}

/// The record's lock, released around stability checks (which take minutes) so an abort is
/// never kept waiting.
struct Guard<'a> {
    board: &'a Board,
    config: &'a Config,
    held: Option<nix::fcntl::Flock<std::fs::File>>,
}

impl<'a> Guard<'a> {
    fn take(board: &'a Board, config: &'a Config) -> Result<Guard<'a>, String> {
        Ok(Guard {
            board,
            config,
            held: Some(store::lock(board, config)?),
        })
    }

    /// Runs `f` without the lock, then takes it again and returns the record as it is now.
    fn unlocked<T>(&mut self, f: impl FnOnce() -> T) -> Result<(T, Option<Record>), String> {
        self.held = None;
        let value = f();
        self.held = Some(store::lock(self.board, self.config)?);
        Ok((value, store::load(self.board, self.config)?))
    }
}

/// `supervisor overclock start`: opens a new run. The reference is taken at stock clock, so a
/// box running an earlier result reboots to stock first; the first trial follows.
pub fn start(board: &Board, config: &Config) -> Result<Outcome, String> {
    let oc = &config.overclock;
    if !oc.enabled {
        return Err(
            "overclocking is off: set `enabled = true` under [overclock] in /etc/appliance/appliance.toml (or the boot partition's appliance.toml) first"
                .into(),
        );
    }
    if let Some(trial) = crate::update::pending(board, config)? {
        return Err(format!(
            "an update to slot {} is pending; overclocking waits until it is committed or rolled back (`supervisor update cancel` calls off one not yet rebooted into)",
            trial.slot
        ));
    }
    let mut guard = Guard::take(board, config)?;
    let mut record = store::load(board, config)?.unwrap_or_default();
    if record.phase == Phase::Climbing {
        return Err(format!(
            "a ladder is already being climbed ({}); `supervisor overclock abort` stops it",
            record.message
        ));
    }
    match board.boot_info() {
        Ok(b) if b.tryboot => {
            return Err("this is a tryboot boot; start after a normal reboot".into());
        }
        Ok(_) => {}
        Err(e) => {
            return Err(format!(
                "cannot tell how this boot started, so a trial's boot could not be recognised: {e}"
            ));
        }
    }
    if let Some((name, value)) = bootfiles::foreign_arm_freq(board)? {
        return Err(format!(
            "config.txt.d/{name} sets arm_freq={value}; remove it so the ladder can find the clock"
        ));
    }
    watchdog_armed(board)?;
    board
        .temperature_c()
        .map_err(|e| format!("a trial must watch the temperature, which cannot be read: {e}"))?;
    board.throttle_bits().map_err(|e| {
        format!("a trial must watch the firmware's throttle bits, which cannot be read: {e}")
    })?;
    if oc.engine_check {
        crate::model::check(board, config, crate::model::reverify(config)).map_err(|e| {
            format!(
                "the engine check needs the verified model {}: {e} (or set engine_check = false under [overclock])",
                config.model.id
            )
        })?;
    }
    record.run += 1;
    record.phase = Phase::Climbing;
    record.reference = None;
    record.result = None;
    record.stock_reboot_tried = false;
    record.message = format!("run {} started", record.run);
    store::save(board, config, &record)?;
    let changed = bootfiles::promote(board, None)?;
    bootfiles::neutralize_tryboot(board)?;
    climb(&mut guard, record, changed)
}

/// `supervisor overclock abort`: stops the ladder (a running trial is marked aborted) and
/// returns `config.txt` to stock clocks, which take effect at the next boot.
pub fn abort(board: &Board, config: &Config) -> Result<String, String> {
    let _guard = Guard::take(board, config)?;
    let Some(mut record) = store::load(board, config)? else {
        return Err("no overclock ladder was ever started; nothing to abort".into());
    };
    if record.phase == Phase::Idle || record.phase == Phase::Aborted {
        return Err(format!("nothing to abort: {}", record.message));
    }
    if let Some(trial) = record.running_mut() {
        trial.status = TrialStatus::Aborted;
        trial.reason = "stopped by overclock abort".into();
        trial.ended_unix = Some(now_unix());
    }
    record.phase = Phase::Aborted;
    record.result = None;
    record.message = "aborted: stock clocks from the next boot".into();
    store::save(board, config, &record)?;
    // A tryboot reboot already asked for must not happen any more.
    board
        .remove_file(paths::REBOOT_PARAM)
        .map_err(|e| e.to_string())?;
    bootfiles::promote(board, None)?;
    bootfiles::neutralize_tryboot(board)?;
    Ok(record.message)
}

/// What the daemon does first at every boot: finish or fail the trial this boot was for,
/// converge the boot files on the record, and go on climbing. A tryboot boot that is not
/// checked to the end is always left by a reboot onto `config.txt`, even when this fails.
pub fn on_boot(board: &Board, config: &Config) -> Result<Outcome, String> {
    // An unreadable flag is treated as a tryboot boot: the safe side is config.txt.
    let tryboot = board.boot_info().map_or(true, |b| b.tryboot);
    match boot(board, config, tryboot) {
        Err(e) if tryboot && !shutting_down() => {
            tracing::error!("overclock: {e}; leaving this tryboot boot");
            board
                .reboot(false)
                .map_err(|r| format!("{e}; and the reboot failed: {r}"))?;
            Ok(Outcome::Rebooting(format!(
                "{e}; rebooting onto config.txt"
            )))
        }
        other => other,
    }
}

fn boot(board: &Board, config: &Config, tryboot: bool) -> Result<Outcome, String> {
    let mut guard = Guard::take(board, config)?;
    let Some(mut record) = store::load(board, config)? else {
        return Ok(Outcome::Continue(
            "no overclock ladder was ever started".into(),
        ));
    };
    let margin = config.overclock.margin_mhz.get();
    let flag_known = board.boot_info().is_ok();
    if let Some(trial) = record.running_mut() {
        let candidate = trial.candidate;
        let interrupted = trial.checking_since_unix.is_some();
        if tryboot && flag_known && !interrupted {
            trial.checking_since_unix = Some(now_unix());
            record.message = format!("checking {candidate} in its tryboot boot");
            store::save(board, config, &record)?;
            return check_trial(&mut guard, record);
        }
        let reason = match (flag_known, tryboot, interrupted) {
            (false, _, _) => {
                "the boot's tryboot flag cannot be read, so the trial cannot be told apart from a fallback"
            }
            (true, true, _) => {
                "the supervisor restarted during the check (it crashed or was killed)"
            }
            (true, false, true) => {
                "the board reset during the check (a hang, crash or power loss); the firmware fell back to config.txt"
            }
            (true, false, false) => {
                "the board came back on config.txt before the check began: it hung or reset booting the candidate, or lost power"
            }
        };
        fail(trial, reason);
        record.finish(margin);
        record.message = format!("{candidate} failed: {reason}; {}", record.message);
        store::save(board, config, &record)?;
        return settle(board, &record, tryboot);
    }
    let changed = bootfiles::promote(board, record.promoted())?;
    bootfiles::neutralize_tryboot(board)?;
    match record.phase {
        Phase::Climbing => climb(&mut guard, record, tryboot || changed),
        Phase::Done => settle(board, &record, tryboot || changed),
        Phase::Idle | Phase::Aborted => settle(board, &record, tryboot),
    }
}

fn fail(trial: &mut Trial, reason: &str) {
    trial.status = TrialStatus::Failed;
    trial.reason = reason.to_string();
    trial.ended_unix = Some(now_unix());
}

/// Converges the boot files on a finished (or aborted) record and reboots when the running
/// clock may not be the one kept.
fn settle(board: &Board, record: &Record, stale_boot: bool) -> Result<Outcome, String> {
    let changed = bootfiles::promote(board, record.promoted())?;
    bootfiles::neutralize_tryboot(board)?;
    if stale_boot || changed {
        let message = format!("{}; rebooting into it", record.message);
        tracing::warn!("overclock: {message}");
        board.reboot(false).map_err(|e| e.to_string())?;
        return Ok(Outcome::Rebooting(message));
    }
    Ok(Outcome::Continue(record.message.clone()))
}

/// Whether a check should stop: the system is going down, or the ladder is no longer climbing.
fn should_stop(board: &Board, config: &Config) -> bool {
    shutting_down()
        || store::load(board, config).is_ok_and(|r| r.is_none_or(|r| r.phase != Phase::Climbing))
}

/// The checks of the trial this tryboot boot is for, then the verdict.
fn check_trial(guard: &mut Guard, record: Record) -> Result<Outcome, String> {
    let (board, config) = (guard.board, guard.config);
    let reference = record
        .reference
        .as_ref()
        .and_then(|r| r.engine_sha256.clone());
    let armed = watchdog_armed(board);
    let (report, now) = guard.unlocked(|| {
        armed.as_ref().ok().map(|()| {
            check::run(board, config, reference.as_deref(), &|| {
                should_stop(board, config)
            })
        })
    })?;
    if shutting_down() {
        return Ok(Outcome::Continue(
            "shutting down during the check; the next boot records the trial as interrupted".into(),
        ));
    }
    // `overclock abort` may have changed the record meanwhile; it wins.
    let mut record = now.unwrap_or(record);
    let Some(trial) = record.running_mut() else {
        return settle(board, &record, true);
    };
    let candidate = trial.candidate;
    trial.ended_unix = Some(now_unix());
    let Some(mut report) = report else {
        let e = armed
            .err()
            .unwrap_or_else(|| "the check did not run".into());
        {
            trial.status = TrialStatus::Aborted;
            trial.reason = format!("not run: {e}");
            record.finish(config.overclock.margin_mhz.get());
            record.message = format!(
                "stopped before checking {candidate}: {e}; {}",
                record.message
            );
            tracing::error!("overclock: {}", record.message);
            store::save(board, config, &record)?;
            return settle(board, &record, true);
        }
    };
    // A pass means nothing unless the board really ran the candidate's clock.
    if report.passed && report.clock_mhz != Some(u64::from(candidate.arm_freq)) {
        report.passed = false;
        report.reason = format!(
            "the board ran at {} MHz, not the candidate's {} (the firmware clamped it or another setting overrode it)",
            report
                .clock_mhz
                .map_or("an unknown".into(), |m| m.to_string()),
            candidate.arm_freq
        );
    }
    let (passed, inconclusive) = (report.passed, report.inconclusive);
    trial.reason = report.reason.clone();
    trial.checks = Some(report);
    if passed {
        trial.status = TrialStatus::Passed;
        record.message = format!("{candidate} passed; promoted into config.txt");
        tracing::info!("overclock: {}", record.message);
        store::save(board, config, &record)?;
        bootfiles::promote(board, record.promoted())?;
        bootfiles::neutralize_tryboot(board)?;
        return climb(guard, record, true);
    }
    // A check that could not judge the clock rules nothing out; it ends the run all the same.
    trial.status = if inconclusive {
        TrialStatus::Aborted
    } else {
        TrialStatus::Failed
    };
    let reason = trial.reason.clone();
    record.finish(config.overclock.margin_mhz.get());
    record.message = format!(
        "{candidate} {}: {reason}; {}",
        if inconclusive { "not judged" } else { "failed" },
        record.message
    );
    tracing::warn!("overclock: {}", record.message);
    store::save(board, config, &record)?;
    settle(board, &record, true)
}

/// Takes the stock reference if the run has none, then arms the next trial or finishes.
/// `stale_boot`: the running clock may not be what `config.txt` now says.
fn climb(guard: &mut Guard, mut record: Record, stale_boot: bool) -> Result<Outcome, String> {
    let (board, config) = (guard.board, guard.config);
    let oc = &config.overclock;
    if record.reference.is_none() {
        if let Some(reason) = not_at_stock(board, stale_boot)? {
            if record.stock_reboot_tried {
                record.phase = Phase::Aborted;
                record.message = format!(
                    "{reason} even after a reboot to stock clocks; the reference cannot be taken at stock"
                );
                store::save(board, config, &record)?;
                return Ok(Outcome::Stopped(record.message));
            }
            record.stock_reboot_tried = true;
            record.message = format!("{reason}: rebooting to stock clocks to take the reference");
            store::save(board, config, &record)?;
            board.reboot(false).map_err(|e| e.to_string())?;
            return Ok(Outcome::Rebooting(record.message));
        }
        tracing::info!(
            "overclock: taking the reference at stock clock ({} s of verified load)",
            oc.check_seconds.get()
        );
        let (report, now) =
            guard.unlocked(|| check::run(board, config, None, &|| should_stop(board, config)))?;
        let Some(mut now) = now else {
            return Err("the overclock record disappeared during the reference check".into());
        };
        if shutting_down() || now.phase != Phase::Climbing {
            return Ok(Outcome::Continue(now.message));
        }
        if !report.passed {
            now.phase = Phase::Aborted;
            now.message = format!(
                "the stability check fails at stock clock ({}); fix cooling or power before overclocking",
                report.reason
            );
            now.reference = Some(report);
            store::save(board, config, &now)?;
            return Ok(Outcome::Stopped(now.message));
        }
        now.reference = Some(report);
        record = now;
    }
    let Some(candidate) = record.next_candidate(&oc.steps) else {
        record.finish(oc.margin_mhz.get());
        tracing::info!("overclock: {}", record.message);
        store::save(board, config, &record)?;
        return settle(board, &record, stale_boot);
    };
    if let Err(e) = watchdog_armed(board) {
        record.finish(oc.margin_mhz.get());
        record.message = format!("stopped before trying {candidate}: {e}; {}", record.message);
        store::save(board, config, &record)?;
        return match settle(board, &record, stale_boot)? {
            Outcome::Continue(message) => Ok(Outcome::Stopped(message)),
            other => Ok(other),
        };
    }
    bootfiles::write_tryboot(board, candidate)?;
    record.trials.push(Trial {
        run: record.run,
        candidate,
        status: TrialStatus::Running,
        reason: "rebooting into it once with tryboot".into(),
        started_unix: now_unix(),
        checking_since_unix: None,
        ended_unix: None,
        checks: None,
    });
    record.message = format!("trying {candidate}: rebooting into it once with tryboot");
    tracing::info!("overclock: {}", record.message);
    store::save(board, config, &record)?;
    if let Err(e) = board.reboot(true) {
        // Nothing was tried: take the trial back rather than count it as a failure.
        record.trials.pop();
        record.finish(oc.margin_mhz.get());
        record.message = format!("could not reboot into {candidate}: {e}; {}", record.message);
        store::save(board, config, &record)?;
        bootfiles::neutralize_tryboot(board)?;
        return Err(record.message);
    }
    Ok(Outcome::Rebooting(record.message))
}

/// Why the running clock is not stock (`None` when it is). A `config.txt` that asks for more
/// than stock outside the ladder's fragment (in any section) is an error: rebooting would not
/// help.
fn not_at_stock(board: &Board, stale_boot: bool) -> Result<Option<String>, String> {
    let boot = board.boot_dir().map_err(|e| e.to_string())?;
    let config_txt = board
        .read(&format!("{boot}/config.txt"))
        .map_err(|e| e.to_string())?;
    for v in config_txt::values(&config_txt, "arm_freq") {
        if v.parse::<u32>().map_or(true, |mhz| mhz > STOCK_ARM_FREQ) {
            return Err(format!(
                "{boot}/config.txt sets arm_freq={v} outside the ladder's fragment; remove it from config.txt.d to let the ladder find the clock"
            ));
        }
    }
    if stale_boot {
        return Ok(Some("this boot's config.txt changed".into()));
    }
    Ok(board
        .facts()
        .cpu_max_mhz
        .filter(|mhz| *mhz > u64::from(STOCK_ARM_FREQ))
        .map(|mhz| format!("the board runs at {mhz} MHz")))
}
