//! `engine score`: teacher-forced top-K log-probabilities of a token sequence as JSON.

use std::process::ExitCode;

use engine::model::Model;
use engine::model_file::ModelFile;

use super::fail;
use crate::ScoreArgs;

/// Prints the top candidates at every position from `args.from` on.
pub fn run(args: ScoreArgs) -> ExitCode {
    let ScoreArgs {
        model,
        ids,
        from,
        top,
        json: _,
    } = args;
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
            serde_json::from_str(&t)
                .map_err(|e| format!("{}: not a JSON array of token ids: {e}", ids.display()))
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
