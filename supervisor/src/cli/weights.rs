//! `supervisor weights …`: the operator's and the box's commands for model weights.
//!
//! Exit status: 0 success; 1 the file or signature does not check out, or installing failed;
//! 2 bad input (a malformed manifest, key or argument).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;
use weights::install::{Approval, install, install_model, sig_path};
use weights::manifest::{DEFAULT_CHUNK, Template};
use weights::sign::Trust;
use weights::verify::{Mapped, verify_file};
use weights::{Error, ErrorKind, Manifest};

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
    let result =
        Approval::load(manifest, trust).and_then(|a| verify_file(file, &a.manifest).map(|()| a));
    report_verified(Some(file), result, as_json)
}

/// `weights verify --installed [--data DIR] [--json]`: model `id` as installed in `data_dir`,
/// against the manifest installed with it, every chunk (read only: unlike the launch gate it
/// does not refresh the install record).
pub fn verify_installed(data_dir: &Path, id: &str, trust: &Trust, as_json: bool) -> ExitCode {
    let (file, result) = match weights::install::installed(data_dir, id, trust) {
        Ok((a, path)) => {
            let result = verify_file(&path, &a.manifest).map(|()| a);
            (Some(path), result)
        }
        Err(e) => (None, Err(e)),
    };
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
    report_installed(
        Approval::load(manifest, trust)
            .and_then(|a| install_model(src, draft, &a, data_dir).map(|i| (a, i))),
    )
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
    let mut spec = match template {
        None => Template::default(),
        Some(path) => match Manifest::read_text(path).and_then(|text| {
            toml::from_str::<Template>(&text).map_err(|e| Error {
                kind: ErrorKind::BadManifest,
                message: format!("{}: {}", path.display(), e.to_string().trim_end()),
                bad_chunk: None,
            })
        }) {
            Ok(t) => t,
            Err(e) => return fail(&e),
        },
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
    let result = Mapped::open(file)
        .and_then(|m| match draft {
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
        .and_then(|m| m.to_toml());
    match result {
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
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (secret, public) = match weights::sign::keygen() {
        Ok(pair) => pair,
        Err(e) => return fail(&e),
    };
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .and_then(|mut f| {
            f.write_all(secret.as_bytes())?;
            f.sync_all()
        });
    if let Err(e) = created {
        eprintln!(
            "error: cannot create {}: {e} (an existing key is never overwritten)",
            out.display()
        );
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let pub_path = PathBuf::from(format!("{}.pub", out.display()));
    if let Err(e) = durable::replace(&pub_path, format!("{public}\n").as_bytes()) {
        eprintln!("error: cannot write {}: {e}", pub_path.display());
        return ExitCode::from(EXIT_FAILED);
    }
    println!("{public}");
    eprintln!(
        "secret key: {} (keep it off the box); public key: {}",
        out.display(),
        pub_path.display()
    );
    ExitCode::SUCCESS
}

/// `weights sign M --key KEY`: writes `M.sig`.
pub fn sign(manifest: &Path, key: &Path) -> ExitCode {
    let text = match Manifest::read_text(manifest)
        .and_then(|t| Manifest::parse(&t, &manifest.display().to_string()).map(|_| t))
    {
        Ok(t) => t,
        Err(e) => return fail(&e),
    };
    let secret = match std::fs::read_to_string(key) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot read key {}: {e}", key.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let signature = match weights::sign::sign(text.as_bytes(), &secret) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}: {e}", key.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let out = sig_path(manifest);
    if let Err(e) = durable::replace(&out, signature.as_bytes()) {
        eprintln!("error: cannot write {}: {e}", out.display());
        return ExitCode::from(EXIT_FAILED);
    }
    println!("signed: {}", out.display());
    ExitCode::SUCCESS
}

/// `weights fetch-default` / `weights fetch --manifest M`: fetch the published source into the
/// cache with pip, then install it through the manifest.
pub fn fetch(approval: Result<Approval, Error>, cache: &Path, data_dir: &Path) -> ExitCode {
    let result = approval.and_then(|a| {
        let source = weights::fetch::source(&a.manifest, cache)?;
        install(&source, &a, data_dir).map(|i| (a, i))
    });
    report_installed(result)
}

/// Brings the manifest's published source into `cache` (checked against its size and SHA-256)
/// and prints its path; installs nothing (benchmarks and tests read it from there).
pub fn source_path(manifest: &Path, cache: &Path) -> ExitCode {
    let result = Manifest::read_text(manifest)
        .and_then(|text| Manifest::parse(&text, &manifest.display().to_string()))
        .and_then(|m| weights::fetch::source(&m, cache));
    match result {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// The default cache: `$XDG_CACHE_HOME/appliance` or `~/.cache/appliance`.
pub fn default_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("appliance")
}
