//! `supervisor weights …`: the operator's and the box's commands for model weights.
//!
//! Exit status: 0 success; 1 the file or signature does not check out, or installing failed;
//! 2 bad input (a malformed manifest, key or argument).

use std::path::Path;
use std::process::ExitCode;

use serde_json::json;
use supervisor_core::weights_ops::{self as ops, KeygenError, SignError};
use weights::install::Approval;
use weights::sign::Trust;
use weights::{Error, ErrorKind};

use super::{EXIT_BAD_INPUT, EXIT_FAILED};

fn fail(e: &Error) -> ExitCode {
    eprintln!("error: {e}");
    exit_for(e)
}

fn exit_for(e: &Error) -> ExitCode {
    match e.kind {
        ErrorKind::BadManifest => ExitCode::from(EXIT_BAD_INPUT),
        _ => ExitCode::from(EXIT_FAILED),
    }
}

fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::BadManifest => "bad-manifest",
        ErrorKind::Mismatch => "mismatch",
        ErrorKind::Signature => "signature",
        ErrorKind::Patch => "patch",
        ErrorKind::Io => "io",
        ErrorKind::Fetch => "fetch",
        ErrorKind::NotInstalled => "not-installed",
    }
}

/// `weights verify FILE --manifest M [--json]`.
pub fn verify(file: &Path, manifest: &Path, trust: &Trust, as_json: bool) -> ExitCode {
    report_verified(Some(file), ops::verify(file, manifest, trust), as_json)
}

/// `weights verify --installed [--data DIR] [--json]`: model `id` as installed in `data_dir`,
/// against the manifest installed with it, every chunk (read only: unlike the launch gate it
/// does not refresh the install record).
pub fn verify_installed(data_dir: &Path, id: &str, trust: &Trust, as_json: bool) -> ExitCode {
    let (file, result) = ops::verify_installed(data_dir, id, trust);
    report_verified(file.as_deref(), result, as_json)
}

/// A verification's outcome as text or JSON (`file` is null when no file was found to check).
fn report_verified(
    file: Option<&Path>,
    result: Result<Approval, Error>,
    as_json: bool,
) -> ExitCode {
    if as_json {
        let body = match &result {
            Ok(a) => {
                json!({ "ok": true, "file": file, "manifest": a.manifest.id, "size": a.manifest.size, "sha256": a.manifest.sha256 })
            }
            Err(e) => json!({
                "ok": false,
                "file": file,
                "error": {
                    "kind": kind_name(e.kind),
                    "message": e.message,
                    "bad_chunk": e.bad_chunk.map(|(index, start, end)| json!({ "index": index, "start": start, "end": end })),
                }
            }),
        };
        println!("{body}");
        return result.map_or_else(|e| exit_for(&e), |_| ExitCode::SUCCESS);
    }
    match result {
        Ok(a) => {
            println!(
                "{}: matches manifest {} ({} bytes, sha256 {})",
                file.map_or_else(String::new, |f| f.display().to_string()),
                a.manifest.id,
                a.manifest.size,
                a.manifest.sha256
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// `weights install SRC [--draft HEAD] --manifest M [--data DIR]`.
pub fn install_file(
    src: &Path,
    draft: Option<&Path>,
    manifest: &Path,
    trust: &Trust,
    data_dir: &Path,
) -> ExitCode {
    report_installed(ops::install_file(src, draft, manifest, trust, data_dir))
}

fn report_installed(result: Result<(Approval, weights::install::Installed), Error>) -> ExitCode {
    match result {
        Ok((a, installed)) => {
            let how = if installed.already_installed {
                "already installed and verified"
            } else {
                "installed and verified"
            };
            println!("{} {how}: {}", a.manifest.id, installed.path.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// `weights manifest FILE [--draft HEAD] [--id ID] [--chunk-size BYTES] [--template T]`.
pub fn manifest(
    file: &Path,
    draft: Option<&Path>,
    id: Option<String>,
    chunk_size: Option<u64>,
    template: Option<&Path>,
) -> ExitCode {
    match ops::manifest(file, draft, id, chunk_size, template) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// `weights keygen [--out FILE]`: writes the secret key (mode 0600, never over an existing file)
/// and `FILE.pub`, and prints the public key for `trusted_keys`.
pub fn keygen(out: &Path) -> ExitCode {
    match ops::keygen(out) {
        Ok((public, pub_path)) => {
            println!("{public}");
            eprintln!(
                "secret key: {} (keep it off the box); public key: {}",
                out.display(),
                pub_path.display()
            );
            ExitCode::SUCCESS
        }
        Err(KeygenError::Keygen(e)) => fail(&e),
        Err(KeygenError::Create(e)) => {
            eprintln!(
                "error: cannot create {}: {e} (an existing key is never overwritten)",
                out.display()
            );
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(KeygenError::WritePublic(pub_path, e)) => {
            eprintln!("error: cannot write {}: {e}", pub_path.display());
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `weights sign M --key KEY`: writes `M.sig`.
pub fn sign(manifest: &Path, key: &Path) -> ExitCode {
    match ops::sign(manifest, key) {
        Ok(out) => {
            println!("signed: {}", out.display());
            ExitCode::SUCCESS
        }
        Err(SignError::Manifest(e)) => fail(&e),
        Err(SignError::ReadKey(e)) => {
            eprintln!("error: cannot read key {}: {e}", key.display());
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(SignError::Key(e)) => {
            eprintln!("error: {}: {e}", key.display());
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(SignError::Write(out, e)) => {
            eprintln!("error: cannot write {}: {e}", out.display());
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `weights fetch-default` / `weights fetch --manifest M`: fetch the published source into the
/// cache with pip, then install it through the manifest.
pub fn fetch(approval: Result<Approval, Error>, cache: &Path, data_dir: &Path) -> ExitCode {
    report_installed(ops::fetch(approval, cache, data_dir))
}

/// Brings the manifest's published source into `cache` (checked against its size and SHA-256)
/// and prints its path; installs nothing (benchmarks and tests read it from there).
pub fn source_path(manifest: &Path, cache: &Path) -> ExitCode {
    match ops::source_path(manifest, cache) {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
