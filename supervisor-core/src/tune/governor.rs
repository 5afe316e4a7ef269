//! The cpufreq governor on every policy.

use super::{Edit, Plan, Step, Verdict};
use crate::board::{Board, BoardError};
use crate::config::Governor;

/// Sets the configured governor on every cpufreq policy.
pub struct GovernorStep {
    /// The governor to run.
    pub desired: Governor,
}

/// One cpufreq policy as read back.
pub struct Policy {
    path: String,
    governor: String,
    available: Vec<String>,
}

impl Step for GovernorStep {
    type Observed = Vec<Policy>;

    fn name(&self) -> &'static str {
        "governor"
    }

    fn observe(&self, board: &Board) -> Result<Vec<Policy>, BoardError> {
        board
            .cpufreq_policies()?
            .into_iter()
            .map(|path| {
                Ok(Policy {
                    governor: board.read_value(&format!("{path}/scaling_governor"))?,
                    available: board
                        .read_value(&format!("{path}/scaling_available_governors"))?
                        .split_whitespace()
                        .map(str::to_string)
                        .collect(),
                    path,
                })
            })
            .collect()
    }

    fn plan(&self, policies: &Vec<Policy>) -> Plan {
        let want = self.desired.as_str();
        let short = |p: &Policy| p.path.rsplit('/').next().unwrap_or(&p.path).to_string();
        let desired = format!("{want} on every cpufreq policy");
        let effective = if policies.iter().all(|p| p.governor == want) {
            if policies.is_empty() {
                "no cpufreq policies".to_string()
            } else {
                let n = policies.len();
                format!(
                    "{want} on {n} {}",
                    if n == 1 { "policy" } else { "policies" }
                )
            }
        } else {
            policies
                .iter()
                .map(|p| format!("{}={}", short(p), p.governor))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let verdict = if policies.is_empty() {
            Verdict::NotApplicable("the kernel exposes no cpufreq policy to set".into())
        } else if let Some(p) = policies
            .iter()
            .find(|p| !p.available.iter().any(|g| g == want))
        {
            Verdict::Failed(format!(
                "{} offers only {}; its kernel lacks the {want} governor",
                short(p),
                p.available.join(" ")
            ))
        } else {
            let edits: Vec<Edit> = policies
                .iter()
                .filter(|p| p.governor != want)
                .map(|p| Edit::WriteAttribute {
                    path: format!("{}/scaling_governor", p.path),
                    value: want.to_string(),
                })
                .collect();
            if edits.is_empty() {
                Verdict::InPlace
            } else {
                Verdict::Change(edits)
            }
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

    fn policy(n: u32, governor: &str, available: &str) -> Policy {
        Policy {
            path: format!("/sys/devices/system/cpu/cpufreq/policy{n}"),
            governor: governor.into(),
            available: available.split_whitespace().map(str::to_string).collect(),
        }
    }

    #[test]
    fn only_policies_off_target_are_written() {
        let step = GovernorStep {
            desired: Governor::Performance,
        };
        let plan = step.plan(&vec![
            policy(0, "performance", "ondemand performance"),
            policy(4, "ondemand", "ondemand performance"),
        ]);
        assert_eq!(plan.effective, "policy0=performance, policy4=ondemand");
        assert_eq!(
            plan.verdict,
            Verdict::Change(vec![Edit::WriteAttribute {
                path: "/sys/devices/system/cpu/cpufreq/policy4/scaling_governor".into(),
                value: "performance".into()
            }])
        );
    }

    #[test]
    fn a_missing_governor_fails_instead_of_writing() {
        let step = GovernorStep {
            desired: Governor::Performance,
        };
        let plan = step.plan(&vec![policy(0, "schedutil", "schedutil powersave")]);
        assert!(
            matches!(plan.verdict, Verdict::Failed(ref r) if r.contains("schedutil powersave"))
        );
        assert_eq!(
            step.plan(&vec![]).verdict,
            Verdict::NotApplicable("the kernel exposes no cpufreq policy to set".into())
        );
    }
}
