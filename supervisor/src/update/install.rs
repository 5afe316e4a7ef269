//! `supervisor update install SOURCE`: a bundle checked (signature by RAUC, compatible,
//! version), written by RAUC into the other slot, then one tryboot reboot into it.

use std::path::Path;

use super::record::compare_versions;
use super::{rauc::Rauc, slot};
use crate::board::Board;
use crate::config::Config;

/// When the box reboots into the new slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reboot {
    /// At once.
    Now,
    /// When the daemon next finds itself inside `[update] window` (at once without one).
    InWindow,
}

/// A local bundle path made absolute (RAUC runs elsewhere); URLs pass through.
fn source_for_rauc(source: &str) -> Result<String, String> {
    if source.contains("://") {
        return Ok(source.to_string());
    }
    let path =
        std::path::absolute(Path::new(source)).map_err(|e| format!("bundle {source}: {e}"))?;
    if !path.is_file() {
        return Err(format!(
            "bundle {}: no such file (give a .raucb file or an http(s) URL)",
            path.display()
        ));
    }
    path.into_os_string()
        .into_string()
        .map_err(|_| format!("bundle {source}: the path is not UTF-8"))
}

/// Checks the bundle and the box, has RAUC install it, and reboots as `reboot` says.
pub async fn install(
    board: &Board,
    config: &Config,
    source: &str,
    force: bool,
    reboot: Reboot,
    progress: &dyn Fn(&str),
) -> Result<String, String> {
    let source = source_for_rauc(source)?;
    let (booted, _) = super::slots(board)?;
    if let Some(trial) = super::pending(board, config)? {
        if trial.rebooted_unix.is_some() {
            return Err(format!(
                "the update to slot {} is being checked; wait for its verdict",
                trial.slot
            ));
        }
    }
    super::refuse_while_overclocking(board, config)?;
    let rauc = Rauc::connect().await?;
    let (compatible, version) = rauc.info(&source).await?;
    let ours = rauc.compatible().await?;
    if compatible != ours {
        return Err(format!(
            "the bundle is for `{compatible}`, this box is `{ours}`: it was built for another product"
        ));
    }
    if let Some(running) = slot::running_version(board) {
        if compare_versions(&version, &running).is_lt() && !force {
            return Err(format!(
                "the bundle holds version {version}, older than the running {running}; give --force to go back"
            ));
        }
    }
    progress(&format!(
        "installing version {version} into slot {} (running {booted})",
        booted.other()
    ));
    rauc.install(&source, progress).await?;
    let prepared = super::pending(board, config)?.is_some_and(|t| t.prepared_unix.is_some());
    if !prepared {
        return Err(
            "RAUC wrote the slot but the supervisor's backend and post-install handler did not arm it: check /etc/rauc/system.conf".into(),
        );
    }
    match reboot {
        Reboot::Now => super::reboot_into_trial(board, config),
        Reboot::InWindow => Ok(format!(
            "version {version} is in slot {}; the box reboots into it {}",
            booted.other(),
            config
                .update
                .window
                .map_or("at the daemon's next check".to_string(), |w| format!(
                    "inside the window {}",
                    String::from(w)
                ))
        )),
    }
}
