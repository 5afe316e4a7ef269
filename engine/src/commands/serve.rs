//! `engine serve`: the files its flags name read, then the library's server until it stops.

use std::process::ExitCode;

use super::{available_cpus, fail, memory_limit_of};
use crate::{ServeArgs, Spec};

/// Serves the model until shut down.
pub fn run(args: ServeArgs) -> ExitCode {
    let ServeArgs {
        model,
        host,
        port,
        threads,
        ctx_size,
        queue,
        api_key,
        control_key,
        control_socket,
        system_prompt,
        alias,
        cache_mib,
        n_predict,
        temp,
        top_p,
        top_k,
        min_p,
        seed,
        chat_template_file,
        reasoning,
        reasoning_format,
        reasoning_budget,
        cors_origins,
        slots,
        tags,
        verbose,
        context_shift,
        spec,
        model_draft,
        memory_limit,
    } = args;
    let asked = Spec::asked(spec, model_draft.as_deref());
    let chat_template = match chat_template_file.map(|p| {
        std::fs::read_to_string(&p)
            .map_err(|e| format!("--chat-template-file {}: {e}", p.display()))
    }) {
        Some(Err(e)) => return fail(e),
        Some(Ok(text)) => Some(text),
        None => None,
    };
    let system_prompt = match system_prompt.map(|p| {
        std::fs::read_to_string(&p)
            .map(|t| t.trim_end().to_string())
            .map_err(|e| format!("--system-prompt {}: {e}", p.display()))
    }) {
        Some(Err(e)) => return fail(e),
        Some(Ok(text)) => Some(text).filter(|t| !t.is_empty()),
        None => None,
    };
    match engine::server::serve(engine::server::ServeConfig {
        model,
        listen: std::net::SocketAddr::new(host, port),
        threads: threads.unwrap_or_else(available_cpus),
        context: ctx_size,
        queue: usize::from(queue),
        api_key: api_key.filter(|k| !k.is_empty()),
        control_key: control_key.filter(|k| !k.is_empty()),
        control_socket,
        system_prompt,
        model_id: alias,
        cache_mib,
        defaults: engine::server::request::Defaults {
            max_tokens: usize::try_from(n_predict).ok(),
            temperature: temp,
            top_p,
            top_k,
            min_p,
            seed: u64::try_from(seed).ok(),
            thinking: reasoning,
            reasoning_format,
            reasoning_budget: usize::try_from(reasoning_budget).ok(),
        },
        chat_template,
        cors: cors_origins,
        slots,
        tags,
        verbose,
        context_shift,
        speculation: asked,
        model_draft,
        memory_limit: memory_limit_of(memory_limit),
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
