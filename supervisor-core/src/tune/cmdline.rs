//! The memory cgroup controller: Raspberry Pi firmware puts `cgroup_disable=memory` on the kernel
//! command line, so `cgroup_enable=memory` must follow it in `cmdline.txt` (order matters).

use super::{Edit, Plan, Step, Verdict};
use crate::board::{Board, BoardError, paths};

/// The kernel argument that turns the memory controller back on.
pub const ENABLE_MEMORY: &str = "cgroup_enable=memory";

/// Makes sure the kernel has the memory controller, staging `cgroup_enable=memory` if not.
pub struct MemoryCgroup;

/// What the memory-controller step reads.
pub struct Observed {
    /// The running kernel offers the memory controller.
    pub available: bool,
    /// Box path of `cmdline.txt`.
    pub cmdline_path: String,
    /// Its contents.
    pub cmdline_txt: String,
}

/// Whether a command line ends up enabling the memory controller: the last of
/// `cgroup_enable=memory` / `cgroup_disable=memory` wins.
pub fn enables_memory(cmdline: &str) -> bool {
    cmdline
        .split_whitespace()
        .rfind(|w| *w == ENABLE_MEMORY || *w == "cgroup_disable=memory")
        == Some(ENABLE_MEMORY)
}

impl Step for MemoryCgroup {
    type Observed = Observed;

    fn name(&self) -> &'static str {
        "kernel.memory_cgroup"
    }

    fn observe(&self, board: &Board) -> Result<Observed, BoardError> {
        let controllers = board.read(&format!("{}/cgroup.controllers", paths::CGROUP_ROOT))?;
        let cmdline_path = crate::board::slot::cmdline_txt(board)?;
        Ok(Observed {
            available: controllers.split_whitespace().any(|c| c == "memory"),
            cmdline_txt: board.read(&cmdline_path)?,
            cmdline_path,
        })
    }

    fn plan(&self, o: &Observed) -> Plan {
        let desired = "memory controller available".to_string();
        let (effective, verdict) = if o.available {
            ("available".to_string(), Verdict::InPlace)
        } else if enables_memory(&o.cmdline_txt) {
            (
                "absent".to_string(),
                Verdict::PendingReboot(format!(
                    "{} has {ENABLE_MEMORY}; the controller appears after a reboot",
                    o.cmdline_path
                )),
            )
        } else {
            // cmdline.txt is a single line; the argument goes at its end so it follows the
            // firmware's cgroup_disable=memory.
            let line = o.cmdline_txt.lines().next().unwrap_or("").trim_end();
            let contents = if line.is_empty() {
                format!("{ENABLE_MEMORY}\n")
            } else {
                format!("{line} {ENABLE_MEMORY}\n")
            };
            (
                "absent (kernel booted without it)".to_string(),
                Verdict::Change(vec![Edit::ReplaceFile {
                    path: o.cmdline_path.clone(),
                    contents,
                }]),
            )
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

    #[test]
    fn the_last_memory_argument_wins() {
        assert!(enables_memory(
            "cgroup_disable=memory root=/dev/a cgroup_enable=memory"
        ));
        assert!(!enables_memory(
            "cgroup_enable=memory cgroup_disable=memory"
        ));
        assert!(!enables_memory("root=/dev/a"));
    }

    #[test]
    fn appends_to_the_single_line_and_keeps_the_rest() {
        let plan = MemoryCgroup.plan(&Observed {
            available: false,
            cmdline_path: "/boot/firmware/cmdline.txt".into(),
            cmdline_txt: "console=tty1 root=PARTUUID=x ro rootwait\n".into(),
        });
        assert_eq!(
            plan.verdict,
            Verdict::Change(vec![Edit::ReplaceFile {
                path: "/boot/firmware/cmdline.txt".into(),
                contents: "console=tty1 root=PARTUUID=x ro rootwait cgroup_enable=memory\n".into()
            }])
        );
    }
}
