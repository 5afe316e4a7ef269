//! The bootloader's SDRAM bank interleave (`SDRAM_BANKLOW`). A Pi 5 bootloader from 2024-12-07 on
//! defaults to 1, which pays off only when the kernel has NUMA emulation to match; a kernel
//! without it loses badly under 1 and wants 3 (platform notes, rpi-eeprom#733). A change is staged
//! like `rpi-eeprom-config --apply` and flashed by the bootloader at the next boot; a bootloader
//! that is already right is never rewritten.

use super::{Edit, Plan, Step, Verdict};
use crate::board::{Board, BoardError, paths};
use crate::bootloader::conf;
use crate::config::BankLow;

const KEY: &str = "SDRAM_BANKLOW";
/// 2024-09-23: first bootloader that reads SDRAM_BANKLOW.
const FIRST_WITH_BANKLOW: u32 = 1_727_049_600;
/// 2024-12-07: bootloader that enables banklow 1 (and so NUMA) by default.
const DEFAULT_BANKLOW_1_SINCE: u32 = 1_733_529_600;

/// Sets `SDRAM_BANKLOW` to suit the kernel.
pub struct BankLowStep {
    /// The configured policy.
    pub desired: BankLow,
}

/// Whether the running kernel has NUMA emulation, and how that was learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Numa {
    /// The kernel created this many nodes.
    Active(usize),
    /// The kernel's build config says.
    BuildConfig(bool),
    /// `numa=fake` is on the command line but the kernel made one node: it lacks emulation.
    Ignored,
    /// Nothing tells.
    Unknown,
}

/// What the interleave step reads.
pub struct Observed {
    numa: Numa,
    current: String,
    staged: Option<String>,
    bootloader_built: u32,
    /// Release day (days since the epoch) of the newest image that staging would use.
    shipped_day: Option<i64>,
}

impl Step for BankLowStep {
    type Observed = Observed;

    fn name(&self) -> &'static str {
        "bootloader.sdram_banklow"
    }

    fn observe(&self, board: &Board) -> Result<Observed, BoardError> {
        if self.desired == BankLow::Keep {
            // Nothing is read, so nothing unreadable can fail a step the operator turned off.
            return Ok(Observed {
                numa: Numa::Unknown,
                current: String::new(),
                staged: None,
                bootloader_built: 0,
                shipped_day: None,
            });
        }
        let nodes = board.numa_nodes()?;
        let numa = if nodes > 1 {
            Numa::Active(nodes)
        } else if let Some(built_in) = board.kernel_config_enabled("CONFIG_NUMA_EMULATION")? {
            Numa::BuildConfig(built_in)
        } else if board
            .kernel_cmdline()?
            .iter()
            .any(|w| w.starts_with("numa=fake="))
        {
            Numa::Ignored
        } else {
            Numa::Unknown
        };
        Ok(Observed {
            numa,
            current: board.bootloader_config()?,
            staged: board.staged_bootloader_config()?,
            bootloader_built: board.dt_u32(&format!("{}/build-timestamp", paths::DT_BOOTLOADER))?,
            shipped_day: board.shipped_bootloader_image().ok().map(|(_, day)| day),
        })
    }

    fn plan(&self, o: &Observed) -> Plan {
        let effective_value = match conf::get(&o.current, KEY) {
            Some(v) => Some(v.to_string()),
            None if o.bootloader_built >= DEFAULT_BANKLOW_1_SINCE => Some("1".to_string()),
            None => None,
        };
        let effective = match (conf::get(&o.current, KEY), &effective_value) {
            (Some(v), _) => v.to_string(),
            (None, Some(v)) => format!("{v} (bootloader default)"),
            (None, None) => "unset (this bootloader's default)".to_string(),
        };
        let plan = |desired: String, verdict| Plan {
            desired,
            effective: effective.clone(),
            verdict,
        };
        let (want, why) = match (self.desired, &o.numa) {
            (BankLow::Keep, _) => {
                return Plan {
                    desired: "left as is".into(),
                    effective: "not read".into(),
                    verdict: Verdict::NotApplicable("sdram_banklow = \"keep\"".into()),
                };
            }
            (BankLow::Pin(n), _) => (n, "pinned in the configuration".to_string()),
            (BankLow::Auto, Numa::Active(nodes)) => (1, format!("kernel runs {nodes} NUMA nodes")),
            (BankLow::Auto, Numa::BuildConfig(true)) => (1, "kernel has NUMA emulation".into()),
            (BankLow::Auto, Numa::BuildConfig(false)) => (3, "kernel lacks NUMA emulation".into()),
            (BankLow::Auto, Numa::Ignored) => {
                (3, "kernel ignored numa=fake: no NUMA emulation".into())
            }
            (BankLow::Auto, Numa::Unknown) => {
                return plan(
                    "1 with NUMA emulation, 3 without".into(),
                    Verdict::NotApplicable(
                        "cannot tell whether the kernel has NUMA emulation (no numa=fake, one node, \
                         no /boot/config-<release>); pin sdram_banklow to decide"
                            .into(),
                    ),
                );
            }
        };
        let desired = format!("{want} ({why})");
        let want = want.to_string();
        if o.bootloader_built < FIRST_WITH_BANKLOW {
            return plan(
                desired,
                Verdict::NotApplicable(
                    "this bootloader predates SDRAM_BANKLOW (2024-09-23); update the bootloader EEPROM".into(),
                ),
            );
        }
        if effective_value.as_deref() == Some(want.as_str()) {
            return plan(desired, Verdict::InPlace);
        }
        if o.staged.as_deref().and_then(|s| conf::get(s, KEY)) == Some(want.as_str()) {
            return plan(
                desired,
                Verdict::PendingReboot(
                    "staged in pieeprom.upd; the bootloader flashes it at the next boot".into(),
                ),
            );
        }
        if conf::get(&o.current, "FREEZE_VERSION") == Some("1") {
            return plan(
                desired,
                Verdict::Failed(
                    "the bootloader config has FREEZE_VERSION=1, so no update may be staged; \
                     unfreeze it or set sdram_banklow = \"keep\""
                        .into(),
                ),
            );
        }
        let running_day = i64::from(o.bootloader_built) / 86_400;
        match o.shipped_day {
            None => {
                return plan(
                    desired,
                    Verdict::Failed(
                        "no bootloader image (pieeprom-YYYY-MM-DD.bin) is installed to stage the change with"
                            .into(),
                    ),
                );
            }
            Some(day) if day < running_day => {
                return plan(
                    desired,
                    Verdict::Failed(
                        "the newest shipped bootloader image is older than the running bootloader; \
                         staging it would downgrade the EEPROM"
                            .into(),
                    ),
                );
            }
            Some(_) => {}
        }
        plan(
            desired,
            Verdict::Change(vec![Edit::StageBootloaderConfig {
                config: conf::set(&o.current, KEY, &want),
            }]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECENT: u32 = 1_746_662_400;

    fn observed(numa: Numa, current: &str, staged: Option<&str>, built: u32) -> Observed {
        Observed {
            numa,
            current: current.into(),
            staged: staged.map(str::to_string),
            bootloader_built: built,
            shipped_day: Some(i64::from(built) / 86_400),
        }
    }

    fn auto() -> BankLowStep {
        BankLowStep {
            desired: BankLow::Auto,
        }
    }

    #[test]
    fn default_banklow_under_a_numa_kernel_is_left_alone() {
        let plan = auto().plan(&observed(
            Numa::Active(8),
            "[all]\nBOOT_UART=1\n",
            None,
            RECENT,
        ));
        assert_eq!(plan.verdict, Verdict::InPlace);
        assert_eq!(plan.effective, "1 (bootloader default)");
    }

    #[test]
    fn a_kernel_without_numa_emulation_gets_3_staged() {
        let plan = auto().plan(&observed(
            Numa::Ignored,
            "[all]\nBOOT_UART=1\n",
            None,
            RECENT,
        ));
        assert_eq!(
            plan.verdict,
            Verdict::Change(vec![Edit::StageBootloaderConfig {
                config: "[all]\nBOOT_UART=1\n[all]\nSDRAM_BANKLOW=3\n".into()
            }])
        );
    }

    #[test]
    fn a_staged_fix_is_pending_and_not_staged_again() {
        let staged = "[all]\nSDRAM_BANKLOW=1\n";
        let plan = auto().plan(&observed(
            Numa::BuildConfig(true),
            "[all]\nSDRAM_BANKLOW=3\n",
            Some(staged),
            RECENT,
        ));
        assert!(matches!(plan.verdict, Verdict::PendingReboot(_)));
    }

    #[test]
    fn old_bootloaders_and_unknown_kernels_are_not_touched() {
        let old = auto().plan(&observed(Numa::Ignored, "[all]\n", None, 1_700_000_000));
        assert!(matches!(old.verdict, Verdict::NotApplicable(ref r) if r.contains("2024-09-23")));
        let unknown = auto().plan(&observed(Numa::Unknown, "[all]\n", None, RECENT));
        assert!(matches!(unknown.verdict, Verdict::NotApplicable(_)));
        let keep = BankLowStep {
            desired: BankLow::Keep,
        }
        .plan(&observed(Numa::Ignored, "[all]\n", None, RECENT));
        assert!(matches!(keep.verdict, Verdict::NotApplicable(_)));
    }

    #[test]
    fn never_downgrades_and_honours_freeze_version() {
        let mut old_image = observed(Numa::Ignored, "[all]\n", None, RECENT);
        old_image.shipped_day = Some(i64::from(RECENT) / 86_400 - 30);
        assert!(
            matches!(auto().plan(&old_image).verdict, Verdict::Failed(ref r) if r.contains("downgrade"))
        );
        let frozen = auto().plan(&observed(
            Numa::Ignored,
            "[all]\nFREEZE_VERSION=1\n",
            None,
            RECENT,
        ));
        assert!(matches!(frozen.verdict, Verdict::Failed(ref r) if r.contains("FREEZE_VERSION")));
    }
}
