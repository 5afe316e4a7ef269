//! `PUT /api/cluster/peers`: the other members of this box's cluster, as `appliance fleet
//! enroll` learnt them (their WireGuard keys from their own status, over pinned TLS). Checked
//! against this box's part and kept; the running cluster task takes them up at its next check.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::App;
use crate::error::DashError;
use supervisor_core::config::cluster::Peer;

/// Where the tool sends them.
pub const PEERS: &str = "/api/cluster/peers";

/// `GET /api/cluster`: this box's part as `status` shows it, its WireGuard key made if it had
/// none yet and the memory its share may take, for `appliance fleet enroll`. 409 on a box that
/// is no cluster's member.
pub async fn get_part(State(app): State<Arc<App>>) -> Result<Response, DashError> {
    let (board, config) = (app.sources.board.clone(), app.sources.config.clone());
    let engine = app.sources.engine.borrow().clone();
    let part = tokio::task::spawn_blocking(move || {
        let Some(cluster) = config.cluster.as_ref() else {
            return Err(DashError::Conflict(
                "this box is no cluster's member: its provisioning has no [cluster] part".into(),
            ));
        };
        let key = supervisor_core::cluster::keys::public_key(&board)
            .map_err(|e| DashError::Internal(format!("this box's WireGuard key: {e}")))?;
        let mut part = supervisor_core::cluster::read(&board, &config, &engine)
            .ok_or_else(|| DashError::Internal("no cluster part".into()))?;
        part.public_key = Some(key);
        part.memory_mib = Some(supervisor_core::cluster::budget(&board, &config, cluster) >> 20);
        Ok(part)
    })
    .await
    .map_err(|e| DashError::Internal(format!("the task crashed: {e}")))??;
    Ok(Json(part).into_response())
}

/// `PUT /api/cluster/peers`: 200 once kept; 400 for peers that do not fit this box's part; 409
/// on a box that is no cluster's member.
pub async fn put_peers(
    State(app): State<Arc<App>>,
    Json(sent): Json<wire::cluster::Peers>,
) -> Result<Response, DashError> {
    let (board, config) = (app.sources.board.clone(), app.sources.config.clone());
    let Some(cluster) = config.cluster.clone() else {
        return Err(DashError::Conflict(
            "this box is no cluster's member: its provisioning has no [cluster] part".into(),
        ));
    };
    let peers = sent
        .peers
        .into_iter()
        .map(|p| {
            let name = p.name.clone();
            serde_json::to_value(p)
                .and_then(serde_json::from_value::<Peer>)
                .map_err(|e| DashError::BadRequest(format!("peer {name:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let count = peers.len();
    tokio::task::spawn_blocking(move || {
        supervisor_core::cluster::peers::replace(&board, &cluster, &config.model.id, peers)
    })
    .await
    .map_err(|e| DashError::Internal(format!("the task crashed: {e}")))?
    .map_err(DashError::BadRequest)?;
    tracing::info!("dashboard: the cluster's {count} other members were sent");
    Ok((StatusCode::OK, format!("{count} peers kept\n")).into_response())
}
