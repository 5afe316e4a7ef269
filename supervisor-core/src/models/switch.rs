//! A switch, as the daemon runs it: the new model must pass the launch gate, start, become
//! ready and answer a one-token completion within the engine's start deadline; then the
//! switch commits. Anything else (it does not verify, exits, never becomes healthy, fails its
//! probe) puts the previous model back on by itself, and the history says why.

use std::time::Duration;

use tokio::sync::watch;
pub use wire::models::Switch;

use super::selection::{self, COMMITTED, REFUSED, ROLLED_BACK, Switching};
use crate::board::Board;
use crate::config::Config;
use crate::engine::{self, EngineStatus, Phase, probe};

/// How the wait for a model's engine ended.
enum Proof {
    /// Ready, and it answered the probe.
    Healthy,
    /// Why not.
    Failed(String),
}

/// Runs `switching` on the engine `handle` supervises (running `switching.from` now); its
/// outcome, also recorded in the selection (a failure to record it is logged: the engine runs
/// what the outcome says either way, and the next start reads the selection afresh).
pub async fn run(
    board: &Board,
    config: Config,
    handle: &engine::Handle,
    switching: Switching,
) -> Switch {
    let config = &config;
    let to = switching.request.to.clone();
    let from = switching.from.clone();
    let serving = handle.serving();
    let (result, reason) = match gate(board, config, &to).await {
        // Its own model is not what it serves: a switch could not be proven now.
        _ if matches!(serving, engine::Serve::Head(_)) => (
            REFUSED,
            format!(
                "not tried: this box serves its cluster's model as the head; switch its own model while it serves alone, or change [model] id; {from} stays its own model"
            ),
        ),
        Err(why) => (REFUSED, format!("not tried: {why}; {from} keeps running")),
        Ok(()) => {
            tracing::info!(
                request = switching.request.request,
                "model switch: {from} → {to}"
            );
            handle.use_model(&to);
            match prove(config, handle.subscribe(), &to).await {
                Proof::Healthy => (COMMITTED, format!("{to} is serving")),
                Proof::Failed(why) => {
                    tracing::error!("model switch to {to} failed: {why}; back to {from}");
                    handle.use_model(&from);
                    let back = match prove(config, handle.subscribe(), &from).await {
                        Proof::Healthy => format!("{from} is serving again"),
                        Proof::Failed(e) => format!("{from} is back but not healthy yet: {e}"),
                    };
                    (ROLLED_BACK, format!("{to} {why}; {back}"))
                }
            }
        }
    };
    let now = board.now_unix();
    let recorded = {
        let (board, config, switching, reason) = (
            board.clone(),
            config.clone(),
            switching.clone(),
            reason.clone(),
        );
        tokio::task::spawn_blocking(move || {
            selection::update(&board, &config, |s| {
                s.finish(&switching, result, reason, now);
                Ok(())
            })
        })
        .await
        .unwrap_or_else(|e| Err(format!("the task crashed: {e}")))
    };
    if let Err(e) = recorded {
        tracing::error!("recording the model switch: {e}");
    }
    tracing::info!(
        request = switching.request.request,
        "model switch {result}: {reason}"
    );
    Switch {
        request: switching.request.request,
        to,
        from: Some(from),
        result: result.to_string(),
        reason,
        ended_unix: now,
    }
}

/// The launch gate on model `id`, before the running engine is stopped for it.
async fn gate(board: &Board, config: &Config, id: &str) -> Result<(), String> {
    let (board, mut config) = (board.clone(), config.clone());
    config.model.id = id.to_string();
    let how = crate::model::between_boots(&config);
    tokio::task::spawn_blocking(move || crate::model::check(&board, &config, how))
        .await
        .map_err(|e| format!("the model check crashed: {e}"))?
        .map(|_| ())
        .map_err(|e| format!("model {id} does not pass the launch gate: {e}"))
}

/// Waits for the engine to serve model `id` and answer a one-token completion, within the
/// engine's start deadline and one probe's.
async fn prove(config: &Config, mut states: watch::Receiver<EngineStatus>, id: &str) -> Proof {
    let e = &config.engine;
    let probe_timeout = Duration::from_millis(e.health_timeout_ms.get());
    let deadline = Duration::from_secs(e.start_timeout_s.get()) + probe_timeout;
    let waited = tokio::time::timeout(deadline, async {
        loop {
            let status = states.borrow_and_update().clone();
            if status.model_id == id {
                match status.state {
                    Phase::Ready => {
                        if let Some(access) = status.access.clone() {
                            let probed = tokio::task::spawn_blocking(move || {
                                probe::check(&access, probe_timeout)
                            })
                            .await;
                            return match probed {
                                Ok(Ok(_)) => Proof::Healthy,
                                Ok(Err(e)) => Proof::Failed(format!("failed its probe: {e}")),
                                Err(e) => Proof::Failed(format!("its probe crashed: {e}")),
                            };
                        }
                    }
                    Phase::Blocked | Phase::BackingOff | Phase::Failing => {
                        return Proof::Failed(status.reason);
                    }
                    Phase::Starting | Phase::Stopped => {}
                }
            }
            if states.changed().await.is_err() {
                return Proof::Failed("the engine's supervision ended".into());
            }
        }
    })
    .await;
    waited.unwrap_or_else(|_| {
        Proof::Failed(format!(
            "did not become healthy within {} s",
            deadline.as_secs()
        ))
    })
}
