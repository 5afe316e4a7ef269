//! The engine process: spawned without a shell, tied to the supervisor's life, its output
//! captured line by line, stopped with SIGTERM and then SIGKILL.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use super::launch::Launch;
use super::logs::LogRing;

/// A running engine process.
pub struct Running {
    child: Child,
    /// Its process id.
    pub pid: u32,
}

/// Starts `launch`. The child gets SIGTERM if the supervisor dies, even by SIGKILL, so no
/// engine outlives the supervisor that owns it.
pub fn spawn(launch: &Launch, logs: &Arc<LogRing>) -> Result<Running, String> {
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    tie_to_parent(&mut command);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", launch.program.display()))?;
    let pid = child
        .id()
        .ok_or_else(|| "the engine exited before its pid was read".to_string())?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(capture(out, Arc::clone(logs)));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(capture(err, Arc::clone(logs)));
    }
    Ok(Running { child, pid })
}

#[allow(unsafe_code)]
fn tie_to_parent(command: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes the
    // async-signal-safe calls prctl, getppid and kill.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            // The parent may have died between fork and prctl.
            if nix::unistd::getppid() != parent {
                let _ = kill(nix::unistd::getpid(), Signal::SIGKILL);
            }
            Ok(())
        });
    }
}

async fn capture(stream: impl AsyncRead + Unpin, logs: Arc<LogRing>) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "engine", "{line}");
        logs.push(&line);
    }
}

impl Running {
    /// Waits for the process to exit on its own.
    pub async fn exited(&mut self) -> String {
        describe(self.child.wait().await)
    }

    /// SIGTERM, then SIGKILL after `grace`; returns how it ended.
    pub async fn stop(mut self, grace: Duration) -> String {
        let pid = Pid::from_raw(i32::try_from(self.pid).unwrap_or(i32::MAX));
        if let Err(e) = kill(pid, Signal::SIGTERM) {
            tracing::warn!("cannot send SIGTERM to the engine ({}): {e}", self.pid);
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => describe(status),
            Err(_) => {
                tracing::warn!(
                    "the engine did not stop within {} s; killing it",
                    grace.as_secs()
                );
                let _ = self.child.start_kill();
                describe(self.child.wait().await)
            }
        }
    }
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(signal)) => format!("killed by signal {signal}"),
            _ => s.to_string(),
        },
        Err(e) => format!("cannot wait for the engine: {e}"),
    }
}
