//! The bootloader EEPROM kept at least as new as the newest image the running system ships:
//! A/B updates depend on tryboot, which old bootloaders do not honour, and a new slot may ship a
//! newer image. An older bootloader gets the newest image staged with its own configuration
//! unchanged (`pieeprom.upd`, flashed by the bootloader at the next boot), as the interleave
//! step stages its change; a bootloader that is current is never rewritten.

use super::{Edit, Plan, Step, Verdict};
use crate::board::{Board, BoardError, paths};
use crate::bootloader::conf;

/// Stages the newest shipped bootloader image when the running one is older.
pub struct CurrentStep;

/// What the step reads.
pub struct Observed {
    /// The running bootloader's build day (days since 1970), `None` without a Pi bootloader.
    running_day: Option<i64>,
    /// The newest shipped image's day.
    shipped_day: Option<i64>,
    /// The running bootloader's configuration.
    current: String,
    /// Whether an update is already staged.
    staged: bool,
}

fn day(unix: u32) -> i64 {
    i64::from(unix) / 86_400
}

fn date(day: i64) -> String {
    crate::clock::civil_date(u64::try_from(day).unwrap_or(0) * 86_400)
}

impl Step for CurrentStep {
    type Observed = Observed;

    fn name(&self) -> &'static str {
        "bootloader.current"
    }

    fn observe(&self, board: &Board) -> Result<Observed, BoardError> {
        let built = board.dt_u32(&format!("{}/build-timestamp", paths::DT_BOOTLOADER));
        let Ok(built) = built else {
            return Ok(Observed {
                running_day: None,
                shipped_day: None,
                current: String::new(),
                staged: false,
            });
        };
        let shipped_day = board.shipped_bootloader_image().ok().map(|(_, day)| day);
        let older = shipped_day.is_some_and(|s| s > day(built));
        Ok(Observed {
            running_day: Some(day(built)),
            shipped_day,
            // Only read when it is needed to stage.
            current: if older {
                board.bootloader_config()?
            } else {
                String::new()
            },
            staged: board.staged_bootloader_config()?.is_some(),
        })
    }

    fn plan(&self, o: &Observed) -> Plan {
        let Some(running) = o.running_day else {
            return Plan {
                desired: "at least the newest shipped image".into(),
                effective: "no Raspberry Pi bootloader".into(),
                verdict: Verdict::NotApplicable(
                    "the device tree has no bootloader build time (not a Pi 5)".into(),
                ),
            };
        };
        let effective = format!("built {}", date(running));
        let Some(shipped) = o.shipped_day else {
            return Plan {
                desired: "at least the newest shipped image".into(),
                effective,
                verdict: Verdict::NotApplicable(
                    "this system ships no bootloader image (pieeprom-YYYY-MM-DD.bin)".into(),
                ),
            };
        };
        let desired = format!("built {} or later", date(shipped));
        let verdict = if running >= shipped {
            Verdict::InPlace
        } else if o.staged {
            Verdict::PendingReboot(
                "an update is staged in pieeprom.upd; the bootloader flashes it at the next boot"
                    .into(),
            )
        } else if conf::get(&o.current, "FREEZE_VERSION") == Some("1") {
            Verdict::NotApplicable(
                "the bootloader config has FREEZE_VERSION=1: the operator keeps this version"
                    .into(),
            )
        } else {
            Verdict::Change(vec![Edit::StageBootloaderConfig {
                config: o.current.clone(),
            }])
        };
        Plan {
            desired,
            effective,
            verdict,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(
        running: Option<i64>,
        shipped: Option<i64>,
        staged: bool,
        config: &str,
    ) -> Observed {
        Observed {
            running_day: running,
            shipped_day: shipped,
            current: config.into(),
            staged,
        }
    }

    #[test]
    fn an_older_bootloader_gets_the_newest_image_with_its_own_config() {
        let config = "[all]\nBOOT_ORDER=0xf461\n";
        let plan = CurrentStep.plan(&observed(Some(19_900), Some(20_200), false, config));
        assert_eq!(
            plan.verdict,
            Verdict::Change(vec![Edit::StageBootloaderConfig {
                config: config.into()
            }])
        );
        assert_eq!(plan.desired, format!("built {} or later", date(20_200)));
    }

    #[test]
    fn a_current_staged_frozen_or_absent_bootloader_is_left_alone() {
        let current = CurrentStep.plan(&observed(Some(20_200), Some(20_200), false, ""));
        assert_eq!(current.verdict, Verdict::InPlace);
        let staged = CurrentStep.plan(&observed(Some(19_000), Some(20_200), true, ""));
        assert!(matches!(staged.verdict, Verdict::PendingReboot(_)));
        let frozen = CurrentStep.plan(&observed(
            Some(19_000),
            Some(20_200),
            false,
            "FREEZE_VERSION=1\n",
        ));
        assert!(matches!(frozen.verdict, Verdict::NotApplicable(_)));
        let none = CurrentStep.plan(&observed(None, None, false, ""));
        assert!(matches!(none.verdict, Verdict::NotApplicable(_)));
        let unshipped = CurrentStep.plan(&observed(Some(19_000), None, false, ""));
        assert!(matches!(unshipped.verdict, Verdict::NotApplicable(_)));
    }
}
