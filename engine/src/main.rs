//! `engine`: the inference engine's command line.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("{}", engine::version());
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "{}: model loading and serving are not built yet; only --version works",
                engine::version()
            );
            ExitCode::from(2)
        }
    }
}
