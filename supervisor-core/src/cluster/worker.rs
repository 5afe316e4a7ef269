//! A worker: the link up, then `ggml-rpc-server` bound to the link address only, in the
//! engine's cgroup, restarted with the engine's backoff when it dies, stopped with the daemon.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{ClusterStatus, keys, link, peers};
use crate::board::Board;
use crate::config::Config;
use crate::config::cluster::Cluster;
use crate::engine::local::{Access, Endpoint};
use crate::engine::{self, Launch, LogRing};

/// The RPC server's tensor cache (`-c`): tensors the head sent once are loaded from here.
pub const CACHE_DIR: &str = "/var/lib/appliance/cluster/rpc-cache";
/// How long the RPC server gets to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// A run this long was not part of a crash loop: the backoff starts over.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long it gets to listen after it starts.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The RPC server's command line.
pub fn launch(board: &Board, config: &Config, cluster: &Cluster) -> Launch {
    let threads = match config.engine.threads.get() {
        0 => crate::config::available_cpus(),
        n => n,
    };
    let port = cluster.rpc_port.get();
    let args: Vec<OsString> = [
        "--host".to_string(),
        cluster.address.ip.to_string(),
        "--port".to_string(),
        port.to_string(),
        "--threads".to_string(),
        threads.to_string(),
        "--cache".to_string(),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    Launch {
        program: super::rpc_server(config),
        args,
        port,
        environment: vec![(
            "LLAMA_CACHE".to_string(),
            board.path(CACHE_DIR).to_string_lossy().into_owned(),
        )],
        // Nothing is asked of it over HTTP; readiness is its port taking connections.
        access: Access {
            endpoint: Endpoint::Loopback(port),
            key: None,
        },
    }
}

/// How often the peers file is looked at for members `appliance fleet enroll` sent.
const PEERS_CHECK: Duration = Duration::from_secs(5);

/// How one run of the RPC server ended.
enum End {
    Shutdown,
    /// The members changed: the link is brought up again and the server restarted.
    PeersChanged(Box<Cluster>),
    Failed(String),
}

/// Runs the worker until `shutdown`, publishing its state.
pub async fn run(
    board: Board,
    config: Config,
    configured: Cluster,
    logs: Arc<LogRing>,
    mut shutdown: watch::Receiver<bool>,
    status: watch::Sender<ClusterStatus>,
) {
    let public_key = keys::public_key(&board).ok();
    let memory_mib = Some(super::budget(&board, &config, &configured) >> 20);
    let publish = |cluster: &Cluster, state: &str, reason: String| {
        let members = super::members(cluster, &[], |_| None);
        status.send_replace(ClusterStatus {
            name: cluster.name.to_string(),
            role: "worker".into(),
            state: state.into(),
            reason,
            public_key: public_key.clone(),
            memory_mib,
            members,
            layers: Vec::new(),
            decode_tokens_per_second: None,
        });
    };
    let mut cluster = match peers::current(&board, &configured) {
        Ok(cluster) => cluster,
        Err(e) => {
            tracing::error!("cluster worker: {e}");
            configured.clone()
        }
    };
    let mut failures = 0u32;
    loop {
        let started = std::time::Instant::now();
        let end = serve_once(
            &board,
            &config,
            &configured,
            &cluster,
            &logs,
            &mut shutdown,
            &|state, reason| publish(&cluster, state, reason),
        )
        .await;
        let reason = match end {
            End::Shutdown => return,
            End::PeersChanged(now) => {
                tracing::info!("cluster worker: the members changed; bringing the link up again");
                cluster = *now;
                failures = 0;
                continue;
            }
            End::Failed(reason) => reason,
        };
        // A server that ran a good while was not part of a crash loop.
        failures = if started.elapsed() >= STABLE_AFTER {
            1
        } else {
            failures + 1
        };
        let pause = Duration::from_millis(
            config
                .engine
                .restart_backoff_ms
                .get()
                .saturating_mul(1 << (failures - 1).min(16))
                .min(60_000),
        );
        tracing::warn!(
            "cluster worker: {reason}; again in {} ms",
            pause.as_millis()
        );
        publish(
            &cluster,
            "failing",
            format!("{reason}; again in {} ms", pause.as_millis()),
        );
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            () = stopped(&mut shutdown) => return,
        }
        if let Ok(now) = peers::current(&board, &configured) {
            cluster = now;
        }
    }
}

/// Resolves when the peers file names other members than `cluster` does.
async fn peers_changed(board: &Board, configured: &Cluster, cluster: &Cluster) -> Box<Cluster> {
    loop {
        tokio::time::sleep(PEERS_CHECK).await;
        let (b, c) = (board.clone(), configured.clone());
        let read = tokio::task::spawn_blocking(move || peers::current(&b, &c)).await;
        if let Ok(Ok(now)) = read
            && now != *cluster
        {
            return Box::new(now);
        }
    }
}

/// One run of the RPC server, until shutdown, new members or its failure.
async fn serve_once(
    board: &Board,
    config: &Config,
    configured: &Cluster,
    cluster: &Cluster,
    logs: &Arc<LogRing>,
    shutdown: &mut watch::Receiver<bool>,
    publish: &(dyn Fn(&str, String) + Sync),
) -> End {
    let (b, c) = (board.clone(), cluster.clone());
    let up = tokio::task::spawn_blocking(move || {
        b.create_private_dir(CACHE_DIR).map_err(|e| e.to_string())?;
        link::up(&b, &c)
    })
    .await
    .unwrap_or_else(|e| Err(format!("bringing the link up crashed: {e}")));
    if let Err(e) = up {
        return End::Failed(e);
    }
    let launch = launch(board, config, cluster);
    let mut running = match engine::spawn(board, config, &launch, logs).await {
        Ok(running) => running,
        Err(e) => return End::Failed(e),
    };
    let address = SocketAddr::from((cluster.address.ip, launch.port));
    let listening = async {
        loop {
            if tokio::net::TcpStream::connect(address).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        exit = running.exited() => return End::Failed(format!("the RPC server exited as it started ({exit})")),
        () = stopped(shutdown) => {
            running.stop(STOP_GRACE).await;
            return End::Shutdown;
        }
        listened = tokio::time::timeout(LISTEN_TIMEOUT, listening) => {
            if listened.is_err() {
                running.kill().await;
                return End::Failed(format!("the RPC server did not listen on {address} within {} s", LISTEN_TIMEOUT.as_secs()));
            }
        }
    }
    tracing::info!("cluster worker: RPC server on {address}");
    publish("up", format!("holding layers for the head on {address}"));
    tokio::select! {
        exit = running.exited() => End::Failed(format!("the RPC server exited ({exit})")),
        () = stopped(shutdown) => {
            running.stop(STOP_GRACE).await;
            End::Shutdown
        }
        now = peers_changed(board, configured, cluster) => {
            running.stop(STOP_GRACE).await;
            End::PeersChanged(now)
        }
    }
}

/// Resolves once shutdown is asked for (or the daemon is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
