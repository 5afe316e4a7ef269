//! Every value the overview shows, in words, from the status document ([`wire::Status`]).
//! Parts a box may lack (the overclock ladder, updates, provisioning) are `Option`s there, and
//! absent parts simply say so. The page and every live update carry this same list.

use std::fmt::Write;

use serde::Serialize;
use wire::status::{Overclock, Provision, Stage, Status, Update};

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

fn number(v: Option<f64>, digits: usize, unit: &str) -> String {
    match v {
        Some(n) => format!("{n:.digits$} {unit}"),
        None => "unknown".into(),
    }
}

/// The cluster this box is a member of: its state and why, each other member's link, the
/// layers each holds; `None` for a box that serves alone.
fn cluster_line(c: Option<&wire::cluster::Cluster>) -> Option<Field> {
    let c = c?;
    let mut text = format!(
        "cluster {} ({}): {} — {}",
        c.name, c.role, c.state, c.reason
    );
    for m in &c.members {
        let link = match m.handshake_age_s {
            Some(age) => format!("handshake {}", duration_words(age)),
            None => "no handshake yet".into(),
        };
        let answers = match m.answers {
            Some(true) => ", answers",
            Some(false) => ", does not answer",
            None => "",
        };
        let _ = write!(
            text,
            "; {} {} {} ({link}{answers})",
            m.role, m.name, m.address
        );
    }
    if !c.layers.is_empty() {
        let shares: Vec<String> = c
            .layers
            .iter()
            .map(|s| {
                let last = (s.first_layer + s.layers).saturating_sub(1);
                let output = if s.output { " and the output" } else { "" };
                format!(
                    "{} layers {}–{last}{output} ({} of {} MiB)",
                    s.member, s.first_layer, s.mib, s.budget_mib
                )
            })
            .collect();
        let _ = write!(text, "; {}", shares.join(", "));
    }
    if let Some(speed) = c.decode_tokens_per_second {
        let _ = write!(text, "; decode {speed:.1} tokens/s");
    }
    let level = match c.state.as_str() {
        "up" => Level::Ok,
        "starting" | "degraded" => Level::Warn,
        _ => Level::Bad,
    };
    Some(health("h-cluster", "cluster", text, level))
}

/// Fleet provisioning: which box of which fleet, or why the last file was refused.
fn provision_line(p: Option<&Provision>) -> Option<Field> {
    let p = p?;
    let (text, level) = if let Some(error) = &p.last_error {
        (
            format!("provisioning file refused, nothing applied: {error}"),
            Level::Bad,
        )
    } else if p.state == "provisioned" {
        let applied = p.applied_unix.map_or_else(
            || "at an unknown time".into(),
            supervisor_core::clock::civil_date,
        );
        (
            format!(
                "provisioned: box {} of fleet {}, generation {}, applied {applied}",
                p.name.as_deref().unwrap_or_default(),
                p.fleet.as_deref().unwrap_or_default(),
                p.generation
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
fn overclock_line(oc: Option<&Overclock>) -> (String, Level) {
    let Some(oc) = oc else {
        return ("not part of this build".into(), Level::Ok);
    };
    let phase = oc.phase.as_str();
    let mut text = phase.to_string();
    if let Some(result) = &oc.result {
        let _ = write!(text, ", keeps {} MHz", result.arm_freq);
    }
    if !oc.enabled {
        text.push_str(" (trials off)");
    }
    if !oc.message.is_empty() {
        let _ = write!(text, " — {}", oc.message);
    }
    if let Some(error) = oc.error.as_deref().filter(|e| !e.is_empty()) {
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
fn update_line(u: Option<&Update>) -> (String, Level) {
    let Some(u) = u else {
        return ("not part of this build".into(), Level::Ok);
    };
    let slots: Vec<String> = u
        .slots
        .iter()
        .map(|s| {
            let version = s.system_version.as_deref().unwrap_or("empty");
            let mut text = format!("slot {} {version}", s.slot);
            if s.booted {
                text.push_str(" (running)");
            }
            if s.state == "bad" {
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
    if let Some(trial) = &u.trial {
        let stage = match trial.stage() {
            Stage::Checking => "being checked",
            Stage::Rebooting => "rebooting into it",
            Stage::Installed => "installed, waiting for the reboot",
            Stage::Writing => "being written",
        };
        let _ = write!(
            text,
            " — version {} to slot {}: {stage}",
            trial.system_version.as_deref().unwrap_or_default(),
            trial.slot
        );
        level = Level::Warn;
    }
    if let Some(last) = &u.last {
        let _ = write!(
            text,
            " — last update: version {} {}: {}",
            last.system_version.as_deref().unwrap_or_default(),
            last.result.replace('-', " "),
            last.reason
        );
        if last.result == "rolled-back" && level == Level::Ok {
            level = Level::Warn;
        }
    }
    if let Some(error) = u.error.as_deref().filter(|e| !e.is_empty())
        && !slots.is_empty()
    {
        let _ = write!(text, " — {error}");
        level = Level::Bad;
    }
    (text, level)
}

/// Every value the overview shows, from the status document and the engine's recent output.
pub fn fields(status: &Status, engine_log: &[String]) -> Vec<Field> {
    let mut out = Vec::new();
    for (i, step) in status.steps.iter().enumerate() {
        let state = step.state.as_str();
        let mut text = format!(
            "{}: {state} (desired {}, effective {})",
            step.name, step.desired, step.effective
        );
        if !step.reason.is_empty() && step_level(state) != Level::Ok {
            let _ = write!(text, " — {}", step.reason);
        }
        out.push(health(
            &format!("h-step-{i}"),
            "tuning",
            text,
            step_level(state),
        ));
    }
    let model = &status.model;
    out.push(health(
        "h-model",
        "weights",
        format!("weights {}: {} — {}", model.id, model.state, model.reason),
        if model.state == "verified" {
            Level::Ok
        } else {
            Level::Bad
        },
    ));
    let engine = &status.engine;
    out.push(health(
        "h-engine",
        "engine",
        format!(
            "engine: {} — {} (restarts {})",
            engine.state, engine.reason, engine.restarts
        ),
        match engine.state.as_str() {
            "ready" => Level::Ok,
            "starting" | "backing-off" | "stopped" => Level::Warn,
            _ => Level::Bad,
        },
    ));
    let (oc, oc_level) = overclock_line(status.overclock.as_ref());
    out.push(health(
        "h-overclock",
        "overclock",
        format!("overclock: {oc}"),
        oc_level,
    ));
    let (update, update_level) = update_line(status.update.as_ref());
    out.push(health(
        "h-update",
        "updates",
        format!("updates: {update}"),
        update_level,
    ));
    if let Some(line) = provision_line(status.provision.as_ref()) {
        out.push(line);
    }
    if let Some(line) = cluster_line(status.cluster.as_ref()) {
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

    let board = &status.board;
    out.push(value("v-model", "Model in use", engine.model_id.clone()));
    out.push(value(
        "v-prefill",
        "Prefill (prompt) speed",
        number(engine.prefill_tokens_per_second, 1, "tokens/s"),
    ));
    out.push(value(
        "v-decode",
        "Decode (answer) speed",
        number(engine.decode_tokens_per_second, 1, "tokens/s"),
    ));
    out.push(value(
        "v-tools",
        "Tool calls",
        match engine.tool_calls {
            None => "unknown".into(),
            Some(t) => format!(
                "{} in {} answers, {} failed (since the engine started)",
                t.calls, t.answers, t.failures
            ),
        },
    ));
    out.push(value(
        "v-temp",
        "Temperature",
        number(board.temperature_c, 1, "°C"),
    ));
    let mhz = |m: Option<u64>| number(m.map(|m| m as f64), 0, "MHz");
    out.push(value(
        "v-clock",
        "CPU clock",
        format!("{} (max {})", mhz(board.cpu_mhz), mhz(board.cpu_max_mhz)),
    ));
    let words = |w: Option<&Vec<String>>| -> String {
        match w {
            None => "unknown".into(),
            Some(a) if a.is_empty() => "none".into(),
            Some(a) => a.join(", "),
        }
    };
    let throttle = board.throttle.as_ref();
    out.push(value(
        "v-throttle-now",
        "Throttling now",
        words(throttle.map(|t| &t.now)),
    ));
    out.push(value(
        "v-throttle-boot",
        "Throttling since boot",
        words(throttle.map(|t| &t.since_boot)),
    ));
    let mib = |m: Option<u64>| number(m.map(|m| m as f64), 0, "MiB");
    out.push(value(
        "v-memory",
        "Memory",
        format!(
            "{} available of {}",
            mib(board.memory_available_mib),
            mib(board.memory_total_mib)
        ),
    ));
    let swap = match &board.swap {
        None => "unknown".to_string(),
        Some(a) if a.is_empty() => "off".to_string(),
        Some(a) => a
            .iter()
            .map(|s| {
                format!(
                    "{} {} of {} MiB used",
                    s.device,
                    s.used_kib / 1024,
                    s.size_kib / 1024
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    out.push(value("v-swap", "Swap", swap));
    out.push(value(
        "v-uptime",
        "Up for",
        board
            .uptime_s
            .map(duration_words)
            .unwrap_or_else(|| "unknown".into()),
    ));
    out.push(value(
        "v-bootloader",
        "Bootloader",
        board
            .boot
            .as_ref()
            .map(|b| {
                format!(
                    "built {}",
                    supervisor_core::clock::civil_date(u64::from(b.bootloader_build_timestamp))
                )
            })
            .unwrap_or_else(|| "unknown".into()),
    ));
    out.push(value(
        "v-os",
        "Operating system",
        board.os.as_deref().unwrap_or("unknown").to_string(),
    ));
    out.push(value("v-engine-log", "Engine log", engine_log.join("\n")));
    out
}

/// A status document for tests: `parts` over the smallest document there is (every required
/// field, empty).
#[cfg(test)]
pub(crate) fn test_status(parts: serde_json::Value) -> Status {
    let mut doc = serde_json::json!({
        "schema_version": 1, "board": {}, "model": { "id": "", "state": "" }, "steps": [],
        "engine": { "state": "" }
    });
    if let (Some(doc), Some(parts)) = (doc.as_object_mut(), parts.as_object()) {
        for (k, v) in parts {
            doc.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(doc).expect("a status document")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_degraded_cluster_says_why_and_which_member_holds_what() {
        let status = test_status(json!({ "cluster": {
            "name": "front-desk", "role": "head", "state": "degraded",
            "reason": "worker w2 does not answer (10.77.0.3:50052: refused)",
            "members": [{ "name": "w2", "role": "worker", "address": "10.77.0.3",
                          "handshake_age_s": 200, "answers": false }],
            "layers": [{ "member": "head", "first_layer": 0, "layers": 4, "output": false,
                         "mib": 190, "budget_mib": 200 }]
        }}));
        let line = fields(&status, &[])
            .into_iter()
            .find(|f| f.id == "h-cluster")
            .expect("a cluster line");
        assert_eq!(line.level, Some(Level::Warn));
        for says in [
            "degraded",
            "w2 does not answer",
            "does not answer)",
            "head layers 0–3",
        ] {
            assert!(line.text.contains(says), "{says}: {}", line.text);
        }
        let alone = test_status(json!({}));
        assert!(fields(&alone, &[]).iter().all(|f| f.id != "h-cluster"));
    }

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
        let f = fields(&test_status(status.clone()), &[]);
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
        let f = fields(&test_status(status.clone()), &[]);
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
        let overclock = |status: &serde_json::Value| test_status(status.clone()).overclock;
        assert_eq!(
            overclock_line(overclock(&status).as_ref()),
            (
                "done, keeps 2600 MHz — 2600 MHz passed every check".to_string(),
                Level::Ok
            )
        );
        status["overclock"]["error"] = json!("cannot read overclock.json");
        assert_eq!(overclock_line(overclock(&status).as_ref()).1, Level::Bad);
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
        let update: Update = serde_json::from_value(update).expect("an update part");
        let (text, level) = update_line(Some(&update));
        assert_eq!(
            text,
            "slot A 3 (bad), slot B 2 (running) — last update: version 3 rolled back: the engine is failing"
        );
        assert_eq!(level, Level::Warn);
        assert_eq!(update_line(None).0, "not part of this build");
    }
}
