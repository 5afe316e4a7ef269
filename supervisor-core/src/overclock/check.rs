//! The stability check a candidate clock must pass: the verified all-core load for the
//! configured time while the temperature and the firmware's throttle bits are sampled, then the
//! engine's greedy output for a fixed prompt, hashed and compared with the one taken at stock.

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::load::{ANSWERS, unit_answer};
use crate::board::Board;
use crate::config::Config;
use crate::tune;

/// Live and sticky under-voltage, frequency cap, throttling and soft temperature limit.
const THROTTLE_MASK: u32 = 0x000f_000f;
/// How often temperature and throttling are read.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// The prompt whose greedy continuation must not change with the clock.
pub const ENGINE_PROMPT: &str = "The three primary colours of light are";
/// How long the engine may take for that continuation.
const ENGINE_DEADLINE: Duration = Duration::from_secs(600);

/// What one check measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Whether every part passed.
    pub passed: bool,
    /// The check could not judge the clock (a reading failed, the engine could not run, it was
    /// stopped): the candidate is neither passed nor failed.
    #[serde(default)]
    pub inconclusive: bool,
    /// The first thing that failed, or a summary of the pass.
    pub reason: String,
    /// The clock the kernel reported during the check, MHz.
    pub clock_mhz: Option<u64>,
    /// Seconds the load ran.
    pub seconds: f64,
    /// Threads that ran it.
    pub threads: usize,
    /// Units of work checked.
    pub units: u64,
    /// Units whose result was wrong.
    pub wrong_units: u64,
    /// The highest temperature sampled, °C.
    pub max_temperature_c: Option<f64>,
    /// The throttle bits seen (all samples ORed), as `get_throttled` prints them.
    pub throttle: Option<String>,
    /// SHA-256 of the engine's output; `None` when the engine check is off.
    pub engine_sha256: Option<String>,
}

/// Runs the check. `reference` is the engine hash taken at stock (`None` while taking it);
/// `stop` is asked between samples and ends the check early (an abort).
pub fn run(
    board: &Board,
    config: &Config,
    reference: Option<&str>,
    stop: &dyn Fn() -> bool,
) -> CheckReport {
    let oc = &config.overclock;
    let threads = crate::config::available_cpus();
    let corruption = board.compute_corruption();
    let done = AtomicBool::new(false);
    let units = AtomicU64::new(0);
    let wrong = AtomicU64::new(0);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(oc.check_seconds.get());
    let mut max_temperature: Option<f64> = None;
    let mut throttle_seen = 0u32;
    let mut failure: Option<String> = None;
    let mut inconclusive = false;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (done, units, wrong) = (&done, &units, &wrong);
            scope.spawn(move || {
                let mut k = t % ANSWERS.len();
                while !done.load(Ordering::Relaxed) {
                    if unit_answer(k, corruption) != ANSWERS[k] {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    units.fetch_add(1, Ordering::Relaxed);
                    k = (k + 1) % ANSWERS.len();
                }
            });
        }
        loop {
            match board.temperature_c() {
                Ok(c) => {
                    max_temperature = Some(max_temperature.map_or(c, |m: f64| m.max(c)));
                    if c > f64::from(oc.temperature_limit_c.get()) {
                        failure = Some(format!(
                            "{c:.1} °C after {:.0} s, over the {} °C limit",
                            started.elapsed().as_secs_f64(),
                            oc.temperature_limit_c.get()
                        ));
                    }
                }
                Err(e) => {
                    failure = Some(format!("cannot read the temperature: {e}"));
                    inconclusive = true;
                }
            }
            match board.throttle_bits() {
                Ok(bits) => {
                    throttle_seen |= bits;
                    if bits & THROTTLE_MASK != 0 && failure.is_none() {
                        let words = crate::board::facts::Throttle::decode(bits & THROTTLE_MASK);
                        failure = Some(format!(
                            "the firmware reports throttling ({bits:#x}): now [{}], since boot [{}]",
                            words.now.join(", "),
                            words.since_boot.join(", ")
                        ));
                    }
                }
                Err(e) => {
                    failure = Some(format!("cannot read the throttle bits: {e}"));
                    inconclusive = true;
                }
            }
            if wrong.load(Ordering::Relaxed) > 0 && failure.is_none() {
                failure = Some("the compute load got a wrong answer".into());
            }
            if failure.is_none() && stop() {
                failure = Some("stopped before the end (abort or shutdown)".into());
                inconclusive = true;
            }
            if failure.is_some() || Instant::now() >= deadline {
                done.store(true, Ordering::Relaxed);
                break;
            }
            std::thread::sleep(
                SAMPLE_EVERY.min(deadline.saturating_duration_since(Instant::now())),
            );
        }
    });
    let units = units.load(Ordering::Relaxed);
    let wrong = wrong.load(Ordering::Relaxed);
    if wrong > 0 {
        inconclusive = false;
        failure = Some(format!(
            "{wrong} of {units} units of the compute load gave a wrong answer"
        ));
    }
    let mut report = CheckReport {
        passed: false,
        inconclusive,
        reason: String::new(),
        clock_mhz: board.facts().cpu_max_mhz,
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        threads,
        units,
        wrong_units: wrong,
        max_temperature_c: max_temperature.map(|c| (c * 10.0).round() / 10.0),
        throttle: Some(format!("{throttle_seen:#x}")),
        engine_sha256: None,
    };
    if let Some(reason) = failure {
        report.reason = reason;
        return report;
    }
    if oc.engine_check {
        match engine_output_sha256(board, config, stop) {
            Ok(hash) => {
                if let Some(expected) = reference
                    && hash != expected
                {
                    report.reason = format!(
                        "the engine's greedy output changed: sha256 {hash}, at stock {expected}"
                    );
                    report.engine_sha256 = Some(hash);
                    return report;
                }
                report.engine_sha256 = Some(hash);
            }
            Err(e) => {
                report.reason = format!("the engine check could not run: {e}");
                report.inconclusive = true;
                return report;
            }
        }
    }
    report.passed = true;
    report.reason = format!(
        "{units} units right in {:.0} s on {threads} threads, at most {}{}",
        report.seconds,
        report
            .max_temperature_c
            .map_or("unknown".into(), |c| format!("{c:.1} °C")),
        if oc.engine_check {
            ", engine output identical"
        } else {
            ""
        }
    );
    report
}

/// SHA-256 of `engine generate`'s greedy output for [`ENGINE_PROMPT`] on the verified model.
fn engine_output_sha256(
    board: &Board,
    config: &Config,
    stop: &dyn Fn() -> bool,
) -> Result<String, String> {
    let approved = crate::model::check(board, config, crate::model::reverify(config))
        .map_err(|e| format!("model {} not usable: {e}", config.model.id))?;
    engine_cgroup(board, config)?;
    let threads = crate::config::available_cpus();
    let mut args: Vec<OsString> = vec!["generate".into(), "--model".into()];
    args.push(approved.path.clone().into_os_string());
    let tokens = config.overclock.engine_tokens.get().to_string();
    let threads = threads.to_string();
    for arg in [
        "--prompt",
        ENGINE_PROMPT,
        "--temp",
        "0",
        "--json",
        "--n-predict",
        &tokens,
        "--threads",
        &threads,
        "--ctx-size",
        "512",
    ] {
        args.push(arg.into());
    }
    let program = crate::engine::binary(config);
    let finished =
        crate::engine::run_to_end(board, config, &program, &args, ENGINE_DEADLINE, stop)?;
    if !finished.status.success() {
        let stderr = String::from_utf8_lossy(&finished.stderr);
        let last = stderr.lines().last().unwrap_or("").trim();
        return Err(format!(
            "engine generate failed ({}): {last}",
            finished.status
        ));
    }
    Ok(weights::hash::to_hex(&weights::hash::sha256(
        &finished.stdout,
    )))
}

/// Brings the engine's cgroup (the slice and its limits) into the tuned state for the check's
/// engine: at a trial boot the check runs before the daemon tunes anything, and cgroups do not
/// survive a reboot. The tuning steps are async (systemd is reached over D-Bus), and this runs
/// on a blocking thread or in a plain CLI command, so on a runtime of its own.
fn engine_cgroup(board: &Board, config: &Config) -> Result<(), String> {
    let backend = tune::Backend::resolve(config.tuning.engine.backend, board);
    let steps: Vec<_> = tune::steps(config, backend)
        .into_iter()
        .filter(|step| step.name().starts_with("cgroup."))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot set up the engine's cgroup: no async runtime: {e}"))?;
    let reports = runtime.block_on(async {
        let applier = tune::applier_for(board, backend).await;
        tune::apply(board, &steps, &applier, false).await
    });
    // The limits' own failures are logged by the pass; only a missing slice keeps the engine out.
    match reports
        .iter()
        .find(|r| r.name == "cgroup.slice" && r.state == tune::State::Failed)
    {
        Some(r) => Err(format!(
            "the engine's cgroup cannot be set up: {}",
            r.reason
        )),
        None => Ok(()),
    }
}
