//! `engine fit`: whether a model's files load (weights, tokenizer, chat template, draft head)
//! and how much context fits boards of each memory size, as JSON. `appliance model manifest`
//! asks this before it records a model's engine settings.

use std::process::ExitCode;

use super::fail;
use crate::FitArgs;
use engine::memory::{Limit, Need};
use engine::model::{DraftHead, Model};
use engine::model_file::ModelFile;
use engine::tokenizer::Tokenizer;
use weights::fit::{Board, Report};

/// Runs the check.
pub fn run(args: FitArgs) -> ExitCode {
    match report(&args) {
        Ok(report) => match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Err(e) => fail(e),
    }
}

fn report(args: &FitArgs) -> Result<Report, String> {
    let file = ModelFile::open(&args.model).map_err(|e| e.to_string())?;
    let model = Model::load(&file).map_err(|e| e.to_string())?;
    let tokenizer = Tokenizer::load(&file).map_err(|e| format!("{}: {e}", args.model.display()))?;
    engine::chat::ChatTemplate::for_model(&file, &tokenizer, None)?;
    let mut file_bytes = file.bytes().len() as u64;
    if let Some(path) = &args.model_draft {
        let head_file = ModelFile::open(path).map_err(|e| e.to_string())?;
        DraftHead::load(&head_file, &model).map_err(|e| format!("{}: {e}", path.display()))?;
        file_bytes += head_file.bytes().len() as u64;
    }
    let h = &model.hparams;
    let context = args.ctx_size.unwrap_or(h.train_context.min(8192));
    let need = Need::of(&model, file_bytes, context, args.cache_mib)?;
    let boards = args
        .boards_gib
        .iter()
        .map(|&gib| {
            let limit_bytes = (gib << 30).saturating_sub(args.reserve_mib << 20);
            let fits_at = |c: usize| {
                Need::of(&model, file_bytes, c, args.cache_mib)
                    .is_ok_and(|n| n.fits(&Limit::given(limit_bytes >> 20)).is_ok())
            };
            // The need grows with the context: the longest that fits, by bisection.
            let (mut low, mut high) = (0usize, h.train_context);
            while low < high {
                let mid = low + (high - low).div_ceil(2);
                if fits_at(mid) {
                    low = mid;
                } else {
                    high = mid - 1;
                }
            }
            Board {
                memory_gib: gib,
                limit_bytes,
                fits: fits_at(context),
                max_context: low as u64,
            }
        })
        .collect();
    Ok(Report {
        architecture: format!("{:?}", h.arch),
        file_bytes,
        trained_context: h.train_context as u64,
        context: context as u64,
        need_bytes: need.total(),
        boards,
    })
}
