//! The work of the `weights` commands, as typed results: verify a file or the installed model,
//! install, make and sign manifests, make keys, fetch published sources. The binary's
//! `cli/weights.rs` prints them and picks the exit status.

use std::path::{Path, PathBuf};

use weights::install::{Approval, Installed, install, install_model};
use weights::sign::Trust;
use weights::verify::verify_file;
use weights::{Error, Manifest};

/// FILE checked against the manifest at `manifest`, its signature by `trust`.
pub fn verify(file: &Path, manifest: &Path, trust: &Trust) -> Result<Approval, Error> {
    Approval::load(manifest, trust).and_then(|a| verify_file(file, &a.manifest).map(|()| a))
}

/// Model `id` as installed in `data_dir`, against the manifest installed with it, every chunk
/// (read only: unlike the launch gate it does not refresh the install record); the file checked,
/// or `None` when none was found to check.
pub fn verify_installed(
    data_dir: &Path,
    id: &str,
    trust: &Trust,
) -> (Option<PathBuf>, Result<Approval, Error>) {
    match weights::install::installed(data_dir, id, trust) {
        Ok((a, path)) => {
            let result = verify_file(&path, &a.manifest).map(|()| a);
            (Some(path), result)
        }
        Err(e) => (None, Err(e)),
    }
}

/// SRC (and its draft head) patched, verified and installed into `data_dir` through the
/// manifest at `manifest`.
pub fn install_file(
    src: &Path,
    draft: Option<&Path>,
    manifest: &Path,
    trust: &Trust,
    data_dir: &Path,
) -> Result<(Approval, Installed), Error> {
    Approval::load(manifest, trust)
        .and_then(|a| install_model(src, draft, &a, data_dir).map(|i| (a, i)))
}

/// A manifest's text for FILE (and its draft head): [`weights::author::manifest`].
pub fn manifest(
    file: &Path,
    draft: Option<&Path>,
    id: Option<String>,
    chunk_size: Option<u64>,
    template: Option<&Path>,
) -> Result<String, Error> {
    weights::author::manifest(file, draft, id, chunk_size, template).and_then(|m| m.to_toml())
}

/// Why a key pair was not made.
#[derive(Debug)]
pub enum KeygenError {
    /// No key could be generated.
    Keygen(Error),
    /// The secret key file could not be created (an existing one is never overwritten).
    Create(std::io::Error),
    /// The public key file could not be written.
    WritePublic(PathBuf, std::io::Error),
}

/// A key pair: the secret key written to `out` (mode 0600, never over an existing file) and the
/// public key to `out.pub`; the public key and that path.
pub fn keygen(out: &Path) -> Result<(String, PathBuf), KeygenError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (secret, public) = weights::sign::keygen().map_err(KeygenError::Keygen)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .and_then(|mut f| {
            f.write_all(secret.as_bytes())?;
            f.sync_all()
        })
        .map_err(KeygenError::Create)?;
    let pub_path = PathBuf::from(format!("{}.pub", out.display()));
    if let Err(e) = durable::replace(&pub_path, format!("{public}\n").as_bytes()) {
        return Err(KeygenError::WritePublic(pub_path, e));
    }
    Ok((public, pub_path))
}

pub use weights::author::{SignError, sign};

/// The published source fetched into the cache with pip, then installed through the manifest.
pub fn fetch(
    approval: Result<Approval, Error>,
    cache: &Path,
    data_dir: &Path,
) -> Result<(Approval, Installed), Error> {
    approval.and_then(|a| {
        let source = weights::fetch::source(&a.manifest, cache)?;
        install(&source, &a, data_dir).map(|i| (a, i))
    })
}

/// The manifest's published source brought into `cache` (checked against its size and
/// SHA-256), its path; installs nothing (benchmarks and tests read it from there).
pub fn source_path(manifest: &Path, cache: &Path) -> Result<PathBuf, Error> {
    Manifest::read_text(manifest)
        .and_then(|text| Manifest::parse(&text, &manifest.display().to_string()))
        .and_then(|m| weights::fetch::source(&m, cache))
}

/// The default cache: `$XDG_CACHE_HOME/appliance` or `~/.cache/appliance`.
pub fn default_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("appliance")
}
