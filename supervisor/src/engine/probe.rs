//! Talking to the engine over loopback HTTP: readiness (`/health`) and the health probe.
//! Blocking calls, run off the async runtime.
//!
//! A busy engine is a healthy engine: while it generates, the probe's own completion would wait
//! behind the user's answer, so then progress (`tokens_processed` growing between probes) is the
//! proof of life; only an idle engine is asked for a one-token completion.

use std::time::Duration;

use serde::Deserialize;

/// The engine's answer to `/health`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Health {
    /// A request is being generated right now.
    #[serde(default)]
    pub busy: bool,
    /// Tokens evaluated or generated since the engine started: grows while it works.
    #[serde(default)]
    pub tokens_processed: u64,
    /// Its recent speeds.
    #[serde(default)]
    pub speeds: Speeds,
}

/// The engine's recent speeds (`/health` → `speeds`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Speeds {
    /// Prompt tokens per second.
    pub prefill_tokens_per_second: Option<f64>,
    /// Generated tokens per second.
    pub decode_tokens_per_second: Option<f64>,
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into()
}

/// `GET /health`: `Ok` once the model is loaded (200), `Err` with why not otherwise.
pub fn health(port: u16, timeout: Duration) -> Result<Health, String> {
    let url = format!("http://127.0.0.1:{port}/health");
    let mut response = agent(timeout)
        .get(&url)
        .call()
        .map_err(|e| format!("{url}: {e}"))?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("{url}: {e}"))?;
    if status != 200 {
        return Err(format!("{url} answered {status}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{url}: unexpected answer: {e}"))
}

/// A one-token greedy completion: the engine is healthy only if it can still generate.
pub fn complete_one_token(port: u16, timeout: Duration) -> Result<(), String> {
    let url = format!("http://127.0.0.1:{port}/completion");
    let body = r#"{"prompt":"Hello","n_predict":1,"temperature":0}"#;
    let mut response = agent(timeout)
        .post(&url)
        .header("content-type", "application/json")
        .send(body)
        .map_err(|e| format!("{url}: {e}"))?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("{url}: {e}"))?;
    if status != 200 {
        return Err(format!("{url} answered {status}: {}", text.trim()));
    }
    let answer: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{url}: unexpected answer: {e}"))?;
    match answer.get("tokens_predicted").and_then(|n| n.as_u64()) {
        Some(_) => Ok(()),
        None => Err(format!("{url}: no tokens_predicted in the answer")),
    }
}

/// One health probe. `previous` is what the last successful probe saw: a busy engine must have
/// processed tokens since then. An idle one must complete a token within `timeout`; when that
/// completion fails but the engine processed tokens meanwhile (a user's request arrived first
/// and the probe's waited behind it, or the queue was full), it is busy, not dead.
pub fn check(port: u16, timeout: Duration, previous: Option<&Health>) -> Result<Health, String> {
    let before = health(port, timeout)?;
    if before.busy {
        return match previous {
            Some(p) if p.busy && before.tokens_processed <= p.tokens_processed => Err(format!(
                "busy, but no token processed since the last probe ({} in all)",
                before.tokens_processed
            )),
            _ => Ok(before),
        };
    }
    match complete_one_token(port, timeout) {
        Ok(()) => health(port, timeout),
        Err(e) => {
            let after = health(port, timeout)?;
            if after.tokens_processed > before.tokens_processed {
                Ok(after)
            } else {
                Err(e)
            }
        }
    }
}
