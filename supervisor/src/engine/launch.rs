//! The engine's command line, from the configuration and the verified model's manifest.

use std::ffi::OsString;
use std::path::PathBuf;

use weights::gate::Approved;

use super::control::ControlKey;
use crate::board::Board;
use crate::config::Config;

/// How the engine is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The `engine` binary.
    pub program: PathBuf,
    /// Its arguments (`serve ...`), passed as a vector: never through a shell.
    pub args: Vec<OsString>,
    /// The loopback port it listens on.
    pub port: u16,
    /// This launch's control key, given to the engine in its environment only.
    pub control_key: ControlKey,
}

/// The `engine` binary: the configured one, else `engine` beside the supervisor's own
/// executable (how the image and `cargo build` lay them out), else `engine` on `PATH`.
pub fn binary(config: &Config) -> PathBuf {
    config
        .engine
        .binary
        .clone()
        .map_or_else(default_binary, PathBuf::from)
}

fn default_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("engine")))
        .filter(|candidate| candidate.is_file())
        .unwrap_or_else(|| PathBuf::from("engine"))
}

impl Launch {
    /// The command for `approved`: threads and context from the configuration where set,
    /// else from the manifest (threads never more than the CPUs the supervisor may use), with a
    /// fresh control key.
    pub fn plan(board: &Board, config: &Config, approved: &Approved) -> Result<Launch, String> {
        let e = &config.engine;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = match e.threads {
            0 => (approved.manifest.engine.threads as usize).clamp(1, cores),
            n => n,
        };
        let context = match e.context {
            0 => approved.manifest.engine.context as usize,
            n => n,
        };
        let mut args: Vec<OsString> = vec!["serve".into(), "--model".into()];
        args.push(approved.path.clone().into_os_string());
        for (flag, value) in [
            ("--host", "127.0.0.1".to_string()),
            ("--port", e.port.to_string()),
            ("--threads", threads.to_string()),
            ("--ctx-size", context.to_string()),
            ("--alias", config.model.id.clone()),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        if let Some(prompt) = &e.system_prompt {
            args.push("--system-prompt".into());
            args.push(board.path(prompt).into_os_string());
        }
        Ok(Launch {
            program: binary(config),
            args,
            port: e.port,
            control_key: ControlKey::generate()?,
        })
    }
}
