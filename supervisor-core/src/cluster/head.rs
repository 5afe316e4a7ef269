//! The head: the link up, then every `check_interval_s` a look at each worker's RPC server over
//! the link. While every worker answers, the engine's supervision serves the cluster's model
//! ([`Serve::Head`]); once one does not, or the cluster's server keeps failing, it serves the
//! box's own model alone (or nothing, with `fallback = "none"`) and the state is `degraded`
//! with the reason, until every worker has answered two checks in a row again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::split::Member;
use super::{ClusterStatus, MemberStatus, keys, link};
use crate::board::Board;
use crate::config::Config;
use crate::config::cluster::{Cluster, Fallback, Role};
use crate::engine::{ClusterHead, EngineStatus, Phase, Serve};

/// How long a worker's RPC port gets to take a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Checks in a row every worker must pass before a degraded cluster is served again.
const WHOLE_AGAIN_AFTER: u32 = 2;
/// How long the cluster's server is not tried again after it kept failing.
const FAILING_PAUSE: Duration = Duration::from_secs(60);

/// The cluster's server for the engine's supervision.
pub fn cluster_head(config: &Config, cluster: &Cluster) -> ClusterHead {
    let mib = |m: u64| m << 20;
    let mut members = vec![Member {
        name: "head".into(),
        budget: mib(cluster.memory_mib.get()),
    }];
    let mut workers = Vec::new();
    for peer in cluster.workers() {
        members.push(Member {
            name: peer.name.to_string(),
            budget: peer.memory_mib.map_or(0, |m| mib(m.get())),
        });
        workers.push(format!("{}:{}", peer.address, cluster.rpc_port.get()));
    }
    ClusterHead {
        model: cluster.model.clone().unwrap_or_default(),
        program: super::llama_server(config),
        members,
        workers,
    }
}

/// Whether each worker's RPC server takes a connection on the link: `Err` with why not.
async fn look(cluster: &Cluster) -> Vec<(String, Result<(), String>)> {
    let mut answers = Vec::new();
    for peer in cluster.workers() {
        let address = SocketAddr::from((peer.address, cluster.rpc_port.get()));
        let answer =
            match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
                .await
            {
                // Closed at once: the server serves one client at a time, and this is not one.
                Ok(Ok(_stream)) => Ok(()),
                Ok(Err(e)) => Err(format!("{address}: {e}")),
                Err(_) => Err(format!(
                    "{address}: no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )),
            };
        answers.push((peer.name.to_string(), answer));
    }
    answers
}

/// Runs the head's checks until `shutdown`, telling the engine's supervision what to serve.
pub async fn run(
    board: Board,
    config: Config,
    cluster: Cluster,
    engine: watch::Receiver<EngineStatus>,
    mut shutdown: watch::Receiver<bool>,
    serve: watch::Sender<Serve>,
    status: watch::Sender<ClusterStatus>,
) {
    let head = Arc::new(cluster_head(&config, &cluster));
    let public_key = keys::public_key(&board).ok();
    let fallback = |why: String| match cluster.fallback {
        Fallback::OwnModel => Serve::Alone,
        Fallback::None => Serve::Nothing(why),
    };
    let mut interval = tokio::time::interval(Duration::from_secs(cluster.check_interval_s.get()));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut link_up = false;
    let mut whole_checks = 0u32;
    let mut ever_served = false;
    let mut failing_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = stopped(&mut shutdown) => return,
        }
        let mut reason = None;
        if !link_up {
            let (b, c) = (board.clone(), cluster.clone());
            match tokio::task::spawn_blocking(move || link::up(&b, &c)).await {
                Ok(Ok(())) => link_up = true,
                Ok(Err(e)) => reason = Some(format!("the link is down: {e}")),
                Err(e) => reason = Some(format!("bringing the link up crashed: {e}")),
            }
        }
        let answers = look(&cluster).await;
        let missing: Vec<String> = answers
            .iter()
            .filter_map(|(name, a)| {
                a.as_ref()
                    .err()
                    .map(|e| format!("worker {name} does not answer ({e})"))
            })
            .collect();
        if reason.is_none() && !missing.is_empty() {
            reason = Some(missing.join("; "));
        }
        whole_checks = if reason.is_none() {
            whole_checks + 1
        } else {
            0
        };
        // The cluster's own server failing (a split that does not fit, a version mismatch)
        // is a reason to fall back too, for a while.
        let engine_now = engine.borrow().clone();
        if matches!(*serve.borrow(), Serve::Head(_)) && engine_now.state == Phase::Failing {
            failing_since = Some(Instant::now());
        }
        if let Some(since) = failing_since {
            if since.elapsed() < FAILING_PAUSE {
                reason.get_or_insert_with(|| {
                    format!("the cluster's server keeps failing: {}", engine_now.reason)
                });
            } else {
                failing_since = None;
            }
        }
        let needed = if ever_served { WHOLE_AGAIN_AFTER } else { 1 };
        let (state, why) = match &reason {
            None if whole_checks >= needed => {
                ever_served = true;
                serve.send_if_modified(|s| replace(s, Serve::Head(Arc::clone(&head))));
                (
                    "up",
                    format!("serving {} over {} workers", head.model, head.workers.len()),
                )
            }
            None => (
                "degraded",
                "every worker answers again; waiting for one more check".to_string(),
            ),
            Some(why) => {
                serve.send_if_modified(|s| {
                    replace(
                        s,
                        fallback(format!("cluster {} is degraded: {why}", cluster.name)),
                    )
                });
                ("degraded", why.clone())
            }
        };
        let now = weights::install::now_unix();
        let links = if link_up {
            link::peers(&cluster, now).unwrap_or_default()
        } else {
            Vec::new()
        };
        let members = cluster
            .peers
            .iter()
            .map(|p| MemberStatus {
                name: p.name.to_string(),
                role: match p.role {
                    Role::Head => "head".into(),
                    Role::Worker => "worker".into(),
                },
                address: p.address.to_string(),
                handshake_age_s: links
                    .iter()
                    .find(|l| l.address == p.address)
                    .and_then(|l| l.handshake_age_s),
                answers: answers
                    .iter()
                    .find(|(n, _)| n == p.name.as_str())
                    .map(|(_, a)| a.is_ok()),
            })
            .collect();
        let next = ClusterStatus {
            name: cluster.name.to_string(),
            role: "head".into(),
            state: state.into(),
            reason: why,
            public_key: public_key.clone(),
            members,
        };
        if *status.borrow() != next {
            if next.state != status.borrow().state {
                tracing::info!("cluster {}: {} ({})", cluster.name, next.state, next.reason);
            }
            status.send_replace(next);
        }
    }
}

/// Replaces `current` with `next`; whether that changed it.
fn replace(current: &mut Serve, next: Serve) -> bool {
    let changed = *current != next;
    *current = next;
    changed
}

/// Resolves once shutdown is asked for (or the daemon is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
