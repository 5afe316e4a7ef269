//! The `[overclock]` section: the ladder of candidate clocks and what a trial must pass.

use serde::{Deserialize, Serialize};

/// The Pi 5's stock Arm clock in MHz; a candidate must be above it.
pub const STOCK_ARM_FREQ: u32 = 2400;

/// One rung: a clock and the voltage offset it is tried at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// `arm_freq` in MHz.
    pub arm_freq: u32,
    /// `over_voltage_delta` in µV added to the firmware's voltage for that clock; 0 is stock.
    #[serde(default)]
    pub over_voltage_delta: u32,
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} MHz", self.arm_freq)?;
        if self.over_voltage_delta > 0 {
            write!(f, " +{} µV", self.over_voltage_delta)?;
        }
        Ok(())
    }
}

/// The candidates, climbed in order: checked to rise strictly and to stay in a sane range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Candidate>", into = "Vec<Candidate>")]
pub struct Ladder(Vec<Candidate>);

/// The highest `arm_freq` accepted: past it the firmware's voltage cap makes a pass meaningless.
const MAX_ARM_FREQ: u32 = 3400;
/// The largest voltage offset accepted (50 mV is where the field stops).
const MAX_OVER_VOLTAGE_DELTA: u32 = 50_000;

impl Ladder {
    /// The candidates in climbing order.
    pub fn steps(&self) -> &[Candidate] {
        &self.0
    }
}

impl TryFrom<Vec<Candidate>> for Ladder {
    type Error = String;
    fn try_from(steps: Vec<Candidate>) -> Result<Self, Self::Error> {
        if steps.is_empty() {
            return Err("overclock.steps is empty: list at least one { arm_freq = … }".into());
        }
        for (i, c) in steps.iter().enumerate() {
            if c.arm_freq <= STOCK_ARM_FREQ || c.arm_freq > MAX_ARM_FREQ {
                return Err(format!(
                    "overclock.steps[{i}]: arm_freq = {} is outside {}-{MAX_ARM_FREQ} MHz (stock is {STOCK_ARM_FREQ})",
                    c.arm_freq,
                    STOCK_ARM_FREQ + 1
                ));
            }
            if c.over_voltage_delta > MAX_OVER_VOLTAGE_DELTA {
                return Err(format!(
                    "overclock.steps[{i}]: over_voltage_delta = {} µV is above {MAX_OVER_VOLTAGE_DELTA} µV",
                    c.over_voltage_delta
                ));
            }
            if i > 0 && steps[i - 1] >= *c {
                return Err(format!(
                    "overclock.steps[{i}] ({c}) does not climb above the step before it ({}): order the steps by clock, then voltage",
                    steps[i - 1]
                ));
            }
        }
        Ok(Ladder(steps))
    }
}

impl From<Ladder> for Vec<Candidate> {
    fn from(l: Ladder) -> Vec<Candidate> {
        l.0
    }
}

/// Safe overclock trials (`supervisor overclock start`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Overclock {
    /// Opt-in: `overclock start` refuses while this is false. Default false.
    pub enabled: bool,
    /// The candidates, climbed in order until the first failure. Default 2600, 2700, 2800,
    /// 2900, 3000 MHz at stock voltage.
    pub steps: Ladder,
    /// MHz taken off the highest passing step for the clock the box keeps, 0-1000. Default 100.
    pub margin_mhz: MarginMhz,
    /// Seconds of verified all-core load per trial, 1-86400. Default 300.
    pub check_seconds: CheckSeconds,
    /// The SoC temperature a trial must stay at or below, 40-85 °C (the firmware throttles from
    /// 80). Default 80.
    pub temperature_limit_c: TemperatureLimitC,
    /// Compare the engine's greedy output for a fixed prompt with the one taken at stock clock.
    /// Default true (needs the configured model installed and verified).
    pub engine_check: bool,
    /// Tokens the engine generates for that comparison, 1-4096. Default 64.
    pub engine_tokens: EngineTokens,
}

impl Default for Overclock {
    fn default() -> Self {
        let steps = (26..=30)
            .map(|f| Candidate {
                arm_freq: f * 100,
                over_voltage_delta: 0,
            })
            .collect();
        Overclock {
            enabled: false,
            steps: Ladder(steps),
            margin_mhz: MarginMhz(100),
            check_seconds: CheckSeconds(300),
            temperature_limit_c: TemperatureLimitC(80),
            engine_check: true,
            engine_tokens: EngineTokens(64),
        }
    }
}

crate::config::ranged_setting!(
    /// MHz taken off the highest passing step, 0-1000.
    MarginMhz(u32), "margin_mhz", 0..=1000, "an integer 0-1000 (MHz)"
);
crate::config::ranged_setting!(
    /// Seconds of load per trial, 1-86400.
    CheckSeconds(u64), "check_seconds", 1..=86_400, "an integer 1-86400 (seconds)"
);
crate::config::ranged_setting!(
    /// The temperature limit, 40-85 °C (the firmware throttles from 80 and stops at 85).
    TemperatureLimitC(u32), "temperature_limit_c", 40..=85,
    "an integer 40-85 (°C; the firmware throttles from 80 and stops at 85)"
);
crate::config::ranged_setting!(
    /// Tokens for the engine comparison, 1-4096.
    EngineTokens(u32), "engine_tokens", 1..=4096, "an integer 1-4096"
);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Overclock, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_ladder_must_climb_within_range() {
        let ok = parse("steps = [{ arm_freq = 2600 }, { arm_freq = 2600, over_voltage_delta = 25000 }, { arm_freq = 2800 }]")
            .expect("climbs");
        assert_eq!(ok.steps.steps().len(), 3);
        for (text, needle) in [
            ("steps = []", "empty"),
            ("steps = [{ arm_freq = 2400 }]", "outside"),
            ("steps = [{ arm_freq = 9000 }]", "outside"),
            (
                "steps = [{ arm_freq = 2800 }, { arm_freq = 2700 }]",
                "does not climb",
            ),
            (
                "steps = [{ arm_freq = 2800, over_voltage_delta = 900000 }]",
                "µV",
            ),
            ("steps = [{ arm_freq = 2800, volts = 1 }]", "unknown field"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn ranges_are_checked() {
        for (text, needle) in [
            (
                "temperature_limit_c = 95",
                "invalid temperature_limit_c 95: allowed is",
            ),
            (
                "temperature_limit_c = 39",
                "invalid temperature_limit_c 39: allowed is",
            ),
            ("check_seconds = 0", "invalid check_seconds 0: allowed is"),
            (
                "check_seconds = 86401",
                "invalid check_seconds 86401: allowed is",
            ),
            ("engine_tokens = 0", "invalid engine_tokens 0: allowed is"),
            (
                "engine_tokens = 4097",
                "invalid engine_tokens 4097: allowed is",
            ),
            ("margin_mhz = 1001", "invalid margin_mhz 1001: allowed is"),
            ("margin_mhz = -1", "invalid margin_mhz -1: allowed is"),
        ] {
            let err = parse(&format!("enabled = false\n{text}\n")).expect_err(text);
            assert!(err.contains(needle) && err.contains("line 2"), "{err}");
        }
        for text in [
            "temperature_limit_c = 40",
            "temperature_limit_c = 85",
            "check_seconds = 1",
            "check_seconds = 86400",
            "engine_tokens = 1",
            "engine_tokens = 4096",
            "margin_mhz = 0",
            "margin_mhz = 1000",
        ] {
            assert!(parse(text).is_ok(), "{text}");
        }
    }
}
