//! A model pushed to the box a chunk at a time, each chunk checked against the signed
//! manifest as it arrives, so a 3 GB transfer that breaks off resumes where it stopped and a
//! corrupted chunk is refused on its own.
//!
//! ```text
//! DATA/incoming/<id>/manifest.toml (+ .sig)   the signed manifest, verbatim
//!                    progress.json            the chunks received of each part, replaced after each
//!                    files/<file>, <draft>    the model's files at their full size, filled chunk by chunk
//! ```
//! Chunks may come in any order and several at once (a client keeps a few in flight, so the
//! network, the hashing and the disk work side by side). A chunk is written at its place and
//! synced before `progress.json` counts it, so after a power cut nothing counted is missing;
//! a chunk half written when the power went is simply not counted, and its resend overwrites
//! it. When the last chunk arrives, `files/` is verified whole and becomes the model's new
//! version directory ([`weights::install::adopt`]: a rename, no copy).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weights::install::{Approval, MANIFEST, SIGNATURE};
use weights::sign::Trust;
use weights::{ErrorKind, Manifest};
use wire::models::{Incoming, Part, Push};

use super::{PushError, selection};
use crate::board::Board;
use crate::config::Config;

/// The largest chunk a push takes (a chunk is held in memory while it is checked).
pub const MAX_CHUNK: u64 = 64 << 20;
/// The part names of a push's URL.
pub const MODEL_PART: &str = "model";
/// The draft head's part.
pub const DRAFT_PART: &str = "draft";

const PROGRESS: &str = "progress.json";
const FILES: &str = "files";

/// The chunks received of each part (indices, ascending), in the order of [`parts`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Progress {
    done: Vec<Vec<u64>>,
}

impl Progress {
    fn has(&self, part: usize, index: u64) -> bool {
        self.done
            .get(part)
            .is_some_and(|d| d.binary_search(&index).is_ok())
    }
}

/// The keys a pushed model must be signed by: the box's trusted keys (the provisioned fleet
/// key among them). A push is always signed, whatever `require_signature` says.
pub fn trust(config: &Config) -> Result<Trust, PushError> {
    let keys = crate::model::trusted_keys(config);
    if keys.is_empty() {
        return Err(PushError::Signature(
            "this box trusts no signing key (its provisioning sets no fleet_key and [model] \
             trusted_keys is empty), so it takes no pushed model"
                .into(),
        ));
    }
    Trust::new(&keys, true).map_err(|e| PushError::Internal(format!("the trusted keys: {e}")))
}

fn data_dir(board: &Board, config: &Config) -> PathBuf {
    crate::model::data_dir(board, config)
}

fn incoming_dir(board: &Board, config: &Config) -> PathBuf {
    data_dir(board, config).join("incoming")
}

/// The parts of `manifest`: name, file, size and chunk hashes.
fn parts(manifest: &Manifest) -> Vec<(&'static str, &str, u64, &[String])> {
    let mut parts = vec![(
        MODEL_PART,
        manifest.file.as_str(),
        manifest.size,
        manifest.chunks.as_slice(),
    )];
    if let Some(d) = &manifest.draft {
        parts.push((DRAFT_PART, d.file.as_str(), d.size, d.chunks.as_slice()));
    }
    parts
}

fn describe(manifest: &Manifest, progress: &Progress, installed: bool) -> Incoming {
    Incoming {
        id: manifest.id.clone(),
        sha256: manifest.sha256.clone(),
        parts: parts(manifest)
            .iter()
            .enumerate()
            .map(|(i, (part, file, size, chunks))| {
                let missing: Vec<u64> = if installed {
                    Vec::new()
                } else {
                    (0..chunks.len() as u64)
                        .filter(|c| !progress.has(i, *c))
                        .collect()
                };
                Part {
                    part: part.to_string(),
                    file: file.to_string(),
                    size: *size,
                    chunk_size: manifest.chunk_size,
                    chunks: chunks.len() as u64,
                    received: chunks.len() as u64 - missing.len() as u64,
                    missing,
                }
            })
            .collect(),
        installed,
    }
}

fn io(what: impl std::fmt::Display, e: impl std::fmt::Display) -> PushError {
    PushError::Internal(format!("{what}: {e}"))
}

/// One push at a time changes `incoming/`: an exclusive lock held until dropped.
fn lock(board: &Board, config: &Config) -> Result<nix::fcntl::Flock<std::fs::File>, PushError> {
    let dir = format!("{}/incoming", config.model.data_dir.trim_end_matches('/'));
    board
        .create_dir_all(&dir)
        .and_then(|()| board.lock(&format!("{dir}/.lock")))
        .map_err(|e| io("locking the incoming models", e))
}

/// Whether model `text` (a manifest) may be installed: not over another version of the model
/// the box runs or would go back to (weights, engine settings or anything else of its
/// manifest), since what runs changes only through a switch's health gate. The caller holds
/// the selection's lock when it then installs ([`selection::update`]).
pub(super) fn check_replaceable(
    board: &Board,
    config: &Config,
    manifest: &Manifest,
    text: &str,
    selection: &selection::Selection,
) -> Result<(), PushError> {
    let installed = weights::install::current_dir(&data_dir(board, config), &manifest.id).ok();
    let Some(vdir) = installed else {
        return Ok(());
    };
    if Manifest::read_text(&vdir.join(MANIFEST)).is_ok_and(|t| t == text) {
        return Ok(());
    }
    let in_use = selection.active_or(&config.model.id) == manifest.id
        || selection.fallback.as_deref() == Some(manifest.id.as_str());
    if in_use {
        return Err(PushError::Conflict(format!(
            "model {} is installed in another version and is the box's active or fallback \
             model; push the new version under a new id and switch to it (`use`), so it goes \
             through the health gate",
            manifest.id
        )));
    }
    Ok(())
}

/// The approved manifest of a push, its signature checked.
fn approve(push: &Push, trust: &Trust) -> Result<Approval, PushError> {
    let signed = trust
        .check(push.manifest.as_bytes(), Some(&push.signature))
        .map_err(|e| PushError::Signature(format!("the manifest is refused: {e}")))?;
    let manifest = Manifest::parse(&push.manifest, "the pushed manifest")
        .map_err(|e| PushError::BadRequest(e.message))?;
    if manifest.chunk_size > MAX_CHUNK {
        return Err(PushError::BadRequest(format!(
            "its chunk size is {} bytes; a push takes chunks of at most {MAX_CHUNK} (make the \
             manifest with --chunk-size {})",
            manifest.chunk_size,
            weights::manifest::DEFAULT_CHUNK
        )));
    }
    Ok(Approval {
        manifest,
        text: push.manifest.clone(),
        signature: Some(push.signature.clone()),
        signed,
    })
}

/// Starts or resumes a push: the manifest's signature checked, then the space for what is
/// still to come; the answer says which chunk to send next (all received when the model is
/// already installed).
pub fn begin(board: &Board, config: &Config, push: &Push) -> Result<Incoming, PushError> {
    let trust = trust(config)?;
    let approval = approve(push, &trust)?;
    let manifest = &approval.manifest;
    let installed = weights::install::installed(&data_dir(board, config), &manifest.id, &trust);
    if installed.is_ok_and(|(it, _)| it.text == push.manifest) {
        return Ok(describe(manifest, &Progress::default(), true));
    }
    let current = selection::read(board, config).map_err(PushError::Internal)?;
    check_replaceable(board, config, manifest, &push.manifest, &current)?;
    let _lock = lock(board, config)?;
    let dir = incoming_dir(board, config).join(&manifest.id);
    if let Some(progress) = resumable(&dir, push) {
        if complete(manifest, &progress) {
            // Every chunk arrived before a power cut or crash stopped the install: it is
            // finished now, or, when its files are gone (moved into place, not yet switched
            // to), the push starts over.
            match install(board, config, &approval, &dir) {
                Ok(done) => return Ok(done),
                Err(e) => tracing::warn!("the push of {} starts over: {e}", manifest.id),
            }
        } else {
            check_space(board, config, manifest, &progress)?;
            return Ok(describe(manifest, &progress, false));
        }
    }
    // Another version of it, half sent: superseded by this one.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| io(format!("removing {}", dir.display()), e))?;
    }
    let progress = Progress {
        done: vec![Vec::new(); parts(manifest).len()],
    };
    check_space(board, config, manifest, &progress)?;
    let staging = incoming_dir(board, config).join(format!(".new-{}", manifest.id));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(staging.join(FILES))
        .map_err(|e| io(format!("creating {}", staging.display()), e))?;
    // Each file at its full size from the start (sparse: it takes room as chunks arrive), so
    // a chunk is written at its place whatever arrived before it.
    for (_, file, size, _) in parts(manifest) {
        let path = staging.join(FILES).join(file);
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(size))
            .map_err(|e| io(format!("creating {}", path.display()), e))?;
    }
    let write = |name: &str, bytes: &[u8]| {
        durable::replace(&staging.join(name), bytes)
            .map_err(|e| io(format!("writing {name} of the push"), e))
    };
    write(MANIFEST, push.manifest.as_bytes())?;
    write(SIGNATURE, push.signature.as_bytes())?;
    write(PROGRESS, &progress_bytes(&progress)?)?;
    durable::sync_dir(&staging.join(FILES)).map_err(|e| io("syncing the push", e))?;
    durable::sync_dir(&staging).map_err(|e| io("syncing the push", e))?;
    std::fs::rename(&staging, &dir).map_err(|e| io(format!("creating {}", dir.display()), e))?;
    durable::sync_dir(&incoming_dir(board, config)).map_err(|e| io("syncing the push", e))?;
    Ok(describe(manifest, &progress, false))
}

fn progress_bytes(progress: &Progress) -> Result<Vec<u8>, PushError> {
    serde_json::to_vec(progress).map_err(|e| io("encoding the progress", e))
}

/// The progress of the push in `dir` when it is of exactly this manifest and signature.
fn resumable(dir: &Path, push: &Push) -> Option<Progress> {
    let text = read_small(&dir.join(MANIFEST), weights::manifest::MAX_MANIFEST_BYTES)?;
    let signature = read_small(&dir.join(SIGNATURE), 4096)?;
    if text != push.manifest || signature != push.signature {
        return None;
    }
    read_progress(dir)
}

/// At most `limit` bytes of the regular file `path` as text (`None`: missing, larger, not a
/// regular file, not UTF-8). Every file of a push is read so: the data partition is writable.
fn read_small(path: &Path, limit: u64) -> Option<String> {
    let bytes = durable::read_bounded(path, limit, durable::Links::Refuse).ok()?;
    String::from_utf8(bytes).ok()
}

/// The progress recorded in the push folder `dir` (a 64 MiB chunk of a 1 TB model is 15 625
/// indices: well under the bound).
fn read_progress(dir: &Path) -> Option<Progress> {
    serde_json::from_str(&read_small(&dir.join(PROGRESS), 4 << 20)?).ok()
}

/// Refuses `still` more bytes on the data partition unless `[model] keep_free_mib` stay free.
pub(super) fn check_room(
    board: &Board,
    config: &Config,
    id: &str,
    still: u64,
) -> Result<(), PushError> {
    let free = board
        .free_bytes(&config.model.data_dir)
        .map_err(|e| io("measuring the free space", e))?;
    let keep = config.model.keep_free_mib.get() << 20;
    if free < still.saturating_add(keep) {
        return Err(PushError::NoSpace(format!(
            "the data partition has {} MiB free; model {id} needs {} MiB more and {} MiB must \
             stay free for the box's state and OS updates ([model] keep_free_mib); remove a \
             model (`appliance fleet model rm`) first",
            free >> 20,
            still.div_ceil(1 << 20),
            keep >> 20
        )));
    }
    Ok(())
}

/// Refuses a push the data partition cannot take while keeping `[model] keep_free_mib` free.
fn check_space(
    board: &Board,
    config: &Config,
    manifest: &Manifest,
    progress: &Progress,
) -> Result<(), PushError> {
    let still: u64 = parts(manifest)
        .iter()
        .enumerate()
        .map(|(i, (_, _, size, chunks))| {
            (0..chunks.len() as u64)
                .filter(|c| !progress.has(i, *c))
                .map(|c| (size - c * manifest.chunk_size).min(manifest.chunk_size))
                .sum::<u64>()
        })
        .sum();
    check_room(board, config, &manifest.id, still)
}

/// The push of `id` under way: its approval (the signature checked again: the directory is
/// on a writable partition) and progress.
fn load(board: &Board, config: &Config, id: &str) -> Result<(Approval, Progress), PushError> {
    let dir = incoming_dir(board, config).join(id);
    let not_found = || {
        PushError::NotFound(format!(
            "no push of model {id} is under way; start it with POST /api/models/push"
        ))
    };
    if !is_plain_id(id) || !dir.is_dir() {
        return Err(not_found());
    }
    let approval = Approval::load(&dir.join(MANIFEST), &trust(config)?).map_err(|e| {
        if e.kind == ErrorKind::Io {
            not_found()
        } else {
            PushError::Internal(format!("the push of {id} is damaged: {e}"))
        }
    })?;
    let progress = read_progress(&dir).ok_or_else(|| {
        PushError::Internal(format!("the progress of the push of {id} is damaged"))
    })?;
    Ok((approval, progress))
}

/// An id as the manifest allows it (so it names a directory and nothing else).
pub(super) fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Takes chunk `index` of `part` of the push of `id`: checked against the manifest's hash,
/// written at its place and synced, then counted. A chunk already counted is acknowledged
/// again (a resend after a lost answer). The chunk that completes the model installs it.
pub fn put_chunk(
    board: &Board,
    config: &Config,
    id: &str,
    part: &str,
    index: u64,
    bytes: &[u8],
) -> Result<Incoming, PushError> {
    // Checked and written without the lock, so chunks sent at once are hashed and written at
    // once; only the count is changed under it.
    let (approval, progress) = load(board, config, id)?;
    let manifest = &approval.manifest;
    let all = parts(manifest);
    let Some(slot) = all.iter().position(|(name, ..)| *name == part) else {
        return Err(PushError::NotFound(format!(
            "model {id} has no part {part:?}; its parts are {}",
            all.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
        )));
    };
    let (_, file, size, chunks) = all[slot];
    let Some(expected) = usize::try_from(index).ok().and_then(|i| chunks.get(i)) else {
        return Err(PushError::BadRequest(format!(
            "{part} of model {id} has {} chunks; there is no chunk {index}",
            chunks.len()
        )));
    };
    let start = index * manifest.chunk_size;
    let length = (size - start).min(manifest.chunk_size);
    if bytes.len() as u64 != length {
        return Err(PushError::BadRequest(format!(
            "chunk {index} of {part} of model {id} is {length} bytes, not {}",
            bytes.len()
        )));
    }
    let digest = weights::hash::to_hex(&weights::hash::sha256(bytes));
    if digest != *expected {
        return Err(PushError::Mismatch(format!(
            "chunk {index} of {part} of model {id} (bytes {start}..{}) hashes to {digest}, not \
             the manifest's {expected}: it was corrupted on the way; send it again",
            start + length
        )));
    }
    if progress.has(slot, index) {
        return Ok(describe(manifest, &progress, false));
    }
    let free = board
        .free_bytes(&config.model.data_dir)
        .map_err(|e| io("measuring the free space", e))?;
    if free < length.saturating_add(config.model.keep_free_mib.get() << 20) {
        return Err(PushError::NoSpace(format!(
            "the data partition has only {} MiB free; the push stops here and resumes once \
             there is room",
            free >> 20
        )));
    }
    let dir = incoming_dir(board, config).join(id);
    write_chunk(&dir.join(FILES).join(file), start, bytes)?;
    let _lock = lock(board, config)?;
    let mut progress = match load(board, config, id) {
        Ok((now, progress)) if now.text == approval.text => progress,
        // Another version's push replaced this one while the chunk was written: the chunk
        // was checked against the other manifest and is not counted.
        Ok(_) => {
            return Err(PushError::Conflict(format!(
                "another version of model {id} is being pushed now; start again \
                 (POST /api/models/push)"
            )));
        }
        // A chunk sent at the same time completed the push meanwhile.
        Err(PushError::NotFound(m)) => {
            let trust = trust(config)?;
            let data = data_dir(board, config);
            return match weights::install::installed(&data, id, &trust) {
                Ok((it, _)) if it.text == approval.text => {
                    Ok(describe(manifest, &Progress::default(), true))
                }
                _ => Err(PushError::NotFound(m)),
            };
        }
        Err(e) => return Err(e),
    };
    if progress.done.len() < all.len() {
        progress.done.resize(all.len(), Vec::new());
    }
    if let Err(at) = progress.done[slot].binary_search(&index) {
        progress.done[slot].insert(at, index);
    }
    durable::replace(&dir.join(PROGRESS), &progress_bytes(&progress)?)
        .map_err(|e| io("recording the push's progress", e))?;
    if !complete(manifest, &progress) {
        return Ok(describe(manifest, &progress, false));
    }
    install(board, config, &approval, &dir)
}

/// Whether every chunk of every part arrived.
fn complete(manifest: &Manifest, progress: &Progress) -> bool {
    parts(manifest)
        .iter()
        .enumerate()
        .all(|(i, (.., chunks))| progress.done.get(i).map(Vec::len) == Some(chunks.len()))
}

/// Installs the complete push in `dir` (its files become the model's new version) and drops
/// what is left of it.
fn install(
    board: &Board,
    config: &Config,
    approval: &Approval,
    dir: &Path,
) -> Result<Incoming, PushError> {
    let id = &approval.manifest.id;
    // What runs may have changed since the push began: checked again, and installed under the
    // selection's lock, so no switch is decided meanwhile.
    selection::update(board, config, |current| {
        check_replaceable(board, config, &approval.manifest, &approval.text, current)?;
        adopt(board, config, approval, dir)
    })?;
    let _ = std::fs::remove_dir_all(dir);
    tracing::info!(model = %id, "pushed model installed");
    Ok(describe(&approval.manifest, &Progress::default(), true))
}

/// The files of the complete push in `dir`, cut to their sizes and verified whole, made the
/// model's new version.
fn adopt(board: &Board, config: &Config, approval: &Approval, dir: &Path) -> Result<(), PushError> {
    let id = &approval.manifest.id;
    // Whatever lies past a file's end (written there by someone else) goes: the size is the
    // manifest's, and the whole is verified next.
    for (_, file, size, _) in parts(&approval.manifest) {
        let path = dir.join(FILES).join(file);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(size))
            .map_err(|e| io(format!("installing model {id}: {}", path.display()), e))?;
    }
    weights::install::adopt(&dir.join(FILES), approval, &data_dir(board, config))
        .map(|_| ())
        .map_err(|e| PushError::Internal(format!("installing model {id}: {e}")))
}

/// Writes `bytes` at `start` of `path` (made at its full size when the push began) and syncs
/// them.
fn write_chunk(path: &Path, start: u64, bytes: &[u8]) -> Result<(), PushError> {
    let what = || format!("writing {}", path.display());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io(what(), e))?;
    file.write_all_at(bytes, start).map_err(|e| io(what(), e))?;
    file.sync_data().map_err(|e| io(what(), e))
}

/// The pushes under way, as far as they got.
pub fn list(board: &Board, config: &Config) -> Vec<Incoming> {
    let Ok(entries) = std::fs::read_dir(incoming_dir(board, config)) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| is_plain_id(name))
        .collect();
    ids.sort();
    ids.iter()
        .filter_map(|id| load(board, config, id).ok())
        .map(|(approval, progress)| describe(&approval.manifest, &progress, false))
        .collect()
}

/// Drops the push of `id`; whether there was one.
pub fn cancel(board: &Board, config: &Config, id: &str) -> Result<bool, PushError> {
    let _lock = lock(board, config)?;
    let dir = incoming_dir(board, config).join(id);
    if !is_plain_id(id) || !dir.is_dir() {
        return Ok(false);
    }
    std::fs::remove_dir_all(&dir).map_err(|e| io(format!("removing {}", dir.display()), e))?;
    Ok(true)
}
