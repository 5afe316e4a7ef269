//! `supervisor run`: the long-running daemon. It tunes the board, tells systemd it is ready,
//! launches and supervises the engine, feeds systemd's watchdog while the engine is healthy,
//! and re-verifies the tuned state on a schedule, repairing and logging drift (a governor
//! another service reset, a cgroup limit someone changed) and the model (weights that fail stop
//! the engine until they verify again). SIGTERM or SIGINT stop the engine
//! (SIGTERM, then SIGKILL) before the daemon exits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use supervisor_core::board::Board;
use supervisor_core::config::Config;
use supervisor_core::engine::{self, LogRing};
use supervisor_core::models;
use supervisor_core::tune::{self, Applier, Backend, Evaluate, State, StepReport};

mod trial;

/// Engine output lines kept in memory for the dashboard.
const ENGINE_LOG_LINES: usize = 500;

fn summary(reports: &[StepReport]) -> String {
    let count = |s: State| reports.iter().filter(|r| r.state == s).count();
    format!(
        "tuning: {} in place, {} applied, {} pending reboot, {} failed",
        count(State::InPlace),
        count(State::Applied),
        count(State::PendingReboot),
        count(State::Failed)
    )
}

fn notify(states: &[NotifyState]) {
    // Outside systemd there is no NOTIFY_SOCKET and this is a no-op.
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

/// The launch gate for the configured model, off the runtime thread (hashing takes a while):
/// the status line, and the verdict as `status` reports it.
async fn check_model(
    board: &Board,
    config: &Config,
    how: weights::gate::Reverify,
) -> (String, supervisor_core::model::ModelStatus) {
    let (board, config) = (board.clone(), config.clone());
    let id = config.model.id.clone();
    let result =
        tokio::task::spawn_blocking(move || supervisor_core::model::check(&board, &config, how))
            .await;
    let model = match &result {
        Ok(gate) => supervisor_core::model::ModelStatus::from_gate(&id, gate),
        Err(e) => supervisor_core::model::ModelStatus {
            id: id.clone(),
            state: "failed",
            path: None,
            draft: None,
            speculation: "ngram",
            reason: format!("model check crashed: {e}"),
        },
    };
    let line = match result {
        Ok(Ok(approved)) => {
            tracing::info!(model = %id, path = %approved.path.display(), "model verified ({})", approved.checked);
            format!("model {id} verified")
        }
        Ok(Err(e)) => {
            tracing::error!(model = %id, "model refused: {e}");
            format!("model {id} refused: {e}")
        }
        Err(e) => format!("model check crashed: {e}"),
    };
    (line, model)
}

/// For `status`; without it `status` still reports the board, only not in this pass's words.
/// A durable write, so off the runtime thread.
async fn publish_pass(board: &Board, reports: &[StepReport]) {
    let (board, reports) = (board.clone(), reports.to_vec());
    let published = tokio::task::spawn_blocking(move || tune::last_pass::publish(&board, &reports))
        .await
        .unwrap_or_else(|e| Err(format!("the task crashed: {e}")));
    if let Err(e) = published {
        tracing::warn!(
            "cannot publish the tuning pass to {}: {e}",
            tune::last_pass::LAST_PASS_FILE
        );
    }
}

/// Seconds between looks at an installed update waiting for its reboot window.
const UPDATE_CHECK_S: u64 = 60;
/// Seconds between looks for a model switch asked for.
const SWITCH_CHECK_S: u64 = 1;

/// `f(board, config)` on a blocking thread (it writes the data partition or walks the board).
async fn blocking<T: Send + 'static>(
    board: &Board,
    config: &Config,
    f: fn(&Board, &Config) -> Result<T, String>,
) -> Result<T, String> {
    let (board, config) = (board.clone(), config.clone());
    tokio::task::spawn_blocking(move || f(&board, &config))
        .await
        .unwrap_or_else(|e| Err(format!("the task crashed: {e}")))
}

/// Tells systemd the daemon is up (a reboot is under way) and waits to be stopped by it.
async fn wait_for_reboot(
    message: &str,
    terminate: &mut tokio::signal::unix::Signal,
    interrupt: &mut tokio::signal::unix::Signal,
) -> Result<(), String> {
    // systemd stops this service as part of the reboot.
    notify(&[NotifyState::Ready, NotifyState::Status(message)]);
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    Ok(())
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(board: &Board, config: &Config) -> Result<(), String> {
    let backend = Backend::resolve(config.tuning.engine.backend, board);
    let steps = tune::steps(config, backend);
    let applier = tune::applier_for(board, backend).await;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;

    let started = tokio::time::Instant::now();
    // Before anything else: this boot may be an update's trial (checked once the daemon is
    // up), the fallback after one, or an overclock trial to check or the fallback after one.
    let trial = match blocking(board, config, supervisor_core::update::on_boot).await {
        Ok(supervisor_core::update::Boot::Trial(slot, left)) => {
            tracing::info!("update: this boot tries slot {slot}; checking it ({left} s left)");
            Some((slot, left))
        }
        Ok(supervisor_core::update::Boot::Normal(message)) => {
            tracing::info!("update: {message}");
            None
        }
        Ok(supervisor_core::update::Boot::Rebooting(message)) => {
            tracing::error!("update: {message}");
            return wait_for_reboot(&message, &mut terminate, &mut interrupt).await;
        }
        Err(e) => {
            tracing::error!("update: {e}");
            None
        }
    };
    // A check takes minutes, so systemd's start timeout is extended.
    let overclock = {
        let (board, config) = (board.clone(), config.clone());
        tokio::task::spawn_blocking(move || {
            if trial.is_some() {
                return Ok(supervisor_core::overclock::Outcome::Continue(
                    "not checked in an update's trial boot".into(),
                ));
            }
            supervisor_core::overclock::on_boot(&board, &config)
        })
    };
    tokio::pin!(overclock);
    let mut extend = tokio::time::interval(Duration::from_secs(10));
    let outcome = loop {
        tokio::select! {
            _ = terminate.recv() => {
                supervisor_core::overclock::request_shutdown();
                return Ok(());
            }
            _ = interrupt.recv() => {
                supervisor_core::overclock::request_shutdown();
                return Ok(());
            }
            _ = extend.tick() => notify(&[NotifyState::ExtendTimeoutUsec(30_000_000)]),
            done = &mut overclock => break done.map_err(|e| format!("overclock boot check crashed: {e}"))?,
        }
    };
    match outcome {
        Ok(supervisor_core::overclock::Outcome::Continue(message)) => {
            tracing::info!("overclock: {message}")
        }
        Ok(supervisor_core::overclock::Outcome::Rebooting(message)) => {
            return wait_for_reboot(&message, &mut terminate, &mut interrupt).await;
        }
        Ok(supervisor_core::overclock::Outcome::Stopped(message)) => {
            tracing::error!("overclock: {message}")
        }
        Err(e) => tracing::error!("overclock: {e}"),
    }

    let reports = tune::apply(board, &steps, &applier, false).await;
    publish_pass(board, &reports).await;
    match blocking(board, config, models::on_start).await {
        Ok(Some(message)) => tracing::warn!("model switch: {message}"),
        Ok(None) => {}
        Err(e) => tracing::error!("model switch: {e}"),
    }
    let (model, verdict) =
        check_model(board, config, supervisor_core::model::reverify(config)).await;
    let status = format!("{}; {model}", summary(&reports));
    tracing::info!("{status}");
    notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
    // The engine is launched after tuning, so it starts inside its limits; the supervision
    // task runs the gate again right before every launch.
    let logs = Arc::new(LogRing::new(ENGINE_LOG_LINES));
    let engine = engine::supervise(
        board.clone(),
        config.clone(),
        Arc::clone(&logs),
        supervisor_core::cluster::initial_serve(config.cluster.as_ref()),
    );
    // This box's part in a cluster, if it has one: it decides what the engine's supervision
    // serves (the cluster's model, the box's own, or nothing).
    let mut cluster =
        supervisor_core::cluster::start(board, config, engine.subscribe(), Arc::clone(&logs));
    let (tuned, tuned_rx) = watch::channel(dashboard::Tuned {
        steps: reports,
        model: verdict,
    });
    let dashboard = dashboard::start(dashboard::Sources {
        board: board.clone(),
        config: config.clone(),
        tuned: tuned_rx,
        engine: engine.subscribe(),
        logs,
    });

    // systemd expects a ping within WatchdogSec; ping at half of it.
    let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
    let mut watchdog_tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    let reverify = config.daemon.reverify_interval_s.get();
    let mut reverify_tick = tokio::time::interval(Duration::from_secs(reverify.max(1)));
    // A pass that outlasts the interval is not followed by a burst of catch-up passes.
    reverify_tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    reverify_tick.tick().await;
    // The re-verification under way: polled beside the signals and the watchdog rather than
    // awaited in their place, so a slow one delays neither, and no second one starts meanwhile.
    let mut pass: Option<Pin<Box<dyn Future<Output = ()> + '_>>> = None;
    let mut clock_tick =
        tokio::time::interval(Duration::from_secs(supervisor_core::clock::SAVE_INTERVAL_S));
    // The trial boot's health check, then an installed update's reboot when its window opens.
    let mut trial_check: Option<Pin<Box<dyn Future<Output = ()> + '_>>> =
        trial.map(|(slot, left)| {
            let deadline = started + Duration::from_secs(left);
            Box::pin(trial::check(board, config, slot, deadline, &tuned, &engine))
                as Pin<Box<dyn Future<Output = ()> + '_>>
        });
    let mut update_tick = tokio::time::interval(Duration::from_secs(UPDATE_CHECK_S));
    // The configuration with the model that runs now: a committed switch changes it.
    let mut live = config.clone();
    let mut switch_tick = tokio::time::interval(Duration::from_secs(SWITCH_CHECK_S));
    let mut switch: Option<Pin<Box<dyn Future<Output = models::switch::Switch> + '_>>> = None;

    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            serve = async {
                if let Some(c) = cluster.as_mut()
                    && c.serve.changed().await.is_ok()
                {
                    return c.serve.borrow_and_update().clone();
                }
                std::future::pending().await
            } => engine.serve(serve),
            _ = watchdog_tick.tick(), if watchdog.is_some() => {
                if engine.watchdog_ok() {
                    notify(&[NotifyState::Watchdog]);
                } else {
                    tracing::error!("the engine has not passed a health probe for too long; not feeding the watchdog");
                }
            }
            _ = clock_tick.tick() => {
                let board = board.clone();
                let recorded = tokio::task::spawn_blocking(move || {
                    supervisor_core::clock::record(&board, supervisor_core::clock::SAVE_INTERVAL_S)
                })
                .await;
                if let Ok(Err(e)) = recorded {
                    tracing::warn!("recording the time on the data partition: {e}");
                }
            }
            // Not while a switch runs: a verdict on the model before would reach the new one.
            _ = reverify_tick.tick(), if reverify > 0 && pass.is_none() && switch.is_none() => {
                pass = Some(Box::pin(reverify_pass(board, live.clone(), &steps, &applier, &tuned, &engine)));
            }
            // A switch asked for (the dashboard or `supervisor model use` wrote it), taken up
            // when no other switch, no update trial and no re-verification is under way.
            _ = switch_tick.tick(), if switch.is_none() && trial_check.is_none() && pass.is_none() => {
                let (b, c, from) = (board.clone(), live.clone(), live.model.id.clone());
                let started = tokio::task::spawn_blocking(move || models::selection::start(&b, &c, &from))
                    .await
                    .unwrap_or_else(|e| Err(format!("the task crashed: {e}")));
                match started {
                    Ok(Some(switching)) => {
                        switch = Some(Box::pin(models::switch::run(board, live.clone(), &engine, switching)));
                    }
                    Ok(None) => {}
                    Err(e) => tracing::error!("model switch: {e}"),
                }
            }
            outcome = async {
                match switch.as_mut() {
                    Some(running) => running.await,
                    None => std::future::pending().await,
                }
            }, if switch.is_some() => {
                switch = None;
                if outcome.result == models::selection::COMMITTED {
                    live.model.id = outcome.to;
                }
                let (_, verdict) = check_model(board, &live, supervisor_core::model::between_boots(&live)).await;
                tuned.send_modify(|t| t.model = verdict);
            }
            () = async {
                match pass.as_mut() {
                    Some(running) => running.await,
                    None => std::future::pending().await,
                }
            }, if pass.is_some() => pass = None,
            () = async {
                match trial_check.as_mut() {
                    Some(running) => running.await,
                    None => std::future::pending().await,
                }
            }, if trial_check.is_some() => trial_check = None,
            _ = update_tick.tick(), if trial_check.is_none() => {
                match blocking(board, config, supervisor_core::update::reboot_when_due).await {
                    Ok(Some(message)) => tracing::info!("update: {message}"),
                    Ok(None) => {}
                    Err(e) => tracing::error!("update: {e}"),
                }
            }
        }
    }
    // Dropped between two board calls: every write it made is whole, and the next start tunes.
    drop(pass);
    drop(trial_check);
    // A switch cut off here is rolled back at the next start.
    drop(switch);
    tracing::info!("stopping");
    notify(&[NotifyState::Stopping]);
    dashboard.stop();
    engine.stop().await;
    if let Some(cluster) = cluster {
        cluster.stop().await;
    }
    Ok(())
}

/// One re-verification: the tuned state re-applied (drift repaired and logged), the model
/// checked, both published. All its board work runs on blocking threads.
async fn reverify_pass(
    board: &Board,
    config: Config,
    steps: &[Arc<dyn Evaluate>],
    applier: &Applier<'_>,
    tuned: &watch::Sender<dashboard::Tuned>,
    engine: &engine::Handle,
) {
    let reports = tune::apply(board, steps, applier, false).await;
    publish_pass(board, &reports).await;
    // Together with the file, not after the model check: `status` and the dashboard
    // must not tell different passes apart while the model is hashed.
    tuned.send_modify(|t| t.steps = reports.clone());
    for drifted in reports.iter().filter(|r| r.state == State::Applied) {
        tracing::warn!(step = %drifted.name, "tuned state had drifted and was restored: {}", drifted.reason);
    }
    // The model served now: the configured one, or a cluster's as its head.
    let mut config = config;
    config.model.id = engine.status().model_id;
    let (model, verdict) = check_model(
        board,
        &config,
        supervisor_core::model::between_boots(&config),
    )
    .await;
    // Only verified weights run, also while running: a failed check stops the engine now,
    // a passing one lets a stopped engine relaunch (through the gate) without waiting.
    engine.model_checked(
        &config.model.id,
        if verdict.state == "verified" {
            Ok(())
        } else {
            Err(verdict.reason.clone())
        },
    );
    let e = engine.status();
    let status = format!("{}; {model}; engine {}", summary(&reports), e.reason);
    notify(&[NotifyState::Status(&status)]);
    tuned.send_modify(|t| t.model = verdict);
}
