//! `engine`: the inference engine's command line. Parsing only; each command is one library call.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use engine::model::Model;
use engine::model_file::ModelFile;

/// The Appliance inference engine.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Teacher-forced scoring: top-K log-probabilities at every position from N on.
    Score {
        /// The GGUF model.
        #[arg(short = 'm', long)]
        model: PathBuf,
        /// A JSON array of token ids.
        #[arg(long)]
        ids: PathBuf,
        /// First position to report (the distribution that predicts ids[N]).
        #[arg(long)]
        from: usize,
        /// Candidates per position.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// JSON output (the only format).
        #[arg(long)]
        json: bool,
    },
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Score {
            model,
            ids,
            from,
            top,
            json: _,
        } => {
            let file = match ModelFile::open(&model) {
                Ok(f) => f,
                Err(e) => return fail(e),
            };
            let model = match Model::load(&file) {
                Ok(m) => m,
                Err(e) => return fail(e),
            };
            let ids: Vec<u32> = match std::fs::read_to_string(&ids)
                .map_err(|e| format!("{}: {e}", ids.display()))
                .and_then(|t| {
                    serde_json::from_str(&t).map_err(|e| {
                        format!("{}: not a JSON array of token ids: {e}", ids.display())
                    })
                }) {
                Ok(ids) => ids,
                Err(e) => return fail(e),
            };
            match engine::score::score(&model, &ids, from, top) {
                Ok(positions) => {
                    println!("{}", serde_json::json!({ "positions": positions }));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}
