//! Models through the dashboard: the list (`GET /api/models`), a push a chunk at a time
//! (`POST /api/models/push`, then `PUT /api/models/incoming/ID/PART/INDEX`), a switch
//! (`POST /api/models/use`) and a removal (`DELETE /api/models/ID`). The work is the core's
//! (`supervisor_core::models`); these handlers run it off the runtime thread and turn its
//! refusals into statuses.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use supervisor_core::board::Board;
use supervisor_core::config::Config;
use supervisor_core::models::catalog::{self, Asked};
use supervisor_core::models::{PushError, incoming};
use wire::models::{Push, Requested, UseRequest};

use crate::App;
use crate::error::DashError;

/// Where a push starts.
pub const PUSH: &str = "/api/models/push";
/// Where its chunks go (`…/ID/PART/INDEX`), as the connection guard matches it.
pub const CHUNKS: &str = "/api/models/incoming/*";
/// The largest push request: a manifest (its chunk list grows with the model) and signature,
/// as JSON (escaping the manifest's quotes and line ends makes it longer).
pub const MAX_PUSH: u64 = 2 * weights::manifest::MAX_MANIFEST_BYTES + 64 * 1024;
/// The largest chunk request.
pub const MAX_CHUNK: u64 = incoming::MAX_CHUNK;
/// Time for one chunk to arrive (64 MiB at about 110 kB/s: the slowest Wi-Fi worth trying).
pub const CHUNK_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Chunks read into memory at once, whoever sends them (a client keeps three in flight): at
/// most 256 MiB beside the engine's model.
pub const CHUNKS_AT_ONCE: usize = 4;

impl From<PushError> for DashError {
    fn from(e: PushError) -> DashError {
        match e {
            PushError::BadRequest(m) => DashError::BadRequest(m),
            PushError::Signature(m) => DashError::Refused(StatusCode::FORBIDDEN, m),
            PushError::NotFound(m) => DashError::Refused(StatusCode::NOT_FOUND, m),
            PushError::Conflict(m) => DashError::Conflict(m),
            PushError::Mismatch(m) => DashError::Refused(StatusCode::UNPROCESSABLE_ENTITY, m),
            PushError::NoSpace(m) => DashError::Refused(StatusCode::INSUFFICIENT_STORAGE, m),
            PushError::Internal(m) => DashError::Internal(m),
        }
    }
}

/// `work(board, config)` on a blocking thread (it hashes, writes and syncs).
async fn off_thread<T: Send + 'static>(
    app: &App,
    work: impl FnOnce(&Board, &Config) -> Result<T, PushError> + Send + 'static,
) -> Result<T, DashError> {
    let (board, config) = (app.sources.board.clone(), app.sources.config.clone());
    tokio::task::spawn_blocking(move || work(&board, &config))
        .await
        .map_err(|e| DashError::Internal(format!("the task crashed: {e}")))?
        .map_err(DashError::from)
}

/// `GET /api/models`.
pub async fn list(State(app): State<Arc<App>>) -> Result<Response, DashError> {
    let models = off_thread(&app, |b, c| {
        catalog::list(b, c).map_err(PushError::Internal)
    })
    .await?;
    Ok(Json(models).into_response())
}

/// `POST /api/models/push`: the signed manifest; the answer says which chunk to send next.
pub async fn push(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, DashError> {
    let push: Push = serde_json::from_slice(&body).map_err(|e| {
        DashError::BadRequest(format!(
            "expected {{\"manifest\": TEXT, \"signature\": TEXT}}: {e}"
        ))
    })?;
    let incoming = off_thread(&app, move |b, c| incoming::begin(b, c, &push)).await?;
    Ok(Json(incoming).into_response())
}

/// `PUT /api/models/incoming/ID/PART/INDEX`: one chunk, as the raw body, read only once one of
/// [`CHUNKS_AT_ONCE`] places is free.
pub async fn chunk(
    State(app): State<Arc<App>>,
    Path((id, part, index)): Path<(String, String, u64)>,
    body: axum::body::Body,
) -> Result<Response, DashError> {
    let _place = app
        .chunk_uploads
        .acquire()
        .await
        .map_err(|e| DashError::Internal(format!("the chunk uploads' limit: {e}")))?;
    let body = axum::body::to_bytes(body, MAX_CHUNK as usize)
        .await
        .map_err(|e| {
            DashError::Refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a chunk is at most {MAX_CHUNK} bytes, and arrives whole: {e}"),
            )
        })?;
    let incoming = off_thread(&app, move |b, c| {
        incoming::put_chunk(b, c, &id, &part, index, &body)
    })
    .await?;
    Ok(Json(incoming).into_response())
}

/// `POST /api/models/use`: 202 with the request's number (its outcome shows in the list's
/// history), or 200 when the model already runs.
pub async fn switch(
    State(app): State<Arc<App>>,
    Json(request): Json<UseRequest>,
) -> Result<Response, DashError> {
    let asked = off_thread(&app, move |b, c| catalog::ask_switch(b, c, &request.id)).await?;
    Ok(match asked {
        Asked::Queued(request) => {
            (StatusCode::ACCEPTED, Json(Requested { request })).into_response()
        }
        Asked::AlreadyActive => (StatusCode::OK, "already the active model\n").into_response(),
    })
}

/// `DELETE /api/models/ID`.
pub async fn remove(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, DashError> {
    let said = off_thread(&app, move |b, c| catalog::remove(b, c, &id)).await?;
    Ok((StatusCode::OK, format!("{said}\n")).into_response())
}
