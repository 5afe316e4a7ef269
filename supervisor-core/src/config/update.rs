//! `[update]`: how long a new slot has to prove itself, and when an unattended install may
//! reboot the box.

use serde::{Deserialize, Serialize};

use crate::config::ranged_setting;

/// The `[update]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Update {
    /// Seconds the trial boot of a new slot has, from the supervisor's start, to verify its
    /// tuning, pass the weights gate, answer a completion and serve the dashboard (60-7200).
    pub health_timeout_s: HealthTimeoutS,
    /// Local time of day an unattended install (USB stick, dashboard, fleet) may reboot into the
    /// new slot, as `HH:MM-HH:MM` (may wrap past midnight); unset: at once.
    pub window: Option<Window>,
}

impl Default for Update {
    fn default() -> Self {
        Update {
            health_timeout_s: HealthTimeoutS(900),
            window: None,
        }
    }
}

ranged_setting!(
    /// Seconds for a trial boot's health check, 60-7200.
    HealthTimeoutS(u64), "health_timeout_s", 60..=7200, "an integer 60-7200 (seconds)"
);

/// A daily window of local time, minutes after midnight `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Window {
    start: u16,
    end: u16,
}

fn minutes(text: &str) -> Option<u16> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60).then_some(h * 60 + m)
}

impl TryFrom<String> for Window {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        let bad = || {
            format!(
                "invalid window {text:?}: expected HH:MM-HH:MM in local time, e.g. \"02:00-05:00\""
            )
        };
        let (a, b) = text.split_once('-').ok_or_else(bad)?;
        let (start, end) = (
            minutes(a.trim()).ok_or_else(bad)?,
            minutes(b.trim()).ok_or_else(bad)?,
        );
        if start == end {
            return Err(format!(
                "invalid window {text:?}: it is empty; leave `window` unset to allow any time"
            ));
        }
        Ok(Window { start, end })
    }
}

impl From<Window> for String {
    fn from(w: Window) -> String {
        format!(
            "{:02}:{:02}-{:02}:{:02}",
            w.start / 60,
            w.start % 60,
            w.end / 60,
            w.end % 60
        )
    }
}

impl Window {
    /// Whether `minute` (after local midnight) lies inside.
    pub fn contains(self, minute: u16) -> bool {
        if self.start < self.end {
            (self.start..self.end).contains(&minute)
        } else {
            minute >= self.start || minute < self.end
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_may_wrap_past_midnight() {
        let w = Window::try_from("02:00-05:30".to_string()).expect("valid");
        assert!(w.contains(120) && w.contains(329) && !w.contains(330) && !w.contains(60));
        let night = Window::try_from("23:00-01:00".to_string()).expect("valid");
        assert!(night.contains(23 * 60) && night.contains(30) && !night.contains(60));
        assert_eq!(String::from(night), "23:00-01:00");
        for bad in [
            "2:00-5:00",
            "25:00-01:00",
            "02:00",
            "02:00-02:00",
            "aa:bb-cc:dd",
        ] {
            assert!(Window::try_from(bad.to_string()).is_err(), "{bad}");
        }
    }
}
