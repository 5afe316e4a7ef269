//! The HTML pages, rendered on the server from the status document as JSON. Reading the JSON
//! rather than the Rust types lets parts added later (the overclock ladder) show up without
//! this file knowing their types, and absent parts simply say so. Every text is escaped.

use std::fmt::Write;

use serde::Serialize;
use serde_json::Value;

/// `&`, `<`, `>`, `"` and `'` as entities: safe in text and in quoted attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

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

fn text_of(v: &Value) -> String {
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
    if oc["enabled"] == Value::Bool(false) {
        return (format!("off ({phase})"), Level::Ok);
    }
    let level = match phase {
        "aborted" => Level::Bad,
        "climbing" => Level::Warn,
        _ => Level::Ok,
    };
    let result = &oc["result"];
    let detail = if result.is_null() {
        String::new()
    } else if let Some(mhz) = result["arm_freq"].as_u64() {
        format!(": {mhz} MHz")
    } else {
        format!(": {}", text_of(result))
    };
    (format!("{phase}{detail}"), level)
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

/// The overclock history table (empty when the build has no overclock trials).
fn overclock_history(oc: &Value) -> String {
    let Some(steps) = oc["steps"].as_array() else {
        return "<p>No overclock trials in this build.</p>".into();
    };
    if steps.is_empty() {
        return "<p>No overclock trials have run.</p>".into();
    }
    let mut html = String::from(
        "<table><thead><tr><th>ARM clock</th><th>over_voltage_delta</th><th>result</th><th>why</th></tr></thead><tbody>",
    );
    for s in steps {
        let _ = write!(
            html,
            "<tr><td>{} MHz</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&text_of(&s["arm_freq"])),
            escape(&text_of(&s["over_voltage_delta"])),
            escape(&text_of(&s["status"])),
            escape(&text_of(&s["reason"]))
        );
    }
    html.push_str("</tbody></table>");
    html
}

fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><link rel=\"stylesheet\" href=\"/assets/style.css\">",
        escape(title)
    )
}

/// Why the dashboard is on loopback only, when it is.
pub fn loopback_notice(open: bool, bound: std::net::SocketAddr) -> String {
    if open {
        format!(
            "<p class=\"notice\" id=\"loopback-notice\">No password is set, so this dashboard \
             answers on this box only ({}). Set <code>[dashboard] password_hash</code> \
             (<code>supervisor dashboard hash-password</code>) to reach it from the network.</p>",
            escape(&bound.to_string())
        )
    } else {
        String::new()
    }
}

/// The login page, with an error when the last attempt failed.
pub fn login(error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"error\" id=\"login-error\">{}</p>", escape(e)))
        .unwrap_or_default();
    format!(
        "{}</head><body class=\"login\"><main><h1>Appliance</h1>{error}\
         <form method=\"post\" action=\"/login\">\
         <label for=\"password\">Password</label>\
         <input type=\"password\" id=\"password\" name=\"password\" autocomplete=\"current-password\" autofocus required>\
         <button type=\"submit\" id=\"login-button\">Log in</button></form></main></body></html>",
        head("Appliance — log in")
    )
}

/// What the overview page is made of.
pub struct Overview<'a> {
    /// The status document.
    pub status: &'a Value,
    /// Its values (see [`fields`]).
    pub fields: &'a [Field],
    /// Rendered charts by name.
    pub charts: &'a [(&'static str, &'static str, String)],
    /// This session's CSRF token.
    pub csrf: &'a str,
    /// The loopback notice, if any (already HTML).
    pub notice: String,
    /// Live-sample number the page was rendered at.
    pub seq: u64,
}

/// The overview page.
pub fn overview(o: &Overview) -> String {
    let mut html = head("Appliance — status");
    let _ = write!(
        html,
        "<meta name=\"csrf-token\" content=\"{}\"><script src=\"/assets/app.js\" defer></script></head><body>",
        escape(o.csrf)
    );
    let model = o.status["board"]["model"]
        .as_str()
        .unwrap_or("unknown board");
    let simulated = if o.status["simulated"] == Value::Bool(true) {
        " (simulated)"
    } else {
        ""
    };
    let _ = write!(
        html,
        "<header><h1>Appliance</h1><span class=\"board\">{}{simulated}</span>\
         <span class=\"live\">live update <span id=\"live-seq\">{}</span> \
         <span id=\"live-state\">connecting…</span></span>\
         <form method=\"post\" action=\"/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <button type=\"submit\" id=\"logout\">Log out</button></form></header><main>{}",
        escape(model),
        o.seq,
        escape(o.csrf),
        o.notice
    );
    html.push_str("<section><h2>Health</h2><ul class=\"health\">");
    for f in o.fields.iter().filter(|f| f.level.is_some()) {
        let level = f.level.map(|l| match l {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Bad => "bad",
        });
        let _ = write!(
            html,
            "<li id=\"{}\" class=\"lvl-{}\">{}</li>",
            escape(&f.id),
            level.unwrap_or("ok"),
            escape(&f.text)
        );
    }
    html.push_str("</ul></section><section><h2>Now</h2><dl class=\"values\">");
    for f in o
        .fields
        .iter()
        .filter(|f| f.level.is_none() && f.id != "v-engine-log")
    {
        let _ = write!(
            html,
            "<dt>{}</dt><dd id=\"{}\">{}</dd>",
            escape(&f.label),
            escape(&f.id),
            escape(&f.text)
        );
    }
    html.push_str("</dl></section><section><h2>Last hour</h2><div class=\"charts\">");
    for (name, title, svg) in o.charts {
        let _ = write!(
            html,
            "<figure><figcaption>{}</figcaption><div id=\"chart-{name}\">{svg}</div></figure>",
            escape(title)
        );
    }
    html.push_str(
        "</div></section><section><h2>Try it</h2>\
         <form id=\"chat-form\"><textarea id=\"chat-input\" maxlength=\"2000\" rows=\"2\" \
         placeholder=\"Ask the model something\"></textarea>\
         <button type=\"submit\" id=\"chat-send\">Send</button></form>\
         <pre id=\"chat-reply\" class=\"reply\"></pre></section>",
    );
    let log = o
        .fields
        .iter()
        .find(|f| f.id == "v-engine-log")
        .map(|f| escape(&f.text))
        .unwrap_or_default();
    let _ = write!(
        html,
        "<section><h2>Engine log</h2><pre id=\"v-engine-log\" class=\"log\">{log}</pre></section>\
         <section><h2>Overclock history</h2>{}</section></main></body></html>",
        overclock_history(&o.status["overclock"])
    );
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn everything_from_the_document_is_escaped() {
        assert_eq!(
            escape("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        let status = json!({
            "board": { "model": "<script>alert(1)</script>" },
            "steps": [{ "name": "gov<", "desired": "a", "effective": "b", "state": "failed", "reason": "<img>" }],
            "engine": { "state": "ready", "reason": "serving", "restarts": 0 }
        });
        let fields = fields(&status, &["<b>log</b>".to_string()]);
        let page = overview(&Overview {
            status: &status,
            fields: &fields,
            charts: &[],
            csrf: "\"><x",
            notice: String::new(),
            seq: 1,
        });
        for raw in ["<script>alert", "<img>", "<b>log", "\"><x", "gov<"] {
            assert!(!page.contains(raw), "{raw} unescaped");
        }
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
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
            "steps": [{ "arm_freq": 2800, "over_voltage_delta": 2, "status": "failed", "reason": "throttled" }] });
        status["steps"][0]["state"] = json!("pending-reboot");
        let f = fields(&status, &[]);
        assert_eq!(get(&f, "h-overclock").level, Some(Level::Bad));
        assert_eq!(get(&f, "h-step-0").level, Some(Level::Warn));
        assert_eq!(get(&f, "h-summary").level, Some(Level::Bad));
        assert!(
            overclock_history(&status["overclock"])
                .contains("<td>2800 MHz</td><td>2</td><td>failed</td><td>throttled</td>")
        );
        status["overclock"]["phase"] = json!("done");
        status["overclock"]["result"] = json!({ "arm_freq": 2600 });
        assert_eq!(overclock_line(&status["overclock"]).0, "done: 2600 MHz");
    }
}
