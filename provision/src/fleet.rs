//! The fleet file and the provisioning file: one typed format.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::values::{
    EnrollmentToken, FleetKey, FleetName, Hostname, IpPrefix, ModelId, NtpServer, PasswordHash,
    Serial, SshKey, Ssid, Timezone, TokenDigest, WifiPsk,
};

/// A fleet file, or a provisioning file (the same format with one box, or all of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// The fleet's name, generation and defaults.
    pub fleet: Fleet,
    /// One entry per box.
    #[serde(default, rename = "box", skip_serializing_if = "Vec::is_empty")]
    pub boxes: Vec<BoxSettings>,
    /// Clusters of boxes serving one model (in a fleet file; a stamped file carries the box's
    /// part in its entry instead).
    #[serde(default, rename = "cluster", skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<crate::cluster::ClusterDef>,
}

/// `[fleet]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    /// The fleet's name.
    pub name: FleetName,
    /// Raised by the operator to re-provision: a box applies a generation once, and only one
    /// higher than the one it has.
    pub generation: u64,
    /// What every box gets unless its entry says otherwise.
    #[serde(default, skip_serializing_if = "BoxSettings::is_empty")]
    pub defaults: BoxSettings,
}

/// One box's settings (`[[box]]`) or the fleet's defaults (`[fleet.defaults]`, without `name`
/// and `serial`). Absent means: the fleet default, else the product's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxSettings {
    /// The box's name, unique in the fleet; also its host name unless `hostname` is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Hostname>,
    /// The board serial this entry is for (required when one file serves several boxes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<Serial>,
    /// Host name (default: the box's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Hostname>,
    /// Time zone (default UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<Timezone>,
    /// NTP servers (default: the OS's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ntp: Option<Vec<NtpServer>>,
    /// Argon2 hash of the dashboard password (none: the dashboard stays loopback-only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<PasswordHash>,
    /// SHA-256 digests of the API tokens `/api/status` accepts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_token_sha256: Option<Vec<TokenDigest>>,
    /// SSH public keys allowed to log in; an SSH server runs only on a box that has some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_authorized_keys: Option<Vec<SshKey>>,
    /// The model to serve (an id from `models/`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelId>,
    /// Whether the box tries overclocks (default off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overclock: Option<bool>,
    /// The ed25519 key the box trusts for later provisioning (a signed USB stick) and updates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_key: Option<FleetKey>,
    /// Network (default: DHCP on Ethernet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// The one-time enrolment token `appliance stamp` adds for this box (never in a fleet
    /// file; a secret, removed from the boot partition once applied).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enrollment_token: Option<EnrollmentToken>,
    /// The box's part in a cluster, which `appliance stamp` adds from the fleet's
    /// `[[cluster]]` (never written in a fleet file's entries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::Membership>,
}

/// `network`: DHCP unless `address` is given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// Static address with prefix length; absent: DHCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<IpPrefix>,
    /// Default gateway (with `address`; inside its network).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// DNS servers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns: Option<Vec<IpAddr>>,
    /// Wi-Fi instead of Ethernet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wifi: Option<Wifi>,
}

/// A Wi-Fi network: its name and its WPA PSK (never the passphrase).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wifi {
    /// The network's name.
    pub ssid: Ssid,
    /// The PSK (`appliance wifi-psk` derives it); removed from the boot partition once applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psk: Option<WifiPsk>,
}

/// A fleet or provisioning file that cannot be used: which file, and what is wrong where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetError {
    /// The file as the user named it.
    pub file: String,
    /// What is wrong (syntax and type errors carry the line, column and key).
    pub message: String,
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

impl std::error::Error for FleetError {}

impl BoxSettings {
    fn is_empty(&self) -> bool {
        *self == BoxSettings::default()
    }

    /// These settings over `defaults`: a field set here wins; `network`'s fields are merged
    /// one by one (a fleet's DNS with a box's address).
    pub fn over(&self, defaults: &BoxSettings) -> BoxSettings {
        let network = match (&self.network, &defaults.network) {
            (Some(own), Some(base)) => Some(Network {
                address: own.address.or(base.address),
                gateway: own.gateway.or(base.gateway),
                dns: own.dns.clone().or_else(|| base.dns.clone()),
                wifi: own.wifi.clone().or_else(|| base.wifi.clone()),
            }),
            (own, base) => own.clone().or_else(|| base.clone()),
        };
        BoxSettings {
            name: self.name.clone().or_else(|| defaults.name.clone()),
            serial: self.serial.clone().or_else(|| defaults.serial.clone()),
            hostname: self.hostname.clone().or_else(|| defaults.hostname.clone()),
            timezone: self.timezone.clone().or_else(|| defaults.timezone.clone()),
            ntp: self.ntp.clone().or_else(|| defaults.ntp.clone()),
            password_hash: self
                .password_hash
                .clone()
                .or_else(|| defaults.password_hash.clone()),
            api_token_sha256: self
                .api_token_sha256
                .clone()
                .or_else(|| defaults.api_token_sha256.clone()),
            ssh_authorized_keys: self
                .ssh_authorized_keys
                .clone()
                .or_else(|| defaults.ssh_authorized_keys.clone()),
            model: self.model.clone().or_else(|| defaults.model.clone()),
            overclock: self.overclock.or(defaults.overclock),
            fleet_key: self
                .fleet_key
                .clone()
                .or_else(|| defaults.fleet_key.clone()),
            network,
            enrollment_token: self
                .enrollment_token
                .clone()
                .or_else(|| defaults.enrollment_token.clone()),
            cluster: self.cluster.clone().or_else(|| defaults.cluster.clone()),
        }
    }

    /// The host name the box takes: `hostname`, else its name.
    pub fn effective_hostname(&self) -> Option<&Hostname> {
        self.hostname.as_ref().or(self.name.as_ref())
    }

    /// Whether anything secret is in these settings (the password hash, token digests, a PSK).
    pub fn has_secrets(&self) -> bool {
        self.password_hash.is_some()
            || self.api_token_sha256.is_some()
            || self.enrollment_token.is_some()
            || self
                .network
                .as_ref()
                .and_then(|n| n.wifi.as_ref())
                .is_some_and(|w| w.psk.is_some())
    }

    /// The secret values these settings hold (what [`BoxSettings::without_secrets`] drops).
    pub fn secrets(&self) -> Vec<&str> {
        let mut secrets: Vec<&str> = Vec::new();
        secrets.extend(self.password_hash.as_ref().map(|h| h.as_str()));
        secrets.extend(self.api_token_sha256.iter().flatten().map(|d| d.digest()));
        secrets.extend(self.enrollment_token.as_ref().map(|t| t.as_str()));
        secrets.extend(
            self.network
                .as_ref()
                .and_then(|n| n.wifi.as_ref())
                .and_then(|w| w.psk.as_ref())
                .map(|p| p.as_str()),
        );
        secrets
    }

    /// The same settings without their secrets.
    pub fn without_secrets(&self) -> BoxSettings {
        let mut plain = self.clone();
        plain.password_hash = None;
        plain.api_token_sha256 = None;
        plain.enrollment_token = None;
        if let Some(wifi) = plain.network.as_mut().and_then(|n| n.wifi.as_mut()) {
            wifi.psk = None;
        }
        plain
    }

    fn check_network(&self, at: &str) -> Result<(), String> {
        let Some(network) = &self.network else {
            return Ok(());
        };
        match (network.address, network.gateway) {
            (None, Some(gateway)) => Err(format!(
                "{at}: network.gateway = \"{gateway}\" without network.address; a gateway needs a static address (or remove it for DHCP)"
            )),
            (Some(address), Some(gateway)) if !address.contains(gateway) => Err(format!(
                "{at}: network.gateway = \"{gateway}\" is outside network.address = \"{address}\""
            )),
            _ => Ok(()),
        }
    }
}

impl FleetFile {
    /// Parses and checks a fleet or provisioning file; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<FleetFile, FleetError> {
        let fail = |message: String| FleetError {
            file: file.to_string(),
            message,
        };
        let parsed: FleetFile =
            toml::from_str(text).map_err(|e| fail(e.to_string().trim_end().to_string()))?;
        parsed.check().map_err(fail)?;
        Ok(parsed)
    }

    fn check(&self) -> Result<(), String> {
        if self.fleet.generation == 0 {
            return Err(
                "fleet.generation = 0: generations start at 1 (raise it to re-provision)".into(),
            );
        }
        let defaults = &self.fleet.defaults;
        if defaults.name.is_some()
            || defaults.serial.is_some()
            || defaults.enrollment_token.is_some()
            || defaults.cluster.is_some()
        {
            return Err(
                "[fleet.defaults] sets name, serial, enrollment_token or cluster: those belong to one box (`appliance stamp` adds the token, and each member's part from [[cluster]])".into(),
            );
        }
        self.fleet.defaults.check_network("[fleet.defaults]")?;
        let (mut names, mut serials) = (HashSet::new(), HashSet::new());
        for (i, entry) in self.boxes.iter().enumerate() {
            let Some(name) = &entry.name else {
                return Err(format!(
                    "[[box]] number {}: no name; every box needs a name = \"...\"",
                    i + 1
                ));
            };
            if !names.insert(name) {
                return Err(format!(
                    "[[box]] \"{name}\" appears twice; names are unique"
                ));
            }
            if let Some(serial) = &entry.serial
                && !serials.insert(serial)
            {
                return Err(format!(
                    "[[box]] \"{name}\": serial {serial} is already another box's"
                ));
            }
            entry
                .over(&self.fleet.defaults)
                .check_network(&format!("[[box]] \"{name}\""))?;
            if entry.cluster.is_some() && !self.clusters.is_empty() {
                return Err(format!(
                    "[[box]] \"{name}\": its cluster part comes from [[cluster]]; remove [box.cluster]"
                ));
            }
        }
        let mut taken = HashSet::new();
        for cluster in &self.clusters {
            cluster.check(&names, &mut taken)?;
            // The head serves its own model while a worker is gone: not the cluster's.
            let head = self
                .boxes
                .iter()
                .find(|b| b.name.as_ref() == Some(&cluster.head))
                .map(|b| b.over(&self.fleet.defaults));
            let own_model = head.and_then(|h| h.model);
            if own_model.as_ref() == Some(&cluster.model)
                && cluster.fallback != Some(crate::cluster::Fallback::None)
            {
                return Err(format!(
                    "[[cluster]] \"{}\": its model {} is also its head's own model (served alone while a worker is gone); give [[box]] \"{}\" another model, or set fallback = \"none\"",
                    cluster.name, cluster.model, cluster.head
                ));
            }
        }
        Ok(())
    }

    /// The file as TOML.
    pub fn to_text(&self) -> String {
        // Serializing checked values of these types cannot fail; an empty text would be
        // refused by the box rather than misread.
        toml::to_string(self).unwrap_or_default()
    }

    /// The provisioning file for box `name`: this fleet's name and generation, the box's entry
    /// with the defaults folded in, no other box.
    pub fn stamp(&self, name: &str) -> Result<FleetFile, String> {
        let entry = self
            .boxes
            .iter()
            .find(|b| b.name.as_ref().is_some_and(|n| n.as_str() == name))
            .ok_or_else(|| {
                let known: Vec<&str> = self
                    .boxes
                    .iter()
                    .filter_map(|b| b.name.as_ref().map(Hostname::as_str))
                    .collect();
                format!(
                    "no [[box]] named \"{name}\" in fleet {} (boxes: {})",
                    self.fleet.name,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            })?;
        let mut settings = entry.over(&self.fleet.defaults);
        if let Some(part) = self.clusters.iter().find_map(|c| c.membership(name)) {
            settings.cluster = Some(part);
        }
        Ok(FleetFile {
            fleet: Fleet {
                name: self.fleet.name.clone(),
                generation: self.fleet.generation,
                defaults: BoxSettings::default(),
            },
            boxes: vec![settings],
            clusters: Vec::new(),
        })
    }

    /// The settings for the board with `serial` (`None`: it has none to read): the one entry
    /// when the file was stamped for one box without a serial, else the entry with that serial.
    pub fn entry_for(&self, serial: Option<&Serial>) -> Result<BoxSettings, String> {
        let this_board = serial.map_or("unknown".to_string(), |s| s.to_string());
        if let [only] = self.boxes.as_slice() {
            return match (&only.serial, serial) {
                (None, _) => Ok(only.over(&self.fleet.defaults)),
                (Some(wanted), Some(actual)) if wanted == actual => {
                    Ok(only.over(&self.fleet.defaults))
                }
                (Some(wanted), _) => Err(format!(
                    "this file is for the board with serial {wanted}, and this board's is {this_board}; stamp the card for this box"
                )),
            };
        }
        let matching =
            serial.and_then(|s| self.boxes.iter().find(|b| b.serial.as_ref() == Some(s)));
        match matching {
            Some(entry) => Ok(entry.over(&self.fleet.defaults)),
            None if self.boxes.is_empty() => Err("the file has no [[box]] entry".into()),
            None => Err(format!(
                "no [[box]] has this board's serial ({this_board}); add serial = \"{this_board}\" to its entry"
            )),
        }
    }

    /// Whether a secret is anywhere in the file.
    pub fn has_secrets(&self) -> bool {
        self.fleet.defaults.has_secrets() || self.boxes.iter().any(BoxSettings::has_secrets)
    }

    /// Every secret value in the file (the defaults' and each box's).
    pub fn secrets(&self) -> Vec<&str> {
        std::iter::once(&self.fleet.defaults)
            .chain(&self.boxes)
            .flat_map(BoxSettings::secrets)
            .collect()
    }

    /// The file without any secret: what a box leaves on its boot partition.
    pub fn without_secrets(&self) -> FleetFile {
        FleetFile {
            fleet: Fleet {
                defaults: self.fleet.defaults.without_secrets(),
                ..self.fleet.clone()
            },
            boxes: self
                .boxes
                .iter()
                .map(BoxSettings::without_secrets)
                .collect(),
            clusters: self.clusters.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$ZmFrZWhhc2hmYWtlaGFzaGZha2VoYXNoZmFrZWg";

    fn fleet() -> String {
        format!(
            r#"
[fleet]
name = "north-clinics"
generation = 2

[fleet.defaults]
timezone = "Europe/Berlin"
password_hash = "{HASH}"
network = {{ dns = ["192.168.1.1"] }}

[[box]]
name = "reception"
serial = "10000000aaaaaaaa"
network = {{ address = "192.168.1.20/24", gateway = "192.168.1.1" }}

[[box]]
name = "lab"
serial = "10000000bbbbbbbb"
hostname = "lab-box"
"#
        )
    }

    #[test]
    fn a_box_takes_its_entry_over_the_defaults() {
        let file = FleetFile::parse(&fleet(), "fleet.toml").expect("parses");
        let serial: Serial = "10000000AAAAAAAA".parse().expect("serial");
        let reception = file.entry_for(Some(&serial)).expect("found by serial");
        assert_eq!(
            reception.effective_hostname().map(Hostname::as_str),
            Some("reception")
        );
        let network = reception.network.expect("network");
        assert_eq!(network.dns, Some(vec!["192.168.1.1".parse().expect("ip")]));
        assert_eq!(network.gateway, Some("192.168.1.1".parse().expect("ip")));
        assert_eq!(
            reception.timezone.map(String::from).as_deref(),
            Some("Europe/Berlin")
        );

        let other: Serial = "10000000cccccccc".parse().expect("serial");
        let err = file.entry_for(Some(&other)).expect_err("no entry");
        assert!(err.contains("10000000cccccccc"), "{err}");
    }

    #[test]
    fn a_stamped_file_holds_one_box_and_reads_back_the_same() {
        let file = FleetFile::parse(&fleet(), "fleet.toml").expect("parses");
        let stamped = file.stamp("lab").expect("stamped");
        assert_eq!(stamped.boxes.len(), 1);
        let again = FleetFile::parse(&stamped.to_text(), "stamped").expect("reads back");
        assert_eq!(again, stamped);
        let lab = again
            .entry_for(Some(&"10000000bbbbbbbb".parse().expect("serial")))
            .expect("lab");
        assert_eq!(
            lab.effective_hostname().map(Hostname::as_str),
            Some("lab-box")
        );
        assert!(again.has_secrets());
        let plain = again.without_secrets();
        assert!(!plain.has_secrets());
        assert!(!plain.to_text().contains("argon2"), "{}", plain.to_text());
        let err = again
            .entry_for(Some(&"10000000aaaaaaaa".parse().expect("serial")))
            .expect_err("another board");
        assert!(err.contains("stamp the card"), "{err}");
        assert!(
            file.stamp("attic")
                .expect_err("unknown")
                .contains("reception, lab")
        );
    }

    #[test]
    fn bad_files_name_the_key_and_line() {
        let unknown = fleet().replace("hostname = \"lab-box\"", "hostnme = \"lab-box\"");
        let err = FleetFile::parse(&unknown, "fleet.toml").expect_err("unknown key");
        assert!(err.to_string().contains("hostnme"), "{err}");
        assert!(err.to_string().contains("line 19"), "{err}");

        let bad_value = fleet().replace("Europe/Berlin", "../etc");
        let err = FleetFile::parse(&bad_value, "fleet.toml").expect_err("bad zone");
        assert!(err.to_string().contains("invalid timezone"), "{err}");
        assert!(err.to_string().starts_with("fleet.toml:"), "{err}");

        let twice = fleet().replace("name = \"lab\"", "name = \"reception\"");
        assert!(
            FleetFile::parse(&twice, "f")
                .expect_err("twice")
                .message
                .contains("twice")
        );

        let gateway = fleet().replace("gateway = \"192.168.1.1\"", "gateway = \"10.0.0.1\"");
        let err = FleetFile::parse(&gateway, "f").expect_err("gateway outside");
        assert!(err.message.contains("outside"), "{err}");

        let zero = fleet().replace("generation = 2", "generation = 0");
        assert!(FleetFile::parse(&zero, "f").is_err());
    }
}
