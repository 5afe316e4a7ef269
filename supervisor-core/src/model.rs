//! The supervisor's side of model weights: trust and paths from the configuration, the default
//! model's manifest, and the gate's verdict as `status` reports it.

use std::path::PathBuf;

use serde::Serialize;
use weights::gate::{self, Approved};
use weights::sign::Trust;
use weights::{Error, ErrorKind};

use crate::board::Board;
use crate::config::{Config, Reverify};

/// Manifest of the default model, SmolLM2-135M-Instruct Q4_1 (also on the card in
/// `/usr/share/appliance/models/`).
pub const DEFAULT_MANIFEST: &str = include_str!("../../models/smollm2-135m-instruct-q4_1.toml");

/// The built-in default manifest, checked like any other: unsigned, so refused when the box
/// requires signatures.
pub fn default_approval(trust: &Trust) -> Result<weights::install::Approval, Error> {
    let signed = trust.check(DEFAULT_MANIFEST.as_bytes(), None)?;
    let manifest = weights::Manifest::parse(DEFAULT_MANIFEST, "the built-in default manifest")?;
    Ok(weights::install::Approval {
        manifest,
        text: DEFAULT_MANIFEST.to_string(),
        signature: None,
        signed,
    })
}

/// The keys this box trusts, from the configuration (the provisioned fleet key among them).
pub fn trusted_keys(config: &Config) -> Vec<String> {
    config
        .model
        .trusted_keys
        .iter()
        .map(|k| k.as_str().to_string())
        .collect()
}

/// The trust of the launch gate: [`trusted_keys`], and a signature required when configured.
pub fn trust(config: &Config) -> Result<Trust, Error> {
    Trust::new(&trusted_keys(config), config.model.require_signature)
}

/// The data directory holding installed models, under the board root.
pub fn data_dir(board: &Board, config: &Config) -> PathBuf {
    board.path(&config.model.data_dir)
}

/// The configured re-verification (at boot and for `status`).
pub fn reverify(config: &Config) -> gate::Reverify {
    match config.model.reverify {
        Reverify::Full => gate::Reverify::Full,
        Reverify::Fast => between_boots(config),
    }
}

/// The daemon's periodic re-check: cheap, and in full on the configured schedule.
pub fn between_boots(config: &Config) -> gate::Reverify {
    gate::Reverify::Fast {
        full_every_s: config
            .model
            .full_verify_interval_hours
            .get()
            .saturating_mul(3600),
    }
}

/// Runs the launch gate for the configured model.
pub fn check(board: &Board, config: &Config, how: gate::Reverify) -> Result<Approved, Error> {
    gate::check(
        &data_dir(board, config),
        &config.model.id,
        how,
        &trust(config)?,
        weights::install::now_unix(),
    )
}

/// The model as `status` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct ModelStatus {
    /// Configured model id.
    pub id: String,
    /// `verified`, `failed` or `not-installed`.
    pub state: &'static str,
    /// The verified weights the engine would be given.
    pub path: Option<String>,
    /// The verified draft head given with them (the model's MTP head), if it has one.
    pub draft: Option<String>,
    /// Where the engine's drafts come from: `mtp` (the draft head) or `ngram`.
    pub speculation: &'static str,
    /// What was checked, or why it failed.
    pub reason: String,
}

impl ModelStatus {
    /// Status from a gate result.
    pub fn from_gate(id: &str, result: &Result<Approved, Error>) -> ModelStatus {
        let (state, path, reason) = match result {
            Ok(ok) => (
                "verified",
                Some(ok.path.display().to_string()),
                match &ok.draft {
                    Some(_) => format!("{}; draft head: every chunk verified", ok.checked),
                    None => ok.checked.clone(),
                },
            ),
            Err(e) if e.kind == ErrorKind::NotInstalled => {
                ("not-installed", None, e.message.clone())
            }
            Err(e) => ("failed", None, e.message.clone()),
        };
        let draft = result
            .as_ref()
            .ok()
            .and_then(|ok| ok.draft.as_ref())
            .map(|d| d.display().to_string());
        ModelStatus {
            id: id.to_string(),
            state,
            path,
            speculation: if draft.is_some() { "mtp" } else { "ngram" },
            draft,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_manifest_is_valid_and_fetchable() {
        let manifest =
            weights::Manifest::parse(super::DEFAULT_MANIFEST, "default manifest").expect("valid");
        assert_eq!(manifest.id, crate::config::Config::default().model.id);
        assert!(manifest.source.is_some_and(|s| !s.pip.is_empty()));
    }
}
