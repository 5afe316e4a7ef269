//! Installing a model into the data directory so that a crash or power cut at any point leaves
//! the old model or the new one, never a mix, and a failure leaves nothing new behind.
//!
//! ```text
//! DATA/models/<id>/current            one line: the version directory in use (switched atomically)
//! DATA/models/<id>/<version>/<file>   the verified weights
//!                           <draft file>   the model's draft head, when it has one
//!                           manifest.toml (+ manifest.toml.sig)   the approved manifest, verbatim
//!                           installed.toml                        size, inode, mtime, last full check
//! ```
//! A new version is built in a staging directory, verified there, renamed into place, and only
//! then does `current` switch to it; older versions are removed afterwards.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use durable::Links;

use crate::hash::{sha256, to_hex, write_synced};
use crate::manifest::{MAX_MANIFEST_BYTES, read_limited};
use crate::sign::{Signed, Trust};
use crate::verify::{Mapped, verify_draft, verify_file};
use crate::{Error, ErrorKind, Manifest, patch};

/// Where a box keeps installed models unless configured otherwise (`[model] data_dir`): the
/// supervisor's default and the engine's for `--installed`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/appliance";

/// File naming the version directory in use.
pub const CURRENT: &str = "current";
/// The approved manifest inside a version directory.
pub const MANIFEST: &str = "manifest.toml";
/// Its signature, when signed.
pub const SIGNATURE: &str = "manifest.toml.sig";
/// The install record inside a version directory.
pub const RECORD: &str = "installed.toml";

/// Most a signature file can hold (an ed25519 signature is 88 characters of base64).
const MAX_SIGNATURE_BYTES: u64 = 4096;
/// Most an install record can hold (a few numbers and one hash).
const MAX_RECORD_BYTES: u64 = 4096;
/// Most `current` can hold (one version directory name).
const MAX_CURRENT_BYTES: u64 = 4096;

/// A manifest together with its exact text and signature, checked against the box's trust.
#[derive(Debug, Clone)]
pub struct Approval {
    /// The parsed manifest.
    pub manifest: Manifest,
    /// Its exact text (what the signature covers).
    pub text: String,
    /// The signature file's text, if signed.
    pub signature: Option<String>,
    /// How the signature checked out.
    pub signed: Signed,
}

impl Approval {
    /// Reads `path` and `path.sig`, checks the signature against `trust`, then parses.
    pub fn load(path: &Path, trust: &Trust) -> Result<Approval, Error> {
        Approval::load_with(path, trust, Links::Follow)
    }

    /// [`Approval::load`] for the copy in a version directory, which the install wrote itself,
    /// so a symbolic link there was put by someone else and is refused.
    fn load_installed(path: &Path, trust: &Trust) -> Result<Approval, Error> {
        Approval::load_with(path, trust, Links::Refuse)
    }

    fn load_with(path: &Path, trust: &Trust, links: Links) -> Result<Approval, Error> {
        let text = read_limited(path, MAX_MANIFEST_BYTES, "manifest", links)?;
        let sig_path = sig_path(path);
        let signature = if fs::symlink_metadata(&sig_path).is_ok() {
            Some(read_limited(
                &sig_path,
                MAX_SIGNATURE_BYTES,
                "signature",
                links,
            )?)
        } else {
            None
        };
        let signed = trust
            .check(text.as_bytes(), signature.as_deref())
            .map_err(|mut e| {
                e.message = format!("{}: {}", path.display(), e.message);
                e
            })?;
        let manifest = Manifest::parse(&text, &path.display().to_string())?;
        Ok(Approval {
            manifest,
            text,
            signature,
            signed,
        })
    }
}

/// `<manifest>.sig`.
pub fn sig_path(manifest: &Path) -> PathBuf {
    let mut name = manifest.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}

/// What an install leaves for the boot-time check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Size of the installed file.
    pub size: u64,
    /// SHA-256 of the installed file.
    pub sha256: String,
    /// Its inode.
    pub inode: u64,
    /// Its modification time, seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// Its status-change time, seconds and nanoseconds (unlike mtime, no one can set it back).
    pub ctime: (i64, i64),
    /// When it was installed (Unix seconds).
    pub installed_at: u64,
    /// When every chunk was last verified (Unix seconds).
    pub last_full_verify: u64,
}

impl Record {
    /// A record of `path` as it is now, for the file of `manifest`.
    pub fn of(
        path: &Path,
        manifest: &Manifest,
        installed_at: u64,
        verified_at: u64,
    ) -> Result<Record, Error> {
        let meta =
            fs::metadata(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Ok(Record {
            size: meta.len(),
            sha256: manifest.sha256.clone(),
            inode: meta.ino(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            installed_at,
            last_full_verify: verified_at,
        })
    }

    /// Whether the file is still the one recorded for `manifest`: same size, hash, inode,
    /// modification and status-change times.
    pub fn still_describes(&self, meta: &fs::Metadata, manifest: &Manifest) -> bool {
        self.size == manifest.size
            && self.sha256 == manifest.sha256
            && self.size == meta.len()
            && self.inode == meta.ino()
            && self.mtime == (meta.mtime(), meta.mtime_nsec())
            && self.ctime == (meta.ctime(), meta.ctime_nsec())
    }

    /// Reads a record file.
    pub fn read(path: &Path) -> Result<Record, Error> {
        let text = read_limited(path, MAX_RECORD_BYTES, "install record", Links::Refuse)?;
        toml::from_str(&text)
            .map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", path.display())))
    }

    /// Writes the record atomically.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let text = toml::to_string(self)
            .map_err(|e| Error::new(ErrorKind::Io, format!("install record: {e}")))?;
        durable::replace(path, text.as_bytes())
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }
}

/// Directory of one model id.
pub fn model_dir(data_dir: &Path, id: &str) -> PathBuf {
    data_dir.join("models").join(id)
}

/// The version directory `current` names, if any.
pub fn current_version(model_dir: &Path) -> Result<Option<String>, Error> {
    let path = model_dir.join(CURRENT);
    let bytes = match durable::read_bounded(&path, MAX_CURRENT_BYTES, Links::Refuse) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{e} (it should name one version directory; reinstall the model to rewrite it)"
                ),
            ));
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    let version = text.trim().to_string();
    let valid = !version.is_empty()
        && !version.starts_with('.')
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if valid {
        Ok(Some(version))
    } else {
        Err(Error::new(
            ErrorKind::Io,
            format!("{} is corrupt: {text:?}", path.display()),
        ))
    }
}

/// The version directory `current` names for model `id` in `data_dir`: its weights, approved
/// manifest and install record. `NotInstalled`, saying how to install, when nothing is.
pub fn current_dir(data_dir: &Path, id: &str) -> Result<PathBuf, Error> {
    let dir = model_dir(data_dir, id);
    let version = current_version(&dir)?.ok_or_else(|| {
        Error::new(
            ErrorKind::NotInstalled,
            format!(
                "model {id} is not installed in {} (no {}); install it with \
                 `supervisor weights fetch-default` (the default model) or \
                 `supervisor weights install FILE --manifest M`",
                data_dir.display(),
                dir.join(CURRENT).display()
            ),
        )
    })?;
    Ok(dir.join(version))
}

/// The installed model `id`: its approved manifest, signature checked against `trust`, and the
/// path of its weights (not verified here: that is [`crate::gate::check`]'s or the caller's job).
pub fn installed(data_dir: &Path, id: &str, trust: &Trust) -> Result<(Approval, PathBuf), Error> {
    let vdir = current_dir(data_dir, id)?;
    let manifest_path = vdir.join(MANIFEST);
    let approval = Approval::load_installed(&manifest_path, trust)?;
    if approval.manifest.id != id {
        return Err(Error::new(
            ErrorKind::Mismatch,
            format!(
                "{} is for model {}, not {id}",
                manifest_path.display(),
                approval.manifest.id
            ),
        ));
    }
    let path = vdir.join(&approval.manifest.file);
    Ok((approval, path))
}

/// The ids of the models installed in `data_dir` (those with a `current`, even a corrupt one,
/// so that its error is reported when it is used), sorted.
pub fn installed_ids(data_dir: &Path) -> Result<Vec<String>, Error> {
    let models = data_dir.join("models");
    let entries = match fs::read_dir(&models) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {}", models.display()), e)),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", models.display()), e))?;
        let Ok(id) = entry.file_name().into_string() else {
            continue;
        };
        if !matches!(current_version(&entry.path()), Ok(None)) {
            ids.push(id);
        }
    }
    ids.sort();
    Ok(ids)
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The result of an install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Path of the installed weights.
    pub path: PathBuf,
    /// Whether the same file was already installed and verified (nothing was written).
    pub already_installed: bool,
}

/// Installs `src` as the model `approval` describes: `src` is either the published source (the
/// manifest's patches are applied) or already the approved file.
pub fn install(src: &Path, approval: &Approval, data_dir: &Path) -> Result<Installed, Error> {
    install_model(src, None, approval, data_dir)
}

/// [`install`] for a model with a draft head: `draft` is the head's file, installed beside
/// the weights as published; the model's files go into place together or not at all.
pub fn install_model(
    src: &Path,
    draft: Option<&Path>,
    approval: &Approval,
    data_dir: &Path,
) -> Result<Installed, Error> {
    let manifest = &approval.manifest;
    let input = Mapped::open(src)?;
    // The input is checked first, so a bad file is reported even when the model is installed.
    let form = classify(src, input.bytes(), manifest)?;
    let head = match (draft, &manifest.draft) {
        (Some(path), Some(_)) => {
            verify_draft(path, manifest)?;
            Some(Mapped::open(path)?)
        }
        (None, None) => None,
        (None, Some(d)) => {
            return Err(Error::new(
                ErrorKind::BadManifest,
                format!(
                    "model {} has a draft head ({}, {} bytes): give its file too (--draft FILE)",
                    manifest.id, d.file, d.size
                ),
            ));
        }
        (Some(path), None) => {
            return Err(Error::new(
                ErrorKind::BadManifest,
                format!(
                    "manifest {} names no draft head, so {} cannot be installed with it",
                    manifest.id,
                    path.display()
                ),
            ));
        }
    };
    let dir = model_dir(data_dir, &manifest.id);
    create_dirs_durably(&dir)?;
    let _lock = lock(&dir)?;
    if let Some(path) = already_installed(&dir, approval) {
        return Ok(Installed {
            path,
            already_installed: true,
        });
    }
    // What a crash or power cut left behind (a staging directory, a superseded version) goes
    // before anything new takes space.
    match current_version(&dir)? {
        Some(current) => remove_other_versions(&dir, &current),
        None => remove_other_versions(&dir, ""),
    }
    let version = format!("{}-{}", &manifest.sha256[..16], unique_suffix());
    let staging = dir.join(format!(".staging-{version}"));
    fs::create_dir(&staging)
        .map_err(|e| Error::io(format!("creating {}", staging.display()), e))?;
    let head_bytes = head.as_ref().map(Mapped::bytes);
    let result = build(input.bytes(), form, head_bytes, approval, &staging)
        .and_then(|()| place(&dir, &staging, &version, &manifest.file));
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result.map(|path| Installed {
        path,
        already_installed: false,
    })
}

/// Moves the filled, synced directory `built` into `dir` as `version` and switches `current`
/// to it, then removes every other version; the path of `file` in it.
fn place(dir: &Path, built: &Path, version: &str, file: &str) -> Result<PathBuf, Error> {
    let target = dir.join(version);
    fs::rename(built, &target)
        .map_err(|e| Error::io(format!("moving {} into place", target.display()), e))?;
    durable::sync_dir(dir).map_err(|e| Error::io(format!("syncing {}", dir.display()), e))?;
    // The switch: before it the old version is in use, after it the new one.
    durable::replace(&dir.join(CURRENT), format!("{version}\n").as_bytes()).map_err(|e| {
        Error::io(
            format!("switching {} to {version}", dir.join(CURRENT).display()),
            e,
        )
    })?;
    remove_other_versions(dir, version);
    Ok(target.join(file))
}

/// Installs a model whose files were received into `received` (a directory on the data
/// partition's filesystem holding the weights and the draft head under their manifest names,
/// nothing else): each is verified in full, the manifest, signature and record are written
/// beside them, and the directory itself becomes the new version (no copy: a pushed model
/// needs its space once). On an error `received` is left as it was.
pub fn adopt(received: &Path, approval: &Approval, data_dir: &Path) -> Result<Installed, Error> {
    let manifest = &approval.manifest;
    let weights = received.join(&manifest.file);
    verify_file(&weights, manifest)?;
    if let Some(draft) = &manifest.draft {
        verify_draft(&received.join(&draft.file), manifest)?;
    }
    let write = |name: &str, text: &str| {
        durable::replace(&received.join(name), text.as_bytes())
            .map_err(|e| Error::io(format!("writing {name}"), e))
    };
    write(MANIFEST, &approval.text)?;
    if let Some(sig) = &approval.signature {
        write(SIGNATURE, sig)?;
    }
    let now = now_unix();
    Record::of(&weights, manifest, now, now)?.write(&received.join(RECORD))?;
    durable::sync_dir(received)
        .map_err(|e| Error::io(format!("syncing {}", received.display()), e))?;
    let dir = model_dir(data_dir, &manifest.id);
    create_dirs_durably(&dir)?;
    let _lock = lock(&dir)?;
    let version = format!("{}-{}", &manifest.sha256[..16], unique_suffix());
    place(&dir, received, &version, &manifest.file).map(|path| Installed {
        path,
        already_installed: false,
    })
}

/// Removes the installed model `id` from `data_dir`: its directory is first renamed out of
/// the models' listing (one atomic step: the model is there or gone), then deleted. Whether
/// the model may go (it is not the one running) is the caller's decision.
pub fn remove(data_dir: &Path, id: &str) -> Result<(), Error> {
    let dir = model_dir(data_dir, id);
    if current_version(&dir)?.is_none() {
        return Err(Error::new(
            ErrorKind::NotInstalled,
            format!("model {id} is not installed in {}", data_dir.display()),
        ));
    }
    let _lock = lock(&dir)?;
    let trash = data_dir.join(format!(".removing-{id}-{}", unique_suffix()));
    fs::rename(&dir, &trash).map_err(|e| Error::io(format!("removing {}", dir.display()), e))?;
    let models = data_dir.join("models");
    durable::sync_dir(&models)
        .map_err(|e| Error::io(format!("syncing {}", models.display()), e))?;
    fs::remove_dir_all(&trash).map_err(|e| Error::io(format!("deleting {}", trash.display()), e))
}

/// Creates `dir` and its parents, syncing each parent so the new entries survive a power cut.
fn create_dirs_durably(dir: &Path) -> Result<(), Error> {
    let mut missing = Vec::new();
    let mut probe = Some(dir);
    while let Some(p) = probe {
        if p.is_dir() {
            break;
        }
        missing.push(p);
        probe = p.parent();
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    for created in missing {
        if let Some(parent) = created.parent() {
            durable::sync_dir(parent)
                .map_err(|e| Error::io(format!("syncing {}", parent.display()), e))?;
        }
    }
    Ok(())
}

/// One install at a time per model: an exclusive lock on `DIR/.lock`, held until dropped.
fn lock(dir: &Path) -> Result<nix::fcntl::Flock<fs::File>, Error> {
    let path = dir.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(
        |(_, errno)| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "another install of this model is running ({}: {errno})",
                    path.display()
                ),
            )
        },
    )
}

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}{:x}", std::process::id())
}

/// The installed file, if `current` already holds exactly this manifest's file, intact.
fn already_installed(dir: &Path, approval: &Approval) -> Option<PathBuf> {
    let version = current_version(dir).ok()??;
    let vdir = dir.join(version);
    let installed_text = read_limited(
        &vdir.join(MANIFEST),
        MAX_MANIFEST_BYTES,
        "manifest",
        Links::Refuse,
    )
    .ok()?;
    let installed_sig = read_limited(
        &vdir.join(SIGNATURE),
        MAX_SIGNATURE_BYTES,
        "signature",
        Links::Refuse,
    )
    .ok();
    // A manifest signed since it was installed is installed again, with its signature.
    if installed_text != approval.text || installed_sig != approval.signature {
        return None;
    }
    let path = vdir.join(&approval.manifest.file);
    verify_file(&path, &approval.manifest).ok()?;
    if let Some(draft) = &approval.manifest.draft {
        verify_draft(&vdir.join(&draft.file), &approval.manifest).ok()?;
    }
    Some(path)
}

/// What an install input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// The published source: the patches apply.
    Source,
    /// Already the approved file.
    Approved,
}

/// Which form `bytes` are in, or why the manifest accepts neither.
fn classify(src: &Path, bytes: &[u8], manifest: &Manifest) -> Result<Form, Error> {
    let len = bytes.len() as u64;
    let is_source = manifest
        .source
        .as_ref()
        .filter(|s| s.size == len && !manifest.patches.is_empty());
    let is_approved = len == manifest.size;
    if is_source.is_some() || is_approved {
        let src_sha = to_hex(&sha256(bytes));
        if is_source.is_some_and(|s| s.sha256 == src_sha) {
            return Ok(Form::Source);
        }
        if is_approved && src_sha == manifest.sha256 {
            return Ok(Form::Approved);
        }
        return Err(mismatch(src, len, &src_sha, manifest));
    }
    Err(mismatch(
        src,
        len,
        "not computed: the size already differs",
        manifest,
    ))
}

fn mismatch(src: &Path, len: u64, src_sha: &str, manifest: &Manifest) -> Error {
    let source = manifest
        .source
        .as_ref()
        .map(|s| format!("the published source ({} bytes, {})", s.size, s.sha256))
        .unwrap_or_else(|| "no published source".into());
    Error::new(
        ErrorKind::Mismatch,
        format!(
            "{} ({len} bytes, sha256 {src_sha}) is not a file manifest {} accepts: it names {source} and the installed file ({} bytes, {}); \
             a truncated or corrupted download, or the wrong file?",
            src.display(),
            manifest.id,
            manifest.size,
            manifest.sha256
        ),
    )
}

/// Fills the staging directory: weights (patched), draft head, manifest, signature, record;
/// all synced.
fn build(
    bytes: &[u8],
    form: Form,
    head: Option<&[u8]>,
    approval: &Approval,
    staging: &Path,
) -> Result<(), Error> {
    let manifest = &approval.manifest;
    let target = staging.join(&manifest.file);
    let output_sha = match form {
        Form::Approved => copy_into(bytes, &target)?,
        Form::Source => apply_patches(bytes, manifest, staging, &target)?,
    };
    if output_sha != manifest.sha256 {
        return Err(Error::new(
            ErrorKind::Mismatch,
            format!(
                "the installed file hashes to {output_sha}, not the manifest's {}",
                manifest.sha256
            ),
        ));
    }
    verify_file(&target, manifest)?;
    if let (Some(head), Some(draft)) = (head, &manifest.draft) {
        let path = staging.join(&draft.file);
        copy_into(head, &path)?;
        verify_draft(&path, manifest)?;
    }
    let write = |name: &str, text: &str| {
        durable::replace(&staging.join(name), text.as_bytes())
            .map_err(|e| Error::io(format!("writing {name}"), e))
    };
    write(MANIFEST, &approval.text)?;
    if let Some(sig) = &approval.signature {
        write(SIGNATURE, sig)?;
    }
    let now = now_unix();
    Record::of(&target, manifest, now, now)?.write(&staging.join(RECORD))?;
    durable::sync_dir(staging).map_err(|e| Error::io(format!("syncing {}", staging.display()), e))
}

/// Writes `bytes` to a new file, synced; returns its SHA-256.
fn copy_into(bytes: &[u8], path: &Path) -> Result<String, Error> {
    let (sha, _) = write_synced(path, |out| {
        for piece in bytes.chunks(1 << 20) {
            out.write_all(piece)
                .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        }
        Ok(())
    })?;
    Ok(sha)
}

/// Applies the patches in order, checking each output's hash before the next step reads it.
fn apply_patches(
    source: &[u8],
    manifest: &Manifest,
    staging: &Path,
    target: &Path,
) -> Result<String, Error> {
    let mut held: Option<(Mapped, PathBuf)> = None;
    let mut last_sha = String::new();
    for (i, step) in manifest.patches.iter().enumerate() {
        let input = held.as_ref().map_or(source, |(m, _)| m.bytes());
        let last = i + 1 == manifest.patches.len();
        let out_path = if last {
            target.to_path_buf()
        } else {
            staging.join(format!(".patch-{i}"))
        };
        let sha = write_synced(&out_path, |out| patch::apply(input, step, out))
            .map(|(sha, _)| sha)
            .map_err(|mut e| {
                e.message = format!("patch {i} ({}): {}", kind_name(step), e.message);
                e
            })?;
        if sha != step.output_sha256() {
            return Err(Error::new(
                ErrorKind::Patch,
                format!(
                    "patch {i} ({}) produced {sha}, not the {} it promises; the manifest does not fit these bytes",
                    kind_name(step),
                    step.output_sha256()
                ),
            ));
        }
        if let Some((_, previous)) = held.take() {
            let _ = fs::remove_file(previous);
        }
        if !last {
            held = Some((Mapped::open(&out_path)?, out_path));
        }
        last_sha = sha;
    }
    Ok(last_sha)
}

fn kind_name(patch: &crate::Patch) -> &'static str {
    match patch {
        crate::Patch::GgufMetadata { .. } => "gguf-metadata",
        crate::Patch::Bytes { .. } => "bytes",
    }
}

/// Removes every version directory but `keep` (and stale staging directories).
fn remove_other_versions(dir: &Path, keep: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name != keep && name != CURRENT && entry.path().is_dir() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
