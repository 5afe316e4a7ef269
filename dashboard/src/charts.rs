//! The one-hour charts as SVG, drawn on the server: the page and every live update carry the
//! same markup, so the browser needs no charting code.

use std::fmt::Write;

use crate::pages::escape;

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 120.0;
/// Room on the left for the axis labels.
const LEFT: f64 = 48.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 8.0;

/// One chart: its title, unit, and (time in ms, value) points, oldest first.
pub struct Series<'a> {
    /// Heading, e.g. "Temperature".
    pub title: &'a str,
    /// Unit after the numbers, e.g. "°C".
    pub unit: &'a str,
    /// Points; `None` is a gap (no reading at that time).
    pub points: Vec<(u64, Option<f64>)>,
}

/// An SVG polyline chart of the last `window_ms` before `now_ms`, or of the time since the
/// first point when that is shorter (a freshly started box fills the chart, not a sliver at its
/// right edge); gaps break the line.
pub fn render(series: &Series, now_ms: u64, window_ms: u64) -> String {
    let earliest = series
        .points
        .iter()
        .map(|(t, _)| *t)
        .min()
        .unwrap_or(now_ms);
    let start = now_ms.saturating_sub(window_ms).max(earliest.min(now_ms));
    let window_ms = now_ms - start;
    let values: Vec<f64> = series
        .points
        .iter()
        .filter(|(t, _)| *t >= start)
        .filter_map(|(_, v)| *v)
        .collect();
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{}">"#,
        escape(series.title)
    );
    let (Some(lo), Some(hi)) = (
        values.iter().copied().reduce(f64::min),
        values.iter().copied().reduce(f64::max),
    ) else {
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" class="empty">no readings yet</text></svg>"#,
            WIDTH / 2.0,
            HEIGHT / 2.0
        );
        return svg;
    };
    // A flat line sits in the middle rather than on an edge.
    let (lo, hi) = if hi - lo < 1e-9 {
        (lo - 1.0, hi + 1.0)
    } else {
        (lo, hi)
    };
    let x = |t: u64| {
        let t = t.clamp(start, now_ms);
        if window_ms == 0 {
            // One point so far: draw it at "now".
            return WIDTH;
        }
        LEFT + (t - start) as f64 / window_ms as f64 * (WIDTH - LEFT)
    };
    let y = |v: f64| TOP + (hi - v) / (hi - lo) * (HEIGHT - TOP - BOTTOM);
    let _ = write!(
        svg,
        r#"<text x="2" y="{:.1}" class="axis">{}</text><text x="2" y="{:.1}" class="axis">{}</text>"#,
        TOP + 8.0,
        escape(&format!("{hi:.1} {}", series.unit)),
        HEIGHT - BOTTOM,
        escape(&format!("{lo:.1} {}", series.unit)),
    );
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (t, v) in series.points.iter().filter(|(t, _)| *t >= start) {
        match v {
            Some(v) => {
                if let Some(run) = runs.last_mut() {
                    run.push((x(*t), y(*v)));
                }
            }
            None => runs.push(Vec::new()),
        }
    }
    for run in runs.iter().filter(|r| !r.is_empty()) {
        let mut points = String::new();
        for (px, py) in run {
            let _ = write!(points, "{px:.1},{py:.1} ");
        }
        let _ = write!(
            svg,
            r#"<polyline class="line" points="{}"/>"#,
            points.trim_end()
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polyline_points(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.split("points=\"")
            .skip(1)
            .map(|rest| {
                rest.split('"')
                    .next()
                    .unwrap_or("")
                    .split(' ')
                    .map(|p| {
                        let (x, y) = p.split_once(',').expect("x,y");
                        (x.parse().expect("x"), y.parse().expect("y"))
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn points_span_the_window_higher_values_higher_and_gaps_break_the_line() {
        let now = 3_600_000;
        let series = Series {
            title: "T <&>",
            unit: "°C",
            points: vec![
                (0, Some(40.0)),
                (1_800_000, Some(60.0)),
                (2_000_000, None),
                (3_600_000, Some(50.0)),
            ],
        };
        let svg = render(&series, now, 3_600_000);
        assert!(svg.contains("T &lt;&amp;&gt;"), "{svg}");
        assert!(svg.contains("60.0 °C") && svg.contains("40.0 °C"), "{svg}");
        let lines = polyline_points(&svg);
        assert_eq!(lines.len(), 2, "{svg}");
        let (first, middle, last) = (lines[0][0], lines[0][1], lines[1][0]);
        assert_eq!(first.0, LEFT);
        assert_eq!(last.0, WIDTH);
        assert!(
            middle.1 < last.1 && last.1 < first.1,
            "60 above 50 above 40"
        );
    }

    #[test]
    fn no_readings_say_so_and_old_points_are_left_out() {
        let empty = Series {
            title: "Decode",
            unit: "tok/s",
            points: vec![(5, None)],
        };
        assert!(render(&empty, 10_000, 3_600_000).contains("no readings yet"));
        let old = Series {
            title: "Clock",
            unit: "MHz",
            points: vec![(0, Some(1.0)), (7_200_000, Some(2400.0))],
        };
        let svg = render(&old, 7_200_000, 3_600_000);
        assert_eq!(
            polyline_points(&svg),
            vec![vec![(WIDTH, (HEIGHT - BOTTOM + TOP) / 2.0)]]
        );
    }

    #[test]
    fn a_young_history_fills_the_chart() {
        let series = Series {
            title: "Clock",
            unit: "MHz",
            points: vec![(1_000_000, Some(1500.0)), (1_010_000, Some(2400.0))],
        };
        let svg = render(&series, 1_010_000, 3_600_000);
        let line = &polyline_points(&svg)[0];
        assert_eq!((line[0].0, line[1].0), (LEFT, WIDTH));
    }
}
