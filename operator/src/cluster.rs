//! The last step of `appliance fleet enroll` for a fleet with clusters: each member's WireGuard
//! public key and memory, read from the member itself over its pinned certificate
//! (`GET /api/cluster`), are sent to every other member of its cluster
//! (`PUT /api/cluster/peers`), with the LAN address it was enrolled at as its endpoint and its
//! link address from the fleet file. The private keys never leave the boxes.

use std::time::Duration;

use provision::FleetFile;
use provision::cluster::ClusterDef;

use crate::fleet::{self, Connected, Paths};

/// WireGuard's port on every member (the box's default; provisioning does not change it).
const WIREGUARD_PORT: u16 = 51820;
/// How long one box gets to answer.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What one member told about itself.
struct Told {
    connected: Connected,
    peer: wire::cluster::Peer,
}

/// The host part of `HOST:PORT` (an IPv6 literal keeps its brackets).
fn host(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(h, _)| h)
}

fn ask_member(
    fleet: &FleetFile,
    lock: &fleet::Lock,
    def: &ClusterDef,
    index: usize,
    token: &str,
    overrides: &[(String, String)],
) -> Result<Told, String> {
    let name = def
        .members()
        .nth(index)
        .ok_or("no such member")?
        .to_string();
    let connected = fleet::connect(fleet, lock, &name, overrides)?;
    let answer = connected.ask(token, "GET", "/api/cluster", None, TIMEOUT)?;
    if answer.status != 200 {
        return Err(format!(
            "{name}: GET /api/cluster answered {}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body).trim()
        ));
    }
    let part: wire::cluster::Cluster = serde_json::from_slice(&answer.body)
        .map_err(|e| format!("{name}: an unexpected answer: {e}"))?;
    if part.name != def.name.as_str() {
        return Err(format!(
            "{name}: it is provisioned for cluster {:?}, not {}: stamp it again",
            part.name, def.name
        ));
    }
    let public_key = part
        .public_key
        .ok_or_else(|| format!("{name}: it told no WireGuard key"))?;
    let address = def
        .address(index)
        .ok_or_else(|| format!("{name}: no link address"))?
        .address
        .to_string();
    let peer = wire::cluster::Peer {
        name: name.clone(),
        role: if index == 0 { "head" } else { "worker" }.into(),
        public_key,
        endpoint: format!("{}:{WIREGUARD_PORT}", host(&connected.address)),
        address,
        memory_mib: part.memory_mib,
    };
    Ok(Told { connected, peer })
}

/// Sends every cluster's members the others; one line per cluster. Returns how many clusters
/// could not be completed.
pub fn exchange(
    paths: &Paths,
    fleet: &FleetFile,
    token: &str,
    overrides: &[(String, String)],
    mut say: impl FnMut(&str),
) -> Result<usize, String> {
    let lock = fleet::read_lock(paths)?;
    let mut failed = 0;
    for def in &fleet.clusters {
        let members = def.members().count();
        let told: Result<Vec<Told>, String> = (0..members)
            .map(|i| ask_member(fleet, &lock, def, i, token, overrides))
            .collect();
        let told = match told {
            Ok(told) => told,
            Err(why) => {
                failed += 1;
                say(&format!("cluster {}: not linked: {why}", def.name));
                continue;
            }
        };
        let mut sent = Vec::new();
        for (i, member) in told.iter().enumerate() {
            let others = wire::cluster::Peers {
                peers: told
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, t)| t.peer.clone())
                    .collect(),
            };
            let body = serde_json::to_vec(&others).map_err(|e| e.to_string())?;
            let answer = member.connected.ask(
                token,
                "PUT",
                "/api/cluster/peers",
                Some(("application/json", &body)),
                TIMEOUT,
            );
            match answer {
                Ok(a) if a.status == 200 => sent.push(member.peer.name.clone()),
                Ok(a) => say(&format!(
                    "cluster {}: {} refused its peers ({}): {}",
                    def.name,
                    member.peer.name,
                    a.status,
                    String::from_utf8_lossy(&a.body).trim()
                )),
                Err(e) => say(&format!("cluster {}: {}: {e}", def.name, member.peer.name)),
            }
        }
        if sent.len() == told.len() {
            say(&format!(
                "cluster {}: linked ({}; head {})",
                def.name,
                sent.join(", "),
                def.head
            ));
        } else {
            failed += 1;
        }
    }
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use super::host;

    #[test]
    fn the_endpoint_is_the_host_the_box_was_reached_at() {
        assert_eq!(host("192.168.1.20:8443"), "192.168.1.20");
        assert_eq!(host("[fd00::1]:8443"), "[fd00::1]");
        assert_eq!(host("reception.local:8443"), "reception.local");
    }
}
