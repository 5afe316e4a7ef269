//! The head: the link up, then every `check_interval_s` a look at each worker's RPC server over
//! the link. While every worker answers, the engine's supervision serves the cluster's model
//! ([`Serve::Head`]); once one does not, or the cluster's server keeps failing, it serves the
//! box's own model alone (or nothing, with `fallback = "none"`) and the state is `degraded`
//! with the reason, until every worker has answered two checks in a row again.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::split::Member;
use super::{ClusterStatus, keys, link, peers};
use crate::board::Board;
use crate::config::Config;
use crate::config::cluster::{Cluster, Fallback};
use crate::engine::{ClusterHead, EngineStatus, Phase, Serve};

/// How long a worker's RPC port gets to take a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Checks in a row every worker must pass before a degraded cluster is served again.
const WHOLE_AGAIN_AFTER: u32 = 2;
/// How long the cluster's server is not tried again after it kept failing.
const FAILING_PAUSE: Duration = Duration::from_secs(60);

/// The cluster's server for the engine's supervision; `budget` is the head's own.
pub fn cluster_head(config: &Config, cluster: &Cluster, budget: u64) -> ClusterHead {
    let mib = |m: u64| m << 20;
    let mut members = vec![Member {
        name: "head".into(),
        budget,
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

/// How each worker is judged: its server busy with ours, or idle and asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Our `llama-server` runs and holds a connection to every worker: each must still have
    /// one (an RPC server serves one client at a time, so a new connection would only wait in
    /// its queue, and fill it).
    Held,
    /// Nothing of ours holds the workers: each must take a connection.
    Ask,
    /// Our server is starting: its own start (or failure) is the verdict.
    Wait,
}

/// The IPv4 connections this network namespace has established, by remote address
/// (`/proc/net/tcp`: the kernel prints each address's bytes as a native-endian word).
fn established() -> Result<Vec<SocketAddrV4>, String> {
    let text =
        std::fs::read_to_string("/proc/net/tcp").map_err(|e| format!("/proc/net/tcp: {e}"))?;
    Ok(parse_tcp(&text))
}

fn parse_tcp(text: &str) -> Vec<SocketAddrV4> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // State 01 is ESTABLISHED.
            if fields.get(3) != Some(&"01") {
                return None;
            }
            let (ip, port) = fields.get(2)?.split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            Some(SocketAddrV4::new(Ipv4Addr::from(ip.to_ne_bytes()), port))
        })
        .collect()
}

/// Whether each worker's RPC server answers on the link: `Err` with why not.
async fn look(cluster: &Cluster, how: Look) -> Vec<(String, Result<(), String>)> {
    let held = match how {
        Look::Held => Some(established()),
        Look::Ask | Look::Wait => None,
    };
    let mut answers = Vec::new();
    for peer in cluster.workers() {
        let v4 = SocketAddrV4::new(peer.address, cluster.rpc_port.get());
        let answer = match (&held, how) {
            (_, Look::Wait) => Ok(()),
            (Some(Ok(connections)), _) if connections.contains(&v4) => Ok(()),
            (Some(Ok(_)), _) => Err(format!("{v4}: the cluster's server lost its connection")),
            (Some(Err(e)), _) => Err(e.clone()),
            (None, _) => connect(SocketAddr::V4(v4)).await,
        };
        answers.push((peer.name.to_string(), answer));
    }
    answers
}

/// A connection to `address`, closed at once (an idle server takes it and sees it end).
async fn connect(address: SocketAddr) -> Result<(), String> {
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_stream)) => Ok(()),
        Ok(Err(e)) => Err(format!("{address}: {e}")),
        Err(_) => Err(format!(
            "{address}: no answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        )),
    }
}

/// Runs the head's checks until `shutdown`, telling the engine's supervision what to serve.
pub async fn run(
    board: Board,
    config: Config,
    configured: Cluster,
    engine: watch::Receiver<EngineStatus>,
    mut shutdown: watch::Receiver<bool>,
    serve: watch::Sender<Serve>,
    status: watch::Sender<ClusterStatus>,
) {
    let budget = super::budget(&board, &config, &configured);
    let mut cluster = configured.clone();
    let mut head = Arc::new(cluster_head(&config, &cluster, budget));
    let public_key = keys::public_key(&board).ok();
    let fallback = |why: String| match configured.fallback {
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
        // Members `appliance fleet enroll` sent since: the link again, a new split.
        let (b, c) = (board.clone(), configured.clone());
        match tokio::task::spawn_blocking(move || peers::current(&b, &c)).await {
            Ok(Ok(now)) if now != cluster => {
                tracing::info!("cluster {}: the members changed", cluster.name);
                cluster = now;
                head = Arc::new(cluster_head(&config, &cluster, budget));
                link_up = false;
                whole_checks = 0;
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => reason = Some(e),
            Err(e) => reason = Some(format!("reading the members crashed: {e}")),
        }
        if cluster.workers().next().is_none() {
            reason.get_or_insert_with(|| {
                "no workers known yet: `appliance fleet enroll` sends each member the others' keys".into()
            });
        }
        if !link_up {
            let (b, c) = (board.clone(), cluster.clone());
            match tokio::task::spawn_blocking(move || link::up(&b, &c)).await {
                Ok(Ok(())) => link_up = true,
                Ok(Err(e)) => reason = Some(format!("the link is down: {e}")),
                Err(e) => reason = Some(format!("bringing the link up crashed: {e}")),
            }
        }
        let engine_now = engine.borrow().clone();
        // The engine's state counts only once it is about the cluster's server.
        let ours = engine_now.model_id == head.model && engine_now.split.is_some();
        let how = match (&*serve.borrow(), engine_now.state) {
            (Serve::Head(_), _) if !ours => Look::Wait,
            (Serve::Head(_), Phase::Ready) => Look::Held,
            (Serve::Head(_), Phase::Starting) => Look::Wait,
            _ => Look::Ask,
        };
        let answers = look(&cluster, how).await;
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
        // (Blocked: the gate refused the cluster's model, e.g. it is not installed.)
        if matches!(*serve.borrow(), Serve::Head(_))
            && engine_now.model_id == head.model
            && matches!(engine_now.state, Phase::Failing | Phase::Blocked)
        {
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
        let members = super::members(&cluster, &links, |name| {
            answers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, a)| a.is_ok())
        });
        let next = ClusterStatus {
            name: cluster.name.to_string(),
            role: "head".into(),
            state: state.into(),
            reason: why,
            public_key: public_key.clone(),
            memory_mib: Some(budget >> 20),
            members,
            layers: Vec::new(),
            decode_tokens_per_second: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn established_connections_are_read_from_the_kernels_table() {
        // 10.77.0.1:40000 → 10.77.0.2:50052 established; one listening; one closing.
        let local = u32::from_ne_bytes([10, 77, 0, 1]);
        let remote = u32::from_ne_bytes([10, 77, 0, 2]);
        let text = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue\n\
             0: {local:08X}:9C40 {remote:08X}:C384 01 00000000:00000000\n\
             1: {local:08X}:1F90 00000000:0000 0A 00000000:00000000\n\
             2: {local:08X}:9C41 {remote:08X}:C384 08 00000000:00000000\n"
        );
        assert_eq!(
            parse_tcp(&text),
            vec![SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), 50052)]
        );
    }
}
