//! One function per CLI subcommand; `main.rs` only parses arguments and calls these.
//!
//! Exit status: 0 success; 1 a tuning step failed (or the daemon stopped on an error);
//! 2 bad input (configuration, board root, arguments).

use std::path::Path;
use std::process::ExitCode;

use crate::board::{Board, BoardResult};
use crate::config::Config;
use crate::report;
use crate::systemd::Systemd;
use crate::tune::{self, Applier, Backend};

/// Exit status for bad input.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit status when a step failed.
pub const EXIT_FAILED: u8 = 1;

fn bad_input(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// Opens the board at `root`. With the `sim` feature a simulated tree opens through
/// `board-sim`; without it (the production build) only the live board opens, and a simulated
/// tree is refused.
pub fn open_board(root: &Path) -> BoardResult<Board> {
    #[cfg(feature = "sim")]
    return board_sim::open(root);
    #[cfg(not(feature = "sim"))]
    Board::open(root)
}

/// The board and its configuration, or the bad-input exit having said why.
pub(crate) fn load(root: &Path, config: Option<&Path>) -> Result<(Board, Config), ExitCode> {
    let board = open_board(root).map_err(bad_input)?;
    let config = Config::for_board(&board, config).map_err(bad_input)?;
    Ok((board, config))
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| bad_input(format!("cannot start the async runtime: {e}")))
}

/// The applier for this board: with a systemd connection when the backend is systemd.
pub async fn applier_for(board: &Board, backend: Backend) -> Applier<'_> {
    match backend {
        Backend::Files => Applier::files_only(board, "the cgroup backend is files"),
        Backend::Systemd => match Systemd::connect(None).await {
            Ok(systemd) => Applier::with_systemd(board, systemd),
            Err(e) => Applier::files_only(
                board,
                format!("cannot reach systemd on the system bus: {e}"),
            ),
        },
    }
}

/// `supervisor sim init DIR [--variant NAME]` (feature `sim`).
#[cfg(feature = "sim")]
pub fn sim_init(dir: &Path, variant: &str) -> ExitCode {
    let Some(v) = board_sim::Variant::from_name(variant) else {
        let names: Vec<&str> = board_sim::Variant::ALL.iter().map(|(n, _)| *n).collect();
        return bad_input(format!(
            "unknown board variant \"{variant}\"; choose one of: {}",
            names.join(", ")
        ));
    };
    match board_sim::init(dir, v) {
        Ok(()) => {
            println!("simulated {} board written to {}", v.name(), dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => bad_input(format!(
            "cannot write a simulated board to {}: {e}",
            dir.display()
        )),
    }
}

/// `supervisor sim write-slot DIR SLOT VERSION` (feature `sim`).
#[cfg(feature = "sim")]
pub fn sim_write_slot(dir: &Path, slot: &str, version: &str) -> ExitCode {
    if !dir.join(board_sim::MARKER).is_file() {
        return bad_input(format!("{} is not a simulated board", dir.display()));
    }
    match board_sim::write_slot(dir, slot, version) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => bad_input(format!("writing slot {slot} of {}: {e}", dir.display())),
    }
}

/// `supervisor sim boot DIR` (feature `sim`).
#[cfg(feature = "sim")]
pub fn sim_boot(dir: &Path) -> ExitCode {
    if !dir.join(board_sim::MARKER).is_file() {
        return bad_input(format!("{} is not a simulated board", dir.display()));
    }
    match board_sim::firmware::boot(dir) {
        Ok(story) => {
            println!("{story}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: booting {}: {e}", dir.display());
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `supervisor provision apply [--from DIR] [--json]`: needs only the board, not the configuration (which
/// provisioning feeds).
pub fn provision_apply(root: &Path, from: Option<&str>, json: bool) -> ExitCode {
    use crate::provision::Outcome;
    let board = match open_board(root) {
        Ok(board) => board,
        Err(e) => return bad_input(e),
    };
    // Before anything is recorded: the floor keeps the record's times plausible.
    match crate::clock::raise_to_floor(&board) {
        Ok(Some(changed)) => eprintln!("{changed}"),
        Ok(None) => {}
        Err(e) => eprintln!("warning: the clock floor could not be kept: {e}"),
    }
    let source = match from {
        Some(dir) => crate::provision::Source::SignedDir(dir.to_string()),
        None => crate::provision::Source::BootPartition,
    };
    let report = match crate::provision::apply(&board, &source) {
        Ok(report) => report,
        Err(e) => return bad_input(format!("provisioning: {e}")),
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => return bad_input(format!("cannot encode the report: {e}")),
        }
    } else {
        print!("{}", report::provision_text(&report.record));
    }
    if report.outcome == Outcome::Rejected {
        eprintln!(
            "error: provisioning file refused, nothing applied: {}",
            report.message
        );
        ExitCode::from(EXIT_FAILED)
    } else {
        eprintln!("{}", report.message);
        ExitCode::SUCCESS
    }
}

/// `supervisor overclock status [--json]`.
pub fn overclock_status(root: &Path, config: Option<&Path>, json: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let status = crate::overclock::status(&board, &config);
    if json {
        return match serde_json::to_string_pretty(&status) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => bad_input(format!("cannot encode status: {e}")),
        };
    }
    print!("{}", report::overclock_text(&status));
    if status.error.is_some() {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

fn overclock_outcome(result: Result<crate::overclock::Outcome, String>) -> ExitCode {
    match result {
        Ok(crate::overclock::Outcome::Continue(message)) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Ok(crate::overclock::Outcome::Rebooting(message)) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Ok(crate::overclock::Outcome::Stopped(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `supervisor overclock start`.
pub fn overclock_start(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => overclock_outcome(crate::overclock::start(&board, &config)),
        Err(code) => code,
    }
}

/// `supervisor overclock boot`.
pub fn overclock_boot(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => overclock_outcome(crate::overclock::on_boot(&board, &config)),
        Err(code) => code,
    }
}

/// `supervisor overclock abort`.
pub fn overclock_abort(root: &Path, config: Option<&Path>) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    match crate::overclock::abort(&board, &config) {
        Ok(message) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `supervisor config check FILE`.
pub fn config_check(file: &Path) -> ExitCode {
    match Config::from_file(file) {
        Ok(_) => {
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => bad_input(e),
    }
}

/// `supervisor --root DIR [--config FILE] apply [--dry-run]`.
pub fn apply(root: &Path, config: Option<&Path>, dry_run: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let backend = Backend::resolve(config.tuning.engine.backend, &board);
    let steps = tune::steps(&config, backend);
    let reports = rt.block_on(async {
        let applier = applier_for(&board, backend).await;
        tune::apply(&board, &steps, &applier, dry_run).await
    });
    print!("{}", report::steps_table(&reports));
    if tune::all_succeeded(&reports) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}

/// `supervisor --root DIR [--config FILE] status [--json]`.
pub fn status(root: &Path, config: Option<&Path>, json: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let backend = Backend::resolve(config.tuning.engine.backend, &board);
    // The gate as configured: `full` hashes every chunk, `fast` trusts an unchanged file.
    let gate = crate::model::check(&board, &config, crate::model::reverify(&config));
    let model = crate::model::ModelStatus::from_gate(&config.model.id, &gate);
    // In the running daemon's words where the board is as its last pass left it, so this says
    // what the dashboard says at the same moment.
    let last_pass = tune::last_pass::read(&board);
    let steps = tune::status_after(&board, &tune::steps(&config, backend), last_pass.as_deref());
    let engine = crate::engine::read_status(&board, &config.model.id);
    let status = report::collect(&board, &config, model, steps, engine);
    if json {
        match serde_json::to_string_pretty(&status.to_wire()) {
            Ok(text) => println!("{text}"),
            Err(e) => return bad_input(format!("cannot encode status: {e}")),
        }
    } else {
        print!("{}", report::facts_text(&status.board, status.simulated));
        print!("{}", report::provision_text(&status.provision));
        print!("{}", report::clock_text(&status.clock));
        let m = &status.model;
        println!(
            "model: {} {} {}",
            m.id,
            m.state,
            m.path.as_deref().unwrap_or("")
        );
        if let Some(draft) = &m.draft {
            println!("       draft head {draft} (speculation: {})", m.speculation);
        }
        println!("       {}", m.reason);
        let e = &status.engine;
        let state = report::word(e.state);
        println!(
            "engine: {state} {} (restarts {}{})",
            e.url.as_deref().unwrap_or(""),
            e.restarts,
            e.last_exit
                .as_deref()
                .map(|x| format!(", last exit: {x}"))
                .unwrap_or_default()
        );
        println!("        {}", e.reason);
        print!("{}", report::overclock_text(&status.overclock));
        print!("{}", report::update_text(&status.update));
        println!();
        print!("{}", report::steps_table(&status.steps));
    }
    ExitCode::SUCCESS
}

/// `supervisor --root DIR [--config FILE] run`.
pub fn run(root: &Path, config: Option<&Path>) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = rt.block_on(crate::daemon::run(&board, &config));
    // A re-verification stopped at shutdown may leave one board call or a model hash running on
    // a blocking thread: a write gets a moment to finish, a long hash is not waited for.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// The configuration for a `weights` command: `--config`, else the board's.
pub fn load_config(root: &Path, config: Option<&Path>) -> Result<(Board, Config), ExitCode> {
    load(root, config)
}

/// The trust a `weights` command checks signatures with.
pub fn trust_for(config: &Config) -> Result<weights::sign::Trust, ExitCode> {
    crate::model::trust(config).map_err(bad_input)
}
