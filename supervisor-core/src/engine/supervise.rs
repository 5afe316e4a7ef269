//! The supervision loop: gate → launch → wait for health → probe while running → on failure
//! back off and relaunch, until the crash-loop limit or shutdown.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::launch::{ClusterHead, Launch};
use super::logs::LogRing;
use super::probe::{self, Health, Progress};
use super::process::{self, Running};
use super::state::{EngineStatus, Phase};
use crate::board::Board;
use crate::config::Config;

/// How long the engine gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often readiness is polled while the engine starts.
const READY_POLL: Duration = Duration::from_millis(250);
/// A run that stayed ready this long was not part of a crash loop: the count starts over.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// Consecutive health probes without an answer that make the engine count as wedged. After a
/// failure the next probe runs at once, not an interval later, so a hang is noticed within one
/// interval plus this many probe deadlines.
const PROBE_FAILURES: u32 = 2;
/// How often a refused model is checked again.
const GATE_RETRY: Duration = Duration::from_secs(30);
/// Log lines kept in the published status.
const STATUS_LOG_LINES: usize = 20;

/// The daemon's handle on the supervision task.
pub struct Handle {
    status: watch::Receiver<EngineStatus>,
    shutdown: watch::Sender<bool>,
    model: watch::Sender<Checked>,
    switch: watch::Sender<Wanted>,
    heartbeat: Arc<Mutex<Instant>>,
    stale_after: Duration,
    task: JoinHandle<()>,
}

/// What the box serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serve {
    /// Its own model, alone.
    Alone,
    /// The cluster's model, as its head.
    Head(Arc<ClusterHead>),
    /// Nothing, and why (a cluster short of a worker, with no fallback).
    Nothing(String),
}

/// What the supervision should run: the model the box serves alone (`[model] id` or the model
/// switched to), and whether it serves that or a cluster's.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wanted {
    model: String,
    serve: Serve,
}

impl Wanted {
    /// The model actually served.
    fn served(&self) -> &str {
        match &self.serve {
            Serve::Head(head) => &head.model,
            Serve::Alone | Serve::Nothing(_) => &self.model,
        }
    }
}

impl Handle {
    /// The engine's current state.
    pub fn status(&self) -> EngineStatus {
        self.status.borrow().clone()
    }

    /// A receiver of every state change (for the dashboard).
    pub fn subscribe(&self) -> watch::Receiver<EngineStatus> {
        self.status.clone()
    }

    /// Whether systemd's watchdog should be fed: not while the engine counts as ready but
    /// has not been probed successfully for several probe intervals (the stack is wedged).
    pub fn watchdog_ok(&self) -> bool {
        let beat = *self.heartbeat.lock().unwrap_or_else(|p| p.into_inner());
        self.status.borrow().state != Phase::Ready || beat.elapsed() < self.stale_after
    }

    /// What the daemon's periodic re-verification of the model found. `Err(why)` stops a
    /// running engine at once and keeps it stopped; `Ok` lets a stopped one relaunch at once
    /// (through the gate, as every launch).
    pub fn model_checked(&self, model: &str, verdict: ModelVerdict) {
        // Every verdict is news, even one equal to the last: the engine may have been
        // relaunched by the gate since, and a repeated failure must stop it again.
        let _previous = self.model.send_replace(Checked {
            model: model.to_string(),
            verdict,
        });
    }

    /// What the box serves now, as last asked ([`Handle::serve`]).
    pub fn serving(&self) -> Serve {
        self.switch.borrow().serve.clone()
    }

    /// Runs model `id` from now on: the running engine is stopped and one is launched on `id`
    /// through the gate, with a fresh crash-loop count. Whether it then proves healthy is for
    /// the caller to watch ([`Handle::subscribe`]: `model_id` names the model of each state).
    pub fn use_model(&self, id: &str) {
        self.switch.send_if_modified(|wanted| {
            // As a cluster's head the box goes on serving the cluster's model: news only
            // when what is served changes.
            let before = wanted.served().to_string();
            wanted.model = id.to_string();
            wanted.served() != before
        });
    }

    /// Serves `serve` from now on: a running server that serves something else is stopped and
    /// the new one launched through the gate.
    pub fn serve(&self, serve: Serve) {
        self.switch.send_if_modified(|wanted| {
            let changed = wanted.serve != serve;
            wanted.serve = serve;
            changed
        });
    }

    /// Stops the engine (SIGTERM, then SIGKILL) and waits for the task to finish.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        if let Err(e) = self.task.await {
            tracing::error!("the engine supervision task failed: {e}");
        }
    }
}

/// Starts supervising what the box serves: `first` (its configured model alone, a cluster's
/// model as its head, or nothing) until [`Handle::serve`] says otherwise.
pub fn supervise(board: Board, config: Config, logs: Arc<LogRing>, first: Serve) -> Handle {
    let initial = EngineStatus::new(&config.model.id);
    let (status_tx, status) = watch::channel(initial.clone());
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (model, model_rx) = watch::channel(Checked {
        model: config.model.id.clone(),
        verdict: Ok(()),
    });
    let (switch, switch_rx) = watch::channel(Wanted {
        model: config.model.id.clone(),
        serve: first,
    });
    let heartbeat = Arc::new(Mutex::new(Instant::now()));
    let e = &config.engine;
    let stale_after = Duration::from_secs(3 * e.health_interval_s.get())
        + 2 * Duration::from_millis(e.health_timeout_ms.get());
    let supervisor = Supervisor {
        board,
        config,
        logs,
        status: initial,
        publish_to: status_tx,
        heartbeat: Arc::clone(&heartbeat),
        shutdown: shutdown_rx,
        model: model_rx,
        switch: switch_rx,
        serving: Serve::Alone,
    };
    let task = tokio::spawn(supervisor.run());
    Handle {
        status,
        shutdown,
        model,
        switch,
        heartbeat,
        stale_after,
        task,
    }
}

struct Supervisor {
    board: Board,
    config: Config,
    logs: Arc<LogRing>,
    status: EngineStatus,
    publish_to: watch::Sender<EngineStatus>,
    heartbeat: Arc<Mutex<Instant>>,
    shutdown: watch::Receiver<bool>,
    model: watch::Receiver<Checked>,
    /// What to run: changed by [`Handle::use_model`] and [`Handle::serve`].
    switch: watch::Receiver<Wanted>,
    /// What the current launches serve.
    serving: Serve,
}

/// The model's latest re-verification: `Err` with why it failed.
pub type ModelVerdict = Result<(), String>;

/// A re-verification's verdict on the model it checked: it counts only for that model.
#[derive(Debug, Clone)]
struct Checked {
    model: String,
    verdict: ModelVerdict,
}

/// How one launch ended.
enum Outcome {
    Shutdown,
    Failed {
        reason: String,
        stable: bool,
    },
    /// Stopped because its weights failed re-verification while it ran.
    Refused(String),
    /// Stopped to run another model.
    Switched,
}

impl Supervisor {
    async fn run(mut self) {
        let mut failures = 0u32;
        // Why the last engine was stopped, while its weights stay refused.
        let mut refused_while_running: Option<String> = None;
        loop {
            // The gate below is newer than any verdict the daemon sent so far.
            self.model.borrow_and_update();
            let wanted = self.switch.borrow_and_update().clone();
            if wanted.served() != self.config.model.id || wanted.serve != self.serving {
                tracing::info!(
                    "engine: switching from model {} to {}{}",
                    self.config.model.id,
                    wanted.served(),
                    match &wanted.serve {
                        Serve::Head(_) => " as the cluster's head",
                        Serve::Alone => "",
                        Serve::Nothing(_) => " (not served)",
                    }
                );
                self.config.model.id = wanted.served().to_string();
                self.serving = wanted.serve.clone();
                self.status.model_id = self.config.model.id.clone();
                self.status.model_sha256 = None;
                self.status.split = None;
                failures = 0;
                refused_while_running = None;
                // Not the last server's phase: what watches it (a cluster's head) must not
                // take the new one for ready, blocked or failing before it has run.
                let next = format!("switching to {}", self.config.model.id);
                self.set(Phase::Starting, next);
            }
            if let Serve::Nothing(why) = &self.serving {
                let reason = format!("not serving: {why}");
                if self.status.reason != reason {
                    tracing::warn!("engine {reason}");
                    self.set(Phase::Blocked, reason);
                }
                if self.idle_until_shutdown_or_switch().await {
                    return;
                }
                continue;
            }
            let approved = match self.gate().await {
                Ok(approved) => {
                    refused_while_running = None;
                    approved
                }
                Err(reason) => {
                    let reason = match &refused_while_running {
                        Some(why) => format!(
                            "stopped: its weights failed verification while it ran ({why}); not relaunched: {reason}"
                        ),
                        None => format!("not launched: {reason}"),
                    };
                    if self.status.state != Phase::Blocked || self.status.reason != reason {
                        tracing::error!("the engine is {reason}");
                        self.set(Phase::Blocked, reason);
                    }
                    // A model installed or repaired later is picked up without a restart: at
                    // the next retry, or as soon as the daemon's re-verification passes.
                    if self.wait_to_gate_again().await {
                        self.set(Phase::Stopped, "stopped with the supervisor".into());
                        return;
                    }
                    continue;
                }
            };
            // A launch that cannot even be planned (no random source for its key) counts as a
            // failed start: backoff, then the crash-loop limit.
            let planned = match &self.serving {
                Serve::Head(head) => Launch::plan_head(&self.config, &approved, head)
                    .map(|(launch, split)| (launch, Some(split))),
                Serve::Alone | Serve::Nothing(_) => {
                    Launch::plan(&self.board, &self.config, &approved).map(|l| (l, None))
                }
            };
            let outcome = match planned {
                Ok((launch, split)) => {
                    self.status.split = split;
                    self.status.model_sha256 = Some(approved.manifest.sha256.clone());
                    self.status.url = Some(format!("http://127.0.0.1:{}", launch.port));
                    self.run_once(&launch).await
                }
                Err(reason) => Outcome::Failed {
                    reason,
                    stable: false,
                },
            };
            match outcome {
                Outcome::Shutdown => {
                    self.set(Phase::Stopped, "stopped with the supervisor".into());
                    return;
                }
                Outcome::Switched => {}
                Outcome::Refused(why) => {
                    tracing::error!("engine stopped: its weights failed verification: {why}");
                    self.set(
                        Phase::Blocked,
                        format!("stopped: its weights failed verification while it ran ({why})"),
                    );
                    refused_while_running = Some(why);
                }
                Outcome::Failed { reason, stable } => {
                    failures = if stable { 1 } else { failures + 1 };
                    let e = &self.config.engine;
                    if failures > e.max_restarts.get() {
                        tracing::error!(
                            "engine failing: {reason}; {failures} failures in a row, not restarting"
                        );
                        self.set(
                            Phase::Failing,
                            format!("engine failing: {reason} ({failures} failures in a row; restart the supervisor to try again)"),
                        );
                        if self.idle_until_shutdown_or_switch().await {
                            return;
                        }
                        continue;
                    }
                    // 1×, 2×, 4×, ... the base pause, at most a minute.
                    let pause = Duration::from_millis(
                        e.restart_backoff_ms
                            .get()
                            .saturating_mul(1 << (failures - 1).min(16))
                            .min(60_000),
                    );
                    tracing::warn!("engine {reason}; restarting in {} ms", pause.as_millis());
                    self.status.restarts += 1;
                    self.set(
                        Phase::BackingOff,
                        format!("{reason}; restarting in {} ms", pause.as_millis()),
                    );
                    if self.sleep_or_shutdown(pause).await {
                        self.set(Phase::Stopped, "stopped with the supervisor".into());
                        return;
                    }
                }
            }
        }
    }

    /// The launch gate, fresh for every launch: weights changed on disk are never served.
    async fn gate(&self) -> Result<weights::gate::Approved, String> {
        let (board, config) = (self.board.clone(), self.config.clone());
        let how = crate::model::between_boots(&config);
        tokio::task::spawn_blocking(move || crate::model::check(&board, &config, how))
            .await
            .map_err(|e| format!("the model check crashed: {e}"))?
            .map_err(|e| format!("model {} refused: {e}", self.config.model.id))
    }

    async fn run_once(&mut self, launch: &Launch) -> Outcome {
        let mut shutdown = self.shutdown.clone();
        let mut model = self.model.clone();
        let mut switch = self.switch.clone();
        let spawned = process::spawn(&self.board, &self.config, launch, &self.logs).await;
        let mut running = match spawned {
            Ok(running) => running,
            Err(reason) => {
                return Outcome::Failed {
                    reason,
                    stable: false,
                };
            }
        };
        self.status.pid = Some(running.pid);
        self.status.ready_unix = None;
        self.status.access = Some(launch.access.clone());
        tracing::info!(
            pid = running.pid,
            "engine started: {}",
            launch.program.display()
        );
        self.set(Phase::Starting, format!("loading {}", self.config.model.id));

        let started = Instant::now();
        let start_timeout = Duration::from_secs(self.config.engine.start_timeout_s.get());
        let health = loop {
            tokio::select! {
                exit = running.exited() => {
                    return self.failed(format!("exited while starting ({exit})"), exit, false);
                }
                _ = stopped(&mut shutdown) => return self.shutdown_engine(running).await,
                why = refused(&mut model, &self.config.model.id) => return self.refuse(running, why).await,
                () = switched(&mut switch) => return self.switch_engine(running).await,
                _ = tokio::time::sleep(READY_POLL) => {
                    let access = launch.access.clone();
                    match blocking(move || probe::health(&access, READY_POLL * 4)).await {
                        Ok(health) => break health,
                        Err(e) if started.elapsed() >= start_timeout => {
                            let exit = running.stop(STOP_GRACE).await;
                            let reason = format!("not healthy {} s after start ({e})", start_timeout.as_secs());
                            return self.failed(reason, exit, false);
                        }
                        Err(_) => {}
                    }
                }
            }
        };
        let ready = Instant::now();
        self.status.ready_unix = Some(weights::install::now_unix());
        self.record(&health);
        tracing::info!(
            "engine ready on {}",
            self.status.url.as_deref().unwrap_or("")
        );
        self.set(Phase::Ready, "serving".into());

        let e = &self.config.engine;
        let (interval, timeout) = (
            Duration::from_secs(e.health_interval_s.get()),
            Duration::from_millis(e.health_timeout_ms.get()),
        );
        // Busy without a token for two intervals, and never less than the slowest step a long
        // prompt takes, before a busy engine counts as wedged.
        let stall_limit = (2 * interval).max(probe::MIN_STALL);
        let mut probes = tokio::time::interval(interval);
        probes.tick().await;
        let mut failed_probes = 0;
        let mut progress = Progress::new(&health, Instant::now());
        loop {
            tokio::select! {
                exit = running.exited() => {
                    let stable = ready.elapsed() >= STABLE_AFTER;
                    return self.failed(format!("exited ({exit})"), exit, stable);
                }
                _ = stopped(&mut shutdown) => return self.shutdown_engine(running).await,
                why = refused(&mut model, &self.config.model.id) => return self.refuse(running, why).await,
                () = switched(&mut switch) => return self.switch_engine(running).await,
                _ = probes.tick() => {
                    let access = launch.access.clone();
                    let probe = blocking(move || probe::check(&access, timeout));
                    match probe.await {
                        Ok(health) => {
                            failed_probes = 0;
                            self.record(&health);
                            match progress.update(&health, Instant::now(), stall_limit) {
                                Ok(moved) => progress = moved,
                                Err(e) => {
                                    // Already judged over many probes: no second chance.
                                    tracing::warn!("engine health probe failed: {e}");
                                    let exit = running.kill().await;
                                    let stable = ready.elapsed() >= STABLE_AFTER;
                                    return self.failed(format!("stopped answering ({e})"), exit, stable);
                                }
                            }
                            self.set(Phase::Ready, "serving".into());
                        }
                        Err(e) => {
                            failed_probes += 1;
                            tracing::warn!("engine health probe failed ({failed_probes}): {e}");
                            if failed_probes >= PROBE_FAILURES {
                                // Wedged: killed outright, since a stopped or hung process may
                                // never act on SIGTERM and the box should answer again soon.
                                let exit = running.kill().await;
                                let stable = ready.elapsed() >= STABLE_AFTER;
                                return self.failed(format!("stopped answering ({e})"), exit, stable);
                            }
                            probes.reset_immediately();
                        }
                    }
                }
            }
        }
    }

    fn record(&mut self, health: &Health) {
        let speeds = health.speeds;
        if speeds.prefill_tokens_per_second.is_some() {
            self.status.prefill_tokens_per_second = speeds.prefill_tokens_per_second;
        }
        if speeds.decode_tokens_per_second.is_some() {
            self.status.decode_tokens_per_second = speeds.decode_tokens_per_second;
        }
        self.status.tool_calls = Some(health.tool_calls);
    }

    fn failed(&mut self, reason: String, exit: String, stable: bool) -> Outcome {
        self.ended(exit);
        Outcome::Failed { reason, stable }
    }

    /// Weights that fail verification are not served a moment longer: the engine is stopped.
    async fn refuse(&mut self, running: Running, why: String) -> Outcome {
        self.ended(running.stop(STOP_GRACE).await);
        Outcome::Refused(why)
    }

    async fn switch_engine(&mut self, running: Running) -> Outcome {
        tracing::info!("stopping the engine to run another model");
        self.ended(running.stop(STOP_GRACE).await);
        Outcome::Switched
    }

    async fn shutdown_engine(&mut self, running: Running) -> Outcome {
        tracing::info!("stopping the engine");
        self.ended(running.stop(STOP_GRACE).await);
        Outcome::Shutdown
    }

    /// The process is gone: how it ended, and no pid or uptime any more.
    fn ended(&mut self, exit: String) {
        self.status.last_exit = Some(exit);
        self.status.pid = None;
        self.status.ready_unix = None;
        self.status.access = None;
    }

    /// Publishes a new state: to the daemon, and to the runtime file `status` reads.
    fn set(&mut self, state: Phase, reason: String) {
        self.status.state = state;
        self.status.reason = reason;
        self.status.recent_log = self.logs.recent(STATUS_LOG_LINES);
        *self.heartbeat.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        if let Err(e) = self.status.publish(&self.board) {
            tracing::warn!("cannot publish the engine state: {e}");
        }
        self.publish_to.send_replace(self.status.clone());
    }

    /// Waits, failing, for shutdown (true) or another model to run (false).
    async fn idle_until_shutdown_or_switch(&mut self) -> bool {
        let mut switch = self.switch.clone();
        tokio::select! {
            _ = stopped(&mut self.shutdown) => {}
            () = switched(&mut switch) => return false,
        }
        let reason = self.status.reason.clone();
        self.set(
            Phase::Stopped,
            format!("stopped with the supervisor; {reason}"),
        );
        true
    }

    /// Waits for the next gate retry, or for the daemon's re-verification to pass; true when
    /// shutdown came first.
    async fn wait_to_gate_again(&mut self) -> bool {
        let mut model = self.model.clone();
        let passed = async {
            while model.changed().await.is_ok() {
                let checked = model.borrow_and_update();
                if checked.model == self.config.model.id && checked.verdict.is_ok() {
                    return;
                }
            }
            std::future::pending::<()>().await;
        };
        let mut switch = self.switch.clone();
        tokio::select! {
            _ = tokio::time::sleep(GATE_RETRY) => false,
            () = passed => false,
            () = switched(&mut switch) => false,
            _ = stopped(&mut self.shutdown) => true,
        }
    }

    /// Sleeps; true when shutdown came first.
    async fn sleep_or_shutdown(&mut self, pause: Duration) -> bool {
        let mut switch = self.switch.clone();
        tokio::select! {
            _ = tokio::time::sleep(pause) => false,
            () = switched(&mut switch) => false,
            _ = stopped(&mut self.shutdown) => true,
        }
    }
}

/// Runs a blocking probe off the runtime thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(format!("the probe crashed: {e}")))
}

/// Resolves with why, once the daemon reports that the model failed re-verification; never
/// when the daemon's handle is gone.
async fn refused(model: &mut watch::Receiver<Checked>, serving: &str) -> String {
    while model.changed().await.is_ok() {
        let checked = model.borrow_and_update();
        if let (true, Err(why)) = (checked.model == serving, &checked.verdict) {
            return why.clone();
        }
    }
    std::future::pending().await
}

/// Resolves once another model is asked for (never when the daemon's handle is gone). The
/// receiver is a clone: the loop's own one marks the request seen when it acts on it.
async fn switched(switch: &mut watch::Receiver<Wanted>) {
    if switch.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves once shutdown is asked for (or the daemon's handle is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
