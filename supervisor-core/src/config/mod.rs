//! The supervisor's configuration: one TOML file, typed, every field defaulted, unknown keys refused.
//!
//! On a box the file is `/etc/appliance/appliance.toml`; a provisioning override on the boot
//! partition (`appliance.toml` there) is laid over it key by key. Locally `--config FILE` names the
//! only file. The documented copy of every key with its default is
//! `overlays/rootfs/etc/appliance/appliance.toml`, which a test keeps equal to [`Config::default`].

pub mod cluster;
pub mod overclock;
pub mod update;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::board::Board;

/// The system-wide configuration file on a box.
pub const SYSTEM_CONFIG: &str = "/etc/appliance/appliance.toml";
/// Name of the provisioning override on the boot partition.
pub const OVERRIDE_NAME: &str = "appliance.toml";

/// Everything the supervisor can be told.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// How the board is tuned for inference.
    pub tuning: Tuning,
    /// The model the engine runs, and how its weights are trusted.
    pub model: Model,
    /// The long-running daemon (`supervisor run`).
    pub daemon: Daemon,
    /// How the daemon runs the engine.
    pub engine: Engine,
    /// Safe overclock trials.
    pub overclock: overclock::Overclock,
    /// A/B system updates.
    pub update: update::Update,
    /// The web dashboard the daemon serves.
    pub dashboard: Dashboard,
    /// This box in a cluster serving one model over several boxes; absent: it serves alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<cluster::Cluster>,
}

/// How the daemon launches, watches and restarts the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Engine {
    /// The `engine` binary. Default unset: `engine` beside the supervisor's executable, else
    /// on `PATH`.
    pub binary: Option<String>,
    /// Threads; 0 takes the model manifest's value (at most the CPUs available), else 1 up to
    /// the CPUs available. Default 0.
    pub threads: Threads,
    /// Context per conversation in tokens; 0 takes the model manifest's value, else 16 to
    /// 1048576 and at most what the manifest gives. Default 0.
    pub context: ContextTokens,
    /// Loopback port the engine listens on (it is never bound beyond loopback), 1-65535.
    /// Default 8080.
    pub port: Port,
    /// A file (box path) holding the system prompt for chats that bring none. Default unset.
    pub system_prompt: Option<String>,
    /// Pause before the first restart; doubled for each further failure in a row, at most a
    /// minute; 1-60000. Default 1000.
    pub restart_backoff_ms: BackoffMs,
    /// Failures in a row (crashes, or starts that never became healthy) before the supervisor
    /// stops restarting and reports "engine failing", 0-1000. Default 5.
    pub max_restarts: MaxRestarts,
    /// Seconds the engine gets to answer `/health` after it starts, 1-3600. Default 120.
    pub start_timeout_s: StartTimeoutS,
    /// Seconds between health probes (a one-token completion), 1-3600. Default 30.
    pub health_interval_s: HealthIntervalS,
    /// Deadline of one health probe in milliseconds, 100-600000. Default 10000.
    pub health_timeout_ms: HealthTimeoutMs,
}

impl Default for Engine {
    fn default() -> Self {
        Engine {
            binary: None,
            threads: Threads(0),
            context: ContextTokens(0),
            port: Port(8080),
            system_prompt: None,
            restart_backoff_ms: BackoffMs(1000),
            max_restarts: MaxRestarts(5),
            start_timeout_s: StartTimeoutS(120),
            health_interval_s: HealthIntervalS(30),
            health_timeout_ms: HealthTimeoutMs(10_000),
        }
    }
}

/// The model the engine runs and how its weights are checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Model {
    /// Id of the installed model the engine runs. Default `"smollm2-135m-instruct-q4_1"`.
    pub id: String,
    /// Data partition directory holding installed models (under the board root).
    /// Default `"/var/lib/appliance"`.
    pub data_dir: String,
    /// Boot-time re-verification: `"full"` hashes every chunk; `"fast"` compares size, inode and
    /// mtime with the install record and hashes every chunk only every
    /// `full_verify_interval_hours`. Default `"full"`.
    pub reverify: Reverify,
    /// Hours between full verifications in `fast` mode (and of the daemon's re-checks),
    /// 1-87600. Default 168 (a week).
    pub full_verify_interval_hours: FullVerifyHours,
    /// Refuse manifests without a valid signature from a trusted key. Default false (a present
    /// signature must still verify).
    pub require_signature: bool,
    /// ed25519 public keys (64 hex digits) whose manifest signatures the box accepts (the
    /// provisioned `fleet_key` is added to them). Default none.
    pub trusted_keys: Vec<PublicKey>,
    /// MiB a pushed model must leave free on the data partition, for the box's own state and
    /// an OS update's upload, 64-1048576. Default 1024.
    pub keep_free_mib: KeepFreeMib,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            id: "smollm2-135m-instruct-q4_1".into(),
            data_dir: weights::install::DEFAULT_DATA_DIR.into(),
            reverify: Reverify::Full,
            full_verify_interval_hours: FullVerifyHours(168),
            require_signature: false,
            trusted_keys: Vec::new(),
            keep_free_mib: KeepFreeMib(1024),
        }
    }
}

/// Boot-time re-verification of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reverify {
    /// Every chunk at every boot.
    Full,
    /// Size, inode and mtime at boot; every chunk on a schedule.
    Fast,
}

/// An ed25519 public key in hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PublicKey(String);

impl PublicKey {
    /// The key in hex.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for PublicKey {
    type Error = String;
    fn try_from(key: String) -> Result<Self, Self::Error> {
        if key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(PublicKey(key.to_ascii_lowercase()))
        } else {
            Err(format!(
                "invalid trusted key \"{key}\": use the 64 hex digits `supervisor weights keygen` prints"
            ))
        }
    }
}

impl From<PublicKey> for String {
    fn from(k: PublicKey) -> String {
        k.0
    }
}

/// The tuned state the supervisor brings the board into and verifies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tuning {
    /// cpufreq governor for every policy. Default `performance`.
    pub governor: Governor,
    /// Bootloader `SDRAM_BANKLOW`: `"auto"` (1 with a NUMA-emulation kernel, 3 without),
    /// `"keep"` (never touch the bootloader) or a value 0–4 to pin. Default `"auto"`.
    pub sdram_banklow: BankLow,
    /// System-wide swap: `"keep"` leaves it alone, `"off"` turns every swap area off (zram too).
    /// The engine never swaps either way. Default `"keep"`.
    pub system_swap: SystemSwap,
    /// The engine's cgroup.
    pub engine: EngineCgroup,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            governor: Governor::Performance,
            sdram_banklow: BankLow::Auto,
            system_swap: SystemSwap::Keep,
            engine: EngineCgroup::default(),
        }
    }
}

/// A cpufreq governor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Governor {
    /// Always the highest clock: the measured best for inference.
    Performance,
    /// The kernel's load-following default.
    Ondemand,
    /// Scheduler-driven.
    Schedutil,
    /// Conservative load-following.
    Conservative,
    /// Always the lowest clock.
    Powersave,
}

impl Governor {
    /// The name the kernel uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Governor::Performance => "performance",
            Governor::Ondemand => "ondemand",
            Governor::Schedutil => "schedutil",
            Governor::Conservative => "conservative",
            Governor::Powersave => "powersave",
        }
    }
}

/// The `SDRAM_BANKLOW` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "BankLowRaw")]
pub enum BankLow {
    /// Choose from the kernel: 1 with NUMA emulation, 3 without.
    Auto,
    /// Leave the bootloader configuration alone.
    Keep,
    /// Pin this value (0–4).
    Pin(u8),
}

#[derive(Serialize)]
#[serde(untagged)]
enum BankLowRaw {
    Word(String),
    Number(i64),
}

impl TryFrom<toml::Value> for BankLow {
    type Error = String;
    fn try_from(raw: toml::Value) -> Result<Self, Self::Error> {
        match raw {
            toml::Value::String(w) if w == "auto" => Ok(BankLow::Auto),
            toml::Value::String(w) if w == "keep" => Ok(BankLow::Keep),
            toml::Value::Integer(n @ 0..=4) => Ok(BankLow::Pin(n as u8)),
            other => Err(format!(
                "invalid sdram_banklow {other}: allowed are \"auto\", \"keep\" or an integer 0-4"
            )),
        }
    }
}

impl From<BankLow> for BankLowRaw {
    fn from(b: BankLow) -> Self {
        match b {
            BankLow::Auto => BankLowRaw::Word("auto".into()),
            BankLow::Keep => BankLowRaw::Word("keep".into()),
            BankLow::Pin(n) => BankLowRaw::Number(i64::from(n)),
        }
    }
}

/// What to do about system-wide swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemSwap {
    /// Leave system swap as the OS set it up.
    Keep,
    /// Turn every swap area off.
    Off,
}

/// How cgroup limits are put in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupBackend {
    /// systemd over D-Bus when the root is `/` and systemd runs; plain files otherwise.
    Auto,
    /// Always through systemd (`SetUnitProperties` on the engine's slice).
    Systemd,
    /// Always by writing the cgroup files directly.
    Files,
}

/// The engine's cgroup (a systemd slice) and its limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineCgroup {
    /// systemd slice the engine runs in; its dashes give its place in the tree
    /// (`appliance-engine.slice` is `appliance.slice/appliance-engine.slice`).
    /// Default `"appliance-engine.slice"`.
    pub slice: SliceName,
    /// `cpu.weight`, 1–10000. Default 10000: the engine wins every CPU contest.
    pub cpu_weight: CpuWeight,
    /// `memory.max` is total RAM minus this many MiB (left to the OS and the supervisor), unless
    /// `memory_max_mib` is set; 0-1073741824. Default 1024.
    pub memory_reserve_mib: ReserveMib,
    /// An explicit `memory.max` in MiB instead of RAM minus the reserve, at least 64 and at
    /// most the board's RAM. Default unset.
    pub memory_max_mib: Option<MemoryMib>,
    /// `memory.low` in MiB: memory the kernel keeps for the engine under pressure, effective only
    /// if every ancestor grants at least as much; at most `memory_max_mib` when both are set.
    /// Default unset (no protection; an earlier value is cleared).
    pub memory_low_mib: Option<MemoryLowMib>,
    /// How the limits are applied. Default `"auto"`.
    pub backend: CgroupBackend,
}

impl Default for EngineCgroup {
    fn default() -> Self {
        EngineCgroup {
            slice: SliceName("appliance-engine.slice".into()),
            cpu_weight: CpuWeight(10_000),
            memory_reserve_mib: ReserveMib(1024),
            memory_max_mib: None,
            memory_low_mib: None,
            backend: CgroupBackend::Auto,
        }
    }
}

/// A memory limit in MiB, at least 64 (less cannot hold any model the engine runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "u64")]
pub struct MemoryMib(u64);

impl MemoryMib {
    /// The limit in MiB.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<i64> for MemoryMib {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, Self::Error> {
        match u64::try_from(n) {
            Ok(m) if (64..=1 << 30).contains(&m) => Ok(MemoryMib(m)),
            _ => Err(format!(
                "invalid memory_max_mib {n}: allowed is an integer from 64 up to the board's RAM in MiB"
            )),
        }
    }
}

impl From<MemoryMib> for u64 {
    fn from(m: MemoryMib) -> u64 {
        m.0
    }
}

/// A cgroup `cpu.weight`, checked to lie in 1–10000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "u32")]
pub struct CpuWeight(u32);

impl CpuWeight {
    /// The weight.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl TryFrom<i64> for CpuWeight {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, Self::Error> {
        match u32::try_from(n) {
            Ok(w @ 1..=10_000) => Ok(CpuWeight(w)),
            _ => Err(format!(
                "invalid cpu_weight {n}: allowed is an integer 1-10000"
            )),
        }
    }
}

impl From<CpuWeight> for u32 {
    fn from(w: CpuWeight) -> u32 {
        w.0
    }
}

/// A systemd slice name such as `appliance-engine.slice`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SliceName(String);

impl SliceName {
    /// The unit name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The slice's cgroup path below the cgroup root, e.g. `appliance.slice/appliance-engine.slice`.
    pub fn cgroup_path(&self) -> String {
        let stem = self.0.trim_end_matches(".slice");
        let parts: Vec<&str> = stem.split('-').collect();
        (1..=parts.len())
            .map(|n| format!("{}.slice", parts[..n].join("-")))
            .collect::<Vec<_>>()
            .join("/")
    }
}

impl TryFrom<String> for SliceName {
    type Error = String;
    fn try_from(name: String) -> Result<Self, Self::Error> {
        let stem = name.strip_suffix(".slice").unwrap_or("");
        let valid = !stem.is_empty()
            && stem != "-"
            && stem
                .split('-')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if valid {
            Ok(SliceName(name))
        } else {
            Err(format!(
                "invalid slice \"{name}\": use a systemd slice name like \"appliance-engine.slice\" \
                 (letters, digits and _ between single dashes, ending in .slice)"
            ))
        }
    }
}

impl From<SliceName> for String {
    fn from(s: SliceName) -> String {
        s.0
    }
}

/// The long-running daemon's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Daemon {
    /// Seconds between re-verifications of the tuned state (another service may undo it); drift
    /// is logged and repaired. 0 turns re-verification off, else 1-86400. Default 300.
    pub reverify_interval_s: ReverifyIntervalS,
}

impl Default for Daemon {
    fn default() -> Self {
        Daemon {
            reverify_interval_s: ReverifyIntervalS(300),
        }
    }
}

/// The web dashboard (`supervisor run` serves it once the board is tuned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dashboard {
    /// Address and port to listen on. Without a password only 127.0.0.1 on the same port is
    /// bound. Default `"0.0.0.0:8000"`.
    pub listen: ListenAddr,
    /// Address and port of HTTPS, served once the box is provisioned (it then has its own
    /// certificate) and has a password; `listen` then only redirects other machines here.
    /// Default `"0.0.0.0:8443"`.
    pub https_listen: ListenAddr,
    /// Argon2 PHC string of the login password (`supervisor dashboard hash-password`); empty:
    /// no login, loopback only. Default empty.
    pub password_hash: PasswordHash,
    /// SHA-256 (64 hex digits) of each API token accepted as `Authorization: Bearer` for
    /// `/api/status` (`supervisor dashboard new-token`). Default none.
    pub api_token_sha256: Vec<TokenDigest>,
    /// Seconds between samples of temperature, clock and speed for the live view and the
    /// one-hour charts, 1-60. Default 5.
    pub sample_interval_s: SampleInterval,
}

impl Default for Dashboard {
    fn default() -> Self {
        Dashboard {
            listen: ListenAddr(std::net::SocketAddr::from(([0, 0, 0, 0], 8000))),
            https_listen: ListenAddr(std::net::SocketAddr::from(([0, 0, 0, 0], 8443))),
            password_hash: PasswordHash(String::new()),
            api_token_sha256: Vec::new(),
            sample_interval_s: SampleInterval(5),
        }
    }
}

/// A socket address such as `0.0.0.0:8000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ListenAddr(std::net::SocketAddr);

impl ListenAddr {
    /// The address.
    pub fn get(self) -> std::net::SocketAddr {
        self.0
    }
}

impl TryFrom<String> for ListenAddr {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        match text.parse::<std::net::SocketAddr>() {
            // Port 0 would bind a random port nobody could find.
            Ok(addr) if addr.port() != 0 => Ok(ListenAddr(addr)),
            _ => Err(format!(
                "invalid listen \"{text}\": use an IP address and a port 1-65535 such as \"0.0.0.0:8000\""
            )),
        }
    }
}

impl From<ListenAddr> for String {
    fn from(a: ListenAddr) -> String {
        a.0.to_string()
    }
}

/// An Argon2 password hash in PHC format, or empty for none; checked at load so a typo is found
/// at provisioning, not at the first login.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PasswordHash(String);

impl PasswordHash {
    /// The PHC string; empty when no password is set.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a password is set.
    pub fn is_set(&self) -> bool {
        !self.0.is_empty()
    }
}

impl TryFrom<String> for PasswordHash {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        if text.is_empty() {
            return Ok(PasswordHash(text));
        }
        match argon2::password_hash::PasswordHash::new(&text) {
            Ok(h) if h.algorithm.as_str().starts_with("argon2") && h.hash.is_some() => {
                Ok(PasswordHash(text))
            }
            _ => Err(
                "invalid password_hash: expected an Argon2 PHC string ($argon2id$v=19$...) as \
                 `supervisor dashboard hash-password` prints it, or \"\" for no password"
                    .into(),
            ),
        }
    }
}

impl From<PasswordHash> for String {
    fn from(h: PasswordHash) -> String {
        h.0
    }
}

/// The SHA-256 of an API token with its scopes: the provisioning format's own type, so a
/// configuration and a provisioning file say the same thing the same way.
pub use provision::values::{Scope, TokenDigest};

/// Seconds between live samples, 1-60.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "u64")]
pub struct SampleInterval(u64);

impl SampleInterval {
    /// The interval in seconds.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<i64> for SampleInterval {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, Self::Error> {
        match u64::try_from(n) {
            Ok(s @ 1..=60) => Ok(SampleInterval(s)),
            _ => Err(format!(
                "invalid sample_interval_s {n}: allowed is an integer 1-60"
            )),
        }
    }
}

impl From<SampleInterval> for u64 {
    fn from(s: SampleInterval) -> u64 {
        s.0
    }
}

/// Declares an integer setting whose allowed values are checked as the file is read, so a value
/// out of range is refused with its key and line (the TOML error carries both) instead of
/// reaching the engine or a timer.
macro_rules! ranged_setting {
    ($(#[$doc:meta])* $name:ident($int:ty), $key:literal, $($allowed:pat_param)|+, $words:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "i64", into = "i64")]
        pub struct $name($int);

        impl $name {
            /// The value.
            pub fn get(self) -> $int {
                self.0
            }
        }

        impl TryFrom<i64> for $name {
            type Error = String;
            fn try_from(n: i64) -> Result<Self, Self::Error> {
                match <$int>::try_from(n) {
                    Ok(v @ ($($allowed)|+)) => Ok($name(v)),
                    _ => Err(format!(concat!("invalid ", $key, " {}: allowed is ", $words), n)),
                }
            }
        }

        impl From<$name> for i64 {
            fn from(v: $name) -> i64 {
                // Every allowed value is far inside i64.
                i64::try_from(v.0).unwrap_or(i64::MAX)
            }
        }
    };
}

pub(crate) use ranged_setting;

ranged_setting!(
    /// Tokens of context: 0 (the manifest's) or 16 to 1 Mi.
    ContextTokens(usize), "context", 0 | 16..=1_048_576,
    "0 (the model manifest's value) or an integer 16-1048576"
);
ranged_setting!(
    /// A TCP port, 1-65535.
    Port(u16), "port", 1..=65535, "an integer 1-65535"
);
ranged_setting!(
    /// The first restart's pause in milliseconds, 1-60000.
    BackoffMs(u64), "restart_backoff_ms", 1..=60_000, "an integer 1-60000 (milliseconds)"
);
ranged_setting!(
    /// Failures in a row allowed before giving up, 0-1000.
    MaxRestarts(u32), "max_restarts", 0..=1000, "an integer 0-1000"
);
ranged_setting!(
    /// Seconds to become healthy, 1-3600.
    StartTimeoutS(u64), "start_timeout_s", 1..=3600, "an integer 1-3600 (seconds)"
);
ranged_setting!(
    /// Seconds between health probes, 1-3600.
    HealthIntervalS(u64), "health_interval_s", 1..=3600, "an integer 1-3600 (seconds)"
);
ranged_setting!(
    /// One health probe's deadline in milliseconds, 100-600000.
    HealthTimeoutMs(u64), "health_timeout_ms", 100..=600_000,
    "an integer 100-600000 (milliseconds)"
);
ranged_setting!(
    /// Hours between full verifications, 1-87600 (ten years).
    FullVerifyHours(u64), "full_verify_interval_hours", 1..=87_600, "an integer 1-87600 (hours)"
);
ranged_setting!(
    /// MiB a pushed model leaves free on the data partition, 64-1048576.
    KeepFreeMib(u64), "keep_free_mib", 64..=1_048_576, "an integer 64-1048576 (MiB)"
);
ranged_setting!(
    /// Seconds between the daemon's re-verifications: 0 (never) or 1-86400.
    ReverifyIntervalS(u64), "reverify_interval_s", 0..=86_400,
    "0 (never) or an integer 1-86400 (seconds)"
);
ranged_setting!(
    /// MiB left to the OS, 0 up to 1 TiB (the board's RAM is checked when tuning).
    ReserveMib(u64), "memory_reserve_mib", 0..=1_073_741_824,
    "an integer 0-1073741824 (MiB; it must also leave part of the board's RAM)"
);
ranged_setting!(
    /// `memory.low` in MiB, 0 up to 1 TiB.
    MemoryLowMib(u64), "memory_low_mib", 0..=1_073_741_824, "an integer 0-1073741824 (MiB)"
);

/// Engine threads: 0 (the manifest's value) or 1 up to the CPUs this machine lets the
/// supervisor use; more only slows every token (threads wait for CPUs) or, absurdly many,
/// aborts the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Threads(usize);

impl Threads {
    /// The count; 0 for the manifest's.
    pub fn get(self) -> usize {
        self.0
    }
}

/// The CPUs this process may run on (affinity and cgroup quota included).
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl TryFrom<i64> for Threads {
    type Error = String;
    fn try_from(n: i64) -> Result<Self, Self::Error> {
        let cpus = available_cpus();
        match usize::try_from(n) {
            Ok(t) if t <= cpus => Ok(Threads(t)),
            _ => Err(format!(
                "invalid threads {n}: allowed is 0 (the model manifest's value) or an integer 1-{cpus} (the CPUs available here)"
            )),
        }
    }
}

impl From<Threads> for i64 {
    fn from(t: Threads) -> i64 {
        i64::try_from(t.0).unwrap_or(i64::MAX)
    }
}

/// A configuration file that cannot be used, with what is wrong and where.
#[derive(Debug)]
pub struct ConfigError {
    /// The offending file.
    pub file: PathBuf,
    /// What is wrong; for syntax and type errors this includes line, column and the key.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration {}: {}",
            self.file.display(),
            self.message
        )
    }
}

impl std::error::Error for ConfigError {}

/// The largest configuration file read (the documented one is a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

fn read_table(file: &Path) -> Result<toml::Table, ConfigError> {
    let fail = |message: String| ConfigError {
        file: file.to_path_buf(),
        message,
    };
    // A FIFO or a huge file in place of the configuration must not hang or exhaust the daemon.
    let bytes = durable::read_bounded(file, MAX_CONFIG_BYTES, durable::Links::Follow)
        .map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| fail("not valid UTF-8 text".into()))?;
    let table = toml::from_str::<toml::Table>(&text).map_err(|e| fail(e.to_string()))?;
    // A file may hold part of [cluster]: provisioning gives the cluster's part, a local file
    // this box's programs or memory. The keys it lacks are lent for its own check; the merged
    // whole is typed in full.
    let lacking: Vec<&str> = match table.get("cluster") {
        Some(toml::Value::Table(c)) => cluster::REQUIRED
            .iter()
            .map(|(key, _)| *key)
            .filter(|key| !c.contains_key(*key))
            .collect(),
        _ => Vec::new(),
    };
    if lacking.is_empty() {
        // Typing each file on its own reports errors with that file's own line numbers.
        toml::from_str::<Config>(&text).map_err(|e| fail(e.to_string().trim_end().to_string()))?;
    } else {
        let mut lent = table.clone();
        if let Some(toml::Value::Table(c)) = lent.get_mut("cluster") {
            for (key, stand_in) in cluster::REQUIRED {
                c.entry(key.to_string())
                    .or_insert_with(|| toml::Value::String(stand_in.to_string()));
            }
        }
        toml::Value::Table(lent)
            .try_into::<Config>()
            .map_err(|e| fail(e.to_string().trim_end().to_string()))?;
    }
    Ok(table)
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

impl Config {
    /// Reads and checks one file.
    pub fn from_file(file: &Path) -> Result<Config, ConfigError> {
        Self::from_files(&[file.to_path_buf()])
    }

    /// Reads files in order, each later one overriding the earlier ones key by key.
    pub fn from_files(files: &[PathBuf]) -> Result<Config, ConfigError> {
        let layers = files
            .iter()
            .map(|file| Ok((file.clone(), read_table(file)?)))
            .collect::<Result<Vec<_>, ConfigError>>()?;
        Self::from_layers(layers)
    }

    /// Lays tables over each other in order; each is named by the file it came from.
    fn from_layers(layers: Vec<(PathBuf, toml::Table)>) -> Result<Config, ConfigError> {
        let mut merged = toml::Table::new();
        let mut last = PathBuf::new();
        for (file, table) in layers {
            merge(&mut merged, table);
            last = file;
        }
        let fail = |message: String| ConfigError {
            file: last.clone(),
            message,
        };
        let config: Config = merged
            .try_into()
            .map_err(|e: toml::de::Error| fail(format!("after applying overrides: {e}")))?;
        if let Some(cluster) = &config.cluster {
            cluster.check(&config.model.id).map_err(fail)?;
        }
        let engine = &config.tuning.engine;
        if let (Some(low), Some(max)) = (engine.memory_low_mib, engine.memory_max_mib) {
            let low = low.get();
            if low > max.get() {
                return Err(fail(format!(
                    "tuning.engine.memory_low_mib = {low} exceeds memory_max_mib = {}; protection above the limit is void",
                    max.get()
                )));
            }
        }
        Ok(config)
    }

    /// The configuration the files give a board: `--config FILE` alone when given; otherwise
    /// the system file (if present), then what fleet provisioning applied (dashboard password,
    /// API tokens, model, overclock; its fleet key trusted for models), then the boot
    /// partition's `appliance.toml` override (if present), each later one winning key by key.
    /// What the board runs with is this and the model it switched to:
    /// `models::selection::config_for_board`.
    pub(crate) fn from_board_files(
        board: &Board,
        explicit: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        if let Some(file) = explicit {
            return Self::from_file(file);
        }
        let mut layers = Vec::new();
        let system = board.path(SYSTEM_CONFIG);
        if system.is_file() {
            layers.push((system.clone(), read_table(&system)?));
        }
        let committed = board.path(crate::provision::COMMITTED);
        let provisioned =
            crate::provision::committed_settings(board).map_err(|message| ConfigError {
                file: committed.clone(),
                message,
            })?;
        if let Some(settings) = &provisioned {
            layers.push((committed, crate::provision::config_layer(settings)));
        }
        if let Ok(boot) = board.boot_dir() {
            let provisioning = board.path(&format!("{boot}/{OVERRIDE_NAME}"));
            if provisioning.is_file() {
                layers.push((provisioning.clone(), read_table(&provisioning)?));
            }
        }
        let mut config = Self::from_layers(layers)?;
        // The fleet key signs the fleet's models as it signs its USB provisioning files.
        if let Some(key) = provisioned.as_ref().and_then(|s| s.fleet_key.as_ref()) {
            let key = PublicKey(key.to_string());
            if !config.model.trusted_keys.contains(&key) {
                config.model.trusted_keys.push(key);
            }
        }
        Ok(config)
    }
}

/// A valid Argon2id PHC string, for tests that need a password hash in a configuration.
#[cfg(test)]
pub(crate) const TEST_PASSWORD_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$\
                                            5Aa1ZpR6mxeyPO6o2yv2qXc+HG4kXGszP/Nd+kSwEk0";

#[cfg(test)]
mod tests {
    use super::*;

    const DOCUMENTED: &str = include_str!("../../../overlays/rootfs/etc/appliance/appliance.toml");

    fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn documented_file_is_exactly_the_defaults() {
        assert_eq!(
            parse(DOCUMENTED).expect("documented file parses"),
            Config::default()
        );
    }

    #[test]
    fn documented_file_names_every_key() {
        fn keys(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
            for (k, v) in table {
                match v {
                    toml::Value::Table(t) => keys(&format!("{prefix}{k}."), t, out),
                    _ => out.push(k.clone()),
                }
            }
        }
        let mut all = Config::default();
        all.tuning.engine.memory_max_mib = Some(MemoryMib(64));
        all.model.trusted_keys = vec![PublicKey("0".repeat(64))];
        all.tuning.engine.memory_low_mib = Some(MemoryLowMib(1));
        all.dashboard.api_token_sha256 =
            vec![TokenDigest::try_from("0".repeat(64)).expect("digest")];
        all.cluster = Some(
            toml::from_str(
                "name = \"c\"\nrole = \"head\"\naddress = \"10.77.0.1/24\"\nmemory_mib = 64\n\
                 model = \"m\"\nllama_server = \"l\"\nrpc_server = \"r\"\n\
                 [[peers]]\nname = \"w\"\nrole = \"worker\"\n\
                 public_key = \"YCfnX2Vx2a6bVT5pT5TGPmX6JzHppgAYdS3sCDR3p2Q=\"\n\
                 endpoint = \"h:1\"\naddress = \"10.77.0.2\"\nmemory_mib = 64\n",
            )
            .expect("cluster"),
        );
        let table = toml::Table::try_from(&all).expect("serialize");
        let mut names = Vec::new();
        keys("", &table, &mut names);
        for name in names {
            assert!(
                DOCUMENTED
                    .lines()
                    .any(|l| l.trim_start_matches("# ").starts_with(&format!("{name} ="))),
                "{name} is not documented in appliance.toml"
            );
        }
    }

    #[test]
    fn a_cluster_section_may_come_in_parts_and_is_whole_once_merged() {
        let dir = tempfile::tempdir().expect("dir");
        let (provisioned, local) = (dir.path().join("a.toml"), dir.path().join("b.toml"));
        std::fs::write(
            &provisioned,
            "[cluster]\nname = \"front\"\nrole = \"worker\"\naddress = \"10.77.0.2/24\"\n",
        )
        .expect("write");
        std::fs::write(&local, "[cluster]\nmemory_mib = 6000\n").expect("write");
        let config = Config::from_files(&[provisioned.clone(), local.clone()]).expect("merged");
        let cluster = config.cluster.expect("cluster");
        assert_eq!(cluster.memory_mib.map(MemoryMib::get), Some(6000));
        assert_eq!(cluster.address.to_string(), "10.77.0.2/24");
        // A part's own mistakes are still its own file's; a part alone is not a section.
        std::fs::write(&local, "[cluster]\nmemory_mib = 6000\nturbo = true\n").expect("write");
        let e = Config::from_files(&[provisioned, local.clone()]).expect_err("unknown key");
        assert!(e.file == local && e.message.contains("turbo"), "{e:?}");
        std::fs::write(&local, "[cluster]\nmemory_mib = 6000\n").expect("write");
        let e = Config::from_files(&[local]).expect_err("no name");
        assert!(e.message.contains("missing field `name`"), "{e:?}");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name_and_line() {
        let err =
            parse("[tuning]\ngovernor = \"performance\"\nturbo = true\n").expect_err("refused");
        assert!(err.contains("turbo"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("governor"), "lists the allowed keys: {err}");
    }

    #[test]
    fn out_of_range_values_name_what_is_allowed() {
        let err = parse("[tuning.engine]\ncpu_weight = 20000\n").expect_err("refused");
        assert!(err.contains("1-10000") && err.contains("line 2"), "{err}");
        for bad in ["7", "true", "\"fast\"", "1.5"] {
            let err = parse(&format!("[tuning]\nsdram_banklow = {bad}\n")).expect_err("refused");
            assert!(
                err.contains("\"auto\", \"keep\" or an integer 0-4"),
                "{err}"
            );
        }
        let err = parse("[tuning.engine]\nmemory_max_mib = 0\n").expect_err("refused");
        assert!(err.contains("from 64"), "{err}");
        let err = parse("[tuning]\ngovernor = \"turbo\"\n").expect_err("refused");
        assert!(err.contains("performance"), "{err}");
        let err = parse("[tuning.engine]\nslice = \"../etc\"\n").expect_err("refused");
        assert!(err.contains("slice"), "{err}");
    }

    #[test]
    fn every_number_has_a_range_and_each_bound_is_enforced_with_key_and_line() {
        let cpus = available_cpus();
        let over_cpus = (cpus + 1).to_string();
        let cpus = cpus.to_string();
        // (table, key, accepted values at and inside the bounds, refused values just outside)
        let cases: &[(&str, &str, &[&str], &[&str])] = &[
            (
                "engine",
                "threads",
                &["0", "1", &cpus],
                &["-1", &over_cpus, "4294967296"],
            ),
            (
                "engine",
                "context",
                &["0", "16", "1048576"],
                &["1", "15", "1048577", "-1"],
            ),
            ("engine", "port", &["1", "65535"], &["0", "65536", "-1"]),
            (
                "engine",
                "restart_backoff_ms",
                &["1", "60000"],
                &["0", "60001"],
            ),
            ("engine", "max_restarts", &["0", "1000"], &["-1", "1001"]),
            ("engine", "start_timeout_s", &["1", "3600"], &["0", "3601"]),
            (
                "engine",
                "health_interval_s",
                &["1", "3600"],
                &["0", "3601"],
            ),
            (
                "engine",
                "health_timeout_ms",
                &["100", "600000"],
                &["99", "600001", "0"],
            ),
            (
                "model",
                "keep_free_mib",
                &["64", "1048576"],
                &["63", "1048577"],
            ),
            (
                "model",
                "full_verify_interval_hours",
                &["1", "87600"],
                &["0", "87601"],
            ),
            (
                "daemon",
                "reverify_interval_s",
                &["0", "1", "86400"],
                &["-1", "86401"],
            ),
            (
                "tuning.engine",
                "memory_reserve_mib",
                &["0", "1073741824"],
                &["-1", "1073741825"],
            ),
            (
                "tuning.engine",
                "memory_low_mib",
                &["0", "1073741824"],
                &["-1", "1073741825"],
            ),
        ];
        for (table, key, good, bad) in cases {
            for value in *good {
                let text = format!("[{table}]\n{key} = {value}\n");
                assert!(parse(&text).is_ok(), "{text}: {:?}", parse(&text).err());
            }
            for value in *bad {
                let text = format!("# a comment first\n[{table}]\n{key} = {value}\n");
                let err = parse(&text).expect_err(&text);
                assert!(
                    err.contains(&format!("invalid {key} {value}: allowed is"))
                        && err.contains("line 3"),
                    "{text}: {err}"
                );
            }
        }
        for listen in ["listen", "https_listen"] {
            let err =
                parse(&format!("[dashboard]\n{listen} = \"0.0.0.0:0\"\n")).expect_err("port 0");
            assert!(err.contains("1-65535") && err.contains("line 2"), "{err}");
        }
    }

    #[test]
    fn dashboard_values_are_checked_at_load() {
        let err = parse("[dashboard]\npassword_hash = \"hunter2\"\n").expect_err("refused");
        assert!(
            err.contains("password_hash")
                && err.contains("line 2")
                && err.contains("hash-password"),
            "{err}"
        );
        let err = parse("[dashboard]\napi_token_sha256 = [\"abc\"]\n").expect_err("refused");
        assert!(err.contains("new-token"), "{err}");
        let err = parse("[dashboard]\nlisten = \"8000\"\n").expect_err("refused");
        assert!(err.contains("0.0.0.0:8000"), "{err}");
        let err = parse("[dashboard]\nsample_interval_s = 0\n").expect_err("refused");
        assert!(err.contains("1-60"), "{err}");
        let ok = parse(&format!(
            "[dashboard]\npassword_hash = \"{TEST_PASSWORD_HASH}\"\n"
        ))
        .expect("valid");
        assert!(ok.dashboard.password_hash.is_set());
    }

    #[test]
    fn slice_names_map_to_nested_cgroups() {
        let slice = SliceName::try_from("appliance-engine.slice".to_string()).expect("valid");
        assert_eq!(
            slice.cgroup_path(),
            "appliance.slice/appliance-engine.slice"
        );
        let flat = SliceName::try_from("llm.slice".to_string()).expect("valid");
        assert_eq!(flat.cgroup_path(), "llm.slice");
        for bad in ["a--b.slice", "-a.slice", "a.service", ".slice", "a/b.slice"] {
            assert!(SliceName::try_from(bad.to_string()).is_err(), "{bad}");
        }
    }

    #[test]
    fn later_files_override_earlier_ones_key_by_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let system = dir.path().join("system.toml");
        let provisioning = dir.path().join("boot.toml");
        std::fs::write(
            &system,
            "[tuning]\nsystem_swap = \"off\"\n[tuning.engine]\ncpu_weight = 500\n",
        )
        .expect("write");
        std::fs::write(
            &provisioning,
            "[tuning.engine]\nmemory_reserve_mib = 2048\n",
        )
        .expect("write");
        let config = Config::from_files(&[system.clone(), provisioning.clone()]).expect("merged");
        assert_eq!(config.tuning.system_swap, SystemSwap::Off);
        assert_eq!(config.tuning.engine.cpu_weight.get(), 500);
        assert_eq!(config.tuning.engine.memory_reserve_mib.get(), 2048);

        std::fs::write(
            &provisioning,
            "[tuning.engine]\nmemory_reserve_mib = \"lots\"\n",
        )
        .expect("write");
        let err = Config::from_files(&[system.clone(), provisioning.clone()]).expect_err("refused");
        assert_eq!(
            err.file, provisioning,
            "the error names the override, not the system file"
        );
        assert!(
            err.message.contains("memory_reserve_mib") && err.message.contains("line 2"),
            "{err}"
        );

        std::fs::write(
            &provisioning,
            "[tuning.engine]\nmemory_max_mib = 1024\nmemory_low_mib = 2048\n",
        )
        .expect("write");
        let err = Config::from_files(&[system, provisioning]).expect_err("refused");
        assert!(err.message.contains("memory_low_mib"), "{err}");
    }
}
