//! `[cluster]`: this box as a member of a cluster that serves one model too large for any one
//! box, on llama.cpp's RPC backend, over a WireGuard link between the members. Absent on a box
//! that serves alone (the default).
//!
//! The head runs `llama-server --rpc` on the cluster's model and keeps the first layers itself;
//! each worker runs `ggml-rpc-server`, bound to its link address only, and holds a run of the
//! layers after them. Every member names every other one, with its WireGuard public key.

use std::fmt;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::config::{MemoryMib, Port, ranged_setting};
use provision::values::Hostname;

/// The keys `[cluster]` cannot do without, with a valid stand-in for checking a file that
/// holds only part of the section (the rest comes from another file).
pub(crate) const REQUIRED: [(&str, &str); 3] = [
    ("name", "stand-in"),
    ("role", "worker"),
    ("address", "10.0.0.1/24"),
];

/// The `[cluster]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// The cluster's name (a host name: letters, digits, `-`), shown in status.
    pub name: Hostname,
    /// What this box does in it.
    pub role: Role,
    /// This box's address on the link, with the link's prefix length (`10.77.0.1/24`).
    pub address: LinkAddress,
    /// The WireGuard interface. Default `appliance-wg`.
    #[serde(default = "default_interface")]
    pub interface: Interface,
    /// UDP port WireGuard listens on. Default 51820.
    #[serde(default = "default_listen_port")]
    pub listen_port: Port,
    /// TCP port of the workers' RPC servers, on the link only. Default 50052.
    #[serde(default = "default_rpc_port")]
    pub rpc_port: Port,
    /// MiB of this box's memory its share of the model (layers and their cache) may take.
    /// Default: the board's memory less `[tuning.engine] memory_reserve_mib`.
    #[serde(default)]
    pub memory_mib: Option<MemoryMib>,
    /// The head: the installed model the cluster serves.
    #[serde(default)]
    pub model: Option<String>,
    /// The head, while a worker is gone: serve `[model] id` alone (`own-model`, the default),
    /// or answer nothing until the cluster is whole (`none`).
    #[serde(default)]
    pub fallback: Fallback,
    /// Seconds between the head's checks that every worker answers on the link, 1-3600.
    /// Default 5.
    #[serde(default = "default_check_interval")]
    pub check_interval_s: CheckIntervalS,
    /// `llama-server`. Default: Debian's, `/usr/bin/llama-server`.
    #[serde(default)]
    pub llama_server: Option<String>,
    /// `ggml-rpc-server`. Default: Debian's, under `/usr/libexec/<triplet>/llama/bin/`.
    #[serde(default)]
    pub rpc_server: Option<String>,
    /// The other members, workers in the order they hold layers (`appliance fleet enroll`
    /// sends them to a provisioned box; until then it waits for them).
    #[serde(default)]
    pub peers: Vec<Peer>,
}

/// Another member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// Its name in the fleet.
    pub name: Hostname,
    /// What it does.
    pub role: Role,
    /// Its WireGuard public key (base64, 32 bytes).
    pub public_key: WireguardKey,
    /// Where its WireGuard listens on the LAN: `HOST:PORT`.
    pub endpoint: Endpoint,
    /// Its address on the link (no prefix).
    pub address: Ipv4Addr,
    /// A worker: MiB its share of the model may take.
    #[serde(default)]
    pub memory_mib: Option<MemoryMib>,
}

/// A member's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Serves the API and holds the first layers.
    Head,
    /// Holds layers for the head, on the link only.
    Worker,
}

/// What the head serves while a worker is gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// `[model] id`, alone.
    #[default]
    OwnModel,
    /// Nothing.
    None,
}

ranged_setting!(
    /// Seconds between the head's checks of its workers, 1-3600.
    CheckIntervalS(u64), "check_interval_s", 1..=3600, "an integer 1-3600 (seconds)"
);

fn default_interface() -> Interface {
    Interface::try_from("appliance-wg".to_string()).unwrap_or_else(|_| unreachable!())
}
fn default_listen_port() -> Port {
    Port::try_from(51820).unwrap_or_else(|_| unreachable!())
}
fn default_rpc_port() -> Port {
    Port::try_from(50052).unwrap_or_else(|_| unreachable!())
}
fn default_check_interval() -> CheckIntervalS {
    CheckIntervalS(5)
}

pub use provision::values::{Endpoint, Interface, WireguardKey};

/// This box's link address with its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LinkAddress {
    /// The address.
    pub ip: Ipv4Addr,
    /// The link's prefix length, 8-30.
    pub prefix: u8,
}

impl TryFrom<String> for LinkAddress {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        let bad = || {
            format!(
                "invalid address {text:?}: expected this box's link address with the link's prefix, e.g. \"10.77.0.1/24\" (prefix 8-30)"
            )
        };
        let (ip, prefix) = text.split_once('/').ok_or_else(bad)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&prefix) {
            return Err(bad());
        }
        Ok(LinkAddress { ip, prefix })
    }
}

impl From<LinkAddress> for String {
    fn from(a: LinkAddress) -> String {
        a.to_string()
    }
}

impl fmt::Display for LinkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix)
    }
}

impl LinkAddress {
    /// Whether `other` is on this link.
    pub fn contains(&self, other: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        (u32::from(self.ip) & mask) == (u32::from(other) & mask)
    }
}

impl Cluster {
    /// The workers, in the order they hold layers.
    pub fn workers(&self) -> impl Iterator<Item = &Peer> {
        self.peers.iter().filter(|p| p.role == Role::Worker)
    }

    /// What this box's share may take, in bytes: `memory_mib`, else the board's memory less the
    /// reserve the tuning leaves the OS.
    pub fn budget(&self, board_memory_mib: Option<u64>, reserve_mib: u64) -> u64 {
        let mib = self.memory_mib.map(MemoryMib::get).unwrap_or_else(|| {
            board_memory_mib.map_or(0, |total| total.saturating_sub(reserve_mib))
        });
        mib << 20
    }

    /// What is wrong with the section as a whole (each field was checked as it was read).
    pub fn check(&self, alone_model_id: &str) -> Result<(), String> {
        let at = "[cluster]";
        let heads = self.peers.iter().filter(|p| p.role == Role::Head).count()
            + usize::from(self.role == Role::Head);
        // A provisioned box knows no peers until enrolment sends them.
        if heads != 1 && !(self.peers.is_empty() && self.role == Role::Worker) {
            return Err(format!(
                "{at}: a cluster has exactly one head; this box and its peers name {heads}"
            ));
        }
        match (&self.role, &self.model) {
            (Role::Head, None) => {
                return Err(format!(
                    "{at}: the head needs `model`, the id of the installed model the cluster serves"
                ));
            }
            (Role::Head, Some(model))
                if model == alone_model_id && self.fallback == Fallback::OwnModel =>
            {
                return Err(format!(
                    "{at}: the cluster's model {model:?} is also [model] id, the model served alone while a worker is gone; name another model there, or set fallback = \"none\""
                ));
            }
            (Role::Worker, Some(_)) => {
                return Err(format!(
                    "{at}: `model` is for the head; a worker receives its layers from it"
                ));
            }
            _ => {}
        }
        let mut names = vec![self.name.as_str()];
        let mut addresses = vec![self.address.ip];
        for peer in &self.peers {
            let at = format!("[[cluster.peers]] {}", peer.name);
            if names.contains(&peer.name.as_str()) {
                return Err(format!("{at}: the name is used twice"));
            }
            names.push(peer.name.as_str());
            if addresses.contains(&peer.address) {
                return Err(format!("{at}: address {} is used twice", peer.address));
            }
            addresses.push(peer.address);
            if !self.address.contains(peer.address) {
                return Err(format!(
                    "{at}: address {} is not on this box's link {}",
                    peer.address, self.address
                ));
            }
            if peer.role == Role::Worker && peer.memory_mib.is_none() {
                return Err(format!(
                    "{at}: a worker needs memory_mib, the MiB its share of the model may take"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "YCfnX2Vx2a6bVT5pT5TGPmX6JzHppgAYdS3sCDR3p2Q=";

    fn head() -> String {
        format!(
            "name = \"front\"\nrole = \"head\"\naddress = \"10.77.0.1/24\"\nmemory_mib = 6000\nmodel = \"big\"\n\
             [[peers]]\nname = \"w1\"\nrole = \"worker\"\npublic_key = \"{KEY}\"\nendpoint = \"192.168.1.21:51820\"\naddress = \"10.77.0.2\"\nmemory_mib = 7000\n"
        )
    }

    #[test]
    fn a_head_with_a_worker_reads_and_checks() {
        let cluster: Cluster = toml::from_str(&head()).expect("reads");
        cluster.check("small").expect("valid");
        assert_eq!(cluster.interface.as_str(), "appliance-wg");
        assert_eq!(cluster.rpc_port.get(), 50052);
        assert_eq!(cluster.workers().count(), 1);
        assert_eq!(cluster.fallback, Fallback::OwnModel);
    }

    #[test]
    fn mistakes_are_named() {
        for (change, says) in [
            (("10.77.0.1/24", "10.77.0.1"), "invalid address"),
            (("\"w1\"", "\"front\""), "the name is used twice"),
            (("10.77.0.2\"", "10.78.0.2\""), "not on this box's link"),
            ((KEY, "not-a-key"), "invalid public_key"),
            (("192.168.1.21:51820", "192.168.1.21"), "invalid endpoint"),
            (("memory_mib = 7000\n", ""), "a worker needs memory_mib"),
            (("model = \"big\"\n", ""), "the head needs `model`"),
            (("model = \"big\"", "model = \"small\""), "also [model] id"),
            (("role = \"worker\"", "role = \"head\""), "exactly one head"),
        ] {
            let text = head().replacen(change.0, change.1, 1);
            let outcome = toml::from_str::<Cluster>(&text)
                .map_err(|e| e.to_string())
                .and_then(|c| c.check("small"));
            let e = outcome.expect_err(says);
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
