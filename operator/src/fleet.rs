//! The fleet on the network: enrolment (`fleet.lock`) and a status table of every box.
//!
//! Beside `fleet.toml` the tool keeps `fleet.secret` (owner-only; the boxes' enrolment tokens
//! are derived from it, see `provision::enroll`) and `fleet.lock`: each enrolled box's address,
//! device public key and the SHA-256 of its TLS certificate. A box that later presents another
//! certificate (its device key was replaced, or something else answers at its address) is
//! flagged and told nothing.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use wire::status::{Stage, UpdateTrial};

use crate::https::{self, Failure};
use provision::FleetFile;
use provision::enroll::{self, Answer};

/// The HTTPS port a box serves its dashboard and API on by default.
pub const DEFAULT_PORT: u16 = 8443;

/// `fleet.lock`: what enrolment learnt about each box.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// Enrolled boxes.
    #[serde(default, rename = "box")]
    pub boxes: Vec<Enrolled>,
}

/// One enrolled box.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Enrolled {
    /// Its name in the fleet file.
    pub name: String,
    /// Where it answered (`host:port`).
    pub address: String,
    /// Its device public key.
    pub device_public_key: String,
    /// SHA-256 of its TLS certificate.
    pub certificate_sha256: String,
    /// Its board serial, if it reported one.
    pub serial: Option<String>,
    /// The generation it was enrolled at.
    pub generation: u64,
}

/// The files beside a fleet file.
pub struct Paths {
    /// `fleet.toml`.
    pub fleet: PathBuf,
    /// `fleet.lock`.
    pub lock: PathBuf,
    /// `fleet.secret`.
    pub secret: PathBuf,
}

impl Paths {
    /// The lock and secret beside `fleet`.
    pub fn beside(fleet: &Path) -> Paths {
        Paths {
            fleet: fleet.to_path_buf(),
            lock: fleet.with_file_name("fleet.lock"),
            secret: fleet.with_file_name("fleet.secret"),
        }
    }
}

/// The fleet's secret, made (owner-only) the first time a card is stamped. Made with an
/// exclusive create: of two `stamp` runs at once one makes it and both use that one, so no
/// card is ever stamped with a secret that is then replaced.
pub fn secret(paths: &Paths) -> Result<Vec<u8>, String> {
    if let Some(secret) = read_secret(paths)? {
        return Ok(secret);
    }
    let mut secret = vec![0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| format!("the OS random source failed: {e}"))?;
    durable::create_private(
        &paths.secret,
        format!("{}\n", hex::encode(&secret)).as_bytes(),
    )
    .map_err(|e| format!("{}: {e}", paths.secret.display()))?;
    // Whoever created it, the file is the secret.
    read_secret(paths)?.ok_or_else(|| format!("{} vanished as it was made", paths.secret.display()))
}

fn read_secret(paths: &Paths) -> Result<Option<Vec<u8>>, String> {
    match std::fs::read_to_string(&paths.secret) {
        Ok(text) => hex::decode(text.trim())
            .ok()
            .filter(|s| s.len() == 32)
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "{} is damaged (not 64 hex digits); restore it from your backup",
                    paths.secret.display()
                )
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", paths.secret.display())),
    }
}

/// Reads `fleet.lock` (empty when there is none yet).
pub fn read_lock(paths: &Paths) -> Result<Lock, String> {
    match std::fs::read_to_string(&paths.lock) {
        Ok(text) => toml::from_str(&text).map_err(|e| format!("{}: {e}", paths.lock.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lock::default()),
        Err(e) => Err(format!("{}: {e}", paths.lock.display())),
    }
}

fn write_lock(paths: &Paths, lock: &Lock) -> Result<(), String> {
    let text = toml::to_string(lock).map_err(|e| e.to_string())?;
    let text = format!(
        "# Written by `appliance fleet enroll`: each box's identity as enrolled. A box presenting\n\
         # another certificate is not trusted. Remove an entry to enrol that box again.\n{text}"
    );
    durable::replace(&paths.lock, text.as_bytes())
        .map_err(|e| format!("{}: {e}", paths.lock.display()))
}

/// Where box `name` is reached: an explicit `NAME=HOST:PORT`, else where it enrolled, else its
/// static address or host name on the HTTPS port.
pub fn address(
    fleet: &FleetFile,
    lock: &Lock,
    name: &str,
    overrides: &[(String, String)],
) -> String {
    if let Some((_, at)) = overrides.iter().find(|(n, _)| n == name) {
        return at.clone();
    }
    if let Some(enrolled) = lock.boxes.iter().find(|b| b.name == name) {
        return enrolled.address.clone();
    }
    let settings = fleet
        .boxes
        .iter()
        .find(|b| b.name.as_ref().is_some_and(|n| n.as_str() == name))
        .map(|b| b.over(&fleet.fleet.defaults));
    match settings.as_ref().and_then(|s| s.network.as_ref()?.address) {
        Some(prefix) if prefix.address.is_ipv6() => format!("[{}]:{DEFAULT_PORT}", prefix.address),
        Some(prefix) => format!("{}:{DEFAULT_PORT}", prefix.address),
        None => {
            let host = settings
                .as_ref()
                .and_then(|s| s.effective_hostname().map(|h| h.to_string()))
                .unwrap_or_else(|| name.to_string());
            format!("{host}:{DEFAULT_PORT}")
        }
    }
}

/// What enrolling one box came to.
pub enum EnrolOutcome {
    /// Enrolled now.
    Enrolled(Enrolled),
    /// Not enrolled, and why.
    Failed(String),
}

/// Enrols box `name` at `address`: asks for its identity with a fresh nonce and checks the
/// answer against the token this fleet's secret gives the box.
pub fn enroll_one(
    fleet: &FleetFile,
    secret: &[u8],
    name: &str,
    address: &str,
    api_token: &str,
) -> EnrolOutcome {
    let (nonce, response) = match with_nonce(address, "/api/enroll", Some(api_token)) {
        Ok(asked) => asked,
        Err(e) => return EnrolOutcome::Failed(e),
    };
    if response.status != 200 {
        return EnrolOutcome::Failed(format!(
            "{address} refused enrolment ({}): {}",
            response.status,
            String::from_utf8_lossy(&response.body).trim()
        ));
    }
    let answer: Answer = match serde_json::from_slice(&response.body) {
        Ok(a) => a,
        Err(e) => return EnrolOutcome::Failed(format!("{address}: not an enrolment answer: {e}")),
    };
    if answer.name != name || answer.fleet != fleet.fleet.name.as_str() {
        return EnrolOutcome::Failed(format!(
            "{address} is box {} of fleet {}, not {name} of {}",
            answer.name, answer.fleet, fleet.fleet.name
        ));
    }
    if answer.certificate_sha256 != response.certificate_sha256 {
        return EnrolOutcome::Failed(format!(
            "{address} vouches for certificate {} but presented {}: something is in between",
            answer.certificate_sha256, response.certificate_sha256
        ));
    }
    let token = enroll::derive_token(secret, fleet.fleet.name.as_str(), name, answer.generation);
    if let Err(e) = enroll::check(&answer, &nonce, &token) {
        return EnrolOutcome::Failed(format!("{address}: {e}"));
    }
    EnrolOutcome::Enrolled(Enrolled {
        name: name.to_string(),
        address: address.to_string(),
        device_public_key: answer.device_public_key,
        certificate_sha256: answer.certificate_sha256,
        serial: answer.serial,
        generation: answer.generation,
    })
}

/// `appliance fleet enroll`: every box not yet in `fleet.lock`, one line each; the lock is
/// written after each box so an interrupted run keeps what it learnt. Returns how many failed.
pub fn enroll_all(
    paths: &Paths,
    fleet: &FleetFile,
    api_token: &str,
    overrides: &[(String, String)],
    mut say: impl FnMut(&str),
) -> Result<usize, String> {
    let secret = secret(paths)?;
    let mut lock = read_lock(paths)?;
    let mut failed = 0;
    for entry in &fleet.boxes {
        let Some(name) = entry.name.as_ref().map(|n| n.to_string()) else {
            continue;
        };
        if lock.boxes.iter().any(|b| b.name == name) {
            say(&format!("{name}: already enrolled"));
            continue;
        }
        let at = address(fleet, &lock, &name, overrides);
        match enroll_one(fleet, &secret, &name, &at, api_token) {
            EnrolOutcome::Enrolled(enrolled) => {
                say(&format!(
                    "{name}: enrolled at {at}, device key {}, certificate {}",
                    enrolled.device_public_key, enrolled.certificate_sha256
                ));
                lock.boxes.push(enrolled);
                write_lock(paths, &lock)?;
            }
            EnrolOutcome::Failed(why) => {
                failed += 1;
                say(&format!("{name}: not enrolled: {why}"));
            }
        }
    }
    Ok(failed)
}

/// One line of `appliance fleet status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// The box.
    pub name: String,
    /// Where it was asked.
    pub address: String,
    /// Whether it answered.
    pub reachable: bool,
    /// `matches`, `MISMATCH` or `not enrolled`.
    pub identity: String,
    /// Why it could not be asked, or what went wrong.
    pub error: Option<String>,
    /// The OS it runs.
    pub os: Option<String>,
    /// The system slot it runs (A or B).
    pub slot: Option<String>,
    /// The system version in that slot.
    pub system_version: Option<String>,
    /// How its last update ended: `committed`, `rolled-back` or `cancelled`, with the version.
    pub last_update: Option<String>,
    /// When that update ended, by the box's clock.
    pub last_update_ended_unix: Option<u64>,
    /// The update under way: `writing`, `installed` (waiting for its reboot, in the box's
    /// update window when one is set), `rebooting` or `checking`.
    pub update_stage: Option<String>,
    /// The boot partition it booted from.
    pub boot_partition: Option<u64>,
    /// The model id.
    pub model: Option<String>,
    /// The launch gate's verdict on the model (`approved` when verified).
    pub model_state: Option<String>,
    /// The engine's state.
    pub engine: Option<String>,
    /// Recent decode speed.
    pub decode_tokens_per_second: Option<f64>,
    /// SoC temperature.
    pub temperature_c: Option<f64>,
    /// Throttling now, in words (empty: none).
    pub throttling: Option<Vec<String>>,
    /// Seconds since boot.
    pub uptime_s: Option<u64>,
    /// The applied provisioning generation.
    pub generation: Option<u64>,
    /// Its cluster, its part and the cluster's state as it sees it (`front-desk head up`).
    pub cluster: Option<String>,
}

/// Asks box `name` for its status, trusting only its enrolled certificate.
pub fn status_one(
    fleet: &FleetFile,
    lock: &Lock,
    name: &str,
    api_token: &str,
    overrides: &[(String, String)],
) -> Row {
    let address = address(fleet, lock, name, overrides);
    let mut row = Row {
        name: name.to_string(),
        address: address.clone(),
        ..Row::default()
    };
    let Some(enrolled) = lock.boxes.iter().find(|b| b.name == name) else {
        row.identity = "not enrolled".into();
        row.error = Some("not enrolled: run `appliance fleet enroll` first".into());
        return row;
    };
    // Who answers, before the token goes anywhere: the enrolled device key must vouch for
    // the certificate this connection presents (a renewed certificate is fine, a new key not).
    let presented = match identify(&address, &enrolled.device_public_key) {
        Ok(presented) => presented,
        Err(Refusal::Untrusted(why)) => {
            row.reachable = true;
            row.identity = "MISMATCH".into();
            row.error = Some(format!("{why}; not trusted"));
            return row;
        }
        Err(Refusal::Unreachable(why)) => {
            row.identity = "unknown".into();
            row.error = Some(why);
            return row;
        }
    };
    let response = https::request(
        &address,
        "GET",
        "/api/status",
        Some(api_token),
        None,
        Some(&presented),
    );
    let response = match response {
        Ok(r) => r,
        Err(Failure::IdentityMismatch { presented }) => {
            row.reachable = true;
            row.identity = "MISMATCH".into();
            row.error = Some(format!(
                "the certificate changed to {presented} between two connections; not trusted"
            ));
            return row;
        }
        Err(e) => {
            row.identity = "unknown".into();
            row.error = Some(e.to_string());
            return row;
        }
    };
    row.reachable = true;
    row.identity = "matches".into();
    if response.status != 200 {
        row.error = Some(format!(
            "status {}: {}",
            response.status,
            String::from_utf8_lossy(&response.body).trim()
        ));
        return row;
    }
    read_status(row, &response.body, &enrolled.device_public_key)
}

/// Fills `row` from the status document `body` a box answered, once its device key is the
/// `enrolled` one; a body that is no status document, or another key, is the row's error.
fn read_status(mut row: Row, body: &[u8], enrolled: &str) -> Row {
    let status = match wire::Status::from_json(body) {
        Ok(s) => s,
        Err(e) => {
            row.error = Some(format!("not a status document: {e}"));
            return row;
        }
    };
    let provision = status.provision.as_ref();
    if provision.and_then(|p| p.device_public_key.as_deref()) != Some(enrolled) {
        row.identity = "MISMATCH".into();
        row.error = Some("its device key is not the enrolled one; not trusted".into());
        return row;
    }
    let board = &status.board;
    row.os = board.os.clone();
    row.boot_partition = board.boot.as_ref().map(|b| u64::from(b.partition));
    row.model = Some(status.model.id.clone());
    row.model_state = Some(status.model.state.clone());
    row.engine = Some(status.engine.state.clone());
    row.decode_tokens_per_second = status.engine.decode_tokens_per_second;
    row.temperature_c = board.temperature_c;
    row.throttling = board.throttle.as_ref().map(|t| t.now.clone());
    row.uptime_s = board.uptime_s;
    row.generation = provision.map(|p| p.generation);
    row.cluster = status
        .cluster
        .as_ref()
        .map(|c| format!("{} {} {}", c.name, c.role, c.state));
    if let Some(update) = &status.update {
        row.slot = update.booted.clone();
        row.system_version = update.booted_slot().and_then(|s| s.system_version.clone());
        row.last_update = update.last.as_ref().map(|last| {
            format!(
                "{} {}",
                last.result,
                last.system_version.as_deref().unwrap_or("?")
            )
        });
        row.last_update_ended_unix = update.last.as_ref().map(|last| last.ended_unix);
        row.update_stage = trial_stage(update.trial.as_ref()).map(str::to_string);
    }
    row
}

/// The stage of the update under way, from the box's trial record.
fn trial_stage(trial: Option<&UpdateTrial>) -> Option<&'static str> {
    Some(match trial?.stage() {
        Stage::Checking => "checking",
        Stage::Rebooting => "rebooting",
        Stage::Installed => "installed",
        Stage::Writing => "writing",
    })
}

/// A box that is waiting for its update window may wait this long for it to open (a window
/// opens once a day), on top of the rollout's wait.
const WINDOW_WAIT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// How long a box may take from its upload to its update's verdict (the install, the reboot,
/// the trial boot's health check).
pub const UPDATE_WAIT: std::time::Duration = std::time::Duration::from_secs(45 * 60);

/// What a rollout brings each box.
pub struct Rollout<'a> {
    /// The signed bundle's bytes.
    pub bundle: &'a [u8],
    /// How long one box may take from its upload to its verdict.
    pub wait: std::time::Duration,
    /// Where progress lines go.
    pub say: &'a dyn Fn(&str),
}

/// Updates box `name` with the rollout's bundle: checks it is the enrolled box, uploads the
/// bundle to its dashboard (pinned to its certificate), waits for the install, then for the
/// box to come back on the new version committed. `Err` says why it stopped (a rollback
/// included).
pub fn update_one(
    fleet: &FleetFile,
    lock: &Lock,
    name: &str,
    api_token: &str,
    overrides: &[(String, String)],
    rollout: &Rollout,
) -> Result<String, String> {
    let (bundle, wait, say) = (rollout.bundle, rollout.wait, rollout.say);
    let before = status_one(fleet, lock, name, api_token, overrides);
    if let Some(e) = before.error {
        return Err(format!("{name}: {e}"));
    }
    let enrolled = lock
        .boxes
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| format!("{name}: not enrolled"))?;
    let address = before.address.clone();
    let presented = identify(&address, &enrolled.device_public_key).map_err(|r| match r {
        Refusal::Untrusted(why) | Refusal::Unreachable(why) => format!("{name}: {why}"),
    })?;
    say(&format!(
        "{name}: running {} in slot {}; uploading {} MB",
        before.system_version.as_deref().unwrap_or("?"),
        before.slot.as_deref().unwrap_or("?"),
        bundle.len() >> 20
    ));
    let ask = |method: &str, path: &str, body: Option<(&str, &[u8])>| {
        https::request(
            &address,
            method,
            path,
            Some(api_token),
            body,
            Some(&presented),
        )
        .map_err(|e| format!("{name}: {e}"))
    };
    let upload = ask(
        "POST",
        "/api/update",
        Some(("application/octet-stream", bundle)),
    )?;
    if upload.status != 202 {
        return Err(format!(
            "{name}: the upload was refused ({}): {}",
            upload.status,
            String::from_utf8_lossy(&upload.body).trim()
        ));
    }
    let deadline = std::time::Instant::now() + wait;
    let progress = loop {
        let answer = ask("GET", "/api/update", None)?;
        let p: wire::Progress = serde_json::from_slice(&answer.body)
            .map_err(|e| format!("{name}: not an update progress document: {e}"))?;
        if !p.running {
            break p;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{name}: the install did not end in time"));
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    };
    if let Some(e) = &progress.error {
        return Err(format!("{name}: the install failed: {e}"));
    }
    // This install's trial: its version, and when the box armed it (by the box's clock). Only
    // an outcome the box recorded after that is this install's verdict: a re-run of the same
    // bundle must not read the previous rollout's `committed`, nor an earlier rollback of the
    // same version.
    let trial = ask("GET", "/api/status", None)
        .ok()
        .and_then(|r| wire::Status::from_json(&r.body).ok())
        .and_then(|s| s.update?.trial)
        .ok_or_else(|| {
            format!("{name}: the install ended but the box shows no update under way")
        })?;
    let target = trial.system_version;
    let armed = trial.armed_unix;
    say(&format!(
        "{name}: installed {}; waiting for it to reboot into it and prove healthy",
        target.as_deref().unwrap_or("the bundle")
    ));
    let latest = deadline + WINDOW_WAIT;
    let mut deadline = deadline;
    let mut told_window = false;
    loop {
        std::thread::sleep(std::time::Duration::from_secs(10));
        let row = status_one(fleet, lock, name, api_token, overrides);
        if row.identity == "MISMATCH" {
            return Err(format!(
                "{name}: {}",
                row.error.unwrap_or_else(|| "identity mismatch".into())
            ));
        }
        // Installed and not rebooted: the box waits for its update window, and the time to
        // the verdict counts from when it reboots.
        if row.update_stage.as_deref() == Some("installed") {
            deadline = (std::time::Instant::now() + wait).min(latest);
            if !told_window {
                say(&format!("{name}: waiting for its update window to reboot"));
                told_window = true;
            }
        }
        match verdict(&row, target.as_deref(), armed) {
            Verdict::Committed => {
                return Ok(format!(
                    "{name}: running {} in slot {}",
                    row.system_version.unwrap_or_default(),
                    row.slot.unwrap_or_default()
                ));
            }
            Verdict::RolledBack => {
                return Err(format!(
                    "{name}: the update was rolled back; it runs {} again",
                    row.system_version.unwrap_or_default()
                ));
            }
            Verdict::Pending => {}
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "{name}: no verdict within {} s (last seen: {})",
                wait.as_secs(),
                row.error
                    .or(row.update_stage)
                    .or(row.last_update)
                    .unwrap_or_default()
            ));
        }
    }
}

/// What a box's status says of the install under way.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// It runs the target version, committed.
    Committed,
    /// It was rolled back.
    RolledBack,
    /// No verdict yet (or the box could not be asked).
    Pending,
}

/// The verdict on an install of `target` whose trial the box armed at `armed` (its clock):
/// only an outcome recorded since then, with no update under way, counts.
fn verdict(row: &Row, target: Option<&str>, armed: u64) -> Verdict {
    let this_install = row.error.is_none()
        && row.update_stage.is_none()
        && row
            .last_update_ended_unix
            .is_some_and(|ended| ended >= armed);
    let last = row.last_update.as_deref().unwrap_or_default();
    let ended = |result: &str| {
        this_install
            && target.map_or(last.starts_with(result), |t| {
                last == format!("{result} {t}")
            })
    };
    if ended("committed") && row.system_version.as_deref() == target {
        Verdict::Committed
    } else if ended("rolled-back") {
        Verdict::RolledBack
    } else {
        Verdict::Pending
    }
}

/// An enrolled box whose device key just vouched for the certificate it presents: where to
/// ask it, and the certificate to pin every request to.
pub struct Connected {
    /// The box's name.
    pub name: String,
    /// Where it answers.
    pub address: String,
    /// SHA-256 of its certificate.
    pub pin: String,
}

impl Connected {
    /// One request to the box, pinned to its certificate, with the API token.
    pub fn ask(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
        timeout: std::time::Duration,
    ) -> Result<https::Response, String> {
        https::request_within(
            timeout,
            &self.address,
            method,
            path,
            Some(token),
            body,
            Some(&self.pin),
        )
        .map_err(|e| format!("{}: {e}", self.name))
    }
}

/// Box `name`, once it proves it is the box that enrolled.
pub fn connect(
    fleet: &FleetFile,
    lock: &Lock,
    name: &str,
    overrides: &[(String, String)],
) -> Result<Connected, String> {
    let enrolled = lock
        .boxes
        .iter()
        .find(|b| b.name == name)
        .ok_or_else(|| format!("{name}: not enrolled: run `appliance fleet enroll` first"))?;
    let address = address(fleet, lock, name, overrides);
    let pin = identify(&address, &enrolled.device_public_key).map_err(|r| match r {
        Refusal::Untrusted(why) => format!("{name}: IDENTITY MISMATCH: {why}; not trusted"),
        Refusal::Unreachable(why) => format!("{name}: {why}"),
    })?;
    Ok(Connected {
        name: name.to_string(),
        address,
        pin,
    })
}

/// Why a box is not asked for its status.
enum Refusal {
    /// It is not the box that enrolled, and why.
    Untrusted(String),
    /// It could not be asked, and why.
    Unreachable(String),
}

/// POSTs a fresh nonce (`{"nonce": hex}`) to `path` on the box at `address`, any certificate
/// accepted (the answer is what proves who it is); returns the nonce and the answer.
fn with_nonce(
    address: &str,
    path: &str,
    api_token: Option<&str>,
) -> Result<(String, https::Response), String> {
    let mut nonce = [0u8; 32];
    getrandom::fill(&mut nonce).map_err(|e| format!("the OS random source failed: {e}"))?;
    let nonce = hex::encode(nonce);
    let body = serde_json::to_string(&wire::NonceRequest {
        nonce: nonce.clone(),
    })
    .map_err(|e| format!("encoding the nonce: {e}"))?;
    let response = https::request(
        address,
        "POST",
        path,
        api_token,
        Some(("application/json", body.as_bytes())),
        None,
    )
    .map_err(|e| e.to_string())?;
    Ok((nonce, response))
}

/// Asks the box at `address` who it is: the certificate it presented when the device key
/// `enrolled` vouches for it.
fn identify(address: &str, enrolled: &str) -> Result<String, Refusal> {
    let (nonce, response) =
        with_nonce(address, "/api/identity", None).map_err(Refusal::Unreachable)?;
    let mismatch = Refusal::Untrusted;
    if response.status != 200 {
        return Err(mismatch(format!(
            "it does not say who it is ({}: {})",
            response.status,
            String::from_utf8_lossy(&response.body).trim()
        )));
    }
    let identity: enroll::Identity = serde_json::from_slice(&response.body)
        .map_err(|e| mismatch(format!("not an identity answer: {e}")))?;
    enroll::check_identity(&identity, &nonce, enrolled, &response.certificate_sha256)
        .map_err(mismatch)?;
    Ok(response.certificate_sha256)
}

/// The rows as an aligned table.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:16} {:22} {:12} {:26} {:7} {:20} {:10} {:>6} {:>7} {:12} {:>10} {:>4} {}\n",
        "BOX",
        "ADDRESS",
        "IDENTITY",
        "OS",
        "SYSTEM",
        "MODEL",
        "ENGINE",
        "TOK/S",
        "TEMP",
        "THROTTLING",
        "UPTIME",
        "GEN",
        "CLUSTER"
    );
    let dash = || "-".to_string();
    for r in rows {
        if let Some(error) = &r.error {
            out.push_str(&format!(
                "{:16} {:22} {:12} {error}\n",
                r.name, r.address, r.identity
            ));
            continue;
        }
        let model = match (&r.model, &r.model_state) {
            (Some(m), Some(s)) => format!("{m} ({s})"),
            (Some(m), None) => m.clone(),
            _ => dash(),
        };
        out.push_str(&format!(
            "{:16} {:22} {:12} {:26} {:7} {:20} {:10} {:>6} {:>7} {:12} {:>10} {:>4} {}\n",
            r.name,
            r.address,
            r.identity,
            r.os.clone().unwrap_or_else(dash),
            match (&r.slot, &r.system_version) {
                (Some(slot), Some(v)) => format!("{slot} {v}"),
                (Some(slot), None) => slot.clone(),
                _ => r.boot_partition.map_or_else(dash, |p| format!("p{p}")),
            },
            model,
            r.engine.clone().unwrap_or_else(dash),
            r.decode_tokens_per_second
                .map_or_else(dash, |t| format!("{t:.1}")),
            r.temperature_c.map_or_else(dash, |t| format!("{t:.1}°C")),
            r.throttling
                .as_ref()
                .map_or_else(dash, |t| if t.is_empty() {
                    "none".into()
                } else {
                    t.join(",")
                }),
            r.uptime_s
                .map_or_else(dash, |s| format!("{}h{:02}m", s / 3600, s / 60 % 60)),
            r.generation.map_or_else(dash, |g| g.to_string()),
            r.cluster.clone().unwrap_or_else(dash),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A box's row: its slot's version, its last outcome and when that ended, the stage of an
    /// update under way.
    fn row(version: &str, last: Option<(&str, u64)>, stage: Option<&str>) -> Row {
        Row {
            system_version: Some(version.into()),
            last_update: last.map(|(l, _)| l.into()),
            last_update_ended_unix: last.map(|(_, t)| t),
            update_stage: stage.map(str::to_string),
            ..Row::default()
        }
    }

    #[test]
    fn only_an_outcome_recorded_after_this_install_is_its_verdict() {
        let armed = 2_000;
        let target = Some("2");
        // A re-run of a rollout of version 2: before its reboot the box still shows the first
        // rollout's `committed 2` (ended before this trial was armed).
        let rerun = row("2", Some(("committed 2", 1_000)), None);
        assert_eq!(verdict(&rerun, target, armed), Verdict::Pending);
        // An earlier rollback of the same version is not this install's.
        let earlier = row("1", Some(("rolled-back 2", 1_500)), None);
        assert_eq!(verdict(&earlier, target, armed), Verdict::Pending);
        // While its trial is under way nothing counts.
        let checking = row("2", Some(("committed 2", 2_500)), Some("checking"));
        assert_eq!(verdict(&checking, target, armed), Verdict::Pending);
        // This install's outcomes.
        let committed = row("2", Some(("committed 2", 2_500)), None);
        assert_eq!(verdict(&committed, target, armed), Verdict::Committed);
        let rolled = row("1", Some(("rolled-back 2", 2_500)), None);
        assert_eq!(verdict(&rolled, target, armed), Verdict::RolledBack);
        // Committed but running another version is no success.
        let elsewhere = row("1", Some(("committed 2", 2_500)), None);
        assert_eq!(verdict(&elsewhere, target, armed), Verdict::Pending);
    }

    #[test]
    fn the_trial_stage_reads_the_box_record() {
        let trial = |json: serde_json::Value| -> UpdateTrial {
            serde_json::from_value(json).expect("a trial record")
        };
        assert_eq!(trial_stage(None), None);
        let writing = trial(serde_json::json!({ "slot": "B", "armed_unix": 1 }));
        assert_eq!(trial_stage(Some(&writing)), Some("writing"));
        let installed = trial(
            serde_json::json!({ "slot": "B", "armed_unix": 1, "prepared_unix": 2, "rebooted_unix": null }),
        );
        assert_eq!(trial_stage(Some(&installed)), Some("installed"));
        let rebooting =
            trial(serde_json::json!({ "slot": "B", "prepared_unix": 2, "rebooted_unix": 3 }));
        assert_eq!(trial_stage(Some(&rebooting)), Some("rebooting"));
        let checking = trial(
            serde_json::json!({ "slot": "B", "prepared_unix": 2, "rebooted_unix": 3, "checking_since_unix": 4 }),
        );
        assert_eq!(trial_stage(Some(&checking)), Some("checking"));
    }

    /// A box running a newer system than this tool: a higher minor version, parts and fields
    /// this tool does not know, a state word it has never seen.
    const NEWER_BOX: &str = r#"{
        "schema_version": 1, "schema_minor": 4, "root": "/", "simulated": false,
        "accelerator": { "kind": "npu" },
        "board": { "os": "Debian GNU/Linux 14", "temperature_c": 55.5, "uptime_s": 7260,
                   "throttle": { "raw": "0x0", "now": [], "since_boot": [], "history": [] },
                   "boot": { "partition": 2, "tryboot": false, "boot_mode": 1,
                             "bootloader_build_timestamp": 1 },
                   "fan_rpm": 3000 },
        "model": { "id": "gemma", "state": "verified", "quantisation": "q4_1" },
        "steps": [],
        "engine": { "state": "draining", "decode_tokens_per_second": 12.25, "queue": 3 },
        "update": { "booted": "B", "committed": "B", "channel": "stable",
                    "slots": [ { "slot": "A", "system_version": "7", "state": "good", "booted": false },
                               { "slot": "B", "system_version": "8", "state": "good", "booted": true,
                                 "signed_by": "fleet" } ],
                    "trial": null,
                    "last": { "slot": "B", "system_version": "8", "result": "committed",
                              "reason": "healthy", "ended_unix": 50 } },
        "provision": { "state": "provisioned", "generation": 3, "device_public_key": "aa",
                       "site": "Hamburg" }
    }"#;

    #[test]
    fn a_newer_box_s_status_fills_the_row() {
        let row = read_status(Row::default(), NEWER_BOX.as_bytes(), "aa");
        assert_eq!(row.error, None);
        assert_eq!(row.os.as_deref(), Some("Debian GNU/Linux 14"));
        assert_eq!(row.engine.as_deref(), Some("draining"));
        assert_eq!(row.decode_tokens_per_second, Some(12.25));
        assert_eq!(row.model.as_deref(), Some("gemma"));
        assert_eq!(row.model_state.as_deref(), Some("verified"));
        assert_eq!(row.slot.as_deref(), Some("B"));
        assert_eq!(row.system_version.as_deref(), Some("8"));
        assert_eq!(row.last_update.as_deref(), Some("committed 8"));
        assert_eq!(row.last_update_ended_unix, Some(50));
        assert_eq!(row.update_stage, None);
        assert_eq!(row.boot_partition, Some(2));
        assert_eq!(row.throttling, Some(Vec::new()));
        assert_eq!(row.uptime_s, Some(7260));
        assert_eq!(row.generation, Some(3));
        assert!(table(&[row]).contains("B 8"));
    }

    #[test]
    fn a_status_that_is_not_one_or_another_key_is_the_rows_error() {
        let row = read_status(Row::default(), NEWER_BOX.as_bytes(), "bb");
        assert_eq!(row.identity, "MISMATCH");
        let row = read_status(Row::default(), b"<html>busy</html>", "aa");
        assert!(
            row.error
                .as_deref()
                .is_some_and(|e| e.starts_with("not a status document: expected value")),
            "{row:?}"
        );
        let without_engine = NEWER_BOX.replace("\"engine\"", "\"motor\"");
        let row = read_status(Row::default(), without_engine.as_bytes(), "aa");
        assert!(
            row.error
                .as_deref()
                .is_some_and(|e| e.starts_with("not a status document: missing field `engine`")),
            "{row:?}"
        );
        let row = read_status(
            Row::default(),
            NEWER_BOX
                .replace("\"schema_version\": 1", "\"schema_version\": 2")
                .as_bytes(),
            "aa",
        );
        assert!(
            row.error
                .as_deref()
                .is_some_and(|e| e.contains("status schema version 2")),
            "{row:?}"
        );
    }

    #[test]
    fn stamps_run_at_once_share_one_fleet_secret() {
        let dir = tempfile::tempdir().expect("dir");
        let paths = Paths::beside(&dir.path().join("fleet.toml"));
        let runs: Vec<_> = (0..8)
            .map(|_| {
                let paths = Paths::beside(&paths.fleet);
                std::thread::spawn(move || secret(&paths).expect("secret"))
            })
            .collect();
        let secrets: Vec<Vec<u8>> = runs.into_iter().map(|r| r.join().expect("run")).collect();
        assert!(secrets.iter().all(|s| s == &secrets[0]), "{secrets:?}");
        assert_eq!(secret(&paths).expect("again"), secrets[0]);
    }
}
