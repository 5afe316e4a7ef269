//! The status document: `GET /api/status` and `supervisor status --json`, the same bytes.
//!
//! `{ "schema_version": 1, "root", "simulated", "board": Board, "model": Model,
//! "steps": [Step], "engine": Engine, "overclock": Overclock, "update": Update,
//! "provision": Provision, "clock": Clock }`, in that order. Required (in every document since
//! version 1): `schema_version`, `board`, `model`, `steps` and `engine`, and within the parts
//! the fields their docs mark *required*. Parts added later (`overclock`, `update`,
//! `provision`, `clock`) are `None` when a box does not send them; every other field has the
//! default its doc names (`None`, empty, 0 or `false`).

use serde::{Deserialize, Serialize};

/// The status document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(expecting = "a status document (a JSON object)")]
pub struct Status {
    /// Major layout version ([`crate::SCHEMA_VERSION`]). Required.
    pub schema_version: u32,
    /// Minor layout version ([`crate::SCHEMA_MINOR`]); absent (0) in version 1.0 documents.
    #[serde(default, skip_serializing_if = "crate::is_zero")]
    pub schema_minor: u32,
    /// The board root the supervisor ran on (`/` on a box). Default empty.
    #[serde(default)]
    pub root: String,
    /// Whether the board is simulated. Default `false`.
    #[serde(default)]
    pub simulated: bool,
    /// Facts about the board. Required.
    pub board: Board,
    /// The model the engine runs, as the launch gate sees it. Required.
    pub model: Model,
    /// Every tuning step. Required.
    pub steps: Vec<Step>,
    /// The engine, as the running daemon last published it. Required.
    pub engine: Engine,
    /// The overclock ladder (`None`: a box from before it).
    #[serde(default)]
    pub overclock: Option<Overclock>,
    /// A/B updates (`None`: a box from before them).
    #[serde(default)]
    pub update: Option<Update>,
    /// Fleet provisioning (`None`: a box from before it).
    #[serde(default)]
    pub provision: Option<Provision>,
    /// The clock (`None`: a box from before it).
    #[serde(default)]
    pub clock: Option<Clock>,
    /// The models on the box (since 1.2): installed, active and fallback, pushes under way,
    /// past switches. Absent from an older box's document, and written only when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<crate::models::Models>,
    /// The cluster this box is a member of (since 1.3); absent when it serves alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::Cluster>,
}

/// Only the version, read before the rest so a document of an unknown major version is
/// refused as such rather than by whichever field it changed.
#[derive(Deserialize)]
#[serde(expecting = "a status document (a JSON object)")]
struct Versioned {
    schema_version: u32,
}

impl Status {
    /// Reads a status document a box sent. Fields this build does not know are ignored and
    /// fields an older box does not send take their defaults; a body that is not JSON, lacks a
    /// required field or has a major version this build does not know is an error saying so.
    pub fn from_json(body: &[u8]) -> Result<Status, serde_json::Error> {
        let Versioned { schema_version } = serde_json::from_slice(body)?;
        if schema_version == 0 || schema_version > crate::SCHEMA_VERSION {
            return Err(<serde_json::Error as serde::de::Error>::custom(format!(
                "status schema version {schema_version}, this build reads version {} \
                 (a newer box needs a newer tool)",
                crate::SCHEMA_VERSION
            )));
        }
        serde_json::from_slice(body)
    }
}

/// Facts about the board; a reading that failed is `None` (JSON `null`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Board {
    /// Device-tree model string.
    #[serde(default)]
    pub model: Option<String>,
    /// SoC temperature in °C.
    #[serde(default)]
    pub temperature_c: Option<f64>,
    /// Firmware throttle state.
    #[serde(default)]
    pub throttle: Option<Throttle>,
    /// Requested CPU clock of policy0 in MHz.
    #[serde(default)]
    pub cpu_mhz: Option<u64>,
    /// Maximum CPU clock in MHz.
    #[serde(default)]
    pub cpu_max_mhz: Option<u64>,
    /// Governor of each cpufreq policy, e.g. `policy0=performance`. Default empty.
    #[serde(default)]
    pub governors: Vec<String>,
    /// Total RAM in MiB.
    #[serde(default)]
    pub memory_total_mib: Option<u64>,
    /// Available RAM in MiB.
    #[serde(default)]
    pub memory_available_mib: Option<u64>,
    /// Active swap areas (`Some` empty: swap is off; `None`: unknown).
    #[serde(default)]
    pub swap: Option<Vec<SwapArea>>,
    /// NUMA nodes the kernel created.
    #[serde(default)]
    pub numa_nodes: Option<u64>,
    /// How this boot happened.
    #[serde(default)]
    pub boot: Option<BootInfo>,
    /// Seconds since the kernel booted.
    #[serde(default)]
    pub uptime_s: Option<u64>,
    /// The operating system's `PRETTY_NAME`.
    #[serde(default)]
    pub os: Option<String>,
    /// The running kernel's host name.
    #[serde(default)]
    pub hostname: Option<String>,
}

/// The firmware's throttle report, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Throttle {
    /// The raw bit field as `vcgencmd get_throttled` prints it, e.g. `0x50005`.
    #[serde(default)]
    pub raw: String,
    /// Conditions active now (`under-voltage`, `arm-frequency-capped`, `throttled`,
    /// `soft-temperature-limit`).
    #[serde(default)]
    pub now: Vec<String>,
    /// Conditions that occurred since boot, in the same words.
    #[serde(default)]
    pub since_boot: Vec<String>,
}

/// One active swap area.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapArea {
    /// Device or file path, e.g. `/dev/zram0`. Required.
    pub device: String,
    /// `partition` or `file`.
    #[serde(default)]
    pub kind: String,
    /// Size in KiB.
    #[serde(default)]
    pub size_kib: u64,
    /// Used in KiB.
    #[serde(default)]
    pub used_kib: u64,
}

/// How the bootloader started this boot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootInfo {
    /// Whether this is a one-shot tryboot boot.
    #[serde(default)]
    pub tryboot: bool,
    /// The partition the boot files came from.
    #[serde(default)]
    pub partition: u32,
    /// The boot mode (BOOT_ORDER code): 1 SD, 4 USB, 6 NVMe, ...
    #[serde(default)]
    pub boot_mode: u32,
    /// The bootloader's build time, Unix seconds.
    #[serde(default)]
    pub bootloader_build_timestamp: u32,
}

/// The model, as the launch gate sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    /// Configured model id. Required.
    pub id: String,
    /// `verified`, `failed` or `not-installed`. Required.
    pub state: String,
    /// The verified weights the engine would be given.
    #[serde(default)]
    pub path: Option<String>,
    /// The verified draft head given with them, if it has one.
    #[serde(default)]
    pub draft: Option<String>,
    /// Where the engine's drafts come from: `mtp` or `ngram`. Default empty.
    #[serde(default)]
    pub speculation: String,
    /// What was checked, or why it failed. Default empty.
    #[serde(default)]
    pub reason: String,
}

/// One tuning step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Stable step name, e.g. `governor`. Required.
    pub name: String,
    /// What the configuration asks for.
    #[serde(default)]
    pub desired: String,
    /// What the board reads back now.
    #[serde(default)]
    pub effective: String,
    /// `in-place`, `applied`, `pending-reboot`, `not-applicable`, `failed` or `needs-apply`.
    /// Required.
    pub state: String,
    /// Why, in words.
    #[serde(default)]
    pub reason: String,
}

/// The engine under supervision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Engine {
    /// `stopped`, `blocked`, `starting`, `ready`, `backing-off` or `failing`. Required.
    pub state: String,
    /// Why, in words.
    #[serde(default)]
    pub reason: String,
    /// Process id while one runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The model it serves.
    #[serde(default)]
    pub model_id: String,
    /// SHA-256 of the verified weights it was given.
    #[serde(default)]
    pub model_sha256: Option<String>,
    /// Where it listens (loopback only).
    #[serde(default)]
    pub url: Option<String>,
    /// Seconds since the running process became ready.
    #[serde(default)]
    pub uptime_s: Option<u64>,
    /// When it became ready (Unix seconds).
    #[serde(default)]
    pub ready_unix: Option<u64>,
    /// Restarts since the supervisor started.
    #[serde(default)]
    pub restarts: u32,
    /// How the last process ended, e.g. `killed by signal 9`.
    #[serde(default)]
    pub last_exit: Option<String>,
    /// Recent prompt-processing speed.
    #[serde(default)]
    pub prefill_tokens_per_second: Option<f64>,
    /// Recent generation speed.
    #[serde(default)]
    pub decode_tokens_per_second: Option<f64>,
    /// Tool calls since the running engine started (minor 1; absent from older boxes and
    /// before the engine first answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<ToolCalls>,
    /// The engine's last output lines.
    #[serde(default)]
    pub recent_log: Vec<String>,
    /// The daemon that published this.
    #[serde(default)]
    pub supervisor_pid: Option<u32>,
}

/// The engine's tool-call counters, since it started (its `/health` → `tool_calls`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCalls {
    /// Chat answers to requests that offered tools.
    #[serde(default)]
    pub answers: u64,
    /// Calls answered.
    #[serde(default)]
    pub calls: u64,
    /// Calls begun that were malformed, of no callable tool, or cut off (given back as text).
    #[serde(default)]
    pub failures: u64,
}

/// The overclock ladder: the `[overclock]` switch, and its record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overclock {
    /// Whether `[overclock] enabled` allows starting a ladder.
    #[serde(default)]
    pub enabled: bool,
    /// Why the record could not be read, if it could not.
    #[serde(default)]
    pub error: Option<String>,
    /// The record's own layout version.
    #[serde(default)]
    pub version: u32,
    /// `idle`, `climbing`, `done` or `aborted`. Required.
    pub phase: String,
    /// The current (or last) run.
    #[serde(default)]
    pub run: u32,
    /// The stability check at stock clock that opened this run.
    #[serde(default)]
    pub reference: Option<Check>,
    /// Every trial of every run, oldest first.
    #[serde(default)]
    pub trials: Vec<Trial>,
    /// The clock the box keeps once done (`None`: stock).
    #[serde(default)]
    pub result: Option<Candidate>,
    /// The last thing that happened, in words.
    #[serde(default)]
    pub message: String,
    /// This run already rebooted to stock clocks to take its reference.
    #[serde(default)]
    pub stock_reboot_tried: bool,
}

/// One overclock rung: a clock and its voltage offset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// `arm_freq` in MHz. Required.
    pub arm_freq: u32,
    /// `over_voltage_delta` in µV; 0 is stock.
    #[serde(default)]
    pub over_voltage_delta: u32,
}

/// One trial of one overclock candidate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// Which run it belongs to.
    #[serde(default)]
    pub run: u32,
    /// The clock tried. Required.
    pub candidate: Candidate,
    /// `running`, `passed`, `failed` or `aborted`. Required.
    pub status: String,
    /// Why it ended as it did.
    #[serde(default)]
    pub reason: String,
    /// When it was armed, Unix seconds.
    #[serde(default)]
    pub started_unix: u64,
    /// When its boot started checking.
    #[serde(default)]
    pub checking_since_unix: Option<u64>,
    /// When it ended.
    #[serde(default)]
    pub ended_unix: Option<u64>,
    /// What the stability check measured.
    #[serde(default)]
    pub checks: Option<Check>,
}

/// What one overclock stability check measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// Whether every part passed.
    #[serde(default)]
    pub passed: bool,
    /// The check could not judge the clock.
    #[serde(default)]
    pub inconclusive: bool,
    /// The first thing that failed, or a summary of the pass.
    #[serde(default)]
    pub reason: String,
    /// The clock the kernel reported during the check, MHz.
    #[serde(default)]
    pub clock_mhz: Option<u64>,
    /// Seconds the load ran.
    #[serde(default)]
    pub seconds: f64,
    /// Threads that ran it.
    #[serde(default)]
    pub threads: u64,
    /// Units of work checked.
    #[serde(default)]
    pub units: u64,
    /// Units whose result was wrong.
    #[serde(default)]
    pub wrong_units: u64,
    /// The highest temperature sampled, °C.
    #[serde(default)]
    pub max_temperature_c: Option<f64>,
    /// The throttle bits seen, as `get_throttled` prints them.
    #[serde(default)]
    pub throttle: Option<String>,
    /// SHA-256 of the engine's output.
    #[serde(default)]
    pub engine_sha256: Option<String>,
}

/// A/B updates: both slots, which runs, the update under way, the last outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    /// The slot running now (`A` or `B`).
    #[serde(default)]
    pub booted: Option<String>,
    /// The slot `config.txt` boots.
    #[serde(default)]
    pub committed: Option<String>,
    /// Both slots. Default empty (a system without A/B slots).
    #[serde(default)]
    pub slots: Vec<Slot>,
    /// The update under way.
    #[serde(default)]
    pub trial: Option<UpdateTrial>,
    /// How the last update ended.
    #[serde(default)]
    pub last: Option<Ended>,
    /// Why something could not be read.
    #[serde(default)]
    pub error: Option<String>,
}

impl Update {
    /// The slot running now, when the box reports it among its slots.
    pub fn booted_slot(&self) -> Option<&Slot> {
        self.slots.iter().find(|s| s.booted)
    }
}

/// One A/B slot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// `A` or `B`. Required.
    pub slot: String,
    /// The system version it holds, if known.
    #[serde(default)]
    pub system_version: Option<String>,
    /// `good` or `bad`.
    #[serde(default)]
    pub state: String,
    /// Whether it runs now.
    #[serde(default)]
    pub booted: bool,
}

/// An update between its install and its verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateTrial {
    /// The slot it was written to. Required.
    pub slot: String,
    /// Its system version.
    #[serde(default)]
    pub system_version: Option<String>,
    /// The slot it replaces.
    #[serde(default)]
    pub from: String,
    /// The version it replaces.
    #[serde(default)]
    pub from_version: Option<String>,
    /// Tuning steps that already failed on the old slot.
    #[serde(default)]
    pub failing_before: Vec<String>,
    /// When RAUC made it primary (the box's clock).
    #[serde(default)]
    pub armed_unix: u64,
    /// When its boot folder was complete and `tryboot.txt` pointed at it.
    #[serde(default)]
    pub prepared_unix: Option<u64>,
    /// When the reboot into it was asked for.
    #[serde(default)]
    pub rebooted_unix: Option<u64>,
    /// When its trial boot began the health check.
    #[serde(default)]
    pub checking_since_unix: Option<u64>,
    /// The kernel's boot id of that boot.
    #[serde(default)]
    pub checking_boot_id: Option<String>,
}

/// How far an update under way has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Being written to its slot.
    Writing,
    /// Installed, waiting for the reboot (in the box's update window when one is set).
    Installed,
    /// The reboot into it was asked for.
    Rebooting,
    /// Its trial boot is checking its health.
    Checking,
}

impl UpdateTrial {
    /// Where the update stands, from the times the box recorded.
    pub fn stage(&self) -> Stage {
        match (
            self.prepared_unix,
            self.rebooted_unix,
            self.checking_since_unix,
        ) {
            (_, _, Some(_)) => Stage::Checking,
            (_, Some(_), None) => Stage::Rebooting,
            (Some(_), None, None) => Stage::Installed,
            (None, None, None) => Stage::Writing,
        }
    }
}

/// The end of an update.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    /// The slot it was written to. Required.
    pub slot: String,
    /// Its system version.
    #[serde(default)]
    pub system_version: Option<String>,
    /// The version the box ran before.
    #[serde(default)]
    pub from_version: Option<String>,
    /// `committed`, `rolled-back` or `cancelled`. Required.
    pub result: String,
    /// Why, in words.
    #[serde(default)]
    pub reason: String,
    /// When, by the box's clock.
    #[serde(default)]
    pub ended_unix: u64,
}

/// Fleet provisioning: what was applied and when, the device key, why a file was refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provision {
    /// `provisioned`, `unprovisioned` or `unknown` (the record is unreadable).
    #[serde(default)]
    pub state: String,
    /// Fleet of the applied file.
    #[serde(default)]
    pub fleet: Option<String>,
    /// The box's name in the fleet.
    #[serde(default)]
    pub name: Option<String>,
    /// The applied generation (0: none).
    #[serde(default)]
    pub generation: u64,
    /// When that generation was applied (Unix seconds).
    #[serde(default)]
    pub applied_unix: Option<u64>,
    /// The board serial.
    #[serde(default)]
    pub serial: Option<String>,
    /// The host name the box took.
    #[serde(default)]
    pub hostname: Option<String>,
    /// The device key's public half (64 hex digits).
    #[serde(default)]
    pub device_public_key: Option<String>,
    /// SHA-256 of the TLS certificate the dashboard serves.
    #[serde(default)]
    pub certificate_sha256: Option<String>,
    /// When this generation was enrolled (Unix seconds).
    #[serde(default)]
    pub enrolled_unix: Option<u64>,
    /// Why the last provisioning file was refused.
    #[serde(default)]
    pub last_error: Option<String>,
}

/// The clock: the time, whether network time synchronised it, the RTC, the floor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clock {
    /// The board's time, Unix seconds.
    #[serde(default)]
    pub now_unix: u64,
    /// Whether network time synchronised the clock in this boot.
    #[serde(default)]
    pub synchronized: bool,
    /// The real-time clock's time, when there is one.
    #[serde(default)]
    pub rtc_unix: Option<u64>,
    /// The earliest time the clock may show.
    #[serde(default)]
    pub floor_unix: Option<u64>,
}
