//! What `status` and `apply` print: the stable JSON document and the human table.
//!
//! JSON (`status --json`), schema version 1:
//! `{ "schema_version": 1, "root": str, "simulated": bool, "board": Facts, "model": ModelStatus,
//! "steps": [StepReport], "engine": EngineStatus, "overclock": OverclockStatus,
//! "update": UpdateStatus, "provision": Record, "clock": ClockStatus }` (`UpdateStatus` is
//! [`crate::update::UpdateStatus`]; `update.slots[]` is `{ slot, system_version, state, booted }`) (`Record` is [`crate::provision::Record`],
//! `ClockStatus` is [`crate::clock::ClockStatus`]).
//! where `StepReport` is `{ name, desired, effective, state, reason }` and `state` is one of
//! `in-place`, `applied`, `pending-reboot`, `not-applicable`, `failed`, `needs-apply`.
//! `Facts` is documented field by field on [`crate::board::facts::Facts`]. Keys are only ever added.

use std::fmt::Write;

use serde::Serialize;

use crate::board::Board;
use crate::board::facts::Facts;
use crate::engine::EngineStatus;
use crate::model::ModelStatus;
use crate::tune::StepReport;

/// Version of the JSON layout; bumped only if a key changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = 1;

/// The `status --json` document.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Layout version.
    pub schema_version: u32,
    /// The board root.
    pub root: String,
    /// Whether the board is simulated.
    pub simulated: bool,
    /// Facts about the board.
    pub board: Facts,
    /// The model the engine runs, as the launch gate sees it.
    pub model: crate::model::ModelStatus,
    /// Every tuning step.
    pub steps: Vec<StepReport>,
    /// The engine, as the running daemon last published it.
    pub engine: crate::engine::EngineStatus,
    /// The overclock ladder: phase, every trial with its checks, the clock kept.
    pub overclock: crate::overclock::OverclockStatus,
    /// A/B updates: both slots, which runs, the update under way, the last outcome.
    pub update: crate::update::UpdateStatus,
    /// Fleet provisioning: what was applied and when, the device key, why a file was refused.
    pub provision: crate::provision::Record,
    /// The clock: the time, whether network time synchronised it, the RTC, the floor.
    pub clock: crate::clock::ClockStatus,
}

/// Updates in words: each slot, then the update under way and the last one.
pub fn update_text(s: &crate::update::UpdateStatus) -> String {
    let mut out = String::new();
    if let Some(e) = &s.error {
        let _ = writeln!(out, "update: {e}");
    }
    for slot in &s.slots {
        let _ = writeln!(
            out,
            "slot {}: {:14} {:4}{}{}",
            slot.slot,
            slot.system_version.as_deref().unwrap_or("(unknown)"),
            slot.state,
            if slot.booted { "  running" } else { "" },
            if s.committed == Some(slot.slot) {
                "  committed"
            } else {
                ""
            },
        );
    }
    if let Some(t) = &s.trial {
        let stage = match (t.prepared_unix, t.rebooted_unix, t.checking_since_unix) {
            (_, _, Some(_)) => "being checked in its trial boot",
            (_, Some(_), None) => "rebooting into it",
            (Some(_), None, None) => "installed, waiting for the reboot",
            (None, None, None) => "being written",
        };
        let _ = writeln!(
            out,
            "update: version {} in slot {}: {stage}",
            t.system_version.as_deref().unwrap_or("?"),
            t.slot
        );
    }
    if let Some(last) = &s.last {
        let _ = writeln!(
            out,
            "last update: version {} to slot {}: {} ({})",
            last.system_version.as_deref().unwrap_or("?"),
            last.slot,
            match last.result {
                crate::update::UpdateResult::Committed => "committed",
                crate::update::UpdateResult::RolledBack => "rolled back",
                crate::update::UpdateResult::Cancelled => "cancelled",
            },
            last.reason
        );
    }
    out
}

/// The overclock ladder in words: where it stands, then one line per trial.
pub fn overclock_text(s: &crate::overclock::OverclockStatus) -> String {
    let mut out = String::new();
    let r = &s.record;
    if let Some(e) = &s.error {
        let _ = writeln!(out, "overclock: unreadable record: {e}");
        return out;
    }
    let phase = word(r.phase);
    let _ = writeln!(
        out,
        "overclock: {phase}{} (run {}): {}",
        if s.enabled {
            ""
        } else {
            ", disabled in config"
        },
        r.run,
        r.message
    );
    let kept = r
        .result
        .map_or_else(|| "stock".to_string(), |c| c.to_string());
    let _ = writeln!(out, "kept: {kept}");
    for t in &r.trials {
        let status = word(t.status);
        let _ = writeln!(
            out,
            "  run {} {:>16}  {status:8}  {}",
            t.run,
            t.candidate.to_string(),
            t.reason
        );
    }
    out
}

/// The status document from what the caller knows about model, steps and engine, with the
/// board's facts read now. `status --json` and the dashboard's `/api/status` both come from here,
/// so they are the same document.
pub fn collect(
    board: &Board,
    config: &crate::config::Config,
    model: ModelStatus,
    steps: Vec<StepReport>,
    engine: EngineStatus,
) -> Status {
    Status {
        schema_version: SCHEMA_VERSION,
        root: board.root().display().to_string(),
        simulated: board.is_simulated(),
        board: board.facts(),
        model,
        steps,
        engine,
        overclock: crate::overclock::status(board, config),
        update: crate::update::status(board, config),
        provision: provision_record(board),
        clock: crate::clock::status(board),
    }
}

/// The provisioning record; an unreadable one is reported as such rather than hidden.
fn provision_record(board: &Board) -> crate::provision::Record {
    match crate::provision::read_record(board) {
        Ok(Some(record)) => record,
        Ok(None) => crate::provision::Record {
            state: "unprovisioned".into(),
            ..Default::default()
        },
        Err(e) => crate::provision::Record {
            state: "unknown".into(),
            last_error: Some(e),
            ..Default::default()
        },
    }
}

/// The provisioning record in words: one line, and the refusal when there was one.
pub fn provision_text(r: &crate::provision::Record) -> String {
    let mut out = String::new();
    match (&r.fleet, &r.name) {
        (Some(fleet), name) => {
            let _ = writeln!(
                out,
                "provisioning: box {} of fleet {fleet}, generation {}, applied {}; host name {}; device key {}",
                name.as_deref().unwrap_or("(unnamed)"),
                r.generation,
                r.applied_unix
                    .map_or_else(|| "at an unknown time".into(), civil_date),
                r.hostname.as_deref().unwrap_or("unchanged"),
                r.device_public_key.as_deref().unwrap_or("none"),
            );
        }
        (None, _) => {
            let _ = writeln!(
                out,
                "provisioning: {}",
                if r.state.is_empty() {
                    "unprovisioned"
                } else {
                    &r.state
                }
            );
        }
    }
    if let Some(e) = &r.last_error {
        let _ = writeln!(out, "provisioning file refused: {e}");
    }
    out
}

/// The word a state enum is written as in the JSON (`in-place`, `ready`, `climbing`, ...).
pub fn word(value: impl Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The steps as an aligned table, one line each plus an indented reason.
pub fn steps_table(steps: &[StepReport]) -> String {
    let mut out = String::new();
    let width = steps.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in steps {
        let state = word(s.state);
        let _ = writeln!(
            out,
            "{:width$}  {:14}  desired: {}  effective: {}",
            s.name, state, s.desired, s.effective
        );
        if !s.reason.is_empty() {
            let _ = writeln!(out, "{:width$}  {}", "", s.reason);
        }
    }
    out
}

/// The board facts in words.
pub fn facts_text(f: &Facts, simulated: bool) -> String {
    let unknown = || "unknown".to_string();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "board: {}{}",
        f.model.clone().unwrap_or_else(unknown),
        if simulated { " (simulated)" } else { "" }
    );
    let temperature = f
        .temperature_c
        .map(|t| format!("{t:.1} °C"))
        .unwrap_or_else(unknown);
    let throttle = match &f.throttle {
        Some(t) => format!(
            "now: {}; since boot: {} ({})",
            words_or_none(&t.now),
            words_or_none(&t.since_boot),
            t.raw
        ),
        None => unknown(),
    };
    let _ = writeln!(out, "temperature: {temperature}; throttling {throttle}");
    let mhz = |m: Option<u64>| m.map(|m| format!("{m} MHz")).unwrap_or_else(unknown);
    let _ = writeln!(
        out,
        "clock: {} (max {}); governor: {}",
        mhz(f.cpu_mhz),
        mhz(f.cpu_max_mhz),
        if f.governors.is_empty() {
            unknown()
        } else {
            f.governors.join(", ")
        }
    );
    let mib = |m: Option<u64>| m.map(|m| format!("{m} MiB")).unwrap_or_else(unknown);
    let swap = match &f.swap {
        None => unknown(),
        Some(areas) if areas.is_empty() => "off".to_string(),
        Some(areas) => areas
            .iter()
            .map(|s| format!("{} {} MiB", s.device, s.size_kib / 1024))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let _ = writeln!(
        out,
        "memory: {} total, {} available; swap: {swap}; NUMA nodes: {}",
        mib(f.memory_total_mib),
        mib(f.memory_available_mib),
        f.numa_nodes.map(|n| n.to_string()).unwrap_or_else(unknown)
    );
    if let Some(b) = &f.boot {
        let mode = boot_mode_word(b.boot_mode);
        let _ = writeln!(
            out,
            "boot: {mode}, partition {}, tryboot {}, bootloader built {}",
            b.partition,
            if b.tryboot { "yes" } else { "no" },
            civil_date(u64::from(b.bootloader_build_timestamp))
        );
    }
    out
}

/// The boot device a bootloader boot mode (a `BOOT_ORDER` code) names: `SD`, `USB`, ...
pub fn boot_mode_word(mode: u32) -> String {
    match mode {
        1 => "SD".to_string(),
        4 => "USB".to_string(),
        6 => "NVMe".to_string(),
        2 => "network".to_string(),
        n => format!("mode {n}"),
    }
}

fn words_or_none(words: &[&str]) -> String {
    if words.is_empty() {
        "none".into()
    } else {
        words.join(", ")
    }
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time.
pub fn civil_time(unix: u64) -> String {
    format!(
        "{} {:02}:{:02} UTC",
        civil_date(unix),
        unix / 3600 % 24,
        unix / 60 % 60
    )
}

/// The clock in words: the time, whether network time synchronised it, the RTC.
pub fn clock_text(c: &crate::clock::ClockStatus) -> String {
    format!(
        "clock: {}, {}; RTC {}\n",
        civil_time(c.now_unix),
        if c.synchronized {
            "synchronised with network time"
        } else {
            "NOT synchronised with network time in this boot (check the NTP servers)"
        },
        c.rtc_unix.map_or_else(
            || "absent".to_string(),
            |t| format!("reads {}", civil_time(t))
        )
    )
}

/// `YYYY-MM-DD` (UTC) of a Unix time.
pub fn civil_date(unix: u64) -> String {
    // Howard Hinnant's days-to-civil algorithm.
    let days = (unix / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::{civil_date, civil_time};

    #[test]
    fn dates_are_utc_calendar_days() {
        assert_eq!(
            civil_time(1_746_662_400 + 3600 + 120),
            "2025-05-08 01:02 UTC"
        );
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(1_746_662_400), "2025-05-08");
        assert_eq!(civil_date(951_782_400), "2000-02-29");
    }
}
