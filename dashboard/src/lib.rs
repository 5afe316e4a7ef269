//! The web dashboard `supervisor run` serves: the box's health at a glance, live, behind a
//! login. Server-rendered HTML, a little JS for the live updates and the chat box, assets
//! compiled into the binary. It reads what the daemon already knows (tuning reports, the
//! engine's state, the engine's log ring) and never blocks the daemon's own work.
//!
//! Routes: `GET /` (overview, or a redirect to `/login`), `GET /login`, `POST /login`,
//! `POST /logout`, `GET /events` (server-sent events), `POST /api/chat`, `GET /api/status`
//! and `GET /metrics` (the same document in Prometheus' text format; both by session or
//! `Authorization: Bearer TOKEN`), `GET /assets/*`.

pub mod auth;
pub mod charts;
mod chat;
mod cluster;
mod error;
pub mod fields;
mod listener;
pub mod live;
mod models;
pub mod pages;
mod routes;
mod update;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use supervisor_core::board::Board;
use supervisor_core::config::{Config, Dashboard};
use supervisor_core::engine::{EngineStatus, LogRing};
use supervisor_core::model::ModelStatus;
use supervisor_core::report::Status;
use supervisor_core::tune::StepReport;

pub use error::DashError;
pub use routes::{Group, ROUTES};

/// What the daemon last found when it tuned the board and checked the model.
#[derive(Debug, Clone)]
pub struct Tuned {
    /// The tuning steps' reports.
    pub steps: Vec<StepReport>,
    /// The launch gate's verdict on the model.
    pub model: ModelStatus,
}

/// What the dashboard reads from the daemon.
pub struct Sources {
    /// The board.
    pub board: Board,
    /// The configuration the daemon runs with.
    pub config: Config,
    /// The last tuning and model check.
    pub tuned: watch::Receiver<Tuned>,
    /// The engine's state.
    pub engine: watch::Receiver<EngineStatus>,
    /// The engine's output lines.
    pub logs: Arc<LogRing>,
}

/// Where to listen: the configured address with a password; without one, loopback on the same
/// port, with the reason to log when that differs from the configuration.
pub fn bind_address(config: &Dashboard) -> (SocketAddr, Option<String>) {
    let wanted = config.listen.get();
    if config.password_hash.is_set() || wanted.ip().is_loopback() {
        return (wanted, None);
    }
    let loopback = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), wanted.port());
    let why = format!(
        "dashboard: no [dashboard] password_hash is set, so it listens on {loopback} only instead of {wanted}; \
         set one (supervisor dashboard hash-password) to serve the network"
    );
    (loopback, Some(why))
}

/// Shared by every request.
pub struct App {
    sources: Sources,
    /// No password: loopback only, and the pages need no login.
    open: bool,
    bound: SocketAddr,
    /// Where HTTPS is served, when it is (provisioned, with a password): plain HTTP then
    /// answers only this box itself and redirects everyone else there.
    https: Option<SocketAddr>,
    sessions: auth::Sessions,
    limiter: auth::LoginLimiter,
    /// Password checks running at once: Argon2 takes ~19 MiB and a core each, so a burst of
    /// logins must not run them all in parallel.
    verifying: tokio::sync::Semaphore,
    history: Mutex<live::History>,
    updates: watch::Sender<Arc<String>>,
    /// Update bundles uploaded, and the install under way.
    uploads: Arc<update::Uploads>,
    /// Model chunks received at once: each is held in memory while it is checked, beside the
    /// engine's model.
    chunk_uploads: tokio::sync::Semaphore,
}

impl App {
    /// The status document as `supervisor status --json` prints it at the same moment: the
    /// steps observed now in the words of the daemon's last pass (as `status` reads it from the
    /// published file), the daemon's model verdict and engine state.
    pub fn status(&self) -> Status {
        let tuned = self.sources.tuned.borrow().clone();
        let (board, config) = (&self.sources.board, &self.sources.config);
        let backend = supervisor_core::tune::Backend::resolve(config.tuning.engine.backend, board);
        let steps = supervisor_core::tune::status_after(
            board,
            &supervisor_core::tune::steps(config, backend),
            Some(&tuned.steps),
        );
        let mut engine = self.sources.engine.borrow().clone();
        // `status` computes the uptime when it reads the published file; so does this.
        engine.uptime_s = engine
            .ready_unix
            .map(|t| weights::install::now_unix().saturating_sub(t));
        supervisor_core::report::collect(board, config, tuned.model, steps, engine)
    }

    /// [`App::status`] off the runtime thread: reading the board walks sysfs, and the daemon
    /// supervises the engine on the same (single) runtime thread.
    async fn status_off_thread(self: &Arc<Self>) -> Result<Status, DashError> {
        let app = Arc::clone(self);
        tokio::task::spawn_blocking(move || app.status())
            .await
            .map_err(|e| DashError::Internal(format!("reading the status crashed: {e}")))
    }

    fn engine_log(&self) -> Vec<String> {
        self.sources.logs.recent(live::LOG_LINES)
    }

    /// Takes one sample and hands the rendered update to every listening browser.
    fn sample(&self) {
        let status = self.status().to_wire();
        let now_ms = unix_ms();
        let update = {
            let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
            live::update(&mut history, &status, &self.engine_log(), now_ms)
        };
        self.updates.send_replace(Arc::new(update));
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The running dashboard.
pub struct Handle {
    tasks: Vec<JoinHandle<()>>,
}

impl Handle {
    /// Stops serving.
    pub fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

/// Starts the sampler and the servers in the background; a port that cannot be bound is logged
/// and leaves the daemon running without that server.
pub fn start(sources: Sources) -> Handle {
    let (bound, downgraded) = bind_address(&sources.config.dashboard);
    if let Some(why) = downgraded {
        tracing::warn!("{why}");
    }
    let tls = https_config(&sources);
    let interval = Duration::from_secs(sources.config.dashboard.sample_interval_s.get());
    let app = Arc::new(App {
        open: !sources.config.dashboard.password_hash.is_set(),
        https: tls.as_ref().map(|(addr, _)| *addr),
        history: Mutex::new(live::History::new(interval.as_secs())),
        sources,
        bound,
        sessions: auth::Sessions::default(),
        limiter: auth::LoginLimiter::default(),
        uploads: Arc::default(),
        chunk_uploads: tokio::sync::Semaphore::new(models::CHUNKS_AT_ONCE),
        verifying: tokio::sync::Semaphore::new(2),
        updates: watch::channel(Arc::new(String::new())).0,
    });
    let sampler = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                let app = Arc::clone(&app);
                if let Err(e) = tokio::task::spawn_blocking(move || app.sample()).await {
                    tracing::error!("dashboard: taking a sample crashed: {e}");
                }
            }
        })
    };
    let plain = {
        let router = routes::router(Arc::clone(&app), false);
        tokio::spawn(async move {
            let Some(listener) = bind(bound, "listen").await else {
                return;
            };
            tracing::info!("dashboard on http://{bound}/");
            listener::serve_plain(listener, router).await;
        })
    };
    let mut tasks = vec![sampler, plain];
    if let Some((addr, config)) = tls {
        let router = routes::router(Arc::clone(&app), true);
        tasks.push(tokio::spawn(async move {
            let Some(listener) = bind(addr, "https_listen").await else {
                return;
            };
            tracing::info!("dashboard on https://{addr}/");
            listener::serve_tls(listener, router, config).await;
        }));
    }
    Handle { tasks }
}

async fn bind(addr: SocketAddr, key: &str) -> Option<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => Some(listener),
        Err(e) => {
            tracing::error!("dashboard: cannot listen on {addr}: {e}; change [dashboard] {key}");
            None
        }
    }
}

/// HTTPS's address and TLS configuration when the box serves it: provisioned (so it has its
/// certificate) and with a password (so it serves the network at all).
fn https_config(sources: &Sources) -> Option<(SocketAddr, Arc<rustls::ServerConfig>)> {
    let dashboard = &sources.config.dashboard;
    if !dashboard.password_hash.is_set() {
        return None;
    }
    let (cert, key) = supervisor_core::provision::identity::tls_identity(&sources.board)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| {
            b.with_no_client_auth().with_single_cert(
                vec![rustls::pki_types::CertificateDer::from(cert)],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
            )
        });
    match config {
        Ok(mut config) => {
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some((dashboard.https_listen.get(), Arc::new(config)))
        }
        Err(e) => {
            tracing::error!(
                "dashboard: the box's TLS certificate cannot be used ({e}); serving plain HTTP only. \
                 `supervisor provision apply` makes a new one after the files under {} are removed",
                supervisor_core::provision::PROVISION_DIR
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_password_only_loopback_is_bound() {
        let mut config = Dashboard::default();
        let (addr, why) = bind_address(&config);
        assert_eq!(addr, "127.0.0.1:8000".parse().expect("addr"));
        assert!(why.is_some_and(|w| w.contains("0.0.0.0:8000") && w.contains("password_hash")));
        config.listen =
            supervisor_core::config::ListenAddr::try_from("[::1]:9000".to_string()).expect("addr");
        assert_eq!(
            bind_address(&config),
            ("[::1]:9000".parse().expect("addr"), None)
        );
        config.listen =
            supervisor_core::config::ListenAddr::try_from("0.0.0.0:80".to_string()).expect("addr");
        config.password_hash = supervisor_core::config::PasswordHash::try_from(
            auth::hash_password("pw").expect("hash"),
        )
        .expect("valid");
        assert_eq!(
            bind_address(&config),
            ("0.0.0.0:80".parse().expect("addr"), None)
        );
    }
}
