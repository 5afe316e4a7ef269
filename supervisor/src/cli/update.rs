//! The `supervisor update` subcommands.

use std::path::Path;
use std::process::ExitCode;

use supervisor_core::update::backend::{self, Call};
use supervisor_core::update::install::{self, Reboot};

use super::{EXIT_BAD_INPUT, EXIT_FAILED, load};

fn done(result: Result<String, String>) -> ExitCode {
    match result {
        Ok(message) => {
            if !message.is_empty() {
                println!("{message}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `supervisor update status [--json]`.
pub fn status(root: &Path, config: Option<&Path>, json: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let status = supervisor_core::update::status(&board, &config);
    if json {
        return done(
            serde_json::to_string_pretty(&status).map_err(|e| format!("cannot encode: {e}")),
        );
    }
    print!("{}", supervisor_core::report::update_text(&status));
    if status.error.is_some() {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// `supervisor update install SOURCE [--force] [--in-window]`.
pub fn install(
    root: &Path,
    config: Option<&Path>,
    source: &str,
    force: bool,
    in_window: bool,
) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let reboot = if in_window {
        Reboot::InWindow
    } else {
        Reboot::Now
    };
    done(block_on(install::install(
        &board,
        &config,
        source,
        force,
        reboot,
        &|line| eprintln!("{line}"),
    )))
}

/// Runs `work` on a fresh single-threaded runtime (RAUC is reached over D-Bus).
fn block_on(
    work: impl std::future::Future<Output = Result<String, String>>,
) -> Result<String, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?
        .block_on(work)
}

/// `supervisor update boot`: what the daemon does first at every boot.
pub fn boot(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => {
            done(
                supervisor_core::update::on_boot(&board, &config).map(|b| match b {
                    supervisor_core::update::Boot::Normal(m)
                    | supervisor_core::update::Boot::Rebooting(m) => m,
                    supervisor_core::update::Boot::Trial(slot, left) => {
                        format!("this boot tries slot {slot}: {left} s left for its health check")
                    }
                }),
            )
        }
        Err(code) => code,
    }
}

/// `supervisor update install-stick DIR`.
pub fn install_stick(root: &Path, config: Option<&Path>, dir: &str) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    done(block_on(install::from_stick(&board, &config, dir)))
}

/// `supervisor update reboot`: into the installed slot now.
pub fn reboot(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => done(supervisor_core::update::reboot_into_trial(&board, &config)),
        Err(code) => code,
    }
}

/// `supervisor update cancel`: the installed slot is not tried.
pub fn cancel(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => done(
            supervisor_core::update::cancel(
                &board,
                &config,
                "cancelled by `supervisor update cancel`",
            )
            .map(|()| "no update is armed".to_string()),
        ),
        Err(code) => code,
    }
}

/// `supervisor update backend ARGS...`: RAUC's custom bootloader backend.
pub fn backend(root: &Path, config: Option<&Path>, args: &[String]) -> ExitCode {
    let call = match Call::parse(args) {
        Ok(call) => call,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    match load(root, config) {
        Ok((board, config)) => done(backend::run(&board, &config, call)),
        Err(code) => code,
    }
}

/// `supervisor update post-install`: RAUC's post-install handler, with RAUC's environment.
pub fn post_install(root: &Path, config: Option<&Path>) -> ExitCode {
    let env = std::env::vars()
        .filter(|(k, _)| k.starts_with("RAUC_"))
        .collect();
    match load(root, config) {
        Ok((board, config)) => done(supervisor_core::update::handler::post_install(
            &board, &config, &env,
        )),
        Err(code) => code,
    }
}
