//! Every value a fleet file can hold, checked when it is read: a typo is found on the
//! operator's machine, not on a box in a clinic.
//!
//! Each type deserializes from a string through `TryFrom<String>`, so serde reports its error
//! with the file's line and key.

use std::fmt;
use std::net::IpAddr;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

macro_rules! string_value {
    ($(#[$doc:meta])* $name:ident, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The checked value.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(text: String) -> Result<Self, String> {
                $check(text).map($name)
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(text: &str) -> Result<Self, String> {
                Self::try_from(text.to_string())
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_value!(
    /// A host name (one DNS label: 1-63 of `a-z 0-9 -`, not starting or ending with `-`),
    /// lowercased. Box names are host names too, so a box is found on the network by its name.
    Hostname,
    check_hostname
);
string_value!(
    /// The fleet's name: 1-64 of `A-Z a-z 0-9 . _ -`.
    FleetName,
    check_fleet_name
);
string_value!(
    /// A board serial as the firmware reports it (8-16 hex digits), lowercased.
    Serial,
    check_serial
);
string_value!(
    /// An IANA time zone such as `Europe/Berlin` or `UTC`.
    Timezone,
    check_timezone
);
string_value!(
    /// An NTP server: a host name or an IP address.
    NtpServer,
    check_ntp_server
);
string_value!(
    /// An Argon2 PHC string, as `supervisor dashboard hash-password` prints it.
    PasswordHash,
    check_password_hash
);
string_value!(
    /// The SHA-256 of an API token (64 hex digits, lowercased), as `supervisor dashboard
    /// new-token` prints it, with the scopes the token has before a colon
    /// (`read+operate:9f86…`); a bare digest has every scope, as tokens always had. Never the
    /// token.
    TokenDigest,
    check_token_digest
);

/// What an API token may do on a box's dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Read the box's state: `/api/status`, `/metrics`, an update's progress.
    Read,
    /// Change the box: install an update.
    Operate,
    /// Enrol the box into a fleet.
    Enroll,
}

impl Scope {
    /// Every scope, by its word.
    pub const ALL: [(&'static str, Scope); 3] = [
        ("read", Scope::Read),
        ("operate", Scope::Operate),
        ("enroll", Scope::Enroll),
    ];

    /// The scope's word.
    pub fn word(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Operate => "operate",
            Scope::Enroll => "enroll",
        }
    }
}

impl TokenDigest {
    /// The digest's 64 hex digits, without the scopes.
    pub fn digest(&self) -> &str {
        let text = self.as_str();
        text.rsplit(':').next().unwrap_or(text)
    }

    /// Whether the token may act in `scope`.
    pub fn allows(&self, scope: Scope) -> bool {
        match self.as_str().rsplit_once(':') {
            None => true,
            Some((scopes, _)) => scopes.split('+').any(|s| s == scope.word()),
        }
    }
}

fn check_token_digest(text: String) -> Result<String, String> {
    let (scopes, digest) = match text.rsplit_once(':') {
        Some((scopes, digest)) => (Some(scopes), digest),
        None => (None, text.as_str()),
    };
    let digest = check_digest(digest.to_string()).map_err(|_| {
        "invalid api_token_sha256 entry: expected the 64 hex digits `supervisor dashboard \
         new-token` prints (the digest, never the token), optionally after its scopes \
         (`read:`, `read+operate:`)"
            .to_string()
    })?;
    let Some(scopes) = scopes else {
        return Ok(digest);
    };
    let mut words: Vec<&str> = Vec::new();
    for word in scopes.split('+') {
        let word = word.trim();
        if !Scope::ALL.iter().any(|(w, _)| *w == word) {
            return Err(format!(
                "invalid api_token_sha256 entry: unknown scope {word:?}; scopes are read, \
                 operate and enroll, joined by `+`"
            ));
        }
        if !words.contains(&word) {
            words.push(word);
        }
    }
    Ok(format!("{}:{digest}", words.join("+")))
}
string_value!(
    /// One OpenSSH public key line: type, base64 key (whose encoded type matches), optional comment.
    SshKey,
    check_ssh_key
);
string_value!(
    /// A model id as in `models/*.toml` (`a-z 0-9 . _ -`).
    ModelId,
    check_model_id
);
string_value!(
    /// An ed25519 public key, 64 hex digits (lowercased), as `supervisor weights keygen` prints it.
    FleetKey,
    check_fleet_key
);
string_value!(
    /// A Wi-Fi network name: 1-32 bytes of UTF-8 without control characters.
    Ssid,
    check_ssid
);
string_value!(
    /// A box's one-time enrolment token (64 hex digits): `appliance stamp` derives it from the
    /// fleet's secret; the box proves it holds it when `appliance fleet enroll` asks.
    EnrollmentToken,
    check_digest
);
string_value!(
    /// A WPA PSK: the 64 hex digits derived from the SSID and passphrase (`appliance wifi-psk`).
    WifiPsk,
    check_digest
);

string_value!(
    /// A network interface name: 1-15 letters, digits, `-` and `_` (the kernel's limit).
    Interface,
    check_interface
);

string_value!(
    /// A WireGuard public key: 32 bytes in standard base64 (44 characters).
    WireguardKey,
    check_wireguard_key
);

string_value!(
    /// Where a WireGuard peer listens: `HOST:PORT` (an IPv4 address, `[IPv6]` or a name; a
    /// port 1-65535).
    Endpoint,
    check_endpoint
);

impl WireguardKey {
    /// 32 bytes from WireGuard's base64 text, or `None`.
    pub fn decode(text: &str) -> Option<[u8; 32]> {
        let text = text.trim();
        if text.len() != 44 {
            return None;
        }
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .ok()?
            .try_into()
            .ok()
    }
}

fn check_interface(text: String) -> Result<String, String> {
    let ok = (1..=15).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(text)
    } else {
        Err(format!(
            "invalid interface {text:?}: allowed are 1-15 letters, digits, '-' and '_'"
        ))
    }
}

fn check_wireguard_key(text: String) -> Result<String, String> {
    match WireguardKey::decode(&text) {
        Some(_) => Ok(text),
        None => Err(format!(
            "invalid public_key {text:?}: expected a WireGuard key, 44 characters of base64 (`wg pubkey` prints one)"
        )),
    }
}

fn check_endpoint(text: String) -> Result<String, String> {
    let bad =
        || format!("invalid endpoint {text:?}: expected HOST:PORT, e.g. \"192.168.1.21:51820\"");
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    // A name or IPv4 address, or an IPv6 address in brackets.
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        }
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 && host_ok => Ok(text),
        _ => Err(bad()),
    }
}

fn check_hostname(text: String) -> Result<String, String> {
    let name = text.to_ascii_lowercase();
    let ok = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(name)
    } else {
        Err(format!(
            "invalid host name \"{text}\": use 1-63 letters, digits and '-', not starting or ending with '-' (e.g. \"clinic-north-1\")"
        ))
    }
}

fn check_fleet_name(text: String) -> Result<String, String> {
    let ok = (1..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(text)
    } else {
        Err(format!(
            "invalid fleet name \"{text}\": use 1-64 letters, digits, '.', '_' and '-'"
        ))
    }
}

fn check_serial(text: String) -> Result<String, String> {
    let serial = text.to_ascii_lowercase();
    if (8..=16).contains(&serial.len()) && serial.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(serial)
    } else {
        Err(format!(
            "invalid serial \"{text}\": a board serial is 8-16 hex digits (on the box: `supervisor status` shows it; `cat /sys/firmware/devicetree/base/serial-number`)"
        ))
    }
}

fn check_timezone(text: String) -> Result<String, String> {
    let segment_ok = |s: &str| {
        s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+'))
    };
    if text.len() <= 64 && text.split('/').all(segment_ok) {
        Ok(text)
    } else {
        Err(format!(
            "invalid timezone \"{text}\": use an IANA zone name such as \"Europe/Berlin\" or \"UTC\""
        ))
    }
}

fn check_ntp_server(text: String) -> Result<String, String> {
    if text.parse::<IpAddr>().is_ok() {
        return Ok(text);
    }
    let label_ok = |l: &str| check_hostname(l.to_string()).is_ok();
    if text.len() <= 253 && text.split('.').all(label_ok) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!(
            "invalid NTP server \"{text}\": use a host name (\"ntp.example.org\") or an IP address"
        ))
    }
}

fn check_password_hash(text: String) -> Result<String, String> {
    match password_hash::PasswordHash::new(&text) {
        Ok(h) if h.algorithm.as_str().starts_with("argon2") && h.hash.is_some() => Ok(text),
        _ => Err(
            "invalid password_hash: expected an Argon2 PHC string ($argon2id$v=19$...) as \
             `supervisor dashboard hash-password` prints it (never the password itself)"
                .into(),
        ),
    }
}

fn check_digest(text: String) -> Result<String, String> {
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(format!(
            "invalid value \"{}\": expected 64 hex digits (a SHA-256 digest or WPA PSK, never the secret itself)",
            text.chars().take(8).collect::<String>() + if text.len() > 8 { "…" } else { "" }
        ))
    }
}

/// The key types an OpenSSH server accepts for login.
const SSH_KEY_TYPES: [&str; 7] = [
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

fn check_ssh_key(text: String) -> Result<String, String> {
    let fail = |why: &str| {
        Err(format!(
            "invalid SSH key \"{}…\": {why}; paste one line of a `.pub` file (\"ssh-ed25519 AAAA… user@host\")",
            text.chars().take(24).collect::<String>()
        ))
    };
    // One line only: a newline would smuggle a second key (or options) into authorized_keys.
    if text.chars().any(|c| c.is_control()) {
        return fail("it holds a line break or control character");
    }
    let mut fields = text.split_whitespace();
    let (Some(kind), Some(blob)) = (fields.next(), fields.next()) else {
        return fail("expected a key type and the base64 key");
    };
    if !SSH_KEY_TYPES.contains(&kind) {
        return fail("unknown key type (options before the key are not accepted)");
    }
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(blob) else {
        return fail("the key is not valid base64");
    };
    // The blob starts with its own type as an SSH string: u32 length, then the name.
    let encoded_kind = bytes
        .get(..4)
        .and_then(|len| {
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            bytes.get(4..4 + len)
        })
        .unwrap_or_default();
    if encoded_kind != kind.as_bytes() {
        return fail("the key's data does not match its type");
    }
    Ok(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn check_model_id(text: String) -> Result<String, String> {
    let ok = (1..=64).contains(&text.len())
        && text.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(text)
    } else {
        Err(format!(
            "invalid model \"{text}\": use a model id as in models/*.toml (e.g. \"smollm2-135m-instruct-q4_1\")"
        ))
    }
}

fn check_fleet_key(text: String) -> Result<String, String> {
    let key = text.to_ascii_lowercase();
    let point = hex::decode(&key)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .and_then(|b| ed25519_dalek::VerifyingKey::from_bytes(&b).ok());
    match point {
        Some(_) => Ok(key),
        None => Err(format!(
            "invalid fleet_key \"{text}\": expected an ed25519 public key, 64 hex digits, as `supervisor weights keygen` prints it"
        )),
    }
}

fn check_ssid(text: String) -> Result<String, String> {
    if (1..=32).contains(&text.len()) && !text.chars().any(char::is_control) {
        Ok(text)
    } else {
        Err(format!(
            "invalid Wi-Fi ssid \"{text}\": 1-32 bytes without control characters"
        ))
    }
}

/// An interface address with its prefix length, `192.168.1.20/24` or `fd00::20/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpPrefix {
    /// The address.
    pub address: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl IpPrefix {
    /// Whether `other` is inside this address's network.
    pub fn contains(&self, other: IpAddr) -> bool {
        fn masked(bits: u128, width: u32, prefix: u8) -> u128 {
            let host_bits = width - u32::from(prefix);
            if host_bits >= 128 {
                0
            } else {
                bits >> host_bits
            }
        }
        match (self.address, other) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                masked(u32::from(a).into(), 32, self.prefix)
                    == masked(u32::from(b).into(), 32, self.prefix)
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                masked(u128::from(a), 128, self.prefix) == masked(u128::from(b), 128, self.prefix)
            }
            _ => false,
        }
    }
}

impl TryFrom<String> for IpPrefix {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let parsed = text.split_once('/').and_then(|(address, prefix)| {
            let address: IpAddr = address.parse().ok()?;
            let prefix: u8 = prefix.parse().ok()?;
            let max = if address.is_ipv4() { 32 } else { 128 };
            (1..=max)
                .contains(&prefix)
                .then_some(IpPrefix { address, prefix })
        });
        parsed.ok_or_else(|| {
            format!(
                "invalid address \"{text}\": use an address with its prefix length, e.g. \"192.168.1.20/24\""
            )
        })
    }
}

impl From<IpPrefix> for String {
    fn from(p: IpPrefix) -> String {
        format!("{}/{}", p.address, p.prefix)
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ssh_blob(kind: &str) -> String {
        let mut blob = (kind.len() as u32).to_be_bytes().to_vec();
        blob.extend_from_slice(kind.as_bytes());
        blob.extend_from_slice(&[0, 0, 0, 32]);
        blob.extend_from_slice(&[7; 32]);
        base64::engine::general_purpose::STANDARD.encode(blob)
    }

    #[test]
    fn host_names_are_dns_labels() {
        assert_eq!(
            "Clinic-North-1".parse::<Hostname>().map(String::from),
            Ok("clinic-north-1".into())
        );
        for bad in ["", "-a", "a-", "a.b", "a b", &"x".repeat(64), "ä"] {
            assert!(bad.parse::<Hostname>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ssh_keys_are_one_checked_line() {
        let good = format!("ssh-ed25519 {} it@desk", ssh_blob("ssh-ed25519"));
        assert_eq!(good.parse::<SshKey>().map(String::from), Ok(good.clone()));
        let smuggled = format!("{good}\nssh-ed25519 {}", ssh_blob("ssh-ed25519"));
        assert!(smuggled.parse::<SshKey>().is_err());
        let options = format!("command=\"sh\" {good}");
        assert!(options.parse::<SshKey>().is_err());
        let mismatched = format!("ssh-ed25519 {}", ssh_blob("ssh-rsa"));
        assert!(mismatched.parse::<SshKey>().is_err());
        assert!("ssh-ed25519 not*base64".parse::<SshKey>().is_err());
    }

    #[test]
    fn prefixes_parse_and_contain_their_gateway() {
        let net: IpPrefix = IpPrefix::try_from("192.168.1.20/24".to_string()).expect("parses");
        assert!(net.contains("192.168.1.1".parse().expect("ip")));
        assert!(!net.contains("192.168.2.1".parse().expect("ip")));
        assert!(!net.contains("fd00::1".parse().expect("ip")));
        let v6 = IpPrefix::try_from("fd00::20/64".to_string()).expect("parses");
        assert!(v6.contains("fd00::1".parse().expect("ip")));
        for bad in ["192.168.1.20", "192.168.1.20/33", "192.168.1.20/0", "x/24"] {
            assert!(IpPrefix::try_from(bad.to_string()).is_err(), "{bad}");
        }
    }

    #[test]
    fn other_values_refuse_what_a_box_could_not_use() {
        assert!("Europe/Berlin".parse::<Timezone>().is_ok());
        assert!("../../etc/shadow".parse::<Timezone>().is_err());
        assert!("/etc/x".parse::<Timezone>().is_err());
        assert!("pool.ntp.org".parse::<NtpServer>().is_ok());
        assert!("10.0.0.1".parse::<NtpServer>().is_ok());
        assert!("ntp;reboot".parse::<NtpServer>().is_err());
        assert!("hunter2".parse::<PasswordHash>().is_err());
        assert!("AB".repeat(32).parse::<TokenDigest>().is_ok());
        assert!("token".parse::<TokenDigest>().is_err());
        let scoped: TokenDigest = format!("read+read:{}", "AB".repeat(32))
            .parse()
            .expect("scoped");
        assert_eq!(scoped.as_str(), format!("read:{}", "ab".repeat(32)));
        assert_eq!(scoped.digest(), "ab".repeat(32));
        assert!(scoped.allows(Scope::Read) && !scoped.allows(Scope::Operate));
        let bare: TokenDigest = "ab".repeat(32).parse().expect("bare");
        assert!(
            Scope::ALL.iter().all(|(_, s)| bare.allows(*s)),
            "a bare digest has every scope"
        );
        let e = format!("admin:{}", "ab".repeat(32))
            .parse::<TokenDigest>()
            .expect_err("scope");
        assert!(e.contains("\"admin\""), "{e}");
        assert!("10000000ABCDEF12".parse::<Serial>().is_ok());
        assert!("xyz".parse::<Serial>().is_err());
        assert!("00".repeat(32).parse::<FleetKey>().is_ok());
        assert!("zz".repeat(32).parse::<FleetKey>().is_err());
        assert!("Smol".parse::<ModelId>().is_err());
        assert!("a".repeat(33).parse::<Ssid>().is_err());
    }
}
