//! The cluster as one box sees it (`status` → `cluster`, since 1.3): its part, the link to each
//! other member, which layers each member holds, and the cluster's decode speed.

use serde::{Deserialize, Serialize};

/// The `cluster` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// The cluster's name.
    pub name: String,
    /// This box's part: `head` or `worker`.
    pub role: String,
    /// `starting`, `up` (head: serving the cluster's model; worker: its RPC server runs),
    /// `degraded` (head: a worker is gone, the link is down or the cluster's server fails; the
    /// box serves its own model or nothing), `failing` (worker: the link or its RPC server
    /// cannot start) or `stopped` (no daemon).
    pub state: String,
    /// Why, in words.
    pub reason: String,
    /// This box's WireGuard public key, for the other members' configuration.
    #[serde(default)]
    pub public_key: Option<String>,
    /// MiB this box's share of the model may take.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// The other members as this box sees them.
    #[serde(default)]
    pub members: Vec<Member>,
    /// The head, while it serves the cluster's model: each member's share, the head first.
    #[serde(default)]
    pub layers: Vec<Share>,
    /// The head: the cluster's recent decode speed (tokens per second).
    #[serde(default)]
    pub decode_tokens_per_second: Option<f64>,
}

/// Another member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// `head` or `worker`.
    pub role: String,
    /// Its address on the link.
    pub address: String,
    /// Seconds since WireGuard's last handshake with it; absent before the first.
    #[serde(default)]
    pub handshake_age_s: Option<u64>,
    /// The head: whether the worker's RPC server answered the last check.
    #[serde(default)]
    pub answers: Option<bool>,
}

/// One member's share of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// The member (`head` for the head).
    pub member: String,
    /// The first repeating layer it holds.
    pub first_layer: usize,
    /// How many it holds.
    pub layers: usize,
    /// Whether it holds the output layer.
    pub output: bool,
    /// MiB of weights and cache it holds.
    pub mib: u64,
    /// MiB it may hold (its `memory_mib`).
    pub budget_mib: u64,
}

/// `PUT /api/cluster/peers`: the other members of the box's cluster, as `appliance fleet
/// enroll` learnt them from each box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peers {
    /// Every other member, the workers in the order they hold layers.
    pub peers: Vec<Peer>,
}

/// One other member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// Its name in the fleet.
    pub name: String,
    /// `head` or `worker`.
    pub role: String,
    /// Its WireGuard public key (base64).
    pub public_key: String,
    /// Where its WireGuard listens on the LAN, `HOST:PORT`.
    pub endpoint: String,
    /// Its address on the link.
    pub address: String,
    /// A worker: MiB its share may take.
    #[serde(default)]
    pub memory_mib: Option<u64>,
}
