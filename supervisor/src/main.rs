//! `supervisor`: the command line. Parsing only; each subcommand is one call into the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use supervisor::commands;

/// The Appliance supervisor: tunes and verifies the board, and runs the engine.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Board root everything is read and written under ("/" on a box, a simulated tree locally).
    #[arg(long, global = true, default_value = "/")]
    root: PathBuf,
    /// Configuration file (default: /etc/appliance/appliance.toml under the root, with the boot
    /// partition's appliance.toml as an override).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Bring the board into the tuned state and verify it by reading back.
    Apply {
        /// Only report what would change.
        #[arg(long)]
        dry_run: bool,
    },
    /// Report every tuning step and facts about the board.
    Status {
        /// Machine-readable output (stable keys, see README).
        #[arg(long)]
        json: bool,
    },
    /// Run the daemon in the foreground.
    Run,
    /// Simulated boards for tests and local runs.
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
    /// Configuration files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum SimCommand {
    /// Write a simulated Raspberry Pi 5 tree into DIR.
    Init {
        /// Directory to write (empty, absent, or an earlier simulation).
        dir: PathBuf,
        /// Board state: pi5-8gb, pi5-4gb, no-memcg, no-numa, wrong-interleave, zram, hot,
        /// old-bootloader.
        #[arg(long, default_value = "pi5-8gb")]
        variant: String,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a configuration file; exit status 2 with the key and line when it is wrong.
    Check {
        /// The file to check.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(commands::EXIT_BAD_INPUT)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    supervisor::logging::init();
    let config = cli.config.as_deref();
    match cli.command {
        Command::Apply { dry_run } => commands::apply(&cli.root, config, dry_run),
        Command::Status { json } => commands::status(&cli.root, config, json),
        Command::Run => commands::run(&cli.root, config),
        Command::Sim {
            command: SimCommand::Init { dir, variant },
        } => commands::sim_init(&dir, &variant),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => commands::config_check(&file),
    }
}
