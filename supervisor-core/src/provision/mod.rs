//! First boot and re-provisioning: the box takes its identity from `appliance-provision.toml`
//! on the boot partition.
//!
//! One pass ([`apply`]) runs at every boot before networking and the supervisor's daemon:
//!
//! 1. The boot file is read, parsed and checked **whole** (every value, this board's entry by
//!    serial, the time zone installed) before anything is written; a bad file changes nothing
//!    and its reason is recorded.
//! 2. A generation higher than the one applied is **committed**: the box's entry is written
//!    (owner-only) to the data partition in one atomic replace. That replace is the only commit
//!    point; a power cut before it leaves the old state, after it the new.
//! 3. Then the boot file is rewritten without its secrets (password hash, token digests, Wi-Fi
//!    PSK). A file whose generation is already applied is only scrubbed, never applied again.
//! 4. The committed settings are realised in the running system ([`runtime`]): they live in
//!    `/run` (the root is read-only), so this happens again at every boot.
//! 5. The box's ed25519 device key is made on the box once and never leaves it; its public half
//!    is in the record (`/var/lib/appliance/provision.json`) with what was applied and when.
//!
//! The supervisor's own settings from provisioning (dashboard password, API tokens, model,
//! overclock) are read by [`crate::config::Config::from_board_files`] from the committed file.

pub mod identity;
pub mod runtime;

use serde::{Deserialize, Serialize};

use crate::board::{Board, paths};
use provision::values::Serial;
use provision::{BoxSettings, Fleet, FleetFile, PROVISION_FILE};

/// Where provisioning keeps what it committed and the device key (owner-only files).
pub const PROVISION_DIR: &str = "/var/lib/appliance/provision";
/// The committed settings: this box's entry of the applied file, secrets (hashes) included.
pub const COMMITTED: &str = "/var/lib/appliance/provision/applied.toml";
/// The record of what was applied, shown by `status` and the dashboard.
pub const RECORD: &str = "/var/lib/appliance/provision.json";
/// A provisioning file larger than this is refused unread (a fleet of thousands fits).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// A new generation was applied.
    Applied,
    /// The file's generation was already applied (or is older): nothing applied.
    Unchanged,
    /// No provisioning file on the boot partition.
    NoFile,
    /// The file was refused; nothing applied.
    Rejected,
}

/// `/var/lib/appliance/provision.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    /// `provisioned` or `unprovisioned`.
    pub state: String,
    /// Fleet of the applied file.
    pub fleet: Option<String>,
    /// The box's name in the fleet.
    pub name: Option<String>,
    /// The applied generation (0: none).
    pub generation: u64,
    /// When that generation was applied (Unix seconds).
    pub applied_unix: Option<u64>,
    /// The board serial, when the firmware reports one.
    pub serial: Option<String>,
    /// The host name the box took.
    pub hostname: Option<String>,
    /// The device key's public half (64 hex digits); the secret half never leaves the box.
    pub device_public_key: Option<String>,
    /// SHA-256 of the TLS certificate the dashboard serves (what `fleet.lock` pins).
    pub certificate_sha256: Option<String>,
    /// When `appliance fleet enroll` enrolled this generation (Unix seconds); its token is
    /// then spent.
    pub enrolled_unix: Option<u64>,
    /// Why the last file on the boot partition was refused; cleared once a file applies or
    /// the file is gone.
    pub last_error: Option<String>,
}

/// The result of [`apply`]: the outcome, a sentence for the log, and the record.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What happened.
    pub outcome: Outcome,
    /// What happened, in words.
    pub message: String,
    /// The record as written.
    pub record: Record,
}

/// Where a provisioning file comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `appliance-provision.toml` on the boot partition: trusted because whoever can write the
    /// card before first boot owns the box; its secrets are removed once applied.
    BootPartition,
    /// A directory (box path) where a USB stick labelled `APPLIANCE` is mounted read-only:
    /// its file counts only with a valid `appliance-provision.toml.sig` by the fleet key the
    /// box already trusts, so physical access alone cannot re-provision a box.
    SignedDir(String),
}

/// Runs one provisioning pass (see the module docs). `Err` is a failure of the board itself
/// (a write that did not happen); a bad file is an `Ok` report with [`Outcome::Rejected`].
pub fn apply(board: &Board, source: &Source) -> Result<Report, String> {
    let _record = lock_record(board)?;
    let mut committed = read_committed(board)?;
    let serial = board_serial(board);
    let stored = read_record(board)?;
    let mut record = stored.clone().unwrap_or_default();
    let found = match source {
        Source::BootPartition => read_boot_file(board),
        Source::SignedDir(dir) => read_signed(board, dir, committed.as_ref()),
    };
    let (outcome, message) = match found {
        None => (
            Outcome::NoFile,
            match source {
                Source::BootPartition => "no provisioning file on the boot partition".to_string(),
                Source::SignedDir(dir) => format!("no {PROVISION_FILE} in {dir}"),
            },
        ),
        Some((path, text)) => match text.and_then(|t| {
            check(board, &path, &t, serial.as_ref()).map(|(file, entry)| (file, entry, t))
        }) {
            Err(reason) => (Outcome::Rejected, reason),
            Ok((file, entry, raw)) => {
                let applied = committed.as_ref().map_or(0, |c| c.fleet.generation);
                let result = if file.fleet.generation > applied {
                    let one = FleetFile {
                        fleet: Fleet {
                            name: file.fleet.name.clone(),
                            generation: file.fleet.generation,
                            defaults: BoxSettings::default(),
                        },
                        boxes: vec![entry],
                        clusters: Vec::new(),
                    };
                    board
                        .create_dir_all(PROVISION_DIR)
                        .map_err(|e| e.to_string())?;
                    board
                        .replace_private_file(COMMITTED, one.to_text().as_bytes())
                        .map_err(|e| e.to_string())?;
                    record.applied_unix = Some(board.now_unix());
                    committed = Some(one);
                    (
                        Outcome::Applied,
                        format!(
                            "applied generation {} of fleet {} from {path}",
                            file.fleet.generation, file.fleet.name
                        ),
                    )
                } else {
                    let why = if file.fleet.generation == applied {
                        "is already applied"
                    } else {
                        "is older than the applied one"
                    };
                    (
                        Outcome::Unchanged,
                        format!(
                            "{path}: generation {} {why}; raise [fleet] generation above {applied} to re-provision",
                            file.fleet.generation
                        ),
                    )
                };
                if file.has_secrets() && *source == Source::BootPartition {
                    scrub(board, &path, raw.as_bytes(), &file)?;
                }
                result
            }
        },
    };
    let settings = committed.as_ref().and_then(|c| c.boxes.first());
    let (mut device_public_key, mut certificate_sha256) = (None, None);
    if let Some(settings) = settings {
        device_public_key = Some(identity::public_hex(&identity::device_key(board)?));
        certificate_sha256 = Some(identity::ensure_tls(
            board,
            settings,
            outcome == Outcome::Applied,
        )?);
        runtime::realise(board, settings)?;
    }
    let new_record = Record {
        state: if committed.is_some() {
            "provisioned"
        } else {
            "unprovisioned"
        }
        .to_string(),
        fleet: committed.as_ref().map(|c| c.fleet.name.to_string()),
        name: settings
            .and_then(|s| s.name.as_ref())
            .map(|n| n.to_string()),
        generation: committed.as_ref().map_or(0, |c| c.fleet.generation),
        applied_unix: record.applied_unix.filter(|_| committed.is_some()),
        serial: serial.map(|s| s.to_string()),
        hostname: settings
            .and_then(BoxSettings::effective_hostname)
            .map(|h| h.to_string()),
        device_public_key,
        certificate_sha256,
        enrolled_unix: record
            .enrolled_unix
            .filter(|_| outcome != Outcome::Applied && committed.is_some()),
        last_error: (outcome == Outcome::Rejected).then(|| message.clone()),
    };
    if stored.as_ref() != Some(&new_record) {
        write_record(board, &new_record)?;
    }
    Ok(Report {
        outcome,
        message,
        record: new_record,
    })
}

/// Writes the record (atomically).
pub fn write_record(board: &Board, record: &Record) -> Result<(), String> {
    let text = serde_json::to_string_pretty(record).map_err(|e| e.to_string())?;
    board
        .create_dir_all(PROVISION_DIR)
        .map_err(|e| e.to_string())?;
    board
        .replace_file(RECORD, format!("{text}\n").as_bytes())
        .map_err(|e| e.to_string())
}

/// Held while the record is read, changed and written: a provisioning pass and an enrolment
/// answer (or two enrolment requests) at once would each write the record as they read it,
/// and two boxes' worth of answers could spend one one-time token.
pub fn lock_record(board: &Board) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    board
        .create_dir_all(PROVISION_DIR)
        .map_err(|e| e.to_string())?;
    board
        .lock(&format!("{PROVISION_DIR}/record.lock"))
        .map_err(|e| e.to_string())
}

/// The record as last written (`None`: provisioning never ran on this box).
pub fn read_record(board: &Board) -> Result<Option<Record>, String> {
    match board.read_optional(RECORD).map_err(|e| e.to_string())? {
        None => Ok(None),
        Some(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            format!("{RECORD} is unreadable ({e}); `supervisor provision apply` rewrites it")
        }),
    }
}

/// The supervisor's own settings from provisioning, as a configuration layer: the dashboard
/// password and API tokens, the model, overclocking.
pub fn config_layer(settings: &BoxSettings) -> toml::Table {
    let mut layer = toml::Table::new();
    let mut dashboard = toml::Table::new();
    if let Some(hash) = &settings.password_hash {
        dashboard.insert("password_hash".into(), hash.as_str().into());
    }
    if let Some(tokens) = &settings.api_token_sha256 {
        let digests = tokens.iter().map(|t| t.as_str().into()).collect();
        dashboard.insert("api_token_sha256".into(), toml::Value::Array(digests));
    }
    let mut section = |name: &str, table: toml::Table| {
        if !table.is_empty() {
            layer.insert(name.into(), toml::Value::Table(table));
        }
    };
    section("dashboard", dashboard);
    if let Some(model) = &settings.model {
        section(
            "model",
            toml::Table::from_iter([("id".into(), model.as_str().into())]),
        );
    }
    if let Some(enabled) = settings.overclock {
        section(
            "overclock",
            toml::Table::from_iter([("enabled".into(), enabled.into())]),
        );
    }
    if let Some(part) = &settings.cluster {
        use provision::cluster::{Fallback, Role};
        let mut cluster = toml::Table::from_iter([
            ("name".into(), part.name.as_str().into()),
            (
                "role".into(),
                match part.role {
                    Role::Head => "head",
                    Role::Worker => "worker",
                }
                .into(),
            ),
            ("address".into(), part.address.to_string().into()),
        ]);
        if let Some(model) = &part.model {
            cluster.insert("model".into(), model.as_str().into());
        }
        if let Some(fallback) = part.fallback {
            let word = match fallback {
                Fallback::OwnModel => "own-model",
                Fallback::None => "none",
            };
            cluster.insert("fallback".into(), word.into());
        }
        section("cluster", cluster);
    }
    layer
}

/// The committed settings of this box (`None`: never provisioned).
pub fn committed_settings(board: &Board) -> Result<Option<BoxSettings>, String> {
    Ok(read_committed(board)?.and_then(|f| f.boxes.into_iter().next()))
}

fn read_committed(board: &Board) -> Result<Option<FleetFile>, String> {
    let Some(text) = board.read_optional(COMMITTED).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    // Written whole by an atomic replace, so a file that does not parse was damaged on disk.
    FleetFile::parse(&text, COMMITTED)
        .map(Some)
        .map_err(|e| format!("{e}; the applied provisioning is damaged: provision the box again"))
}

/// The firmware's serial number, if it reports a well-formed one.
fn board_serial(board: &Board) -> Option<Serial> {
    let raw = board.read_bytes(paths::DT_SERIAL_NUMBER).ok()?;
    let text = String::from_utf8_lossy(&raw);
    text.trim_end_matches('\0').trim().parse().ok()
}

/// The boot partition's provisioning file: its path and its text, or why it cannot be read.
fn read_boot_file(board: &Board) -> Option<(String, Result<String, String>)> {
    let boot = board.boot_dir().ok()?;
    let path = format!("{boot}/{PROVISION_FILE}");
    let text = read_limited(board, &path)?;
    Some((path, text))
}

/// A file of at most [`MAX_FILE_BYTES`] (`None`: there is none).
fn read_limited(board: &Board, path: &str) -> Option<Result<String, String>> {
    let meta = std::fs::metadata(board.path(path)).ok()?;
    Some(if meta.len() > MAX_FILE_BYTES {
        Err(format!(
            "{path} is {} bytes; a provisioning file is at most {MAX_FILE_BYTES}",
            meta.len()
        ))
    } else {
        board.read(path).map_err(|e| e.to_string())
    })
}

/// The provisioning file in `dir` if its signature is by the fleet key this box trusts.
fn read_signed(
    board: &Board,
    dir: &str,
    committed: Option<&FleetFile>,
) -> Option<(String, Result<String, String>)> {
    let path = format!("{}/{PROVISION_FILE}", dir.trim_end_matches('/'));
    let text = read_limited(board, &path)?.and_then(|text| {
        let key = committed
            .and_then(|c| c.boxes.first())
            .and_then(|s| s.fleet_key.as_ref())
            .ok_or_else(|| {
                format!(
                    "{path}: refused: this box trusts no fleet key yet (its provisioning sets no fleet_key), so it takes no file from a USB stick; provision it from the boot partition"
                )
            })?;
        let signature = board
            .read_optional(&format!("{path}.sig"))
            .map_err(|e| e.to_string())?;
        let trust = weights::sign::Trust::new(&[key.to_string()], true)
            .map_err(|e| format!("the trusted fleet key: {e}"))?;
        trust
            .check(text.as_bytes(), signature.as_deref())
            .map_err(|e| {
                format!(
                    "{path}: refused, not signed by this box's fleet key {key}: {e} (sign it with `appliance usb`)"
                )
            })?;
        Ok(text)
    });
    Some((path, text))
}

/// Everything that can be wrong with the file, found before anything is written.
fn check(
    board: &Board,
    path: &str,
    text: &str,
    serial: Option<&Serial>,
) -> Result<(FleetFile, BoxSettings), String> {
    let file = FleetFile::parse(text, path).map_err(|e| e.to_string())?;
    let entry = file.entry_for(serial).map_err(|e| format!("{path}: {e}"))?;
    if let Some(zone) = &entry.timezone {
        let zone_file = format!("{}/{zone}", paths::ZONEINFO);
        if !board.path(&zone_file).is_file() {
            return Err(format!(
                "{path}: timezone = \"{zone}\" is not a zone this image has ({zone_file} is missing); use an IANA name such as \"Europe/Berlin\""
            ));
        }
    }
    Ok((file, entry))
}

const SCRUBBED_HEADER: &str = "# Applied by this box. Its secrets (password hash, API token digests, Wi-Fi PSK) were\n\
# removed once they were stored on the data partition; `supervisor status` shows what was\n\
# applied. To re-provision, write a file with a higher [fleet] generation.\n";

/// Removes the secrets from the provisioning file at `path` (its text `raw`, parsed as `file`):
/// first each secret's bytes are overwritten where they lie on the medium, then the file is
/// replaced with its secret-free form. A rename alone would leave the old clusters on the
/// card, readable by anyone who pulls it. A crash between the steps leaves the old file with
/// its secrets blanked but still valid (its generation already applied: it is only scrubbed
/// again).
fn scrub(board: &Board, path: &str, raw: &[u8], file: &FleetFile) -> Result<(), String> {
    let at = |e: &dyn std::fmt::Display| format!("removing the secrets from {path}: {e}");
    let mut edits = Vec::new();
    for secret in file.secrets() {
        let found = occurrences(raw, secret.as_bytes());
        if found.is_empty() {
            // Every secret is ASCII without a character TOML escapes: parsed, it is its text.
            return Err(at(&"a secret's text was not found to overwrite it"));
        }
        let blank = blanked(secret);
        edits.extend(
            found
                .into_iter()
                .map(|offset| (offset, blank.clone().into_bytes())),
        );
    }
    board.overwrite_in_place(path, &edits).map_err(|e| at(&e))?;
    let text = format!("{SCRUBBED_HEADER}{}", file.without_secrets().to_text());
    board
        .replace_file(path, text.as_bytes())
        .map_err(|e| at(&e))
}

/// Where `needle` starts in `raw`.
fn occurrences(raw: &[u8], needle: &[u8]) -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = raw
        .get(from..)
        .and_then(|rest| rest.windows(needle.len()).position(|w| w == needle))
    {
        found.push(from + i);
        from += i + needle.len().max(1);
    }
    found
}

/// A value of the same length and kind as `secret` that gives nothing away: the salt and
/// hash of an Argon2 PHC string become `A`s (its algorithm and costs are no secret), a hex
/// digest becomes `0`s. The file stays valid, so a crash before its replacement leaves a
/// file the next boot reads.
fn blanked(secret: &str) -> String {
    if !secret.starts_with('$') {
        return "0".repeat(secret.len());
    }
    let parts: Vec<&str> = secret.split('$').collect();
    let salt = parts.len().saturating_sub(2);
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            if i >= salt && i > 0 {
                "A".repeat(part.len())
            } else {
                (*part).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("$")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn blanked_secrets_keep_their_kind_and_give_nothing_away() {
        let hash = crate::config::TEST_PASSWORD_HASH.to_string();
        let blank = blanked(&hash);
        assert_eq!(blank.len(), hash.len());
        assert!(
            blank.parse::<provision::values::PasswordHash>().is_ok(),
            "{blank}"
        );
        let secret_parts: Vec<&str> = hash.rsplitn(3, '$').take(2).collect();
        for part in secret_parts {
            assert!(!blank.contains(part), "{blank} keeps {part}");
        }
        let digest = "9f".repeat(32);
        assert_eq!(blanked(&digest), "0".repeat(64));
        assert_eq!(occurrences(b"ab ab a", b"ab"), vec![0, 3]);
        assert!(occurrences(b"a", b"ab").is_empty());
    }

    #[test]
    fn the_supervisor_runs_with_what_was_provisioned_under_the_boot_override() {
        let dir = tempfile::tempdir().expect("tempdir");
        board_sim::init(dir.path(), board_sim::Variant::Pi5_8gb).expect("sim");
        let board = board_sim::open(dir.path()).expect("board");
        let hash = crate::config::TEST_PASSWORD_HASH.to_string();
        let digest = "ab".repeat(32);
        let file = format!(
            "[fleet]\nname = \"clinics\"\ngeneration = 1\n\n[[box]]\nname = \"north-1\"\n\
             password_hash = \"{hash}\"\napi_token_sha256 = [\"{digest}\"]\n\
             model = \"gemma3-270m\"\noverclock = true\n"
        );
        let boot = board.boot_dir().expect("boot dir");
        board
            .replace_file(&format!("{boot}/{PROVISION_FILE}"), file.as_bytes())
            .expect("stamp");
        assert_eq!(
            Config::from_board_files(&board, None).expect("config"),
            Config::default()
        );

        assert_eq!(
            apply(&board, &Source::BootPartition)
                .expect("apply")
                .outcome,
            Outcome::Applied
        );
        let config = Config::from_board_files(&board, None).expect("config");
        assert_eq!(config.dashboard.password_hash.as_str(), hash);
        assert_eq!(config.dashboard.api_token_sha256.len(), 1);
        assert_eq!(config.dashboard.api_token_sha256[0].as_str(), digest);
        assert_eq!(config.model.id, "gemma3-270m");
        assert!(config.overclock.enabled);

        board
            .replace_file(
                &format!("{boot}/{}", crate::config::OVERRIDE_NAME),
                b"[overclock]\nenabled = false\n",
            )
            .expect("override");
        let config = Config::from_board_files(&board, None).expect("config");
        assert!(!config.overclock.enabled, "the boot override wins");
        assert_eq!(
            config.dashboard.password_hash.as_str(),
            hash,
            "the rest stays"
        );
    }

    #[test]
    fn a_box_stamped_from_a_fleet_with_a_cluster_runs_its_part() {
        let fleet = provision::FleetFile::parse(
            "[fleet]\nname = \"clinics\"\ngeneration = 1\n\
             [[box]]\nname = \"reception\"\nmodel = \"small\"\n[[box]]\nname = \"office-1\"\n\
             [[cluster]]\nname = \"front-desk\"\nhead = \"reception\"\nworkers = [\"office-1\"]\n\
             link = \"10.77.0.0/24\"\nmodel = \"big\"\n",
            "fleet.toml",
        )
        .expect("fleet");
        for (name, role, address, model) in [
            (
                "reception",
                crate::config::cluster::Role::Head,
                "10.77.0.1/24",
                Some("big"),
            ),
            (
                "office-1",
                crate::config::cluster::Role::Worker,
                "10.77.0.2/24",
                None,
            ),
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            board_sim::init(dir.path(), board_sim::Variant::Pi5_8gb).expect("sim");
            let board = board_sim::open(dir.path()).expect("board");
            let stamped = fleet.stamp(name).expect("stamp").to_text();
            let boot = board.boot_dir().expect("boot dir");
            board
                .replace_file(&format!("{boot}/{PROVISION_FILE}"), stamped.as_bytes())
                .expect("card");
            apply(&board, &Source::BootPartition).expect("apply");
            let config = Config::from_board_files(&board, None).expect("config");
            let cluster = config.cluster.expect("a cluster part");
            assert_eq!(cluster.name.as_str(), "front-desk");
            assert_eq!(cluster.role, role);
            assert_eq!(cluster.address.to_string(), address);
            assert_eq!(cluster.model.as_deref(), model);
            assert!(cluster.peers.is_empty(), "the peers come with enrolment");
        }
        // A box in two clusters, a cluster naming a stranger: refused with the reason.
        let e = provision::FleetFile::parse(
            "[fleet]\nname = \"clinics\"\ngeneration = 1\n[[box]]\nname = \"reception\"\n\
             [[cluster]]\nname = \"front-desk\"\nhead = \"reception\"\nworkers = [\"store\"]\n\
             link = \"10.77.0.0/24\"\nmodel = \"big\"\n",
            "fleet.toml",
        )
        .expect_err("stranger");
        assert!(e.message.contains("\"store\" is not a [[box]]"), "{e}");
        // The head's own model, served alone while a worker is gone, is not the cluster's.
        let e = provision::FleetFile::parse(
            "[fleet]\nname = \"clinics\"\ngeneration = 1\n\
             [[box]]\nname = \"reception\"\nmodel = \"big\"\n[[box]]\nname = \"office-1\"\n\
             [[cluster]]\nname = \"front-desk\"\nhead = \"reception\"\nworkers = [\"office-1\"]\n\
             link = \"10.77.0.0/24\"\nmodel = \"big\"\n",
            "fleet.toml",
        )
        .expect_err("same model");
        assert!(e.message.contains("also its head's own model"), "{e}");
    }
}
