//! The production `supervisor` carries no simulator code, and the supervisor's crates depend one
//! way (board, then supervisor-core, then dashboard, then the `supervisor` daemon and command
//! line): checked on the workspace's own dependency graph, as cargo reports it.
//!
//! The simulated board (`board-sim`) reaches the supervisor only through its `sim` feature, which
//! the production build leaves off: these tests fail if `board-sim` becomes a plain dependency,
//! a default feature turns it on, anything else the supervisor depends on brings it in, or the
//! `board` crate starts to depend on the layers above it.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn workspace_manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")
}

fn cargo(args: &[&str]) -> String {
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(args)
        .arg("--manifest-path")
        .arg(workspace_manifest())
        .args(["--locked", "--offline"])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The workspace's packages as `cargo metadata` declares them.
fn packages() -> Vec<Value> {
    let metadata: Value =
        serde_json::from_str(&cargo(&["metadata", "--no-deps", "--format-version", "1"]))
            .expect("cargo metadata is JSON");
    metadata["packages"]
        .as_array()
        .expect("a package list")
        .clone()
}

fn package<'a>(packages: &'a [Value], name: &str) -> &'a Value {
    packages
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("package {name} is in the workspace"))
}

/// `package`'s normal (not dev, not build) dependencies: (name, optional).
fn normal_dependencies(package: &Value) -> Vec<(String, bool)> {
    package["dependencies"]
        .as_array()
        .expect("a dependency list")
        .iter()
        .filter(|d| d["kind"].is_null())
        .map(|d| {
            (
                d["name"].as_str().expect("a name").to_string(),
                d["optional"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// The crates `cargo tree -e normal -p package` lists, sorted, each once: what the package's
/// production build links.
fn production_tree(package: &str) -> Vec<String> {
    let mut crates: Vec<String> = cargo(&[
        "tree", "-e", "normal", "-p", package, "--prefix", "none", "--format", "{p}",
    ])
    .lines()
    .filter_map(|line| line.split_whitespace().next().map(str::to_string))
    .collect();
    crates.sort();
    crates.dedup();
    crates
}

#[test]
fn board_sim_is_only_an_optional_dependency_that_no_default_feature_enables() {
    let packages = packages();
    let supervisor = package(&packages, "supervisor");
    for (name, optional) in normal_dependencies(supervisor) {
        if name == "board-sim" {
            assert!(
                optional,
                "board-sim must stay an optional dependency of the supervisor (feature `sim`)"
            );
        }
    }
    // Every feature the default set turns on, followed through the features it names.
    let features = &supervisor["features"];
    let mut pending: Vec<String> = vec!["default".into()];
    let mut enabled: Vec<String> = Vec::new();
    while let Some(feature) = pending.pop() {
        if enabled.contains(&feature) {
            continue;
        }
        if let Some(implied) = features[&feature].as_array() {
            pending.extend(
                implied
                    .iter()
                    .filter_map(|f| f.as_str())
                    .map(str::to_string),
            );
        }
        enabled.push(feature);
    }
    assert!(
        !enabled
            .iter()
            .any(|f| f == "sim" || f.contains("board-sim")),
        "the default features enable the simulator: {enabled:?}"
    );
}

#[test]
fn the_production_supervisor_links_no_simulator() {
    let crates = production_tree("supervisor");
    assert!(
        crates.iter().any(|c| c == "board"),
        "cargo tree lists the supervisor's dependencies: {crates:?}"
    );
    assert!(
        !crates.iter().any(|c| c == "board-sim"),
        "the production supervisor depends on board-sim: {crates:?}"
    );
}

/// The supervisor's crates, lowest first: each may depend only on those before it.
const LAYERS: &[&str] = &["board", "supervisor-core", "dashboard", "supervisor"];

#[test]
fn each_supervisor_crate_depends_only_on_the_layers_below_it() {
    for (i, layer) in LAYERS.iter().enumerate() {
        let tree = production_tree(layer);
        assert!(
            tree.iter().any(|c| c == layer),
            "cargo tree lists {layer} itself: {tree:?}"
        );
        for above in &LAYERS[i + 1..] {
            assert!(
                !tree.iter().any(|c| c == above),
                "{layer} depends on {above}, a layer above it: {tree:?}"
            );
        }
    }
}

#[test]
fn the_board_depends_on_nothing_above_it() {
    let board = production_tree("board");
    for above in ["supervisor", "board-sim"] {
        assert!(
            !board.iter().any(|c| c == above),
            "board depends on {above}: {board:?}"
        );
    }
    let simulator = production_tree("board-sim");
    assert!(
        !simulator.iter().any(|c| c == "supervisor"),
        "board-sim depends on the supervisor: {simulator:?}"
    );
}
