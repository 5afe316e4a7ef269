//! What the workspace's tests share: the processes they start, and the tiny random models
//! ([`tiny`]) every architecture is tested on.
//!
//! A test that runs another crate's binary runs the one built from this checkout:
//! [`binary`] has cargo bring it up to date first (a no-op when it is), where a binary
//! found lying in `target/` may be from an older commit.
//!
//! A test owns every process it starts: [`Owned`] kills and reaps its child when dropped, so a
//! failed assertion (a panic) leaves no daemon behind. A wait for a started process to become
//! ready ([`Owned::wait_until`]) ends as soon as that process exits, and otherwise lasts as long
//! as the start does: its bound is only a last resort for a process hung far past any start,
//! not a guess at how fast a quiet machine is.

pub mod tiny;

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The binary `name` of workspace package `package`, built by cargo in the running test's
/// profile (`target/<profile>/`) when it is not up to date.
///
/// # Panics
/// When the build fails.
pub fn binary(package: &str, name: &str) -> PathBuf {
    binary_with_features(package, name, &[])
}

/// [`binary`] built with the package's `features` on (e.g. the supervisor's `sim`, for a test
/// that runs it on simulated boards).
///
/// # Panics
/// When the build fails.
pub fn binary_with_features(package: &str, name: &str, features: &[&str]) -> PathBuf {
    // One build at a time from this test process (tests run on parallel threads).
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let exe = std::env::current_exe().expect("the test executable");
    let profile_dir = exe.ancestors().nth(2).expect("target/<profile>");
    let mut build = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    build.args(["build", "--locked", "-p", package, "--bin", name]);
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("cargo");
    assert!(status.success(), "building {package}'s {name}");
    profile_dir.join(name)
}

/// A fresh self-signed RSA key and certificate made by `openssl` in `dir`
/// (`NAME.key.pem`, `NAME.cert.pem`, common name `name`): what signs update bundles.
///
/// # Panics
/// When `openssl` is missing or fails.
pub fn signing_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{name}.key.pem"));
    let cert = dir.join(format!("{name}.cert.pem"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args(["-days", "1", "-subj", &format!("/CN={name}")])
        .output()
        .unwrap_or_else(|e| panic!("openssl must be installed (scripts/test installs it): {e}"));
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (key, cert)
}

/// The bound of [`Owned::wait_until`]: a start that takes this long is hung, on any machine.
pub const HUNG: Duration = Duration::from_secs(600);

/// A started process, killed and reaped when dropped.
#[derive(Debug)]
pub struct Owned {
    child: Child,
    what: String,
}

impl Owned {
    /// Starts `command`; `what` names it in failures.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn spawn(command: &mut Command, what: &str) -> Owned {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Owned {
            child,
            what: what.to_string(),
        }
    }

    /// Polls `ready` until it holds.
    ///
    /// # Panics
    /// When the process exits first, or is still not ready after [`HUNG`].
    pub fn wait_until(&mut self, ready: impl FnMut() -> bool) {
        self.wait_until_for(HUNG, ready);
    }

    /// [`Owned::wait_until`] with a bound of its own (for a wait whose work is known to be
    /// short, where a long hang would only delay the failure).
    ///
    /// # Panics
    /// When the process exits first, or is still not ready after `bound`.
    pub fn wait_until_for(&mut self, bound: Duration, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + bound;
        loop {
            if ready() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited before it was ready: {status}", self.what);
            }
            assert!(
                Instant::now() < deadline,
                "{} was not ready after {} s",
                self.what,
                bound.as_secs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Deref for Owned {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.child
    }
}

impl DerefMut for Owned {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        // Already reaped by the test: nothing to kill, and the error says so.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_process_is_killed() {
        let owned = Owned::spawn(Command::new("sleep").arg("600"), "sleep");
        let pid = owned.id();
        drop(owned);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
        assert!(status.is_err(), "process {pid} outlived its owner");
    }

    #[test]
    fn a_process_killed_on_panic() {
        let pid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = std::sync::Arc::clone(&pid);
        let failed = std::thread::spawn(move || {
            let owned = Owned::spawn(Command::new("sleep").arg("600"), "sleep");
            seen.store(owned.id(), std::sync::atomic::Ordering::SeqCst);
            panic!("an assertion failed");
        })
        .join();
        assert!(failed.is_err());
        let pid = pid.load(std::sync::atomic::Ordering::SeqCst);
        assert!(std::fs::read_to_string(format!("/proc/{pid}/status")).is_err());
    }

    #[test]
    #[should_panic(expected = "exited before it was ready")]
    fn a_wait_ends_when_the_process_does() {
        let mut owned = Owned::spawn(&mut Command::new("true"), "true");
        owned.wait_until(|| false);
    }
}
