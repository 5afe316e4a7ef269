//! The live view: a sample of temperature, clock and decode speed every few seconds, kept for
//! an hour, and server-sent events carrying every overview value and the redrawn charts.
//! One sampler renders each update once, however many browsers watch.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;
use tokio::sync::watch;
use wire::Status;

use crate::charts::{self, Series};
use crate::fields::{self, Field};

/// The charts' time span.
pub const WINDOW_MS: u64 = 3_600_000;
/// Points drawn per chart at most: more than the chart has pixels only makes every update
/// bigger (an hour at one sample a second would be 3600).
pub const CHART_POINTS: usize = 300;
/// Engine log lines the overview shows.
pub const LOG_LINES: usize = 40;

/// One reading.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    /// Counts up by one per sample since the daemon started.
    pub seq: u64,
    /// When, in Unix milliseconds.
    pub unix_ms: u64,
    /// SoC temperature.
    pub temperature_c: Option<f64>,
    /// CPU clock.
    pub cpu_mhz: Option<u64>,
    /// The engine's recent decode speed.
    pub decode_tokens_per_second: Option<f64>,
}

/// The last hour of samples.
#[derive(Debug)]
pub struct History {
    samples: VecDeque<Sample>,
    capacity: usize,
    next_seq: u64,
}

impl History {
    /// Room for one hour at one sample every `interval_s` seconds.
    pub fn new(interval_s: u64) -> History {
        let capacity = (WINDOW_MS / 1000 / interval_s.max(1)) as usize + 1;
        History {
            samples: VecDeque::with_capacity(capacity),
            capacity,
            next_seq: 1,
        }
    }

    /// Records the readings in a status document taken at `unix_ms`.
    pub fn record(&mut self, status: &Status, unix_ms: u64) -> Sample {
        let sample = Sample {
            seq: self.next_seq,
            unix_ms,
            temperature_c: status.board.temperature_c,
            cpu_mhz: status.board.cpu_mhz,
            decode_tokens_per_second: status.engine.decode_tokens_per_second,
        };
        self.next_seq += 1;
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        sample
    }

    /// The newest sample's number (0 before the first).
    pub fn seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// The three charts: (element name, title, SVG).
    pub fn charts(&self, now_ms: u64) -> Vec<(&'static str, &'static str, String)> {
        let stride = self.samples.len().div_ceil(CHART_POINTS).max(1);
        let last = self.samples.len().saturating_sub(1);
        let series = |pick: fn(&Sample) -> Option<f64>| -> Vec<(u64, Option<f64>)> {
            self.samples
                .iter()
                .enumerate()
                // Counted from the newest, so the latest sample is always drawn.
                .filter(|(i, _)| (last - i).is_multiple_of(stride))
                .map(|(_, s)| (s.unix_ms, pick(s)))
                .collect()
        };
        let draw = |title, unit, points| {
            charts::render(
                &Series {
                    title,
                    unit,
                    points,
                },
                now_ms,
                WINDOW_MS,
            )
        };
        vec![
            (
                "temperature",
                "Temperature (°C)",
                draw("Temperature", "°C", series(|s| s.temperature_c)),
            ),
            (
                "clock",
                "CPU clock (MHz)",
                draw("CPU clock", "MHz", series(|s| s.cpu_mhz.map(|m| m as f64))),
            ),
            (
                "decode",
                "Decode speed (tokens/s)",
                draw(
                    "Decode speed",
                    "tok/s",
                    series(|s| s.decode_tokens_per_second),
                ),
            ),
        ]
    }
}

/// What one server-sent event carries.
#[derive(Debug, Serialize)]
pub struct Update<'a> {
    /// The sample this update belongs to.
    pub sample: Sample,
    /// Every overview value by element id.
    pub fields: &'a [Field],
    /// Redrawn charts by element name.
    pub charts: Vec<(&'static str, String)>,
}

/// Takes a sample from a fresh status document and renders the update every browser gets.
pub fn update(
    history: &mut History,
    status: &Status,
    engine_log: &[String],
    unix_ms: u64,
) -> String {
    let sample = history.record(status, unix_ms);
    let fields = fields::fields(status, engine_log);
    let charts = history
        .charts(unix_ms)
        .into_iter()
        .map(|(name, _, svg)| (name, svg))
        .collect();
    serde_json::to_string(&Update {
        sample,
        fields: &fields,
        charts,
    })
    .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode the update: {e}\"}}"))
}

/// The event stream for one browser: the latest update at once, then each new one, for as
/// long as `allowed` holds (the session that opened it has not logged out or expired).
pub fn stream(
    updates: watch::Receiver<Arc<String>>,
    allowed: impl Fn() -> bool + Send + Sync + 'static,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut updates = updates;
    updates.mark_changed();
    let allowed = Arc::new(allowed);
    let events = futures_util::stream::unfold(updates, move |mut rx| {
        let allowed = Arc::clone(&allowed);
        async move {
            rx.changed().await.ok()?;
            if !allowed() {
                return None;
            }
            let data = rx.borrow_and_update().clone();
            Some((Ok(Event::default().event("update").data(data.as_str())), rx))
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::test_status;
    use serde_json::{Value, json};

    #[test]
    fn history_keeps_one_hour_and_numbers_samples() {
        let mut history = History::new(60);
        assert_eq!(history.capacity, 61);
        for i in 0..100u64 {
            let status = test_status(json!({
                "board": { "temperature_c": 40.0 + i as f64, "cpu_mhz": 2400 },
                "engine": { "state": "ready", "decode_tokens_per_second": null }
            }));
            history.record(&status, i * 60_000);
        }
        assert_eq!(history.seq(), 100);
        assert_eq!(history.samples.len(), 61);
        assert_eq!(history.samples.front().map(|s| s.seq), Some(40));
        let update: Value = serde_json::from_str(&update(
            &mut history,
            &test_status(json!({})),
            &[],
            100 * 60_000,
        ))
        .expect("json");
        assert_eq!(update["sample"]["seq"], 101);
        assert_eq!(update["charts"].as_array().map(Vec::len), Some(3));
        assert!(
            update["fields"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["id"] == "v-temp"))
        );
    }

    #[test]
    fn charts_draw_at_most_chart_points_and_always_the_newest() {
        let mut history = History::new(1);
        for i in 0..3600u64 {
            let status = test_status(json!({ "board": { "temperature_c": i as f64 } }));
            history.record(&status, i * 1000);
        }
        let charts = history.charts(3_599_000);
        let points = charts[0].2.matches(',').count();
        assert!(
            (CHART_POINTS / 2..=CHART_POINTS).contains(&points),
            "{points}"
        );
        assert!(
            charts[0].2.contains("3599.0 °C"),
            "the newest reading is drawn"
        );
    }
}
