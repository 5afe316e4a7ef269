//! `engine generate`: a continuation of the prompt, streamed to stdout as it is sampled, or
//! one JSON object at the end.

use std::io::Write as _;
use std::process::ExitCode;

use engine::chat::{ChatTemplate, Message};
use engine::model::{DraftHead, Model};
use engine::sampler::{Sampler, Sampling};
use engine::speculate::Source;
use engine::tokenizer::{TextStream, Tokenizer};

use super::{available_cpus, fail, memory_limit_of, open};
use crate::{GenerateArgs, Spec};

/// What `engine generate` produced.
struct Generated {
    ids: Vec<u32>,
    tokens: Vec<u32>,
    stop: engine::generate::Stop,
    text: String,
    /// Tokens drafted and accepted, when speculating.
    drafts: Option<(usize, usize)>,
}

/// Generates from the model given or installed.
pub fn run(args: GenerateArgs) -> ExitCode {
    let GenerateArgs {
        model,
        installed,
        data,
        prompt,
        n_predict,
        temp,
        seed,
        chat,
        spec,
        model_draft,
        threads,
        ctx_size,
        json,
        memory_limit,
    } = args;
    let asked = Spec::asked(spec, model_draft.as_deref());
    let head_file = match model_draft
        .as_deref()
        .filter(|_| asked == Some(Source::Mtp))
    {
        Some(path) => match open(path) {
            Ok(f) => Some(f),
            Err(code) => return code,
        },
        None => None,
    };
    let model = match (model, installed) {
        (Some(model), _) => model,
        (None, id) => match engine::installed::resolve(&data, id.flatten().as_deref()) {
            Ok(model) => model,
            Err(e) => return fail(e),
        },
    };
    let file = match open(&model) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let threads = threads.unwrap_or_else(available_cpus);
    let run = || -> Result<Generated, String> {
        let tok = Tokenizer::load(&file).map_err(|e| format!("{}: {e}", model.display()))?;
        let m = Model::load(&file).map_err(|e| e.to_string())?;
        if let Some(limit) = memory_limit_of(memory_limit) {
            engine::memory::Need::of(&m, file.bytes().len() as u64, ctx_size, 0)?.fits(&limit)?;
        }
        let ids = if chat {
            ChatTemplate::from_model(&file, &tok)?
                .prompt_ids(&tok, &[Message::new("user", &prompt)])?
        } else {
            tok.encode(&prompt, true)
        };
        let mut sampler = Sampler::new(Sampling {
            temperature: temp,
            seed,
            ..Sampling::default()
        });
        let mut stream = TextStream::new();
        let mut text = String::new();
        let mut stdout = std::io::stdout();
        let mut show = |token: u32| {
            let piece = stream.push(&tok.token_bytes(token));
            if !json {
                let _ = write!(stdout, "{piece}");
                let _ = stdout.flush();
            }
            text.push_str(&piece);
        };
        let own = DraftHead::nextn(&m);
        let source = Source::chosen(asked, head_file.is_some() || own.is_some());
        let head = match (&head_file, source) {
            (Some(f), _) => Some(DraftHead::load(f, &m).map_err(|e| e.to_string())?),
            (None, Source::Mtp) => Some(own.ok_or(engine::server::NO_DRAFT_SOURCE)?),
            (None, _) => None,
        };
        let mut speculation = (source != Source::None).then(|| {
            engine::speculate::Speculation::new(
                engine::speculate::MAX_DRAFT,
                0,
                engine::speculate::Costs::prior(),
            )
        });
        let (tokens, stop) = engine::generate::generate(
            &m,
            &ids,
            engine::generate::Budget {
                limit: n_predict,
                context: ctx_size,
                threads,
            },
            &mut sampler,
            &tok.end_ids(&file),
            speculation.as_mut(),
            head.as_ref(),
            &mut show,
        )?;
        // A character the limit cut in half is not text: it is dropped, not shown as U+FFFD.
        stream.finish();
        if !json {
            println!();
        }
        let drafts = speculation.map(|s| s.drafts());
        Ok(Generated {
            ids,
            tokens,
            stop,
            text,
            drafts,
        })
    };
    match run() {
        Ok(Generated {
            ids,
            tokens,
            stop,
            text,
            drafts,
        }) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "prompt_tokens": ids, "tokens": tokens, "text": text, "stop": stop,
                        "draft_n": drafts.map(|d| d.0), "draft_n_accepted": drafts.map(|d| d.1),
                    })
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
