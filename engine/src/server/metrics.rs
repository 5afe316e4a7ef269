//! `GET /metrics`: the engine's counters in Prometheus' text format. llama.cpp's names where
//! it has them (`llamacpp:prompt_tokens_total`, `llamacpp:requests_processing`, …), so its
//! dashboards work unchanged; beyond them, `engine_`-prefixed latency histograms (time to
//! first token, time between tokens), the live decode rate and the prefix cache's use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use metrics_text::{Exposition, Histogram};

use super::AppState;
use super::worker::Summary;

/// Bucket bounds of the time to first token, in seconds (a Pi's prefill spans 0.05–30 s).
const FIRST_TOKEN_BOUNDS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Bucket bounds of the time between tokens, in seconds.
const NEXT_TOKEN_BOUNDS: &[f64] = &[0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0];

/// What the generation thread records as it works; read by `/metrics` without waiting for it.
pub struct Metrics {
    prompt_tokens: AtomicU64,
    prompt_micros: AtomicU64,
    predicted_tokens: AtomicU64,
    predicted_micros: AtomicU64,
    cached_tokens: AtomicU64,
    passes: AtomicU64,
    requests_finished: AtomicU64,
    requests_failed: AtomicU64,
    kv_tokens: AtomicU64,
    max_tokens_seen: AtomicU64,
    prefix_cache_bytes: AtomicU64,
    prefix_caches: AtomicU64,
    drafts: AtomicU64,
    drafted_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
    tool_requests: AtomicU64,
    tool_calls: AtomicU64,
    tool_call_failures: AtomicU64,
    first_token: Histogram,
    next_token: Histogram,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            prompt_tokens: AtomicU64::new(0),
            prompt_micros: AtomicU64::new(0),
            predicted_tokens: AtomicU64::new(0),
            predicted_micros: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            requests_finished: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            kv_tokens: AtomicU64::new(0),
            max_tokens_seen: AtomicU64::new(0),
            prefix_cache_bytes: AtomicU64::new(0),
            prefix_caches: AtomicU64::new(0),
            drafts: AtomicU64::new(0),
            drafted_tokens: AtomicU64::new(0),
            accepted_tokens: AtomicU64::new(0),
            tool_requests: AtomicU64::new(0),
            tool_calls: AtomicU64::new(0),
            tool_call_failures: AtomicU64::new(0),
            first_token: Histogram::new(FIRST_TOKEN_BOUNDS),
            next_token: Histogram::new(NEXT_TOKEN_BOUNDS),
        }
    }
}

fn micros(ms: f64) -> u64 {
    (ms * 1e3).max(0.0) as u64
}

impl Metrics {
    /// A model pass ran; the sequence now holds `tokens` tokens.
    pub fn pass(&self, tokens: usize) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.kv_tokens.store(tokens as u64, Ordering::Relaxed);
        self.max_tokens_seen
            .fetch_max(tokens as u64, Ordering::Relaxed);
    }

    /// A request's first token came, `waited` after it arrived.
    pub fn first_token(&self, waited: Duration) {
        self.first_token.observe(waited.as_secs_f64());
    }

    /// A later token came, `gap` after the one before.
    pub fn next_token(&self, gap: Duration) {
        self.next_token.observe(gap.as_secs_f64());
    }

    /// A choice finished; the prefix cache now holds `cache_bytes` in `caches` caches.
    pub fn finished(&self, summary: &Summary, cache_bytes: usize, caches: usize) {
        let add = |counter: &AtomicU64, n: u64| counter.fetch_add(n, Ordering::Relaxed);
        add(&self.prompt_tokens, summary.timings.prompt_n as u64);
        add(&self.prompt_micros, micros(summary.timings.prompt_ms));
        add(&self.predicted_tokens, summary.timings.predicted_n as u64);
        add(&self.predicted_micros, micros(summary.timings.predicted_ms));
        add(&self.cached_tokens, summary.timings.cache_n as u64);
        add(&self.requests_finished, 1);
        self.prefix_cache_bytes
            .store(cache_bytes as u64, Ordering::Relaxed);
        self.prefix_caches.store(caches as u64, Ordering::Relaxed);
    }

    /// A choice's speculation drafted `drafted` tokens, of which `accepted` were kept.
    pub fn drafts(&self, drafted: usize, accepted: usize) {
        if drafted > 0 {
            self.drafts.fetch_add(1, Ordering::Relaxed);
        }
        self.drafted_tokens
            .fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted_tokens
            .fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// A generation failed.
    pub fn failed(&self) {
        self.requests_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// The tool-call counters, for `/health` (the supervisor's status reads them there).
    pub fn tool_calls(&self) -> serde_json::Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "answers": get(&self.tool_requests),
            "calls": get(&self.tool_calls),
            "failures": get(&self.tool_call_failures),
        })
    }

    /// A chat offering tools was answered with `calls` calls, `broken` more begun but given
    /// back as text (malformed, of no callable tool, or cut off).
    pub fn tool_answer(&self, calls: usize, broken: usize) {
        self.tool_requests.fetch_add(1, Ordering::Relaxed);
        self.tool_calls.fetch_add(calls as u64, Ordering::Relaxed);
        self.tool_call_failures
            .fetch_add(broken as u64, Ordering::Relaxed);
    }
}

/// `GET /metrics` (behind the API key, like every endpoint but `/health`).
pub async fn serve(State(state): State<AppState>) -> Response {
    let body = render(&state);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

fn render(state: &AppState) -> String {
    let m = &state.metrics;
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64;
    let seconds = |counter: &AtomicU64| get(counter) / 1e6;
    let mut out = Exposition::new();
    out.counter(
        "llamacpp:prompt_tokens_total",
        "Prompt tokens evaluated (not taken from the prefix cache).",
        get(&m.prompt_tokens),
    );
    out.counter(
        "llamacpp:prompt_seconds_total",
        "Seconds spent evaluating prompts.",
        seconds(&m.prompt_micros),
    );
    out.counter(
        "llamacpp:tokens_predicted_total",
        "Tokens generated.",
        get(&m.predicted_tokens),
    );
    out.counter(
        "llamacpp:tokens_predicted_seconds_total",
        "Seconds spent generating.",
        seconds(&m.predicted_micros),
    );
    out.counter(
        "llamacpp:prompt_tokens_cached_total",
        "Prompt tokens taken from the prefix cache instead of evaluated.",
        get(&m.cached_tokens),
    );
    out.counter(
        "llamacpp:n_decode_total",
        "Model passes (a prompt slice or one generated token each).",
        get(&m.passes),
    );
    out.counter(
        "engine_tool_call_answers_total",
        "Chat answers to requests that offered tools.",
        get(&m.tool_requests),
    );
    out.counter(
        "engine_tool_calls_total",
        "Tool calls answered.",
        get(&m.tool_calls),
    );
    out.counter(
        "engine_tool_call_failures_total",
        "Tool calls a model began that were malformed, of no callable tool, or cut off, and \
         were given back as text.",
        get(&m.tool_call_failures),
    );
    let rate = |tokens: &AtomicU64, us: &AtomicU64| {
        let s = seconds(us);
        if s > 0.0 { get(tokens) / s } else { 0.0 }
    };
    out.gauge(
        "llamacpp:prompt_tokens_seconds",
        "Average prompt throughput, tokens per second.",
        rate(&m.prompt_tokens, &m.prompt_micros),
    );
    out.gauge(
        "llamacpp:predicted_tokens_seconds",
        "Average generation throughput, tokens per second.",
        rate(&m.predicted_tokens, &m.predicted_micros),
    );
    let (busy, queued, context, speeds) = match state.ready.get() {
        Some(r) => {
            let a = r.worker.activity();
            (
                u8::from(a.busy),
                a.queued,
                r.context,
                Some(r.worker.speeds()),
            )
        }
        None => (0, 0, 0, None),
    };
    out.gauge(
        "llamacpp:n_busy_slots_per_decode",
        "Sequences per model pass: one, as this engine runs one generation at a time.",
        if get(&m.passes) > 0.0 { 1.0 } else { 0.0 },
    );
    out.gauge(
        "llamacpp:requests_processing",
        "Requests being generated now.",
        f64::from(busy),
    );
    out.gauge(
        "llamacpp:requests_deferred",
        "Requests waiting in the queue.",
        queued as f64,
    );
    out.gauge(
        "llamacpp:n_tokens_max",
        "Longest sequence held so far, in tokens.",
        get(&m.max_tokens_seen),
    );
    out.gauge(
        "llamacpp:kv_cache_tokens",
        "Tokens in the running (or last) sequence's KV cache.",
        get(&m.kv_tokens),
    );
    if context > 0 {
        out.gauge(
            "llamacpp:kv_cache_usage_ratio",
            "The running (or last) sequence's share of the context.",
            get(&m.kv_tokens) / context as f64,
        );
        out.gauge(
            "engine_context_tokens",
            "The context per conversation.",
            context as f64,
        );
    }
    if let Some(s) = speeds {
        if let Some(rate) = s.decode_tokens_per_second {
            out.gauge(
                "engine_decode_tokens_per_second",
                "Generation speed of the latest request with at least 16 tokens.",
                rate,
            );
        }
        if let Some(rate) = s.prefill_tokens_per_second {
            out.gauge(
                "engine_prefill_tokens_per_second",
                "Prompt speed of the latest request with at least 16 prompt tokens.",
                rate,
            );
        }
    }
    out.counter(
        "engine_requests_finished_total",
        "Choices generated to their end.",
        get(&m.requests_finished),
    );
    out.counter(
        "engine_requests_failed_total",
        "Generations that failed.",
        get(&m.requests_failed),
    );

    out.gauge(
        "engine_prefix_cache_bytes",
        "Memory held by kept conversation caches.",
        get(&m.prefix_cache_bytes),
    );
    out.gauge(
        "engine_prefix_cache_entries",
        "Conversation caches kept.",
        get(&m.prefix_caches),
    );
    out.counter(
        "llamacpp:spec_decode_num_drafts_total",
        "Choices that drafted tokens by speculation.",
        get(&m.drafts),
    );
    out.counter(
        "llamacpp:spec_decode_num_draft_tokens_total",
        "Tokens drafted by speculation.",
        get(&m.drafted_tokens),
    );
    out.counter(
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "Drafted tokens the model confirmed.",
        get(&m.accepted_tokens),
    );
    out.histogram(
        "engine_time_to_first_token_seconds",
        "From a request's arrival to its first generated token.",
        &m.first_token,
    );
    out.histogram(
        "engine_inter_token_latency_seconds",
        "Between consecutive generated tokens of one answer.",
        &m.next_token,
    );
    out.finish()
}
