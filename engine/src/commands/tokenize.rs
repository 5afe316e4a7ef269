//! `engine tokenize`: the token ids of a text as JSON.

use std::process::ExitCode;

use engine::tokenizer::Tokenizer;

use super::{fail, open};
use crate::TokenizeArgs;

/// Prints the token ids of `args.text`.
pub fn run(args: TokenizeArgs) -> ExitCode {
    let TokenizeArgs {
        model,
        special,
        text,
        json: _,
    } = args;
    let file = match open(&model) {
        Ok(f) => f,
        Err(code) => return code,
    };
    match Tokenizer::load(&file) {
        Ok(tok) => {
            println!("{}", serde_json::json!(tok.encode(&text, special)));
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{}: {e}", model.display())),
    }
}
