//! The other members as `appliance fleet enroll` sent them (`PUT /api/cluster/peers`): their
//! WireGuard keys, LAN endpoints, link addresses and memory. Kept on the data partition, written
//! atomically, and taken up by the running cluster task at its next check (no restart).

use serde::{Deserialize, Serialize};

use crate::board::Board;
use crate::config::cluster::{Cluster, Peer};

/// The peers file; when present it replaces `[[cluster.peers]]` of the configuration.
pub const FILE: &str = "/var/lib/appliance/cluster/peers.toml";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeersFile {
    #[serde(default)]
    peers: Vec<Peer>,
}

/// `cluster` with the peers file's members, if there is one.
pub fn current(board: &Board, cluster: &Cluster) -> Result<Cluster, String> {
    let Some(text) = board.read_optional(FILE).map_err(|e| e.to_string())? else {
        return Ok(cluster.clone());
    };
    let file: PeersFile = toml::from_str(&text).map_err(|e| {
        format!("{FILE} is damaged ({e}); run `appliance fleet enroll` again to resend it")
    })?;
    Ok(Cluster {
        peers: file.peers,
        ..cluster.clone()
    })
}

/// Checks `peers` against this box's part in `cluster` and keeps them.
pub fn replace(
    board: &Board,
    cluster: &Cluster,
    alone_model_id: &str,
    peers: Vec<Peer>,
) -> Result<(), String> {
    let next = Cluster {
        peers,
        ..cluster.clone()
    };
    next.check(alone_model_id)?;
    let text = toml::to_string(&PeersFile { peers: next.peers })
        .map_err(|e| format!("cannot write the peers: {e}"))?;
    board
        .create_private_dir(super::keys::DIR)
        .and_then(|()| board.replace_file(FILE, text.as_bytes()))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_sent_replace_the_configured_ones_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        board_sim::init(dir.path(), board_sim::Variant::Pi5_8gb).expect("sim");
        let board = board_sim::open(dir.path()).expect("board");
        let cluster: Cluster = toml::from_str(
            "name = \"front\"\nrole = \"head\"\naddress = \"10.77.0.1/24\"\nmodel = \"big\"\n",
        )
        .expect("cluster");
        assert_eq!(current(&board, &cluster).expect("none yet"), cluster);
        let peer = |address: &str| -> Peer {
            toml::from_str(&format!(
                "name = \"w1\"\nrole = \"worker\"\npublic_key = \"YCfnX2Vx2a6bVT5pT5TGPmX6JzHppgAYdS3sCDR3p2Q=\"\n\
                 endpoint = \"192.168.1.21:51820\"\naddress = \"{address}\"\nmemory_mib = 7000\n"
            ))
            .expect("peer")
        };
        replace(&board, &cluster, "small", vec![peer("10.77.0.2")]).expect("kept");
        let now = current(&board, &cluster).expect("read");
        assert_eq!(now.peers, vec![peer("10.77.0.2")]);
        let e = replace(&board, &cluster, "small", vec![peer("10.99.0.2")]).expect_err("off link");
        assert!(e.contains("not on this box's link"), "{e}");
        assert_eq!(
            current(&board, &cluster).expect("read").peers,
            now.peers,
            "kept"
        );
    }
}
