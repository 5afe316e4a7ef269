//! `engine bench`: the library's timing runs, printed as a table like llama-bench's or as its
//! JSON rows.

use std::path::Path;
use std::process::ExitCode;

use engine::chat::{ChatTemplate, Message};
use engine::model::{DraftHead, Model};
use engine::model_file::ModelFile;
use engine::tokenizer::Tokenizer;

use super::{available_cpus, fail, open};
use crate::{BenchArgs, Spec};

/// Runs the timing runs asked for and prints their rows.
pub fn run(args: BenchArgs) -> ExitCode {
    let BenchArgs {
        model,
        prompt,
        generate,
        depths,
        threads,
        repetitions,
        batch,
        json,
        spec,
        spec_prompt,
        model_draft,
    } = args;
    let file = match open(&model) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let loaded = match Model::load(&file) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    let head_file = match model_draft.as_deref().map(open).transpose() {
        Ok(f) => f,
        Err(code) => return code,
    };
    let head = match head_file
        .as_ref()
        .map(|f| DraftHead::load(f, &loaded))
        .transpose()
    {
        Ok(head) => head,
        Err(e) => return fail(e),
    };
    // Without a head file, `--spec mtp` times the model's own nextn layer.
    let head = match (head, spec) {
        (None, Spec::Mtp) => match DraftHead::nextn(&loaded) {
            Some(head) => Some(head),
            None => return fail(engine::server::NO_DRAFT_SOURCE),
        },
        (head, _) => head,
    };
    let speculation = match spec {
        Spec::None => None,
        Spec::Mtp if batch.is_empty() => {
            return fail(
                "engine bench times n-gram speculation (--spec ngram); a draft \
                 source's steps and the depth the planner picks for it are timed with \
                 --batch 1,2,3,4,5 (and --model-draft FILE, or --spec mtp for a model's \
                 own nextn layer)",
            );
        }
        Spec::Mtp => None,
        Spec::Ngram => match bench_chat(&file, &model, spec_prompt.as_deref()) {
            Ok(ids) => Some(ids),
            Err(e) => return fail(e),
        },
    };
    let threads = if threads.is_empty() {
        vec![available_cpus()]
    } else {
        threads
    };
    let plan = engine::bench::Plan {
        prompts: prompt,
        generate,
        depths,
        threads,
        repetitions,
        batches: batch,
        speculation,
    };
    let rows = match engine::bench::run(&loaded, head.as_ref(), &plan) {
        Ok(rows) => rows,
        Err(e) => return fail(e),
    };
    let peak = engine::memory::peak_rss()
        .map(|b| format!("peak RSS: {:.1} MiB", b as f64 / f64::from(1 << 20)));
    if json {
        println!("{}", serde_json::json!(rows));
        if let Some(peak) = &peak {
            eprintln!("{peak}");
        }
    } else {
        let name = model
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        println!(
            "| model | threads | test | t/s | ms/pass | accepted / drafted |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |"
        );
        for row in &rows {
            let ms = match (&row.avg_ms, &row.passes) {
                (Some(m), _) => format!("{m:.2}"),
                (None, Some(passes)) => engine::bench::loop_summary(passes),
                (None, None) => String::new(),
            };
            let drafts = row
                .drafts
                .map(|(drafted, accepted)| format!("{accepted} / {drafted}"))
                .unwrap_or_default();
            println!(
                "| {name} | {} | {} | {:.2} ± {:.2} | {ms} | {drafts} |",
                row.n_threads,
                row.test_name(),
                row.avg_ts,
                row.stddev_ts
            );
        }
        print_planner_depths(&rows, &plan.threads);
        if let Some(peak) = &peak {
            println!("\n{peak}");
        }
    }
    ExitCode::SUCCESS
}

/// The depth the planner picks for a draft head from the rows' timed passes and head steps,
/// per thread count, at acceptance rates 0.5 to 0.9 (nothing without a head row).
fn print_planner_depths(rows: &[engine::bench::Row], threads: &[usize]) {
    const RATES: [f64; 5] = [0.5, 0.6, 0.7, 0.8, 0.9];
    let table: Vec<(usize, Vec<usize>)> = threads
        .iter()
        .filter_map(|&t| Some((t, engine::bench::planner_depths(rows, t, &RATES)?)))
        .collect();
    if table.is_empty() {
        return;
    }
    let header: Vec<String> = RATES.iter().map(|r| format!("{r:.1}")).collect();
    println!(
        "\nDraft depth the planner picks, by acceptance rate:\n\n| threads | {} |\n| ---: |{}",
        header.join(" | "),
        " ---: |".repeat(RATES.len())
    );
    for (t, depths) in table {
        let cells: Vec<String> = depths.iter().map(ToString::to_string).collect();
        println!("| {t} | {} |", cells.join(" | "));
    }
}

/// What `engine bench --spec` asks when no prompt is given: an answer that is mostly quoted.
const QUOTING_PROMPT: &str = "Discharge summary. Patient: Maria Keller, born 1958-04-17, admitted \
2026-11-20 with community-acquired pneumonia of the right lower lobe. Treatment: \
amoxicillin-clavulanate 875/125 mg twice daily for seven days, oxygen by nasal cannula for the \
first two days. Course: fever settled on day three; CRP fell from 148 to 22 mg/L. Discharged \
2026-11-26 in good condition. Follow-up: chest X-ray in six weeks at the Lindenstrasse practice; \
see the GP within one week.\n\nQuote the treatment and the follow-up sentences of this summary \
word for word.";

/// The token ids of a one-message chat for `engine bench --spec`: the text of `prompt` (or
/// the built-in quoting request) rendered with the model's chat template.
fn bench_chat(file: &ModelFile, model: &Path, prompt: Option<&Path>) -> Result<Vec<u32>, String> {
    let text = match prompt {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("--spec-prompt {}: {e}", path.display()))?,
        None => QUOTING_PROMPT.to_string(),
    };
    let tok = Tokenizer::load(file).map_err(|e| format!("{}: {e}", model.display()))?;
    ChatTemplate::from_model(file, &tok)?.prompt_ids(&tok, &[Message::new("user", &text)])
}
