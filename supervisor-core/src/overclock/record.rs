//! The ladder's record: every trial, its checks and result, and the clock the box keeps. Pure:
//! the decisions here see only the record and the configured ladder; [`super::store`] reads and
//! writes it and [`super`] carries the decisions out.

use serde::{Deserialize, Serialize};

use super::check::CheckReport;
use super::config::{Candidate, Ladder, STOCK_ARM_FREQ};

/// Layout version of the state file.
pub const VERSION: u32 = 1;

/// Where the ladder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Never started.
    Idle,
    /// Trials are under way: the box reboots into each candidate once.
    Climbing,
    /// Finished: the box keeps [`Record::result`] (stock when it is `None`).
    Done,
    /// Stopped by `overclock abort`: the box is back at stock clocks.
    Aborted,
}

/// What became of one trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrialStatus {
    /// `tryboot.txt` holds the candidate and the board reboots (or has rebooted) into it.
    Running,
    /// Every check passed; the candidate was promoted into `config.txt`.
    Passed,
    /// A check failed, or the board reset during the trial; never tried again.
    Failed,
    /// `overclock abort` stopped it.
    Aborted,
}

/// One trial of one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// Which `overclock start` this trial belongs to (1, 2, ...).
    pub run: u32,
    /// The clock tried.
    pub candidate: Candidate,
    /// Its state.
    pub status: TrialStatus,
    /// Why it ended as it did, in words.
    pub reason: String,
    /// When the trial was armed, Unix seconds.
    pub started_unix: u64,
    /// When the tryboot boot started checking, Unix seconds; unset until then.
    pub checking_since_unix: Option<u64>,
    /// When it ended, Unix seconds.
    pub ended_unix: Option<u64>,
    /// What the stability check measured.
    pub checks: Option<CheckReport>,
}

/// The state file (`overclock.json` in the data directory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Layout version ([`VERSION`]).
    pub version: u32,
    /// Where the ladder stands.
    pub phase: Phase,
    /// The current (or last) run; each `overclock start` adds one.
    pub run: u32,
    /// The stability check at stock clock that opened this run: the engine's reference output.
    pub reference: Option<CheckReport>,
    /// Every trial of every run, oldest first.
    pub trials: Vec<Trial>,
    /// The clock the box keeps once done: the highest passing step minus the margin.
    pub result: Option<Candidate>,
    /// The last thing that happened, in words.
    pub message: String,
    /// This run already rebooted to stock clocks to take its reference (never twice).
    #[serde(default)]
    pub stock_reboot_tried: bool,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            version: VERSION,
            phase: Phase::Idle,
            run: 0,
            reference: None,
            trials: Vec::new(),
            result: None,
            message: "never started".into(),
            stock_reboot_tried: false,
        }
    }
}

impl Record {
    /// The trial the board is rebooting into or checking, if any.
    pub fn running_mut(&mut self) -> Option<&mut Trial> {
        self.trials
            .iter_mut()
            .rev()
            .find(|t| t.status == TrialStatus::Running)
    }

    /// The highest candidate that passed in the current run.
    pub fn highest_passed(&self) -> Option<Candidate> {
        self.trials
            .iter()
            .filter(|t| t.run == self.run && t.status == TrialStatus::Passed)
            .map(|t| t.candidate)
            .max()
    }

    /// Whether `c` is known not to work: it, or a candidate at most as fast with at least as
    /// much voltage, failed in some run. A failed step is never tried again.
    fn ruled_out(&self, c: Candidate) -> bool {
        self.trials.iter().any(|t| {
            t.status == TrialStatus::Failed
                && t.candidate.arm_freq <= c.arm_freq
                && t.candidate.over_voltage_delta >= c.over_voltage_delta
        })
    }

    /// The next candidate to try in the current run: the first step faster than the highest
    /// that passed and not ruled out by an earlier failure (so a later run can retry a clock
    /// that failed with a step giving it more voltage); none when the ladder is climbed.
    pub fn next_candidate(&self, ladder: &Ladder) -> Option<Candidate> {
        let floor = self.highest_passed();
        ladder
            .steps()
            .iter()
            .copied()
            .filter(|c| floor.is_none_or(|f| c.arm_freq > f.arm_freq))
            .find(|c| !self.ruled_out(*c))
    }

    /// The clock `config.txt` should carry now: the highest passing step while climbing, the
    /// result once done, stock otherwise.
    pub fn promoted(&self) -> Option<Candidate> {
        match self.phase {
            Phase::Climbing => self.highest_passed(),
            Phase::Done => self.result,
            Phase::Idle | Phase::Aborted => None,
        }
    }

    /// Ends the run: the box keeps the highest passing step minus `margin_mhz` (stock when
    /// that is not above stock).
    pub fn finish(&mut self, margin_mhz: u32) {
        self.phase = Phase::Done;
        self.result = self.highest_passed().and_then(|best| {
            let arm_freq = best.arm_freq.saturating_sub(margin_mhz);
            (arm_freq > STOCK_ARM_FREQ).then_some(Candidate {
                arm_freq,
                over_voltage_delta: best.over_voltage_delta,
            })
        });
        self.message = match (self.highest_passed(), self.result) {
            (Some(best), Some(kept)) => {
                format!("done: {best} passed; keeping {kept} ({margin_mhz} MHz margin)")
            }
            (Some(best), None) => {
                format!(
                    "done: {best} passed, but with the {margin_mhz} MHz margin that is stock; keeping stock"
                )
            }
            (None, _) => "done: no step passed; keeping stock".into(),
        };
    }
}

/// The `config.txt.d` fragment that sets `c`.
pub fn fragment_text(c: Candidate) -> String {
    let mut text = String::from(
        "# Written by the supervisor's overclock ladder (supervisor overclock status).\n[all]\n",
    );
    text.push_str(&format!("arm_freq={}\n", c.arm_freq));
    if c.over_voltage_delta > 0 {
        text.push_str(&format!("over_voltage_delta={}\n", c.over_voltage_delta));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mhz(arm_freq: u32) -> Candidate {
        Candidate {
            arm_freq,
            over_voltage_delta: 0,
        }
    }

    fn trial(run: u32, c: Candidate, status: TrialStatus) -> Trial {
        Trial {
            run,
            candidate: c,
            status,
            reason: String::new(),
            started_unix: 0,
            checking_since_unix: None,
            ended_unix: None,
            checks: None,
        }
    }

    fn climbing(trials: Vec<Trial>) -> Record {
        Record {
            phase: Phase::Climbing,
            run: 2,
            trials,
            ..Record::default()
        }
    }

    #[test]
    fn the_ladder_is_climbed_in_order_and_stops_below_a_failure() {
        let ladder = super::super::config::Overclock::default().steps;
        let mut r = climbing(vec![]);
        assert_eq!(r.next_candidate(&ladder), Some(mhz(2600)));
        r.trials.push(trial(2, mhz(2600), TrialStatus::Passed));
        r.trials.push(trial(2, mhz(2700), TrialStatus::Passed));
        assert_eq!(r.next_candidate(&ladder), Some(mhz(2800)));
        assert_eq!(r.promoted(), Some(mhz(2700)));
        // A failure in an earlier run rules that step (and faster ones) out for good.
        r.trials.insert(0, trial(1, mhz(2800), TrialStatus::Failed));
        assert_eq!(r.next_candidate(&ladder), None);
        // Passes from an earlier run do not count towards this one.
        let r = climbing(vec![trial(1, mhz(2900), TrialStatus::Passed)]);
        assert_eq!(r.next_candidate(&ladder), Some(mhz(2600)));
    }

    #[test]
    fn more_voltage_may_retry_a_failed_clock_in_a_later_run() {
        let boosted = |arm_freq| Candidate {
            arm_freq,
            over_voltage_delta: 25_000,
        };
        let ladder: Ladder = vec![mhz(2600), mhz(2800), boosted(2800), boosted(2900)]
            .try_into()
            .expect("ladder");
        // Run 1 failed 2800 at stock voltage; run 2 skips it and tries 2800 with more.
        let mut r = climbing(vec![
            trial(1, mhz(2600), TrialStatus::Passed),
            trial(1, mhz(2800), TrialStatus::Failed),
            trial(2, mhz(2600), TrialStatus::Passed),
        ]);
        assert_eq!(r.next_candidate(&ladder), Some(boosted(2800)));
        // Once 2800 passed with more voltage, the same clock is not tried again.
        r.trials.push(trial(2, boosted(2800), TrialStatus::Passed));
        assert_eq!(r.next_candidate(&ladder), Some(boosted(2900)));
        // A faster clock with no more voltage than a failure is ruled out.
        let r = climbing(vec![trial(1, boosted(2700), TrialStatus::Failed)]);
        assert_eq!(r.next_candidate(&ladder), Some(mhz(2600)));
        let r = climbing(vec![
            trial(1, boosted(2700), TrialStatus::Failed),
            trial(2, mhz(2600), TrialStatus::Passed),
        ]);
        assert_eq!(r.next_candidate(&ladder), None);
        // An aborted trial rules nothing out.
        let r = climbing(vec![trial(1, mhz(2600), TrialStatus::Aborted)]);
        assert_eq!(r.next_candidate(&ladder), Some(mhz(2600)));
    }

    #[test]
    fn the_result_keeps_a_margin_below_the_best_pass() {
        let mut r = climbing(vec![
            trial(2, mhz(2600), TrialStatus::Passed),
            trial(2, mhz(2800), TrialStatus::Passed),
            trial(2, mhz(2900), TrialStatus::Failed),
        ]);
        r.finish(100);
        assert_eq!(r.result, Some(mhz(2700)));
        assert_eq!(r.promoted(), Some(mhz(2700)));
        assert!(r.message.contains("keeping 2700 MHz"), "{}", r.message);
        r.finish(500);
        assert_eq!(r.result, None);
        assert_eq!(r.promoted(), None);
    }

    #[test]
    fn fragments_set_only_what_differs_from_stock() {
        let text = fragment_text(mhz(2700));
        assert_eq!(config_txt::setting(&text, "arm_freq"), Some("2700"));
        assert_eq!(config_txt::setting(&text, "over_voltage_delta"), None);
        let text = fragment_text(Candidate {
            arm_freq: 2800,
            over_voltage_delta: 25_000,
        });
        assert_eq!(
            config_txt::setting(&text, "over_voltage_delta"),
            Some("25000")
        );
    }
}
