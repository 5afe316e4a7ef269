//! The engine's command line, from the configuration and the verified model's manifest.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use weights::gate::Approved;

use super::control::ControlKey;
use super::local::{Access, Endpoint};
use crate::board::{Board, paths};
use crate::config::{Config, available_cpus};

/// How the engine is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The `engine` binary.
    pub program: PathBuf,
    /// Its arguments (`serve ...`), passed as a vector: never through a shell.
    pub args: Vec<OsString>,
    /// The loopback port it listens on.
    pub port: u16,
    /// Variables added to its environment (none secret: the control key is passed apart).
    pub environment: Vec<(String, String)>,
    /// Where the probe and the dashboard's chat reach it; our engine's control key, given to
    /// it in its environment only.
    pub access: Access,
}

/// The longest path a Unix socket may have (`sun_path` less its terminating zero).
const MAX_SOCKET_PATH: usize = 107;

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

/// The cluster head's server: llama.cpp's `llama-server` on the cluster's model, the layers
/// after the head's own on the workers' RPC servers, over the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterHead {
    /// The model the cluster serves.
    pub model: String,
    /// `llama-server`.
    pub program: PathBuf,
    /// The head and then each worker, with what its share may take.
    pub members: Vec<crate::cluster::split::Member>,
    /// Each worker's RPC server (`ADDRESS:PORT` on the link), in the members' order.
    pub workers: Vec<String>,
}

/// Threads: the configuration's, else the manifest's (never more than the CPUs available).
fn threads(config: &Config, approved: &Approved) -> usize {
    match config.engine.threads.get() {
        0 => (approved.manifest.engine.threads as usize).clamp(1, available_cpus()),
        n => n,
    }
}

/// Context: the configuration's where set, else the manifest's; above the manifest's refused.
fn context(config: &Config, approved: &Approved) -> Result<usize, String> {
    let allowed = approved.manifest.engine.context as usize;
    match config.engine.context.get() {
        0 => Ok(allowed),
        n if allowed > 0 && n > allowed => Err(format!(
            "not started: [engine] context = {n} is more than the {allowed} tokens model {}'s manifest allows; lower it, or set 0 to take the manifest's",
            approved.manifest.id
        )),
        n => Ok(n),
    }
}

/// The manifest's sampling defaults as flags (the same names for the engine and llama-server).
fn sampling(approved: &Approved) -> Vec<OsString> {
    let settings = &approved.manifest.engine;
    let mut args = Vec::new();
    for (flag, value) in [
        ("--temp", settings.temperature.map(|t| t.to_string())),
        ("--top-p", settings.top_p.map(|p| p.to_string())),
        ("--top-k", settings.top_k.map(|k| k.to_string())),
        ("--min-p", settings.min_p.map(|p| p.to_string())),
    ] {
        if let Some(value) = value {
            args.push(flag.into());
            args.push(value.into());
        }
    }
    args
}

impl Launch {
    /// The cluster head's `llama-server` for `approved` (the cluster's model, verified): the
    /// split planned from the model's tensors and the members' memory (refused when they cannot
    /// hold it), bound to loopback on the engine's port, as the engine would be.
    pub fn plan_head(
        config: &Config,
        approved: &Approved,
        head: &ClusterHead,
    ) -> Result<(Launch, crate::cluster::split::Split), String> {
        let context = context(config, approved)?;
        let sizes = crate::cluster::split::sizes(&approved.path, context as u64)?;
        let split = crate::cluster::split::plan(&sizes, &head.members)
            .map_err(|e| format!("not started: {e}"))?;
        let port = config.engine.port.get();
        let mut args: Vec<OsString> = vec!["--model".into(), approved.path.clone().into()];
        args.extend(sampling(approved));
        for (flag, value) in [
            ("--rpc", head.workers.join(",")),
            ("--n-gpu-layers", split.gpu_layers().to_string()),
            ("--tensor-split", split.tensor_split()),
            // The split is ours: llama.cpp's own fitting would move layers by free memory.
            ("--fit", "off".to_string()),
            ("--host", "127.0.0.1".to_string()),
            ("--port", port.to_string()),
            ("--threads", threads(config, approved).to_string()),
            ("--ctx-size", context.to_string()),
            ("--alias", head.model.clone()),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        args.push("--no-webui".into());
        let launch = Launch {
            program: head.program.clone(),
            args,
            port,
            environment: Vec::new(),
            access: Access {
                endpoint: Endpoint::Loopback(port),
                key: None,
            },
        };
        Ok((launch, split))
    }

    /// The command for `approved`: threads and context from the configuration where set,
    /// else from the manifest (threads never more than the CPUs the supervisor may use), with a
    /// fresh control key. A configured context above the manifest's is refused: the manifest
    /// is what the model was approved to run with.
    pub fn plan(board: &Board, config: &Config, approved: &Approved) -> Result<Launch, String> {
        let e = &config.engine;
        let threads = threads(config, approved);
        let context = context(config, approved)?;
        let mut args: Vec<OsString> = vec!["serve".into(), "--model".into()];
        args.push(approved.path.clone().into_os_string());
        // The head was verified with the weights; the engine drafts from it by default.
        if let Some(draft) = &approved.draft {
            args.push("--model-draft".into());
            args.push(draft.clone().into_os_string());
        }
        args.extend(sampling(approved));
        for (flag, value) in [
            ("--host", "127.0.0.1".to_string()),
            ("--port", e.port.get().to_string()),
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
        let control_socket = board.path(paths::ENGINE_CONTROL_SOCKET);
        check_socket_path(&control_socket)?;
        args.push("--control-socket".into());
        args.push(control_socket.clone().into_os_string());
        Ok(Launch {
            program: binary(config),
            args,
            port: e.port.get(),
            environment: Vec::new(),
            access: Access {
                endpoint: Endpoint::Socket(control_socket),
                key: Some(ControlKey::generate()?),
            },
        })
    }
}

fn check_socket_path(path: &Path) -> Result<(), String> {
    let length = path.as_os_str().len();
    if length > MAX_SOCKET_PATH {
        return Err(format!(
            "not started: its control socket {} is {length} bytes long, over the {MAX_SOCKET_PATH} \
             a Unix socket's path may have (run with a shorter --root)",
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use super::*;
    use weights::manifest::Template;

    /// A simulated board under `dir`, the default configuration, and an approval of a stand-in
    /// model whose manifest says 4 threads and 4096 tokens of context.
    pub(crate) fn approved(dir: &Path) -> (Board, Config, Approved) {
        let root = dir.join("board");
        board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
        let board = board_sim::open(&root).expect("board");
        let config = Config::default();
        let template = Template {
            id: Some(config.model.id.clone()),
            ..Template::default()
        };
        let approved = Approved {
            path: dir.join("model.gguf"),
            draft: None,
            manifest: template
                .build(b"weights", "model.gguf", 1 << 20)
                .expect("manifest"),
            signed: weights::sign::Signed::Unsigned,
            checked: "test".into(),
        };
        (board, config, approved)
    }

    fn flag<'a>(launch: &'a Launch, name: &str) -> Option<&'a std::ffi::OsStr> {
        let at = launch.args.iter().position(|a| a == name)?;
        launch.args.get(at + 1).map(OsString::as_os_str)
    }

    #[test]
    fn the_context_comes_from_the_manifest_and_never_exceeds_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (board, mut config, approved) = approved(dir.path());
        assert_eq!(approved.manifest.engine.context, 4096);
        let launch = Launch::plan(&board, &config, &approved).expect("plan");
        assert_eq!(flag(&launch, "--ctx-size"), Some("4096".as_ref()));
        config.engine.context = toml::from_str::<Config>("[engine]\ncontext = 2048\n")
            .expect("config")
            .engine
            .context;
        let launch = Launch::plan(&board, &config, &approved).expect("plan");
        assert_eq!(flag(&launch, "--ctx-size"), Some("2048".as_ref()));
        config.engine.context = toml::from_str::<Config>("[engine]\ncontext = 8192\n")
            .expect("config")
            .engine
            .context;
        let e = Launch::plan(&board, &config, &approved).expect_err("above the manifest");
        assert!(
            e.contains("context = 8192 is more than the 4096 tokens"),
            "{e}"
        );
    }

    #[test]
    fn a_draft_head_and_sampling_defaults_reach_the_engine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (board, config, mut approved) = approved(dir.path());
        let plain = Launch::plan(&board, &config, &approved).expect("plan");
        assert_eq!(flag(&plain, "--model-draft"), None);
        assert_eq!(flag(&plain, "--top-k"), None);
        approved.draft = Some(dir.path().join("head.gguf"));
        approved.manifest.engine.temperature = Some(1.0);
        approved.manifest.engine.top_p = Some(0.95);
        approved.manifest.engine.top_k = Some(64);
        let launch = Launch::plan(&board, &config, &approved).expect("plan");
        assert_eq!(
            flag(&launch, "--model-draft"),
            Some(dir.path().join("head.gguf").as_os_str())
        );
        assert_eq!(flag(&launch, "--temp"), Some("1".as_ref()));
        assert_eq!(flag(&launch, "--top-p"), Some("0.95".as_ref()));
        assert_eq!(flag(&launch, "--top-k"), Some("64".as_ref()));
    }
}
