//! The Prometheus text exposition format, version 0.0.4: what a Prometheus server scrapes and
//! what `prometheus_client.parser.text_string_to_metric_families` reads.
//!
//! An [`Exposition`] is a string being built, one metric family after another: a `# HELP` line,
//! a `# TYPE` line, then the family's samples. Label values and help texts are escaped; values
//! are written so every parser reads them back exactly (integers without an exponent, `NaN`,
//! `+Inf`, `-Inf`). A [`Histogram`] counts observations into fixed buckets and can be shared
//! between threads; [`Exposition::histogram`] writes its cumulative buckets, sum and count.
//!
//! ```
//! use metrics_text::{Exposition, Histogram, Kind};
//!
//! let latency = Histogram::new(&[0.1, 0.5, 1.0]);
//! latency.observe(0.3);
//! let mut out = Exposition::new();
//! out.counter("llamacpp:prompt_tokens_total", "Prompt tokens processed.", 42.0);
//! out.gauge("temperature_celsius", "SoC temperature.", 48.25);
//! let mut steps = out.family(Kind::Gauge, "step", "One sample per step, its state a label.");
//! for name in ["governor", "swap"] {
//!     steps.sample(&[("step", name), ("state", "applied")], 1.0);
//! }
//! out.histogram("request_seconds", "Request latency.", &latency);
//! let text = out.finish();
//! assert!(text.contains("step{step=\"swap\",state=\"applied\"} 1\n"));
//! assert!(text.contains("request_seconds_bucket{le=\"+Inf\"} 1\n"));
//! ```
//!
//! A name that is not a valid metric or label name, a counter whose name does not end in
//! `_total` or a family written twice is a programming error: it fails a debug assertion, and in
//! a release build that family (or sample) is left out rather than making the whole exposition
//! unreadable.

use std::collections::HashSet;
use std::fmt::Write;
use std::sync::Mutex;

/// The `Content-Type` of an exposition in this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric family's type, for [`Exposition::family`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only ever goes up (or resets to zero when the process restarts). Its name ends in
    /// `_total`, and the `# TYPE` line and the samples use that same full name, as llama.cpp's
    /// `llamacpp:prompt_tokens_total` does; parsers that follow OpenMetrics call the family by
    /// the name without `_total`.
    Counter,
    /// A value that goes up and down.
    Gauge,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// An exposition being written: families in the order they are added.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    names: HashSet<String>,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// A counter (`name` ends in `_total`) with one sample and no labels.
    pub fn counter(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.family(Kind::Counter, name, help).sample(&[], value);
        self
    }

    /// A gauge with one sample and no labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.family(Kind::Gauge, name, help).sample(&[], value);
        self
    }

    /// A family with labelled samples, added one by one with [`Family::sample`] (e.g. in a
    /// loop over owned label values). Its `# HELP` and `# TYPE` lines are written with the first sample, so a family that gets
    /// none leaves no trace.
    pub fn family<'a>(&'a mut self, kind: Kind, name: &'a str, help: &'a str) -> Family<'a> {
        let valid = valid_metric_name(name) && (kind != Kind::Counter || name.ends_with("_total"));
        debug_assert!(
            valid,
            "{name:?} is not a valid {} name (counters end in _total)",
            kind.word()
        );
        Family {
            exposition: self,
            kind,
            name,
            help,
            state: if valid {
                FamilyState::Pending
            } else {
                FamilyState::Skipped
            },
        }
    }

    /// A histogram family `name` without labels: `name_bucket{le="..."}` for every bound and
    /// `+Inf`, counting cumulatively, then `name_sum` and `name_count`.
    pub fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) -> &mut Self {
        let valid = valid_metric_name(name);
        debug_assert!(valid, "{name:?} is not a valid histogram name");
        if !valid || !self.header(name, help, "histogram") {
            return self;
        }
        let snapshot = histogram.snapshot();
        for (bound, count) in &snapshot.buckets {
            let _ = write!(self.out, "{name}_bucket{{le=\"");
            write_value(&mut self.out, *bound);
            let _ = writeln!(self.out, "\"}} {count}");
        }
        let _ = write!(self.out, "{name}_sum ");
        write_value(&mut self.out, snapshot.sum);
        let _ = writeln!(self.out, "\n{name}_count {}", snapshot.count);
        self
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.out
    }

    /// The finished text.
    pub fn finish(self) -> String {
        self.out
    }

    /// Writes `# HELP` and `# TYPE` for a family not written before; `false` for a repeat.
    fn header(&mut self, name: &str, help: &str, kind: &str) -> bool {
        let fresh = self.names.insert(name.to_string());
        debug_assert!(fresh, "metric family {name:?} written twice");
        if !fresh {
            return false;
        }
        let _ = write!(self.out, "# HELP {name} ");
        escape_into(&mut self.out, help, false);
        let _ = writeln!(self.out, "\n# TYPE {name} {kind}");
        true
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FamilyState {
    /// Valid, no sample written yet (so no header either).
    Pending,
    /// Header written.
    Open,
    /// Invalid or a repeat: nothing of it is written.
    Skipped,
}

/// A counter or gauge family being written, from [`Exposition::family`].
#[derive(Debug)]
pub struct Family<'a> {
    exposition: &'a mut Exposition,
    kind: Kind,
    name: &'a str,
    help: &'a str,
    state: FamilyState,
}

impl Family<'_> {
    /// Adds one sample: `labels` as (name, value) pairs (values escaped here), and its value.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let labels_valid = labels.iter().enumerate().all(|(i, (label, _))| {
            valid_label_name(label) && labels[..i].iter().all(|(other, _)| other != label)
        });
        debug_assert!(
            labels_valid,
            "labels {labels:?} of {:?}: invalid or repeated label names",
            self.name
        );
        if !labels_valid {
            return self;
        }
        if self.state == FamilyState::Pending {
            self.state = if self
                .exposition
                .header(self.name, self.help, self.kind.word())
            {
                FamilyState::Open
            } else {
                FamilyState::Skipped
            };
        }
        if self.state != FamilyState::Open {
            return self;
        }
        let out = &mut self.exposition.out;
        out.push_str(self.name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (label, text)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(label);
                out.push_str("=\"");
                escape_into(out, text, true);
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        write_value(out, value);
        out.push('\n');
        self
    }
}

/// Whether `name` is a metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn valid_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// Whether `name` is a label name: `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved
/// for Prometheus itself).
pub fn valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with("__")
}

/// Appends `text` escaped: backslash and line feed always, the double quote in label values.
fn escape_into(out: &mut String, text: &str, label_value: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if label_value => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// A sample value as this format writes it: `NaN`, `+Inf`, `-Inf`, integers in plain digits
/// (`3`, not `3.0` or `3e0`), other values in the shortest form that reads back as the same
/// `f64` (an exponent only for very small or very large magnitudes).
pub fn format_value(value: f64) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: f64) {
    // Every integer-valued f64 below 2^63 converts to i64 exactly.
    const EXACT_I64: f64 = 9_223_372_036_854_775_808.0;
    if value.is_nan() {
        out.push_str("NaN");
    } else if value == f64::INFINITY {
        out.push_str("+Inf");
    } else if value == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else if value.fract() == 0.0 && value.abs() < EXACT_I64 {
        // `as i64` also writes -0.0 as 0.
        let _ = write!(out, "{}", value as i64);
    } else if value.abs() < 1e-4 || value.abs() >= EXACT_I64 {
        let _ = write!(out, "{value:e}");
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Observations counted into fixed buckets, with their sum: safe to share between threads
/// (`Arc<Histogram>`), observed by some while another writes an exposition.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds, increasing, finite or `-Inf`; the `+Inf` bucket is implicit.
    bounds: Vec<f64>,
    counts: Mutex<Counts>,
}

#[derive(Debug, Clone)]
struct Counts {
    /// Per bucket, not cumulative; one more than the bounds (the `+Inf` bucket).
    buckets: Vec<u64>,
    sum: f64,
}

/// A histogram's counts at one moment, consistent with each other.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// (upper bound, observations at most that bound), cumulative; the last bound is `+Inf`
    /// and its count is [`Snapshot::count`].
    pub buckets: Vec<(f64, u64)>,
    /// The sum of every observation.
    pub sum: f64,
    /// How many observations there were.
    pub count: u64,
}

impl Histogram {
    /// A histogram with these bucket upper bounds (an observation `v` counts in every bucket
    /// with `v <= bound`). The bounds are sorted and deduplicated; NaN and `+Inf` are dropped,
    /// since the `+Inf` bucket is always there.
    pub fn new(bounds: &[f64]) -> Histogram {
        let mut bounds: Vec<f64> = bounds
            .iter()
            .copied()
            .filter(|b| !b.is_nan() && *b != f64::INFINITY)
            .collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let buckets = vec![0; bounds.len() + 1];
        Histogram {
            bounds,
            counts: Mutex::new(Counts { buckets, sum: 0.0 }),
        }
    }

    /// The bucket upper bounds, without the implicit `+Inf`.
    pub fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    /// Counts one observation; a NaN is ignored (it has no bucket and would make the sum NaN).
    pub fn observe(&self, value: f64) {
        if value.is_nan() {
            return;
        }
        let bucket = self.bounds.partition_point(|b| *b < value);
        let mut counts = self.lock();
        if let Some(n) = counts.buckets.get_mut(bucket) {
            *n += 1;
        }
        counts.sum += value;
    }

    /// The counts now, cumulative per bucket.
    pub fn snapshot(&self) -> Snapshot {
        let counts = self.lock().clone();
        let mut total = 0;
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&counts.buckets)
            .map(|(bound, n)| {
                total += n;
                (bound, total)
            })
            .collect();
        Snapshot {
            buckets,
            sum: counts.sum,
            count: total,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counts are consistent after every statement, so a panic elsewhere while holding
        // the lock leaves nothing half-done.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_exactly() {
        for (value, text) in [
            (0.0, "0"),
            (-0.0, "0"),
            (3.0, "3"),
            (-17.0, "-17"),
            (48.25, "48.25"),
            (0.1, "0.1"),
            (2_400_000_000.0, "2400000000"),
            (9_007_199_254_740_993.0, "9007199254740992"),
            (1e18, "1000000000000000000"),
            (1e300, "1e300"),
            (1.5e-7, "1.5e-7"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
        ] {
            assert_eq!(format_value(value), text, "{value}");
        }
        for value in [
            0.1,
            1.0 / 3.0,
            1e-300,
            123_456.789,
            f64::MAX,
            f64::MIN_POSITIVE,
        ] {
            let text = format_value(value);
            assert_eq!(text.parse::<f64>().ok(), Some(value), "{text}");
        }
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut out = Exposition::new();
        out.family(Kind::Gauge, "x", "a \"quoted\" back\\slash\nand a new line")
            .sample(&[("path", "C:\\dir\n\"name\"")], 1.0);
        assert_eq!(
            out.as_str(),
            "# HELP x a \"quoted\" back\\\\slash\\nand a new line\n\
             # TYPE x gauge\n\
             x{path=\"C:\\\\dir\\n\\\"name\\\"\"} 1\n"
        );
    }

    #[test]
    fn counters_keep_their_total_name_and_families_follow_each_other() {
        let mut out = Exposition::new();
        out.counter("llamacpp:prompt_tokens_total", "Prompt tokens.", 42.0);
        out.family(Kind::Gauge, "up", "Serving.")
            .sample(&[("a", "1"), ("b", "2")], 1.0)
            .sample(&[("a", "3")], 0.0);
        out.gauge("temperature_celsius", "Temperature.", 48.25);
        assert_eq!(
            out.finish(),
            "# HELP llamacpp:prompt_tokens_total Prompt tokens.\n\
             # TYPE llamacpp:prompt_tokens_total counter\n\
             llamacpp:prompt_tokens_total 42\n\
             # HELP up Serving.\n\
             # TYPE up gauge\n\
             up{a=\"1\",b=\"2\"} 1\n\
             up{a=\"3\"} 0\n\
             # HELP temperature_celsius Temperature.\n\
             # TYPE temperature_celsius gauge\n\
             temperature_celsius 48.25\n"
        );
    }

    #[test]
    fn a_family_built_in_a_loop_writes_its_header_once() {
        let mut out = Exposition::new();
        let names = vec!["governor".to_string(), "swap".to_string()];
        let mut family = out.family(Kind::Gauge, "step", "Steps.");
        for name in &names {
            family.sample(&[("step", name)], 1.0);
        }
        assert_eq!(
            out.as_str(),
            "# HELP step Steps.\n# TYPE step gauge\nstep{step=\"governor\"} 1\nstep{step=\"swap\"} 1\n"
        );
        out.family(Kind::Gauge, "never", "No sample.");
        assert!(!out.as_str().contains("never"));
    }

    #[test]
    fn names_are_checked() {
        for ok in ["a", "_a", ":a", "llamacpp:prompt_tokens_total", "A9_:"] {
            assert!(valid_metric_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a-b", "a b", "a.b", "é"] {
            assert!(!valid_metric_name(bad), "{bad}");
        }
        for ok in ["a", "_a", "le", "A_9"] {
            assert!(valid_label_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a:b", "__name__", "a-b"] {
            assert!(!valid_label_name(bad), "{bad}");
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "counters end in _total")]
    fn a_counter_without_total_is_a_programming_error() {
        Exposition::new().counter("requests", "Requests.", 1.0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "written twice")]
    fn a_family_written_twice_is_a_programming_error() {
        let mut out = Exposition::new();
        out.gauge("x", "X.", 1.0);
        out.gauge("x", "X.", 2.0);
    }

    #[test]
    fn histograms_count_cumulatively() {
        let h = Histogram::new(&[1.0, 0.5, f64::INFINITY, 0.5, f64::NAN, 2.5]);
        assert_eq!(h.bounds(), &[0.5, 1.0, 2.5]);
        for v in [0.1, 0.5, 0.7, 1.0, 3.0, 100.0, f64::NAN] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(
            s.buckets,
            vec![(0.5, 2), (1.0, 4), (2.5, 4), (f64::INFINITY, 6)]
        );
        assert_eq!(s.count, 6);
        assert!((s.sum - 105.3).abs() < 1e-9, "{}", s.sum);

        let mut out = Exposition::new();
        out.histogram("latency_seconds", "Latency.", &h);
        assert_eq!(
            out.as_str(),
            format!(
                "# HELP latency_seconds Latency.\n\
                 # TYPE latency_seconds histogram\n\
                 latency_seconds_bucket{{le=\"0.5\"}} 2\n\
                 latency_seconds_bucket{{le=\"1\"}} 4\n\
                 latency_seconds_bucket{{le=\"2.5\"}} 4\n\
                 latency_seconds_bucket{{le=\"+Inf\"}} 6\n\
                 latency_seconds_sum {}\n\
                 latency_seconds_count 6\n",
                format_value(s.sum)
            )
        );
    }

    #[test]
    fn an_empty_histogram_still_has_its_inf_bucket() {
        let mut out = Exposition::new();
        out.histogram("h", "H.", &Histogram::new(&[]));
        assert_eq!(
            out.as_str(),
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 0\nh_sum 0\nh_count 0\n"
        );
    }

    #[test]
    fn histograms_are_shared_between_threads() {
        let h = std::sync::Arc::new(Histogram::new(&[10.0]));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let h = std::sync::Arc::clone(&h);
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        h.observe(f64::from(t * 1000 + i % 20));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let s = h.snapshot();
        assert_eq!(s.count, 4000);
        // i % 20 <= 10 for 11 of every 20, but only in thread 0 (the others add 1000+).
        assert_eq!(s.buckets[0], (10.0, 550));
    }
}
