//! A worker: the link up, then `ggml-rpc-server` bound to the link address only, in the
//! engine's cgroup, restarted with the engine's backoff when it dies, stopped with the daemon.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{ClusterStatus, MemberStatus, keys, link};
use crate::board::Board;
use crate::config::Config;
use crate::config::cluster::Cluster;
use crate::engine::local::{Access, Endpoint};
use crate::engine::{self, Launch, LogRing};

/// The RPC server's tensor cache (`-c`): tensors the head sent once are loaded from here.
pub const CACHE_DIR: &str = "/var/lib/appliance/cluster/rpc-cache";
/// How long the RPC server gets to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);
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

/// Runs the worker until `shutdown`, publishing its state.
pub async fn run(
    board: Board,
    config: Config,
    cluster: Cluster,
    logs: Arc<LogRing>,
    mut shutdown: watch::Receiver<bool>,
    status: watch::Sender<ClusterStatus>,
) {
    let public_key = keys::public_key(&board).ok();
    let publish = |state: &str, reason: String| {
        let members = cluster
            .peers
            .iter()
            .map(|p| MemberStatus {
                name: p.name.to_string(),
                role: super::role_word(p.role).into(),
                address: p.address.to_string(),
                handshake_age_s: None,
                answers: None,
            })
            .collect();
        status.send_replace(ClusterStatus {
            name: cluster.name.to_string(),
            role: "worker".into(),
            state: state.into(),
            reason,
            public_key: public_key.clone(),
            members,
            layers: Vec::new(),
            decode_tokens_per_second: None,
        });
    };
    let mut failures = 0u32;
    loop {
        let outcome = serve_once(&board, &config, &cluster, &logs, &mut shutdown, &publish).await;
        let Err(reason) = outcome else { return };
        failures += 1;
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
            "failing",
            format!("{reason}; again in {} ms", pause.as_millis()),
        );
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// One run of the RPC server: `Ok` at shutdown, `Err` with why it ended otherwise.
async fn serve_once(
    board: &Board,
    config: &Config,
    cluster: &Cluster,
    logs: &Arc<LogRing>,
    shutdown: &mut watch::Receiver<bool>,
    publish: &(dyn Fn(&str, String) + Sync),
) -> Result<(), String> {
    let (b, c) = (board.clone(), cluster.clone());
    tokio::task::spawn_blocking(move || {
        b.create_private_dir(CACHE_DIR).map_err(|e| e.to_string())?;
        link::up(&b, &c)
    })
    .await
    .map_err(|e| format!("bringing the link up crashed: {e}"))??;
    let launch = launch(board, config, cluster);
    let mut running = engine::spawn(board, config, &launch, logs).await?;
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
        exit = running.exited() => return Err(format!("the RPC server exited as it started ({exit})")),
        () = stopped(shutdown) => {
            running.stop(STOP_GRACE).await;
            return Ok(());
        }
        listened = tokio::time::timeout(LISTEN_TIMEOUT, listening) => {
            if listened.is_err() {
                running.kill().await;
                return Err(format!("the RPC server did not listen on {address} within {} s", LISTEN_TIMEOUT.as_secs()));
            }
        }
    }
    tracing::info!("cluster worker: RPC server on {address}");
    publish("up", format!("holding layers for the head on {address}"));
    tokio::select! {
        exit = running.exited() => Err(format!("the RPC server exited ({exit})")),
        () = stopped(shutdown) => {
            running.stop(STOP_GRACE).await;
            Ok(())
        }
    }
}

/// Resolves once shutdown is asked for (or the daemon is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
