//! The private link between the cluster's boxes: a WireGuard interface with every other member
//! as its one peer per address, and an nftables table that lets only those peers, over the link,
//! reach the RPC port. The RPC server has no authentication and no encryption ("never expose it
//! to an open network"), so nothing but the link may reach it.
//!
//! The kernel's WireGuard is used where the kernel has it; otherwise `wireguard-go`, as
//! `wg-quick` does. Every command is run with its arguments as a vector, never through a shell.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use serde::Serialize;

use super::keys;
use crate::board::Board;
use crate::config::cluster::{Cluster, Role};

/// The nftables table the supervisor owns.
pub const TABLE: &str = "appliance_cluster";
/// WireGuard's configuration as `wg syncconf` reads it (owner-only; it holds the private key).
const WG_CONF: &str = "/run/appliance/cluster/wireguard.conf";
/// The ruleset as `nft -f` reads it.
const RULES: &str = "/run/appliance/cluster/firewall.nft";
/// Keepalive, seconds: a worker's side of the tunnel stays open through NAT and firewalls.
const KEEPALIVE_S: u16 = 25;
/// A peer whose last handshake is older than this counts as gone (WireGuard renews every 2 min).
const HANDSHAKE_FRESH_S: u64 = 180;

/// Runs `program args…`; its error output in the message when it fails.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e} (is it installed?)"))?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(format!(
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// WireGuard's configuration for this box: its key file's content and every peer.
fn wireguard_conf(cluster: &Cluster, private_key: &str) -> String {
    let mut text = format!(
        "[Interface]\nPrivateKey = {}\nListenPort = {}\n",
        private_key.trim(),
        cluster.listen_port.get()
    );
    for peer in &cluster.peers {
        text.push_str(&format!(
            "\n[Peer]\n# {}\nPublicKey = {}\nAllowedIPs = {}/32\nEndpoint = {}\nPersistentKeepalive = {KEEPALIVE_S}\n",
            peer.name, peer.public_key, peer.address, peer.endpoint
        ));
    }
    text
}

/// The firewall: replaces the table in one transaction (never a moment without it). Answers to
/// this box's own connections pass, and the box itself (loopback); on the link only the head's
/// RPC connections come in (to a worker; a head runs no RPC server); the RPC port is dropped on
/// every other interface, IPv4 and IPv6.
pub fn ruleset(cluster: &Cluster) -> String {
    let interface = cluster.interface.as_str();
    let port = cluster.rpc_port.get();
    // Only the head is a client of the RPC servers; a head runs none.
    let peers: Vec<String> = cluster
        .peers
        .iter()
        .filter(|p| cluster.role == Role::Worker && p.role == Role::Head)
        .map(|p| p.address.to_string())
        .collect();
    let from_peers = if peers.is_empty() {
        String::new()
    } else {
        format!(
            "\t\tiifname \"{interface}\" ip saddr {{ {} }} tcp dport {port} accept\n",
            peers.join(", ")
        )
    };
    format!(
        "table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\tct state established,related accept\n\
         \t\tiifname \"lo\" accept\n\
         {from_peers}\
         \t\tiifname \"{interface}\" drop\n\
         \t\ttcp dport {port} drop\n\
         \t}}\n}}\n"
    )
}

/// Brings the link up as configured (again, idempotently: peers the configuration no longer
/// names are dropped), with the firewall first, so the RPC port is never open beyond it.
pub fn up(board: &Board, cluster: &Cluster) -> Result<(), String> {
    board
        .create_private_dir("/run/appliance/cluster")
        .map_err(|e| e.to_string())?;
    board
        .replace_file(RULES, ruleset(cluster).as_bytes())
        .map_err(|e| e.to_string())?;
    let rules = board.path(RULES);
    run("nft", &["-f", &rules.to_string_lossy()]).map_err(|e| format!("the firewall: {e}"))?;

    keys::public_key(board)?;
    let private = board.read(keys::PRIVATE_KEY).map_err(|e| e.to_string())?;
    board
        .replace_private_file(WG_CONF, wireguard_conf(cluster, &private).as_bytes())
        .map_err(|e| e.to_string())?;
    let interface = cluster.interface.as_str();
    if run("ip", &["link", "show", "dev", interface]).is_err() {
        let kernel = run(
            "ip",
            &["link", "add", "dev", interface, "type", "wireguard"],
        );
        if let Err(e) = kernel {
            tracing::info!("cluster: no WireGuard in the kernel ({e}); using wireguard-go");
            run("wireguard-go", &[interface]).map_err(|e| format!("the link: {e}"))?;
        }
    }
    let conf = board.path(WG_CONF);
    run("wg", &["syncconf", interface, &conf.to_string_lossy()])
        .map_err(|e| format!("the link: {e}"))?;
    let address = cluster.address.to_string();
    run("ip", &["address", "replace", &address, "dev", interface])
        .and_then(|_| run("ip", &["link", "set", "dev", interface, "up"]))
        .map_err(|e| format!("the link: {e}"))?;
    Ok(())
}

/// One peer as WireGuard sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerLink {
    /// Its link address.
    pub address: Ipv4Addr,
    /// Seconds since the last handshake; none yet: `None`.
    pub handshake_age_s: Option<u64>,
    /// Bytes received from it.
    pub received_bytes: u64,
    /// Bytes sent to it.
    pub sent_bytes: u64,
}

impl PeerLink {
    /// A handshake recent enough that the tunnel is up.
    pub fn is_up(&self) -> bool {
        self.handshake_age_s
            .is_some_and(|age| age < HANDSHAKE_FRESH_S)
    }
}

/// The link's peers now (`wg show IF dump`), each by its link address.
pub fn peers(cluster: &Cluster, now_unix: u64) -> Result<Vec<PeerLink>, String> {
    let dump = run("wg", &["show", cluster.interface.as_str(), "dump"])?;
    Ok(parse_dump(&dump, now_unix))
}

/// `wg show dump`: the interface's line, then per peer: key, preshared key, endpoint, allowed
/// IPs, latest handshake (Unix seconds, 0 for none), received, sent, keepalive.
fn parse_dump(dump: &str, now_unix: u64) -> Vec<PeerLink> {
    dump.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let address = fields.get(3)?.split(',').next()?.split('/').next()?;
            let handshake: u64 = fields.get(4)?.parse().ok()?;
            Some(PeerLink {
                address: address.parse().ok()?,
                handshake_age_s: (handshake > 0).then(|| now_unix.saturating_sub(handshake)),
                received_bytes: fields.get(5)?.parse().ok()?,
                sent_bytes: fields.get(6)?.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cluster {
        toml::from_str(
            "name = \"front\"\nrole = \"worker\"\naddress = \"10.77.0.2/24\"\nmemory_mib = 6000\n\
             [[peers]]\nname = \"head\"\nrole = \"head\"\npublic_key = \"YCfnX2Vx2a6bVT5pT5TGPmX6JzHppgAYdS3sCDR3p2Q=\"\n\
             endpoint = \"192.168.1.20:51820\"\naddress = \"10.77.0.1\"\n",
        )
        .expect("cluster")
    }

    #[test]
    fn only_peers_on_the_link_reach_the_rpc_port() {
        let rules = ruleset(&cluster());
        assert!(rules.starts_with("table inet appliance_cluster\ndelete table"));
        let accept = rules
            .find("iifname \"appliance-wg\" ip saddr { 10.77.0.1 } tcp dport 50052 accept")
            .expect("peers accepted");
        let drop_link = rules
            .find("iifname \"appliance-wg\" drop")
            .expect("rest dropped");
        let drop_port = rules.find("tcp dport 50052 drop").expect("port dropped");
        assert!(accept < drop_link && drop_link < drop_port, "{rules}");
        // A head runs no RPC server: nothing may reach the port there.
        let mut head = cluster();
        head.role = Role::Head;
        head.model = Some("big".into());
        head.peers[0].role = Role::Worker;
        let rules = ruleset(&head);
        assert!(!rules.contains("dport 50052 accept"), "{rules}");
        assert!(rules.contains("tcp dport 50052 drop"), "{rules}");
    }

    #[test]
    fn the_configuration_names_every_peer_and_keepalive() {
        let conf = wireguard_conf(&cluster(), "PRIVATE\n");
        assert!(conf.starts_with("[Interface]\nPrivateKey = PRIVATE\nListenPort = 51820\n"));
        assert!(conf.contains("AllowedIPs = 10.77.0.1/32\nEndpoint = 192.168.1.20:51820\n"));
        assert!(conf.contains("PersistentKeepalive = 25"));
    }

    #[test]
    fn a_dump_gives_each_peers_handshake_and_bytes() {
        let dump = "priv\tpub\t51820\toff\n\
                    KEY1\t(none)\t192.168.1.20:51820\t10.77.0.1/32\t1000\t300\t400\t25\n\
                    KEY2\t(none)\t(none)\t10.77.0.3/32\t0\t0\t0\t25\n";
        let peers = parse_dump(dump, 1010);
        assert_eq!(peers.len(), 2);
        assert_eq!(peers[0].address, Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(peers[0].handshake_age_s, Some(10));
        assert!(peers[0].is_up());
        assert_eq!((peers[0].received_bytes, peers[0].sent_bytes), (300, 400));
        assert!(!peers[1].is_up());
    }
}
