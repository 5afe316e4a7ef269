//! Bringing the board into the tuned state and proving it.
//!
//! Every step follows one cycle: **observe** the effective state by reading it back from the
//! board, **plan** by comparing it with what the configuration desires, **apply** the planned
//! [`Edit`]s, and **verify** by observing and planning again. A step is only `applied` when the
//! read-back after the write shows the desired value; configuration that silently did not take is
//! reported as `failed`, with what was read.

mod bootloader;
mod bootloader_current;
mod cgroup;
mod cmdline;
mod edit;
mod governor;
pub mod last_pass;
mod swap;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use edit::{Applier, Edit, UnitProperty};

use crate::board::{Board, BoardError};
use crate::config::{CgroupBackend, Config};
use crate::systemd::Systemd;

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Already as desired; nothing was written.
    InPlace,
    /// Written and read back as desired.
    Applied,
    /// Staged; takes effect at the next boot.
    PendingReboot,
    /// Does not apply to this board or configuration.
    NotApplicable,
    /// Could not be brought into the desired state (see the reason).
    Failed,
    /// Not as desired; `apply` would change it (only from `status` and `apply --dry-run`).
    NeedsApply,
}

/// What one step found, did and read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReport {
    /// Stable step name, e.g. `governor` or `cgroup.cpu_weight`.
    pub name: String,
    /// What the configuration asks for.
    pub desired: String,
    /// What the board reads back now.
    pub effective: String,
    /// Where the step stands.
    pub state: State,
    /// Why, in words (what was written, what failed, what is awaited).
    pub reason: String,
}

/// The outcome of comparing desired with effective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do.
    InPlace,
    /// These edits, in order, bring the board to the desired state (or stage it for the next
    /// boot, in which case the read-back afterwards is `PendingReboot`).
    Change(Vec<Edit>),
    /// A change is already staged for the next boot.
    PendingReboot(String),
    /// The step does not apply here.
    NotApplicable(String),
    /// The desired state cannot be reached.
    Failed(String),
}

/// A step's view of desired against effective, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// What the configuration asks for.
    pub desired: String,
    /// What the board reads back.
    pub effective: String,
    /// What to do.
    pub verdict: Verdict,
}

/// One tuning step: observe, then plan from the observation alone (so plans are testable
/// without a board).
pub trait Step {
    /// What the step reads off the board.
    type Observed;
    /// Stable name for reports.
    fn name(&self) -> &'static str;
    /// Reads the effective state back from the board.
    fn observe(&self, board: &Board) -> Result<Self::Observed, BoardError>;
    /// Compares the observation with the desired state.
    fn plan(&self, observed: &Self::Observed) -> Plan;
}

/// A step with its observation type erased, so steps of all kinds run in one list. Shared with
/// the blocking threads that observe the board, hence `Send + Sync`.
pub trait Evaluate: Send + Sync {
    /// Stable name for reports.
    fn name(&self) -> &'static str;
    /// Observe and plan; an unreadable board becomes a `Failed` plan naming the file.
    fn evaluate(&self, board: &Board) -> Plan;
}

impl<S: Step + Send + Sync> Evaluate for S {
    fn name(&self) -> &'static str {
        Step::name(self)
    }

    fn evaluate(&self, board: &Board) -> Plan {
        match self.observe(board) {
            Ok(observed) => self.plan(&observed),
            Err(e) => Plan {
                desired: String::from("?"),
                effective: String::from("unreadable"),
                verdict: Verdict::Failed(e.to_string()),
            },
        }
    }
}

/// How cgroup limits reach the kernel on this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// systemd sets them on the slice over D-Bus.
    Systemd,
    /// The supervisor writes the cgroup files itself.
    Files,
}

impl Backend {
    /// Resolves the configured backend: `auto` means systemd on a live box that runs it.
    pub fn resolve(configured: CgroupBackend, board: &Board) -> Backend {
        match configured {
            CgroupBackend::Systemd => Backend::Systemd,
            CgroupBackend::Files => Backend::Files,
            CgroupBackend::Auto => {
                if board.runs_systemd() {
                    Backend::Systemd
                } else {
                    Backend::Files
                }
            }
        }
    }
}

/// The applier for this board: with a systemd connection when the backend is systemd.
pub async fn applier_for(board: &Board, backend: Backend) -> Applier<'_> {
    match backend {
        Backend::Files => Applier::files_only(board, "the cgroup backend is files"),
        Backend::Systemd => match Systemd::connect(None).await {
            Ok(systemd) => Applier::with_systemd(board, systemd),
            Err(e) => Applier::files_only(
                board,
                format!("cannot reach systemd on the system bus: {e}"),
            ),
        },
    }
}

/// The configured tuned state applied (or with `dry_run` only planned) and verified on this
/// board, through the applier its backend calls for (`supervisor apply`).
pub async fn apply_configured(board: &Board, config: &Config, dry_run: bool) -> Vec<StepReport> {
    let backend = Backend::resolve(config.tuning.engine.backend, board);
    let steps = steps(config, backend);
    let applier = applier_for(board, backend).await;
    apply(board, &steps, &applier, dry_run).await
}

/// The steps of the tuned state, in the order they are applied.
pub fn steps(config: &Config, backend: Backend) -> Vec<Arc<dyn Evaluate>> {
    let tuning = &config.tuning;
    let engine = || cgroup::Target::new(&tuning.engine, backend);
    vec![
        Arc::new(cmdline::MemoryCgroup),
        Arc::new(governor::GovernorStep {
            desired: tuning.governor,
        }),
        Arc::new(cgroup::SliceStep(engine())),
        Arc::new(cgroup::CpuWeightStep(engine())),
        Arc::new(cgroup::MemoryMaxStep(engine())),
        Arc::new(cgroup::SwapMaxStep(engine())),
        Arc::new(cgroup::MemoryLowStep(engine())),
        Arc::new(swap::SystemSwapStep {
            desired: tuning.system_swap,
        }),
        // Before the interleave step: whatever either stages carries the newest image.
        Arc::new(bootloader_current::CurrentStep),
        Arc::new(bootloader::BankLowStep {
            desired: tuning.sdram_banklow,
        }),
    ]
}

/// Reports where every step stands without changing anything.
pub fn status(board: &Board, steps: &[Arc<dyn Evaluate>]) -> Vec<StepReport> {
    steps
        .iter()
        .map(|step| report_unapplied(step.name(), step.evaluate(board)))
        .collect()
}

/// Where every step stands now, in the words of the last pass that tuned the board (the
/// running daemon's, at start or its last re-verification), so that `status` and the dashboard
/// say the same thing at the same moment. See [`carry`].
pub fn status_after(
    board: &Board,
    steps: &[Arc<dyn Evaluate>],
    last_pass: Option<&[StepReport]>,
) -> Vec<StepReport> {
    status(board, steps)
        .into_iter()
        .map(|now| {
            let before = last_pass.and_then(|p| p.iter().find(|r| r.name == now.name));
            carry(now, before)
        })
        .collect()
}

/// A step as observed now, told in the words of the last pass while the board is still as that
/// pass left it: `applied` (that pass wrote it, and it still reads back as desired) rather than
/// `in-place`, and `failed` with that pass's reason (it tried and could not) rather than
/// `needs-apply`. Anything else the observation says is newer than the pass and wins: drift since
/// shows as `needs-apply`, a repair by hand as `in-place`.
fn carry(now: StepReport, before: Option<&StepReport>) -> StepReport {
    let Some(before) = before.filter(|b| b.desired == now.desired) else {
        return now;
    };
    match (now.state, before.state) {
        (State::InPlace, State::Applied) | (State::NeedsApply, State::Failed) => StepReport {
            state: before.state,
            reason: before.reason.clone(),
            ..now
        },
        _ => now,
    }
}

fn report_unapplied(name: &str, plan: Plan) -> StepReport {
    let (state, reason) = match plan.verdict {
        Verdict::InPlace => (State::InPlace, String::new()),
        Verdict::Change(edits) => (State::NeedsApply, format!("would {}", describe(&edits))),
        Verdict::PendingReboot(r) => (State::PendingReboot, r),
        Verdict::NotApplicable(r) => (State::NotApplicable, r),
        Verdict::Failed(r) => (State::Failed, r),
    };
    StepReport {
        name: name.to_string(),
        desired: plan.desired,
        effective: plan.effective,
        state,
        reason,
    }
}

/// The edits in words, e.g. `write performance to …; create cgroup …`.
fn describe(edits: &[Edit]) -> String {
    let list: Vec<String> = edits.iter().map(ToString::to_string).collect();
    list.join("; ")
}

/// How long a read-back may take to show an edit: systemd applies unit changes through jobs
/// that finish shortly after the D-Bus call returns.
const SETTLE_ATTEMPTS: u32 = 20;
const SETTLE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Applies every step in order and verifies each by reading back. With `dry_run`, only plans.
/// Every read and write of the board runs on a blocking thread, one at a time: the daemon's
/// runtime thread also serves the dashboard, probes the engine and feeds the watchdog, and a
/// board call can stall (a slow card under a boot file's fsync, a lowered `memory.max`
/// reclaiming first). A pass dropped half-way leaves every write it made whole.
pub async fn apply(
    board: &Board,
    steps: &[Arc<dyn Evaluate>],
    applier: &Applier<'_>,
    dry_run: bool,
) -> Vec<StepReport> {
    let mut reports = Vec::with_capacity(steps.len());
    for step in steps {
        let plan = evaluate(board, step).await;
        let report = match plan.verdict {
            Verdict::Change(ref edits) if !dry_run => {
                let edits = edits.clone();
                apply_and_verify(board, step, plan, &edits, applier).await
            }
            _ => report_unapplied(step.name(), plan),
        };
        log(&report);
        reports.push(report);
    }
    reports
}

/// Observes and plans one step off the runtime thread.
async fn evaluate(board: &Board, step: &Arc<dyn Evaluate>) -> Plan {
    let (board, observer) = (board.clone(), Arc::clone(step));
    tokio::task::spawn_blocking(move || observer.evaluate(&board))
        .await
        .unwrap_or_else(|e| Plan {
            desired: String::from("?"),
            effective: String::from("unreadable"),
            verdict: Verdict::Failed(format!("observing {} crashed: {e}", step.name())),
        })
}

async fn apply_and_verify(
    board: &Board,
    step: &Arc<dyn Evaluate>,
    before: Plan,
    edits: &[Edit],
    applier: &Applier<'_>,
) -> StepReport {
    let name = step.name().to_string();
    for edit in edits {
        if let Err(e) = applier.apply(edit).await {
            let after = evaluate(board, step).await;
            return StepReport {
                name,
                desired: before.desired,
                effective: after.effective,
                state: State::Failed,
                reason: format!("could not {edit}: {e}"),
            };
        }
    }
    let mut after = evaluate(board, step).await;
    for _ in 1..SETTLE_ATTEMPTS {
        if !matches!(after.verdict, Verdict::Change(_)) {
            break;
        }
        tokio::time::sleep(SETTLE_INTERVAL).await;
        after = evaluate(board, step).await;
    }
    let done = describe(edits);
    let (state, reason) = match after.verdict {
        Verdict::InPlace => (State::Applied, done),
        Verdict::PendingReboot(r) => (State::PendingReboot, format!("{done}; {r}")),
        Verdict::Change(_) => (
            State::Failed,
            format!(
                "{done}, but it reads back as {} instead of {}",
                after.effective, after.desired
            ),
        ),
        Verdict::NotApplicable(r) | Verdict::Failed(r) => {
            (State::Failed, format!("{done}, then: {r}"))
        }
    };
    StepReport {
        name,
        desired: after.desired,
        effective: after.effective,
        state,
        reason,
    }
}

fn log(report: &StepReport) {
    let StepReport {
        name,
        desired,
        effective,
        state,
        reason,
    } = report;
    match state {
        State::Failed => tracing::error!(step = %name, %desired, %effective, "failed: {reason}"),
        State::Applied | State::PendingReboot => {
            tracing::info!(step = %name, %desired, %effective, state = ?state, "{reason}")
        }
        _ => tracing::debug!(step = %name, %desired, %effective, state = ?state, "{reason}"),
    }
}

/// Whether a run succeeded: no step failed.
pub fn all_succeeded(reports: &[StepReport]) -> bool {
    reports.iter().all(|r| r.state != State::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(state: State, desired: &str, reason: &str) -> StepReport {
        StepReport {
            name: "governor".into(),
            desired: desired.into(),
            effective: "performance".into(),
            state,
            reason: reason.into(),
        }
    }

    #[test]
    fn the_last_pass_names_what_it_did_while_the_board_is_as_it_left_it() {
        let wrote = report(State::Applied, "performance", "write performance to …");
        let now = report(State::InPlace, "performance", "");
        assert_eq!(carry(now.clone(), Some(&wrote)), wrote);
        assert_eq!(
            carry(now.clone(), None),
            now,
            "no daemon: the board as observed"
        );

        let could_not = report(State::Failed, "performance", "could not write: read-only");
        let still_wrong = report(State::NeedsApply, "performance", "would write performance");
        assert_eq!(carry(still_wrong.clone(), Some(&could_not)), could_not);

        // Newer than the pass: drift since it, a repair by hand, another configuration.
        assert_eq!(carry(still_wrong.clone(), Some(&wrote)), still_wrong);
        assert_eq!(carry(now.clone(), Some(&could_not)), now);
        let other = report(State::Applied, "powersave", "write powersave to …");
        assert_eq!(carry(now.clone(), Some(&other)), now);
    }
}
