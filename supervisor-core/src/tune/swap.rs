//! System-wide swap, verified against `/proc/swaps`. (The engine's own swap is `memory.swap.max`.)

use super::{Edit, Plan, Step, Verdict};
use crate::board::facts::SwapArea;
use crate::board::{Board, BoardError};
use crate::config::SystemSwap;

/// Turns every swap area off when configured to.
pub struct SystemSwapStep {
    /// What the configuration wants.
    pub desired: SystemSwap,
}

impl Step for SystemSwapStep {
    /// `None` when `/proc/swaps` is unreadable and the step is turned off anyway.
    type Observed = Option<Vec<SwapArea>>;

    fn name(&self) -> &'static str {
        "swap.system"
    }

    fn observe(&self, board: &Board) -> Result<Option<Vec<SwapArea>>, BoardError> {
        match self.desired {
            SystemSwap::Keep => Ok(board.active_swaps().ok()),
            SystemSwap::Off => board.active_swaps().map(Some),
        }
    }

    fn plan(&self, observed: &Option<Vec<SwapArea>>) -> Plan {
        let no_areas = Vec::new();
        let areas = observed.as_ref().unwrap_or(&no_areas);
        let effective = if observed.is_none() {
            "unreadable".to_string()
        } else if areas.is_empty() {
            "off".to_string()
        } else {
            let names: Vec<&str> = areas.iter().map(|a| a.device.as_str()).collect();
            format!("on: {}", names.join(", "))
        };
        let (desired, verdict) = match self.desired {
            SystemSwap::Keep => (
                "as the OS set it up".to_string(),
                Verdict::NotApplicable("system_swap = \"keep\"".into()),
            ),
            SystemSwap::Off if areas.is_empty() => ("off".to_string(), Verdict::InPlace),
            SystemSwap::Off => (
                "off".to_string(),
                Verdict::Change(
                    areas
                        .iter()
                        .map(|a| Edit::SwapOff {
                            device: a.device.clone(),
                        })
                        .collect(),
                ),
            ),
        };
        Plan {
            desired,
            effective,
            verdict,
        }
    }
}
