//! Making and signing manifests, on the machine that has the model's files: what
//! `supervisor weights manifest|sign` and `appliance model manifest|sign` run.

use std::path::{Path, PathBuf};

use crate::install::sig_path;
use crate::manifest::{DEFAULT_CHUNK, Template};
use crate::verify::Mapped;
use crate::{Error, ErrorKind, Manifest};

/// The manifest for FILE (and its draft head), hashes computed in parallel, from a template
/// with name, engine settings, pip source and patches.
pub fn manifest(
    file: &Path,
    draft: Option<&Path>,
    id: Option<String>,
    chunk_size: Option<u64>,
    template: Option<&Path>,
) -> Result<Manifest, Error> {
    let mut spec = match template {
        None => Template::default(),
        Some(path) => Manifest::read_text(path).and_then(|text| {
            toml::from_str::<Template>(&text).map_err(|e| Error {
                kind: ErrorKind::BadManifest,
                message: format!("{}: {}", path.display(), e.to_string().trim_end()),
                bad_chunk: None,
            })
        })?,
    };
    if id.is_some() {
        spec.id = id;
    }
    let name_of = |path: &Path| {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let chunk = chunk_size.unwrap_or(DEFAULT_CHUNK);
    Mapped::open(file).and_then(|m| match draft {
        Some(head) => {
            let head_bytes = Mapped::open(head)?;
            spec.build_with_draft(
                m.bytes(),
                &name_of(file),
                chunk,
                Some((head_bytes.bytes(), &name_of(head))),
            )
        }
        None => spec.build(m.bytes(), &name_of(file), chunk),
    })
}

/// Why a manifest was not signed.
#[derive(Debug)]
pub enum SignError {
    /// The manifest is unreadable or malformed.
    Manifest(Error),
    /// The key file could not be read.
    ReadKey(std::io::Error),
    /// The key file's contents are not a secret key.
    Key(Error),
    /// The signature could not be written to this path.
    Write(PathBuf, std::io::Error),
}

impl std::fmt::Display for SignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignError::Manifest(e) | SignError::Key(e) => write!(f, "{e}"),
            SignError::ReadKey(e) => write!(f, "reading the key: {e}"),
            SignError::Write(path, e) => write!(f, "writing {}: {e}", path.display()),
        }
    }
}

/// The manifest at `manifest` signed with the secret key file `key`: `M.sig` written, its path.
pub fn sign(manifest: &Path, key: &Path) -> Result<PathBuf, SignError> {
    let text = Manifest::read_text(manifest)
        .and_then(|t| Manifest::parse(&t, &manifest.display().to_string()).map(|_| t))
        .map_err(SignError::Manifest)?;
    let secret = std::fs::read_to_string(key).map_err(SignError::ReadKey)?;
    let signature = crate::sign::sign(text.as_bytes(), &secret).map_err(SignError::Key)?;
    let out = sig_path(manifest);
    if let Err(e) = durable::replace(&out, signature.as_bytes()) {
        return Err(SignError::Write(out, e));
    }
    Ok(out)
}
