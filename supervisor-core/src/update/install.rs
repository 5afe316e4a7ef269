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
    progress: &(dyn Fn(&str) + Sync),
) -> Result<String, String> {
    let source = source_for_rauc(source)?;
    let (booted, _) = super::slots(board)?;
    if let Some(trial) = super::pending(board, config)?
        && trial.rebooted_unix.is_some()
    {
        return Err(format!(
            "the update to slot {} is being checked; wait for its verdict",
            trial.slot
        ));
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
    if let Some(running) = slot::running_version(board)
        && compare_versions(&version, &running).is_lt()
        && !force
    {
        return Err(format!(
            "the bundle holds version {version}, older than the running {running}; give --force to go back"
        ));
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

/// `supervisor update install-stick DIR`: the newest bundle on a USB stick mounted at `dir`
/// (a box path), unless this box already runs it or rolled it back; the reboot waits for the
/// window.
pub async fn from_stick(board: &Board, config: &Config, dir: &str) -> Result<String, String> {
    let host_dir = board.path(dir);
    let mut bundles: Vec<String> = std::fs::read_dir(&host_dir)
        .map_err(|e| format!("listing {dir}: {e}"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".raucb") && !n.starts_with('.'))
        .collect();
    bundles.sort();
    if bundles.is_empty() {
        return Ok(format!("no update bundle (*.raucb) in {dir}"));
    }
    let rauc = Rauc::connect().await?;
    let mut newest: Option<(String, String)> = None;
    for name in &bundles {
        let path = host_dir.join(name).display().to_string();
        match rauc.info(&path).await {
            Ok((_, version)) => {
                if newest
                    .as_ref()
                    .is_none_or(|(_, v)| compare_versions(&version, v).is_gt())
                {
                    newest = Some((path, version));
                }
            }
            Err(e) => tracing::warn!("{dir}/{name}: {e}"),
        }
    }
    let Some((path, version)) = newest else {
        return Err(format!(
            "no bundle in {dir} passed RAUC's check (see the log for each one's reason)"
        ));
    };
    if slot::running_version(board).as_deref() == Some(version.as_str()) {
        return Ok(format!("version {version} from {dir} is already running"));
    }
    let status = super::status(board, config);
    if let Some(last) = &status.last
        && last.system_version.as_deref() == Some(version.as_str())
        && last.result == super::UpdateResult::RolledBack
    {
        // The stick may stay plugged in: the rolled-back version is left alone, not retried.
        return Ok(format!(
            "version {version} was rolled back on this box ({}); not installing it again from {dir}",
            last.reason
        ));
    }
    if status
        .trial
        .as_ref()
        .is_some_and(|t| t.system_version.as_deref() == Some(version.as_str()))
    {
        return Ok(format!(
            "version {version} is already installed and waiting"
        ));
    }
    install(board, config, &path, false, Reboot::InWindow, &|line| {
        tracing::info!("update from {dir}: {line}")
    })
    .await
}
