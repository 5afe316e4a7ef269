//! Every engine process starts here: the supervised `engine serve` and the overclock check's
//! one-shot `engine generate` alike are spawned without a shell, tied to the supervisor's life
//! and moved into the engine's cgroup slice before they are handed back. The server's output is
//! captured line by line; it is stopped with SIGTERM and then SIGKILL.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Child;

use super::control::{self, ControlKey};
use super::launch::Launch;
use super::logs::LogRing;
use crate::board::{Board, paths};
use crate::config::Config;

/// A running engine process.
pub struct Running {
    child: Child,
    /// Its process id.
    pub pid: u32,
}

/// The command every engine process is started from: arguments as a vector, nothing on stdin,
/// output piped to the supervisor, and SIGKILL when the supervisor dies, even by SIGKILL. A
/// server gets its control key in the environment, where other users cannot read it.
fn command(
    program: &Path,
    args: &[OsString],
    environment: &[(String, String)],
    control_key: Option<&ControlKey>,
) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    command.envs(environment.iter().map(|(k, v)| (k, v)));
    if let Some(key) = control_key {
        command.env(control::ENV, key.as_str());
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tie_to_parent(&mut command);
    command
}

#[allow(unsafe_code)]
fn tie_to_parent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes the
    // async-signal-safe calls prctl, getppid and kill.
    unsafe {
        command.pre_exec(move || {
            // SIGKILL: a stopped engine, or one that ignores SIGTERM, must not outlive a
            // supervisor that crashed.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died between fork and prctl.
            if nix::unistd::getppid() != parent {
                let _ = kill(nix::unistd::getpid(), Signal::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Moves `pid` into the engine's slice, where its CPU weight and memory limits hold.
fn place_in_cgroup(board: &Board, config: &Config, pid: u32) -> Result<(), String> {
    let slice = config.tuning.engine.slice.cgroup_path();
    let procs = format!("{}/{slice}/cgroup.procs", paths::CGROUP_ROOT);
    board
        .write_attribute(&procs, &pid.to_string())
        .map_err(|e| format!("not started: cannot put it in its cgroup: {e}"))
}

/// Starts `launch` in the engine's slice.
///
/// Call it from the runtime's own thread, never from a `spawn_blocking` one: the kernel sends
/// the parent-death signal when the *thread* that forked the child ends, and an idle blocking
/// thread ends after a few seconds, which would take a healthy engine down with it.
pub async fn spawn(
    board: &Board,
    config: &Config,
    launch: &Launch,
    logs: &Arc<LogRing>,
) -> Result<Running, String> {
    if let super::local::Endpoint::Socket(_) = launch.access.endpoint {
        board
            .create_private_dir(paths::ENGINE_CONTROL_DIR)
            .map_err(|e| format!("not started: {e}"))?;
    }
    let mut command = tokio::process::Command::from(command(
        &launch.program,
        &launch.args,
        &launch.environment,
        launch.access.key.as_ref(),
    ));
    command.kill_on_drop(true);
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
    // Moving a process between cgroups can wait on the kernel for a while (and a simulated
    // board's writes can be made slow): not on the thread the dashboard and probes share.
    let (board, config) = (board.clone(), config.clone());
    let placed = tokio::task::spawn_blocking(move || place_in_cgroup(&board, &config, pid))
        .await
        .unwrap_or_else(|e| {
            Err(format!(
                "not started: placing it in its cgroup crashed: {e}"
            ))
        });
    if let Err(e) = placed {
        // It has only just started: nothing to shut down gracefully.
        let _ = child.start_kill();
        let _ = child.wait().await;
        return Err(e);
    }
    Ok(Running { child, pid })
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

    /// SIGKILL at once, then reaps it; returns how it ended. For a wedged engine: a stopped
    /// (SIGSTOP) or hung process may never act on SIGTERM, and waiting the grace period for it
    /// only keeps the box from answering longer.
    pub async fn kill(mut self) -> String {
        if let Err(e) = self.child.start_kill() {
            tracing::warn!("cannot send SIGKILL to the engine ({}): {e}", self.pid);
        }
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
                self.kill().await
            }
        }
    }
}

/// How a one-shot engine command ended, with everything it printed.
pub struct Finished {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// Runs a one-shot engine command (`engine generate`) to its end, in the engine's slice like
/// the server; it is killed when `stop` says so or after `limit`. Blocking: the calling thread
/// waits here for the child, and must, since the parent-death signal is tied to it.
pub fn run_to_end(
    board: &Board,
    config: &Config,
    program: &Path,
    args: &[OsString],
    limit: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<Finished, String> {
    let mut child = command(program, args, &[], None)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    // Both pipes are drained while the engine runs, so a chatty engine cannot block on them.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let finish = |child: &mut std::process::Child, why: String| {
        let _ = child.kill();
        let _ = child.wait();
        Err(why)
    };
    if let Err(e) = place_in_cgroup(board, config, child.id()) {
        return finish(&mut child, e);
    }
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline && !stop() => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Ok(None) if stop() => {
                return finish(&mut child, "stopped (abort or shutdown)".into());
            }
            Ok(None) => {
                return finish(&mut child, format!("no answer in {} s", limit.as_secs()));
            }
            Err(e) => return finish(&mut child, format!("waiting for the engine: {e}")),
        }
    };
    Ok(Finished {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::launch::tests::approved;

    #[test]
    fn the_control_key_reaches_the_engine_in_its_environment_and_nowhere_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (board, config, approved) = approved(dir.path());
        let launch = Launch::plan(&board, &config, &approved).expect("plan");
        let launch_key = launch.access.key.clone().expect("the engine gets a key");
        let key = launch_key.as_str().to_string();
        let command = command(&launch.program, &launch.args, &[], Some(&launch_key));
        let env: Vec<_> = command.get_envs().collect();
        assert!(
            env.contains(&(
                std::ffi::OsStr::new(control::ENV),
                Some(std::ffi::OsStr::new(&key))
            )),
            "{env:?}"
        );
        assert!(
            command
                .get_args()
                .all(|a| !a.to_string_lossy().contains(&key)),
            "the key is not on the command line"
        );
        assert!(
            !format!("{launch:?}").contains(&key),
            "nor in a debug print"
        );
        let next = Launch::plan(&board, &config, &approved).expect("plan");
        assert_ne!(next.access.key, launch.access.key, "fresh for every launch");
        // The one-shot `engine generate` serves nothing and gets no key.
        let one_shot = super::command(&launch.program, &launch.args, &[], None);
        assert!(one_shot.get_envs().all(|(name, _)| name != control::ENV));
    }
}
