//! This box as a member of a cluster: several boxes serving one model too large for any of them,
//! on llama.cpp's RPC backend (Debian's `llama.cpp` and `ggml-rpc-server`, the same build on
//! every member), over a private WireGuard link ([`link`]).
//!
//! - A **worker** brings the link up and runs `ggml-rpc-server` bound to its link address, in
//!   the engine's cgroup, its tensor cache on the data partition, restarted when it dies
//!   ([`worker`]).
//! - The **head** brings the link up and checks its workers every `check_interval_s`. While
//!   all of them answer on the link, it serves the cluster's model as `llama-server --rpc`
//!   through the engine's supervision (the same gate, probe, restart and status), the layers
//!   split by [`split`]; while one is gone it serves its own model alone (or nothing), and goes
//!   back once they all answer again ([`head`]).

pub mod head;
pub mod keys;
pub mod link;
pub mod peers;
pub mod split;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::board::Board;
use crate::config::Config;
use crate::config::cluster::{Cluster, Fallback, Role};
use crate::engine::{EngineStatus, LogRing, Serve};

/// Debian's `llama-server`.
const LLAMA_SERVER: &str = "/usr/bin/llama-server";

/// The configured `llama-server`, else Debian's.
pub fn llama_server(config: &Config) -> PathBuf {
    config
        .cluster
        .as_ref()
        .and_then(|c| c.llama_server.clone())
        .map_or_else(|| PathBuf::from(LLAMA_SERVER), PathBuf::from)
}

/// The configured `ggml-rpc-server`, else Debian's (`llama.cpp-tools-extra`, off `PATH`).
pub fn rpc_server(config: &Config) -> PathBuf {
    config
        .cluster
        .as_ref()
        .and_then(|c| c.rpc_server.clone())
        .map_or_else(
            || {
                PathBuf::from(format!(
                    "/usr/libexec/{}-linux-gnu/llama/bin/ggml-rpc-server",
                    std::env::consts::ARCH
                ))
            },
            PathBuf::from,
        )
}

pub use wire::cluster::{Cluster as ClusterStatus, Member as MemberStatus};

/// Where the daemon publishes the cluster as this box sees it, for `status`.
pub const STATE_FILE: &str = "/run/appliance/cluster/state.json";

/// Writes `status` to [`STATE_FILE`] atomically.
pub fn publish(board: &Board, status: &ClusterStatus) -> Result<(), String> {
    let text = serde_json::to_vec_pretty(status).map_err(|e| e.to_string())?;
    board
        .create_dir_all("/run/appliance/cluster")
        .and_then(|()| board.replace_file(STATE_FILE, &text))
        .map_err(|e| e.to_string())
}

/// The cluster as the running daemon last published it, with the layers the head's server
/// holds and its decode speed from `engine`; `None` on a box that serves alone.
pub fn read(board: &Board, config: &Config, engine: &EngineStatus) -> Option<ClusterStatus> {
    let cluster = config.cluster.as_ref()?;
    let published = board
        .read_optional(STATE_FILE)
        .ok()
        .flatten()
        .and_then(|text| serde_json::from_str::<ClusterStatus>(&text).ok());
    let mut status = match published {
        Some(status) if engine.supervisor_pid.is_some() => status,
        _ => ClusterStatus {
            name: cluster.name.to_string(),
            role: role_word(cluster.role).into(),
            state: "stopped".into(),
            reason: "the supervisor daemon is not running".into(),
            public_key: keys::public_key_if_made(board),
            memory_mib: None,
            members: Vec::new(),
            layers: Vec::new(),
            decode_tokens_per_second: None,
        },
    };
    if let Some(split) = engine.split.as_ref().filter(|_| status.state == "up") {
        status.layers = split
            .shares
            .iter()
            .map(|s| wire::cluster::Share {
                member: s.member.clone(),
                first_layer: s.layers.start,
                layers: s.layers.len(),
                output: s.output,
                mib: s.bytes.div_ceil(1 << 20),
                budget_mib: s.budget >> 20,
            })
            .collect();
        status.decode_tokens_per_second = engine.decode_tokens_per_second;
    }
    Some(status)
}

/// What this box's share may take, in bytes (`memory_mib`, else the board's memory less the
/// tuning's reserve).
pub fn budget(board: &Board, config: &Config, cluster: &Cluster) -> u64 {
    cluster.budget(
        board.facts().memory_total_mib,
        config.tuning.engine.memory_reserve_mib.get(),
    )
}

/// The other members as `status` lists them: each one's last WireGuard handshake from
/// `links`, and whether it answered the head's last check (`answered`, by name).
fn members(
    cluster: &Cluster,
    links: &[link::PeerLink],
    answered: impl Fn(&str) -> Option<bool>,
) -> Vec<MemberStatus> {
    cluster
        .peers
        .iter()
        .map(|p| MemberStatus {
            name: p.name.to_string(),
            role: role_word(p.role).into(),
            address: p.address.to_string(),
            handshake_age_s: links
                .iter()
                .find(|l| l.address == p.address)
                .and_then(|l| l.handshake_age_s),
            answers: answered(p.name.as_str()),
        })
        .collect()
}

/// `head` or `worker`.
pub fn role_word(role: Role) -> &'static str {
    match role {
        Role::Head => "head",
        Role::Worker => "worker",
    }
}

/// The cluster's task on this box, for the daemon.
pub struct Running {
    /// What the box serves, as the cluster decides it (the daemon passes it to the engine's
    /// supervision).
    pub serve: watch::Receiver<Serve>,
    /// How the cluster looks from here.
    pub status: watch::Receiver<ClusterStatus>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops the task (a worker's RPC server with it) and waits for it.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        if let Err(e) = self.task.await {
            tracing::error!("the cluster task failed: {e}");
        }
    }
}

/// Starts this box's part in its cluster, if it has one; `engine` is the engine supervision's
/// state (the head falls back when the cluster's server keeps failing).
pub fn start(
    board: &Board,
    config: &Config,
    engine: watch::Receiver<EngineStatus>,
    logs: Arc<LogRing>,
) -> Option<Running> {
    let cluster = config.cluster.clone()?;
    let initial = ClusterStatus {
        name: cluster.name.to_string(),
        role: role_word(cluster.role).into(),
        state: "starting".into(),
        reason: "bringing the link up".into(),
        public_key: None,
        memory_mib: None,
        members: Vec::new(),
        layers: Vec::new(),
        decode_tokens_per_second: None,
    };
    let (status_tx, status) = watch::channel(initial);
    // Every change published for `status`, which reads it from the runtime file.
    let mut changes = status.clone();
    let publishing = board.clone();
    tokio::spawn(async move {
        loop {
            let now = changes.borrow_and_update().clone();
            let b = publishing.clone();
            let written = tokio::task::spawn_blocking(move || publish(&b, &now)).await;
            if let Ok(Err(e)) = written {
                tracing::warn!("cannot publish the cluster's state: {e}");
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (board, config) = (board.clone(), config.clone());
    let (serve_tx, serve) = watch::channel(initial_serve(config.cluster.as_ref()));
    let task = match cluster.role {
        Role::Worker => tokio::spawn(worker::run(
            board,
            config,
            cluster,
            logs,
            shutdown_rx,
            status_tx,
        )),
        Role::Head => tokio::spawn(head::run(
            board,
            config,
            cluster,
            engine,
            shutdown_rx,
            serve_tx.clone(),
            status_tx,
        )),
    };
    drop(serve_tx);
    Some(Running {
        serve,
        status,
        shutdown,
        task,
    })
}

/// What a box serves as it starts: alone without a cluster; nothing as a worker; as a head,
/// its fallback until its workers have answered once (so the API answers from the start).
pub fn initial_serve(cluster: Option<&Cluster>) -> Serve {
    let Some(cluster) = cluster else {
        return Serve::Alone;
    };
    match (cluster.role, cluster.fallback) {
        (Role::Worker, _) => Serve::Nothing(format!(
            "this box is a worker of cluster {}: it holds layers for the head and serves no model itself",
            cluster.name
        )),
        (Role::Head, Fallback::OwnModel) => Serve::Alone,
        (Role::Head, Fallback::None) => Serve::Nothing(format!(
            "cluster {} is starting; its workers have not answered yet",
            cluster.name
        )),
    }
}
