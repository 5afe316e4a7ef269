//! What one wide pass costs the one-token passes after it: a model's passes timed in rounds of
//! eight one-token passes, one pass of `WIDTH` tokens (every row's logits, as a speculative
//! check computes them) and twelve one-token passes, each of the twelve printed against the
//! mean of the last four before the wide pass. A timing of passes back to back (`engine bench
//! --batch`, the planner's calibration) cannot see this cost; a speculative answer pays it.
//! `pause:MS` in place of a width sleeps MS milliseconds where the wide pass would run: what any
//! break of that length in the stream of one-token passes costs the passes after it.
//!
//! Usage: `cargo run --release -p engine --example pass_aftermath -- MODEL.gguf THREADS
//! WIDTH|pause:MS [ROUNDS]` (WIDTH 1: no wide pass, the baseline; ROUNDS: 30).

use std::path::Path;
use std::time::{Duration, Instant};

use engine::model::{KvCache, Logits, Model};
use engine::model_file::ModelFile;

/// Positions prefilled before the rounds start (a short chat's prompt).
const PROMPT: usize = 200;
/// One-token passes after the wide one that are timed.
const AFTER: usize = 12;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: pass_aftermath MODEL.gguf THREADS WIDTH|pause:MS [ROUNDS]";
    let number = |i: usize, default: Option<usize>| -> Result<usize, String> {
        match (args.get(i), default) {
            (Some(text), _) => text
                .parse()
                .map_err(|_| format!("{text:?} is not a number; {usage}")),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(usage.to_string()),
        }
    };
    let path = args.get(1).ok_or(usage)?;
    // With a pause the width is 1: no wide pass runs, only the sleep.
    let (width, pause) = match args.get(3).and_then(|a| a.strip_prefix("pause:")) {
        Some(ms) => {
            let ms: u64 = ms
                .parse()
                .map_err(|_| format!("{ms:?} is not a number of milliseconds; {usage}"))?;
            (1, Some(Duration::from_millis(ms)))
        }
        None => (number(3, None)?, None),
    };
    let (threads, rounds) = (number(2, None)?, number(4, Some(30))?);
    if !(1..=16).contains(&width) || rounds == 0 {
        return Err(format!(
            "WIDTH must be 1 to 16 and ROUNDS at least 1; {usage}"
        ));
    }
    let file = ModelFile::open(Path::new(path)).map_err(|e| e.to_string())?;
    let model = Model::load(&file).map_err(|e| e.to_string())?;
    let vocab = model.hparams.vocab as u32;
    let per_round = 8 + width + AFTER;
    let context = (PROMPT + per_round * 4).min(model.hparams.train_context);
    if context < PROMPT + per_round {
        return Err("the model's context is too short for a round".into());
    }
    let mut cache = KvCache::on_threads(&model.hparams, context, threads)?;
    // Ordinary ids spread over the vocabulary, as the calibration uses.
    let ids: Vec<u32> = (0..context as u32)
        .map(|t| t.wrapping_mul(7919).wrapping_add(11) % vocab)
        .collect();
    model.forward(&ids[..PROMPT], 0, &mut cache, Logits::Last)?;
    let mut pos = PROMPT;
    let step = |pos: &mut usize, cache: &mut KvCache| -> Result<f64, String> {
        let started = Instant::now();
        model.forward(&ids[*pos..*pos + 1], *pos, cache, Logits::Last)?;
        *pos += 1;
        Ok(started.elapsed().as_secs_f64())
    };
    let (mut before, mut after) = (0.0, [0.0f64; AFTER]);
    for _ in 0..rounds {
        // The cache is reused from the prompt on: rounds see the same range of positions.
        if pos + per_round > context {
            pos = PROMPT;
        }
        for i in 0..8 {
            let seconds = step(&mut pos, &mut cache)?;
            if i >= 4 {
                before += seconds / 4.0;
            }
        }
        if width > 1 {
            model.forward(&ids[pos..pos + width], pos, &mut cache, Logits::All)?;
        }
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
        for slot in &mut after {
            *slot += step(&mut pos, &mut cache)?;
        }
    }
    let before = before / rounds as f64;
    let ratios: Vec<String> = after
        .iter()
        .map(|s| format!("{:.3}", s / rounds as f64 / before))
        .collect();
    let between = match pause {
        Some(p) => format!("a pause of {} ms", p.as_millis()),
        None => format!("width {width}"),
    };
    println!(
        "threads {threads}, {between}: one-token pass {:.2} ms before; the {AFTER} after it, against that: {}",
        before * 1e3,
        ratios.join(" ")
    );
    Ok(())
}
