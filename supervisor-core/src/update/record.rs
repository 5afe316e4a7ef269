//! The update record on the data partition: the trial under way, each slot's last known version
//! and health, and how the last update ended. Pure data and decisions; [`super::store`] reads
//! and writes it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::slot::Slot;

/// The record's layout version.
pub const VERSION: u32 = 1;

/// Everything the box remembers about updates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Layout version ([`VERSION`]).
    pub version: u32,
    /// An installed slot waiting for its trial boot, or being checked in it.
    pub trial: Option<Trial>,
    /// What each slot is known to hold.
    pub slots: BTreeMap<String, SlotRecord>,
    /// How the last update ended.
    pub last: Option<Ended>,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            version: VERSION,
            trial: None,
            slots: BTreeMap::new(),
            last: None,
        }
    }
}

/// What a slot holds, as far as the box knows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotRecord {
    /// The system version installed in it.
    pub system_version: Option<String>,
    /// Marked bad: a trial of it failed (or RAUC marked it while writing it).
    pub bad: bool,
}

/// An update between its install and its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trial {
    /// The slot the update was written to.
    pub slot: Slot,
    /// Its system version.
    pub system_version: Option<String>,
    /// The slot (and version) it replaces.
    pub from: Slot,
    /// The version it replaces.
    pub from_version: Option<String>,
    /// Tuning steps that already failed on the old slot when the update was armed: the new
    /// one must tune at least as well, not better than the board allows.
    #[serde(default)]
    pub failing_before: Vec<String>,
    /// When RAUC made it primary.
    pub armed_unix: u64,
    /// When its boot folder was complete and `tryboot.txt` pointed at it.
    pub prepared_unix: Option<u64>,
    /// When the tryboot reboot into it was asked for (`None`: waiting for the reboot window).
    pub rebooted_unix: Option<u64>,
    /// When its trial boot began the health check.
    pub checking_since_unix: Option<u64>,
    /// The kernel's boot id of that boot: a supervisor restarted in the same boot resumes the
    /// check (its time still counted from the first start), one in another boot does not.
    #[serde(default)]
    pub checking_boot_id: Option<String>,
}

/// How an update ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Result {
    /// The new slot passed its health check and the firmware now boots it.
    Committed,
    /// The new slot failed (or never came up) and the box is back on the old one.
    RolledBack,
    /// The update was called off before its trial boot.
    Cancelled,
}

/// The end of an update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ended {
    /// The slot the update was written to.
    pub slot: Slot,
    /// Its system version.
    pub system_version: Option<String>,
    /// The version the box ran before.
    pub from_version: Option<String>,
    /// How it ended.
    pub result: Result,
    /// Why, in words.
    pub reason: String,
    /// When.
    pub ended_unix: u64,
}

impl Record {
    /// The record of `slot`, created empty when absent.
    pub fn slot_mut(&mut self, slot: Slot) -> &mut SlotRecord {
        self.slots.entry(slot.bootname().to_string()).or_default()
    }

    /// The record of `slot`.
    pub fn slot(&self, slot: Slot) -> SlotRecord {
        self.slots.get(slot.bootname()).cloned().unwrap_or_default()
    }

    /// Ends the trial with `result`: recorded as the last update; a failed slot is marked bad.
    pub fn end_trial(&mut self, result: Result, reason: String, now: u64) {
        let Some(trial) = self.trial.take() else {
            return;
        };
        if result == Result::RolledBack {
            self.slot_mut(trial.slot).bad = true;
        }
        if result == Result::Committed {
            self.slot_mut(trial.slot).bad = false;
        }
        self.last = Some(Ended {
            slot: trial.slot,
            system_version: trial.system_version,
            from_version: trial.from_version,
            result,
            reason,
            ended_unix: now,
        });
    }
}

/// Orders two system versions: dot- or dash-separated parts, numeric parts by value, others as
/// text (`2026.12.2` < `2026.12.10`, `1.0` < `1.0.1`).
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| {
        v.split(['.', '-', '+'])
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let (a, b) = (parts(a), parts(b));
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (
            a.get(i).map_or("", String::as_str),
            b.get(i).map_or("", String::as_str),
        );
        let order = match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => x.cmp(y),
        };
        if order.is_ne() {
            return order;
        }
    }
    std::cmp::Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering::*;

    #[test]
    fn versions_compare_by_their_numbers() {
        assert_eq!(compare_versions("2026.12.2", "2026.12.10"), Less);
        assert_eq!(compare_versions("1.0", "1.0.1"), Less);
        assert_eq!(compare_versions("2", "1"), Greater);
        assert_eq!(compare_versions("3.1", "3.1"), Equal);
        assert_eq!(compare_versions("1.0-rc1", "1.0-rc2"), Less);
    }

    #[test]
    fn a_rollback_marks_the_slot_bad_and_a_commit_clears_it() {
        let mut record = Record {
            trial: Some(Trial {
                slot: Slot::B,
                system_version: Some("3".into()),
                from: Slot::A,
                from_version: Some("2".into()),
                failing_before: Vec::new(),
                armed_unix: 1,
                prepared_unix: Some(1),
                rebooted_unix: Some(2),
                checking_since_unix: None,
                checking_boot_id: None,
            }),
            ..Record::default()
        };
        record.end_trial(Result::RolledBack, "engine never healthy".into(), 9);
        assert!(record.slot(Slot::B).bad);
        assert_eq!(record.trial, None);
        let last = record.last.clone().expect("recorded");
        assert_eq!((last.result, last.slot), (Result::RolledBack, Slot::B));
        record.end_trial(Result::Committed, "again".into(), 10);
        // No trial: nothing changes.
        assert_eq!(record.last, Some(last));
    }
}
