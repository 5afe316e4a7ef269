//! Every value the overview shows, in words, from the status document as JSON. Reading the
//! JSON rather than the Rust types lets parts added later (the overclock ladder) show up without
//! this file knowing their types, and absent parts simply say so. The page and every live update
//! carry this same list.

use std::fmt::Write;

use serde::Serialize;
use serde_json::Value;

/// How a health line looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As it should be.
    Ok,
    /// Working, but needs a look or a reboot.
    Warn,
    /// Broken.
    Bad,
}

/// One value on the overview, by element id; the live updates carry the same list.
#[derive(Debug, Clone, Serialize)]
pub struct Field {
    /// Element id.
    pub id: String,
    /// What it is, in words.
    #[serde(skip)]
    pub label: String,
    /// The value in words.
    pub text: String,
    /// For health lines: how healthy.
    pub level: Option<Level>,
}

pub(super) fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn number(v: &Value, digits: usize, unit: &str) -> String {
    match v.as_f64() {
        Some(n) => format!("{n:.digits$} {unit}"),
        None => "unknown".into(),
    }
}

/// Fleet provisioning: which box of which fleet, or why the last file was refused.
fn provision_line(p: &Value) -> Option<Field> {
    if p.is_null() {
        return None;
    }
    let (text, level) = if let Some(error) = p["last_error"].as_str() {
        (
            format!("provisioning file refused, nothing applied: {error}"),
            Level::Bad,
        )
    } else if p["state"] == "provisioned" {
        let applied = p["applied_unix"]
            .as_u64()
            .map_or_else(|| "at an unknown time".into(), crate::report::civil_date);
        (
            format!(
                "provisioned: box {} of fleet {}, generation {}, applied {applied}",
                text_of(&p["name"]),
                text_of(&p["fleet"]),
                text_of(&p["generation"])
            ),
            Level::Ok,
        )
    } else {
        (
            "not provisioned: the image's defaults (see README, \"Provision a fleet\")".into(),
            Level::Ok,
        )
    };
    Some(health("h-provision", "provisioning", text, level))
}

/// `3 d 4 h 5 min` style duration.
pub fn duration_words(seconds: u64) -> String {
    let (d, h, m) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60);
    match (d, h) {
        (0, 0) => format!("{m} min {} s", seconds % 60),
        (0, _) => format!("{h} h {m} min"),
        _ => format!("{d} d {h} h {m} min"),
    }
}

fn step_level(state: &str) -> Level {
    match state {
        "in-place" | "applied" | "not-applicable" => Level::Ok,
        "pending-reboot" | "needs-apply" => Level::Warn,
        _ => Level::Bad,
    }
}

fn health(id: &str, label: &str, text: String, level: Level) -> Field {
    Field {
        id: id.into(),
        label: label.into(),
        text,
        level: Some(level),
    }
}

fn value(id: &str, label: &str, text: String) -> Field {
    Field {
        id: id.into(),
        label: label.into(),
        text,
        level: None,
    }
}

/// The overclock line from the status document's `overclock` part, when this build has one.
fn overclock_line(oc: &Value) -> (String, Level) {
    if oc.is_null() {
        return ("not part of this build".into(), Level::Ok);
    }
    let phase = oc["phase"].as_str().unwrap_or("unknown");
    let result = &oc["result"];
    let mut text = phase.to_string();
    if let Some(mhz) = result["arm_freq"].as_u64() {
        let _ = write!(text, ", keeps {mhz} MHz");
    }
    if oc["enabled"] == Value::Bool(false) {
        text.push_str(" (trials off)");
    }
    let message = text_of(&oc["message"]);
    if !message.is_empty() {
        let _ = write!(text, " — {message}");
    }
    let error = text_of(&oc["error"]);
    if !error.is_empty() {
        let _ = write!(text, " — {error}");
        return (text, Level::Bad);
    }
    let level = match phase {
        "aborted" => Level::Bad,
        "climbing" => Level::Warn,
        _ => Level::Ok,
    };
    (text, level)
}

/// The update line from the status document's `update` part: both slots (version, health, which
/// runs), the update under way, the last one's outcome.
fn update_line(u: &Value) -> (String, Level) {
    if u.is_null() {
        return ("not part of this build".into(), Level::Ok);
    }
    let empty = Vec::new();
    let slots: Vec<String> = u["slots"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|s| {
            let version = s["system_version"].as_str().unwrap_or("empty");
            let mut text = format!("slot {} {version}", text_of(&s["slot"]));
            if s["booted"] == Value::Bool(true) {
                text.push_str(" (running)");
            }
            if s["state"] == "bad" {
                text.push_str(" (bad)");
            }
            text
        })
        .collect();
    let mut text = if slots.is_empty() {
        "no A/B slots".to_string()
    } else {
        slots.join(", ")
    };
    let mut level = Level::Ok;
    let trial = &u["trial"];
    if !trial.is_null() {
        let stage = if !trial["checking_since_unix"].is_null() {
            "being checked"
        } else if !trial["rebooted_unix"].is_null() {
            "rebooting into it"
        } else if !trial["prepared_unix"].is_null() {
            "installed, waiting for the reboot"
        } else {
            "being written"
        };
        let _ = write!(
            text,
            " — version {} to slot {}: {stage}",
            text_of(&trial["system_version"]),
            text_of(&trial["slot"])
        );
        level = Level::Warn;
    }
    let last = &u["last"];
    if !last.is_null() {
        let result = text_of(&last["result"]);
        let _ = write!(
            text,
            " — last update: version {} {}: {}",
            text_of(&last["system_version"]),
            result.replace('-', " "),
            text_of(&last["reason"])
        );
        if result == "rolled-back" && level == Level::Ok {
            level = Level::Warn;
        }
    }
    let error = text_of(&u["error"]);
    if !error.is_empty() && !slots.is_empty() {
        let _ = write!(text, " — {error}");
        level = Level::Bad;
    }
    (text, level)
}

/// Every value the overview shows, from the status document and the engine's recent output.
pub fn fields(status: &Value, engine_log: &[String]) -> Vec<Field> {
    let mut out = Vec::new();
    let empty = Vec::new();
    for (i, step) in status["steps"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .enumerate()
    {
        let state = step["state"].as_str().unwrap_or("unknown");
        let mut text = format!(
            "{}: {state} (desired {}, effective {})",
            text_of(&step["name"]),
            text_of(&step["desired"]),
            text_of(&step["effective"])
        );
        let reason = text_of(&step["reason"]);
        if !reason.is_empty() && step_level(state) != Level::Ok {
            let _ = write!(text, " — {reason}");
        }
        out.push(health(
            &format!("h-step-{i}"),
            "tuning",
            text,
            step_level(state),
        ));
    }
    let model = &status["model"];
    let model_state = model["state"].as_str().unwrap_or("unknown");
    out.push(health(
        "h-model",
        "weights",
        format!(
            "weights {}: {model_state} — {}",
            text_of(&model["id"]),
            text_of(&model["reason"])
        ),
        if model_state == "verified" {
            Level::Ok
        } else {
            Level::Bad
        },
    ));
    let engine = &status["engine"];
    let engine_state = engine["state"].as_str().unwrap_or("unknown");
    out.push(health(
        "h-engine",
        "engine",
        format!(
            "engine: {engine_state} — {} (restarts {})",
            text_of(&engine["reason"]),
            text_of(&engine["restarts"])
        ),
        match engine_state {
            "ready" => Level::Ok,
            "starting" | "backing-off" | "stopped" => Level::Warn,
            _ => Level::Bad,
        },
    ));
    let (oc, oc_level) = overclock_line(&status["overclock"]);
    out.push(health(
        "h-overclock",
        "overclock",
        format!("overclock: {oc}"),
        oc_level,
    ));
    let (update, update_level) = update_line(&status["update"]);
    out.push(health(
        "h-update",
        "updates",
        format!("updates: {update}"),
        update_level,
    ));
    if let Some(line) = provision_line(&status["provision"]) {
        out.push(line);
    }
    let worst = out
        .iter()
        .filter_map(|f| f.level)
        .max_by_key(|l| *l as u8)
        .unwrap_or(Level::Ok);
    let summary = match worst {
        Level::Ok => "Healthy: tuned, verified and serving",
        Level::Warn => "Working, but something needs a look",
        Level::Bad => "Not healthy: see the red lines",
    };
    out.insert(0, health("h-summary", "summary", summary.into(), worst));

    let board = &status["board"];
    out.push(value(
        "v-model",
        "Model in use",
        text_of(&engine["model_id"]),
    ));
    out.push(value(
        "v-prefill",
        "Prefill (prompt) speed",
        number(&engine["prefill_tokens_per_second"], 1, "tokens/s"),
    ));
    out.push(value(
        "v-decode",
        "Decode (answer) speed",
        number(&engine["decode_tokens_per_second"], 1, "tokens/s"),
    ));
    out.push(value(
        "v-temp",
        "Temperature",
        number(&board["temperature_c"], 1, "°C"),
    ));
    out.push(value(
        "v-clock",
        "CPU clock",
        format!(
            "{} (max {})",
            number(&board["cpu_mhz"], 0, "MHz"),
            number(&board["cpu_max_mhz"], 0, "MHz")
        ),
    ));
    let words = |v: &Value| -> String {
        match v.as_array() {
            None => "unknown".into(),
            Some(a) if a.is_empty() => "none".into(),
            Some(a) => a.iter().map(text_of).collect::<Vec<_>>().join(", "),
        }
    };
    let throttle = &board["throttle"];
    out.push(value(
        "v-throttle-now",
        "Throttling now",
        words(&throttle["now"]),
    ));
    out.push(value(
        "v-throttle-boot",
        "Throttling since boot",
        words(&throttle["since_boot"]),
    ));
    out.push(value(
        "v-memory",
        "Memory",
        format!(
            "{} available of {}",
            number(&board["memory_available_mib"], 0, "MiB"),
            number(&board["memory_total_mib"], 0, "MiB")
        ),
    ));
    let swap = match board["swap"].as_array() {
        None => "unknown".to_string(),
        Some(a) if a.is_empty() => "off".to_string(),
        Some(a) => a
            .iter()
            .map(|s| {
                let kib = |k: &str| s[k].as_u64().unwrap_or(0) / 1024;
                format!(
                    "{} {} of {} MiB used",
                    text_of(&s["device"]),
                    kib("used_kib"),
                    kib("size_kib")
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    out.push(value("v-swap", "Swap", swap));
    out.push(value(
        "v-uptime",
        "Up for",
        board["uptime_s"]
            .as_u64()
            .map(duration_words)
            .unwrap_or_else(|| "unknown".into()),
    ));
    out.push(value(
        "v-bootloader",
        "Bootloader",
        board["boot"]["bootloader_build_timestamp"]
            .as_u64()
            .map(|t| format!("built {}", crate::report::civil_date(t)))
            .unwrap_or_else(|| "unknown".into()),
    ));
    out.push(value(
        "v-os",
        "Operating system",
        board["os"].as_str().unwrap_or("unknown").to_string(),
    ));
    out.push(value("v-engine-log", "Engine log", engine_log.join("\n")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn health_is_the_worst_part_and_absent_parts_are_tolerated() {
        let mut status = json!({
            "steps": [{ "name": "governor", "desired": "performance", "effective": "performance", "state": "in-place", "reason": "" }],
            "model": { "id": "m", "state": "verified", "reason": "all chunks" },
            "engine": { "state": "ready", "reason": "serving", "restarts": 0, "decode_tokens_per_second": 83.94 },
            "board": { "throttle": { "now": [], "since_boot": ["under-voltage"] }, "uptime_s": 90061 }
        });
        let get =
            |fields: &[Field], id: &str| fields.iter().find(|f| f.id == id).cloned().expect(id);
        let f = fields(&status, &[]);
        assert_eq!(get(&f, "h-summary").level, Some(Level::Ok));
        assert_eq!(
            get(&f, "h-overclock").text,
            "overclock: not part of this build"
        );
        assert_eq!(get(&f, "v-decode").text, "83.9 tokens/s");
        assert_eq!(get(&f, "v-prefill").text, "unknown");
        assert_eq!(get(&f, "v-throttle-now").text, "none");
        assert_eq!(get(&f, "v-throttle-boot").text, "under-voltage");
        assert_eq!(get(&f, "v-uptime").text, "1 d 1 h 1 min");
        assert_eq!(get(&f, "v-swap").text, "unknown");

        status["overclock"] = json!({ "enabled": true, "phase": "aborted", "result": null,
            "message": "aborted by the operator",
            "trials": [{ "run": 1, "candidate": { "arm_freq": 2800, "over_voltage_delta": 20000 },
                         "status": "failed", "reason": "throttled" }] });
        status["steps"][0]["state"] = json!("pending-reboot");
        let f = fields(&status, &[]);
        assert_eq!(get(&f, "h-overclock").level, Some(Level::Bad));
        assert_eq!(get(&f, "h-step-0").level, Some(Level::Warn));
        assert_eq!(get(&f, "h-summary").level, Some(Level::Bad));
        assert_eq!(
            get(&f, "h-overclock").text,
            "overclock: aborted — aborted by the operator"
        );
        status["overclock"]["phase"] = json!("done");
        status["overclock"]["message"] = json!("2600 MHz passed every check");
        status["overclock"]["result"] = json!({ "arm_freq": 2600, "over_voltage_delta": 0 });
        assert_eq!(
            overclock_line(&status["overclock"]),
            (
                "done, keeps 2600 MHz — 2600 MHz passed every check".to_string(),
                Level::Ok
            )
        );
        status["overclock"]["error"] = json!("cannot read overclock.json");
        assert_eq!(overclock_line(&status["overclock"]).1, Level::Bad);
    }

    #[test]
    fn the_update_line_shows_both_slots_and_the_last_outcome() {
        let update = json!({
            "booted": "B", "committed": "B", "error": null, "trial": null,
            "slots": [
                { "slot": "A", "system_version": "3", "state": "bad", "booted": false },
                { "slot": "B", "system_version": "2", "state": "good", "booted": true }
            ],
            "last": { "slot": "A", "system_version": "3", "from_version": "2",
                      "result": "rolled-back", "reason": "the engine is failing", "ended_unix": 1 }
        });
        let (text, level) = update_line(&update);
        assert_eq!(
            text,
            "slot A 3 (bad), slot B 2 (running) — last update: version 3 rolled back: the engine is failing"
        );
        assert_eq!(level, Level::Warn);
        assert_eq!(update_line(&Value::Null).0, "not part of this build");
    }
}
