//! Update bundles through the dashboard: `POST /api/update` takes a bundle as the raw request
//! body (a browser's file, or `appliance fleet update`), stores it on the data partition,
//! and has RAUC install it in the background; `GET /api/update` tells how far it got. The box
//! then reboots into the new slot (inside `[update] window` when one is set) and keeps it only
//! if it proves healthy.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::error::DashError;
use supervisor_core::board::Board;
use supervisor_core::config::Config;

/// The route.
pub const PATH: &str = "/api/update";
/// The largest bundle taken (a root filesystem image compressed, well under a slot).
pub const MAX_BUNDLE: u64 = 4 << 30;
/// Time for the whole upload (4 GiB at ~2.5 MB/s).
pub const UPLOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Progress lines kept.
const LINES: usize = 40;

/// How the last upload is doing: the `GET /api/update` document.
pub use wire::Progress;

/// The uploads' shared state.
#[derive(Default)]
pub struct Uploads {
    progress: Mutex<Progress>,
}

impl Uploads {
    /// A copy of the progress.
    pub fn progress(&self) -> Progress {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn say(&self, line: &str) {
        let mut p = self.lock();
        p.lines.push(line.to_string());
        let extra = p.lines.len().saturating_sub(LINES);
        p.lines.drain(..extra);
    }

    fn finish(&self, result: Result<String, String>) {
        let mut p = self.lock();
        p.running = false;
        match result {
            Ok(done) => p.done = Some(done),
            Err(e) => p.error = Some(e),
        }
    }
}

/// Where the upload is stored (the data partition: the root is read-only and `/run` is RAM).
fn upload_path(config: &Config) -> String {
    format!(
        "{}/update-upload.raucb",
        config.model.data_dir.trim_end_matches('/')
    )
}

/// Streams `body` into the upload file, then starts the install in the background.
pub async fn accept(
    uploads: Arc<Uploads>,
    board: Board,
    config: Config,
    declared: Option<u64>,
    body: Body,
) -> Result<Progress, DashError> {
    {
        let mut p = uploads.lock();
        if p.running {
            return Err(DashError::Conflict(
                "an update is already being installed; see GET /api/update".into(),
            ));
        }
        *p = Progress {
            running: true,
            ..Progress::default()
        };
    }
    let stored = store(&uploads, &board, &config, declared, body).await;
    let path = match stored {
        Ok(path) => path,
        Err(e) => {
            uploads.finish(Err(e.clone()));
            return Err(DashError::BadRequest(e));
        }
    };
    let progress = uploads.progress();
    let task_uploads = Arc::clone(&uploads);
    tokio::spawn(async move {
        let say = |line: &str| task_uploads.say(line);
        let source = board.path(&path).display().to_string();
        let installed = supervisor_core::update::install::install(
            &board,
            &config,
            &source,
            false,
            supervisor_core::update::install::Reboot::InWindow,
            &say,
        )
        .await;
        // RAUC has copied what it needs (or refused it): the upload's space is given back.
        let (b, c, p) = (board.clone(), config.clone(), path.clone());
        let rebooting = tokio::task::spawn_blocking(move || {
            let _ = b.remove_file(&p);
            match installed {
                Ok(message) => {
                    supervisor_core::update::reboot_when_due(&b, &c).map(|r| r.unwrap_or(message))
                }
                Err(e) => Err(e),
            }
        })
        .await
        .unwrap_or_else(|e| Err(format!("the install task crashed: {e}")));
        if let Err(e) = &rebooting {
            tracing::error!("dashboard update: {e}");
        }
        task_uploads.finish(rebooting);
    });
    Ok(progress)
}

/// Space left free on the data partition beside an upload (the box keeps recording its state
/// there, and the install unpacks nothing there, but a full disk breaks every durable write).
const KEEP_FREE: u64 = 64 << 20;

/// The partial upload, removed when the upload does not complete: an error, the client gone
/// (the handler's future dropped mid-stream) or a full disk leave no gigabytes behind.
struct Partial {
    path: std::path::PathBuf,
    kept: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

async fn store(
    uploads: &Uploads,
    board: &Board,
    config: &Config,
    declared: Option<u64>,
    body: Body,
) -> Result<String, String> {
    let path = upload_path(config);
    let partial = format!("{path}.partial");
    board
        .create_dir_all(&config.model.data_dir)
        .map_err(|e| e.to_string())?;
    // A partial upload a power cut left behind is given back first, then the space checked.
    let _ = board.remove_file(&partial);
    let free = board
        .free_bytes(&config.model.data_dir)
        .map_err(|e| e.to_string())?;
    let needed = declared.unwrap_or(0).saturating_add(KEEP_FREE);
    if free < needed {
        return Err(format!(
            "the data partition has {} MiB free; this bundle needs {} MiB and {} MiB must stay \
             free (remove old files, or install from a USB stick)",
            free >> 20,
            declared.unwrap_or(0).div_ceil(1 << 20),
            KEEP_FREE >> 20
        ));
    }
    let host = board.path(&partial);
    let mut guard = Partial {
        path: host.clone(),
        kept: false,
    };
    let mut file = tokio::fs::File::create(&host)
        .await
        .map_err(|e| format!("storing the upload in {partial}: {e}"))?;
    let mut stream = body.into_data_stream();
    let mut received: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| format!("the upload broke off after {received} bytes: {e}"))?;
        received += chunk.len() as u64;
        if declared.is_none() && received.saturating_add(KEEP_FREE) > free {
            return Err(format!(
                "the upload outgrew the data partition's free space after {received} bytes"
            ));
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| format!("storing the upload in {partial}: {e}"))?;
        uploads.lock().received = received;
    }
    if received == 0 {
        return Err("the request carried no bundle: send the .raucb file as the body".into());
    }
    file.sync_all()
        .await
        .map_err(|e| format!("storing the upload in {partial}: {e}"))?;
    drop(file);
    tokio::fs::rename(&host, board.path(&path))
        .await
        .map_err(|e| format!("placing the upload at {path}: {e}"))?;
    guard.kept = true;
    uploads.say(&format!("received {received} bytes"));
    Ok(path)
}
