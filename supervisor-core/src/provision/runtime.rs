//! The committed settings made real in the running system.
//!
//! The root filesystem is read-only, so everything lands in `/run` (tmpfs) and is written again
//! at every boot, before the daemons that read it start: systemd-networkd's `.network` files
//! (named to sort before the image's DHCP default), a systemd-timesyncd drop-in, the
//! `/etc/localtime` target, the Wi-Fi network for wpa_supplicant and SSH authorized keys. A
//! setting the applied generation lacks has its file removed.

use std::fmt::Write;

use crate::board::{Board, paths};
use provision::{BoxSettings, Network};

/// The wired network, sorting before the image's `20-wired.network`.
pub const WIRED_NETWORK: &str = "/run/systemd/network/10-appliance-wired.network";
/// The Wi-Fi network's addressing.
pub const WIFI_NETWORK: &str = "/run/systemd/network/10-appliance-wifi.network";
/// The NTP servers.
pub const TIMESYNCD_DROPIN: &str = "/run/systemd/timesyncd.conf.d/50-appliance.conf";
/// The Wi-Fi network to join (owner-only: it holds the PSK), read by `appliance-wifi@.service`
/// for whichever wireless interface the board has.
pub const WPA_SUPPLICANT_CONF: &str = "/run/appliance/wpa_supplicant.conf";
/// Keys that may log in over SSH.
pub const SSH_AUTHORIZED_KEYS: &str = "/run/appliance/ssh/authorized_keys";

/// Writes (or removes) every runtime file for `settings`.
pub fn realise(board: &Board, settings: &BoxSettings) -> Result<(), String> {
    let fail = |e: crate::board::BoardError| e.to_string();
    for dir in [
        paths::RUN_NETWORK_DIR,
        paths::RUN_TIMESYNCD_DIR,
        paths::RUN_APPLIANCE,
        "/run/appliance/ssh",
    ] {
        board.create_dir_all(dir).map_err(fail)?;
    }
    if let Some(name) = settings.effective_hostname() {
        board
            .write_attribute(paths::KERNEL_HOSTNAME, name.as_str())
            .map_err(fail)?;
    }
    let network = settings.network.clone().unwrap_or_default();
    put(board, WIRED_NETWORK, settings.network.as_ref().map(wired))?;
    let wifi = network.wifi.as_ref();
    put(board, WIFI_NETWORK, wifi.map(|_| wireless(&network)))?;
    let wpa = wifi.map(|w| {
        let key = match &w.psk {
            Some(psk) => format!("    psk={psk}\n"),
            None => "    key_mgmt=NONE\n".to_string(),
        };
        // The SSID in hex: no quoting rules for the operator's characters to break.
        format!(
            "ctrl_interface=DIR=/run/wpa_supplicant\nnetwork={{\n    ssid={}\n{key}}}\n",
            hex::encode(w.ssid.as_str())
        )
    });
    match wpa {
        Some(text) => board
            .replace_private_file(WPA_SUPPLICANT_CONF, text.as_bytes())
            .map_err(fail)?,
        None => board.remove_file(WPA_SUPPLICANT_CONF).map_err(fail)?,
    }
    let ntp = settings
        .ntp
        .as_ref()
        .filter(|s| !s.is_empty())
        .map(|servers| {
            let list: Vec<&str> = servers.iter().map(|s| s.as_str()).collect();
            format!("{HEADER}[Time]\nNTP={}\n", list.join(" "))
        });
    put(board, TIMESYNCD_DROPIN, ntp)?;
    let zone = settings.timezone.as_ref().map_or("UTC", |z| z.as_str());
    board
        .replace_symlink(paths::RUN_LOCALTIME, &format!("{}/{zone}", paths::ZONEINFO))
        .map_err(fail)?;
    let keys = settings
        .ssh_authorized_keys
        .as_ref()
        .filter(|k| !k.is_empty())
        .map(|keys| {
            keys.iter()
                .fold(String::new(), |out, k| out + k.as_str() + "\n")
        });
    match keys {
        Some(text) => board
            .replace_private_file(SSH_AUTHORIZED_KEYS, text.as_bytes())
            .map_err(fail)?,
        None => board.remove_file(SSH_AUTHORIZED_KEYS).map_err(fail)?,
    }
    Ok(())
}

const HEADER: &str = "# Written at boot by appliance-provision from the applied provisioning.\n";

fn put(board: &Board, path: &str, text: Option<String>) -> Result<(), String> {
    let done = match text {
        Some(text) => board.replace_file(path, text.as_bytes()),
        None => board.remove_file(path),
    };
    done.map_err(|e| e.to_string())
}

/// Ethernet: the static address when one is given, else DHCP; DNS servers either way.
fn wired(network: &Network) -> String {
    let mut out = format!("{HEADER}[Match]\nType=ether\n\n[Network]\n");
    match network.address {
        Some(address) => {
            let _ = writeln!(out, "Address={address}");
            if let Some(gateway) = network.gateway {
                let _ = writeln!(out, "Gateway={gateway}");
            }
        }
        None => out.push_str("DHCP=yes\n"),
    }
    dns(&mut out, network);
    out
}

/// Wi-Fi takes its address by DHCP (a static address belongs to the wired port).
fn wireless(network: &Network) -> String {
    let mut out = format!("{HEADER}[Match]\nType=wlan\n\n[Network]\nDHCP=yes\n");
    dns(&mut out, network);
    out
}

fn dns(out: &mut String, network: &Network) {
    for server in network.dns.iter().flatten() {
        let _ = writeln!(out, "DNS={server}");
    }
}
