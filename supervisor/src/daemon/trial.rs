//! The health check of an update's trial boot: the new slot is kept only once its tuning is
//! verified, its weights pass the gate, its engine answers a completion and its dashboard
//! answers, all before the deadline; otherwise the daemon rolls it back and reboots, and the
//! firmware boots the old slot.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use supervisor_core::board::Board;
use supervisor_core::config::Config;
use supervisor_core::engine::{self, Phase};
use supervisor_core::tune::State;
use supervisor_core::update::slot::Slot;

/// Pause between looks while something is not healthy yet.
const RETRY: Duration = Duration::from_secs(2);

/// One look at the new slot. Only the last line of [`look`] says `Healthy`, after every check
/// has passed: each early return is a reason not to commit, so a check skipped by a later
/// change leaves the slot uncommitted rather than committed unverified.
enum Health {
    /// Every check passed: the slot may be committed.
    Healthy,
    /// Not healthy yet; waiting may change that.
    Pending(String),
    /// Not healthy, and it will not become so in this boot.
    Failed(String),
}

/// Looks at tuning, the model, the engine and the dashboard, in that order.
async fn look(
    config: &Config,
    failing_before: &[String],
    tuned: &watch::Sender<dashboard::Tuned>,
    engine: &engine::Handle,
) -> Health {
    let status = engine.status();
    // An engine the supervision gave up on will not come back in this boot.
    if status.state == Phase::Failing {
        return Health::Failed(format!("the engine is failing: {}", status.reason));
    }
    let (failed, model) = {
        let t = tuned.borrow();
        let failed = t
            .steps
            .iter()
            .find(|r| r.state == State::Failed && !failing_before.contains(&r.name))
            .map(|r| format!("tuning step {} failed: {}", r.name, r.reason));
        (failed, t.model.clone())
    };
    if let Some(why) = failed {
        return Health::Pending(why);
    }
    if model.state != "verified" {
        return Health::Pending(format!("the model is {}: {}", model.state, model.reason));
    }
    if status.state != Phase::Ready {
        return Health::Pending(format!("the engine is not serving: {}", status.reason));
    }
    // Never healthy by default: without the way in to this engine there is no proof.
    let Some(access) = status.access else {
        return Health::Pending("the way in to the engine is not known yet".into());
    };
    let answered = tokio::task::spawn_blocking(move || {
        engine::probe::complete_one_token(&access, Duration::from_secs(60))
    })
    .await
    .unwrap_or_else(|e| Err(format!("the completion crashed: {e}")));
    match answered {
        Ok(engine::probe::Completion::Generated) => {}
        Ok(engine::probe::Completion::QueueFull) => {
            return Health::Pending("the engine's queue is full; no completion yet".into());
        }
        Err(e) => {
            return Health::Pending(format!("the engine did not answer a completion: {e}"));
        }
    }
    match dashboard_answers(config).await {
        Ok(()) => Health::Healthy,
        Err(why) => Health::Pending(why),
    }
}

/// What the trial ends in.
enum Verdict {
    /// Healthy before the deadline.
    Commit,
    /// Not, for the reason given.
    RollBack(String),
}

/// The dashboard answers HTTP on its plain port over loopback.
async fn dashboard_answers(config: &Config) -> Result<(), String> {
    let (bound, _) = dashboard::bind_address(&config.dashboard);
    let port = bound.port();
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(
                format!(
                    "GET /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Ok(Ok(head)) if head.starts_with(b"HTTP/1.1 ") => Ok(()),
        Ok(Ok(_)) => Err(format!("the dashboard on {address} does not answer HTTP")),
        Ok(Err(e)) => Err(format!("the dashboard on {address} does not answer: {e}")),
        Err(_) => Err(format!(
            "the dashboard on {address} did not answer within 10 s"
        )),
    }
}

/// Checks until healthy or `deadline`, then commits or rolls back (which reboots).
pub async fn check(
    board: &Board,
    config: &Config,
    slot: Slot,
    deadline: Instant,
    tuned: &watch::Sender<dashboard::Tuned>,
    engine: &engine::Handle,
) {
    let failing_before = {
        let (board, config) = (board.clone(), config.clone());
        tokio::task::spawn_blocking(move || supervisor_core::update::pending(&board, &config))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
            .map(|t| t.failing_before)
            .unwrap_or_default()
    };
    let verdict = loop {
        match look(config, &failing_before, tuned, engine).await {
            Health::Healthy => break Verdict::Commit,
            Health::Failed(why) => break Verdict::RollBack(why),
            Health::Pending(why) if Instant::now() >= deadline => {
                break Verdict::RollBack(format!(
                    "not healthy within {} s: {why}",
                    config.update.health_timeout_s.get(),
                ));
            }
            Health::Pending(why) => tracing::info!("update: slot {slot} not healthy yet: {why}"),
        }
        tokio::time::sleep(RETRY).await;
    };
    let (board, config) = (board.clone(), config.clone());
    let done = tokio::task::spawn_blocking(move || match verdict {
        Verdict::Commit => supervisor_core::update::commit(
            &board,
            &config,
            "tuning verified, weights verified, the engine answered a completion, the dashboard answered",
        ),
        Verdict::RollBack(why) => supervisor_core::update::roll_back(&board, &config, &why),
    })
    .await
    .unwrap_or_else(|e| Err(format!("the task crashed: {e}")));
    match done {
        Ok(message) => tracing::info!("update: {message}"),
        Err(e) => tracing::error!("update: {e}"),
    }
}
