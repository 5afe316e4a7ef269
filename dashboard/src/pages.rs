//! The HTML pages, rendered on the server; every text in them is escaped.

use std::fmt::Write;

use wire::status::{Overclock, Status};

use crate::fields::{Field, Level};

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

/// The overclock history table from the status document's `overclock` part: its `trials`,
/// each a `candidate` clock with its status and reason.
pub(super) fn overclock_history(oc: Option<&Overclock>) -> String {
    let Some(oc) = oc else {
        return "<p>No overclock trials in this build.</p>".into();
    };
    if oc.trials.is_empty() {
        return "<p>No overclock trials have run.</p>".into();
    }
    let mut html = String::from(
        "<table id=\"overclock-history\"><thead><tr><th>run</th><th>Arm clock</th>\
         <th>voltage offset</th><th>result</th><th>why</th></tr></thead><tbody>",
    );
    for t in &oc.trials {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{} MHz</td><td>{} µV</td><td>{}</td><td>{}</td></tr>",
            t.run,
            t.candidate.arm_freq,
            t.candidate.over_voltage_delta,
            escape(&t.status),
            escape(&t.reason)
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

/// The box's models: each installed one with its size, signer, verification and the way to
/// switch to it or remove it; the switch history; with a login, the upload of a signed model.
pub(super) fn models_section(models: Option<&wire::models::Models>, login: bool) -> String {
    let mut html = String::from("<section id=\"models\"><h2>Models</h2>");
    let Some(m) = models else {
        html.push_str("<p>The models cannot be read (see the journal).</p></section>");
        return html;
    };
    html.push_str(
        "<table class=\"models\"><tr><th>Model</th><th>Role</th><th>MiB</th><th>Draft head</th>\
         <th>Signed by</th><th>Verified</th><th></th></tr>",
    );
    for i in &m.installed {
        let role = match m.role(&i.id) {
            "installed" => "",
            role => role,
        };
        let verified = match (&i.problem, i.verified_unix) {
            (Some(p), _) => format!("problem: {p}"),
            (None, Some(t)) => format!("every chunk, at {t} (unix)"),
            (None, None) => "not yet".into(),
        };
        let actions = if role.is_empty() && login {
            format!(
                "<button class=\"model-use\" data-id=\"{id}\">Use</button> \
                 <button class=\"model-rm\" data-id=\"{id}\">Remove</button>",
                id = escape(&i.id)
            )
        } else {
            String::new()
        };
        let _ = write!(
            html,
            "<tr><td title=\"{}\">{}</td><td>{role}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{actions}</td></tr>",
            escape(&i.name),
            escape(&i.id),
            i.size >> 20,
            if i.draft { "yes" } else { "no" },
            escape(&i.signed_by.chars().take(16).collect::<String>()),
            escape(&verified)
        );
    }
    html.push_str("</table>");
    for push in &m.incoming {
        let (got, all) = push.chunk_counts();
        let _ = write!(
            html,
            "<p>Push of {} under way: {got} of {all} chunks (send it again to resume).</p>",
            escape(&push.id)
        );
    }
    if !m.history.is_empty() {
        html.push_str("<h3>Switches</h3><ul class=\"switches\">");
        for s in m.history.iter().rev() {
            let _ = write!(
                html,
                "<li>{} → {}: {} ({}) at {} (unix)</li>",
                escape(s.from.as_deref().unwrap_or("?")),
                escape(&s.to),
                escape(&s.result),
                escape(&s.reason),
                s.ended_unix
            );
        }
        html.push_str("</ul>");
    }
    if login {
        html.push_str(
            "<h3>Add a model</h3><form id=\"model-form\">\
             <label>Manifest <input type=\"file\" id=\"model-manifest\" accept=\".toml\"></label>\
             <label>Signature <input type=\"file\" id=\"model-signature\" accept=\".sig\"></label>\
             <label>Weights <input type=\"file\" id=\"model-weights\" accept=\".gguf\"></label>\
             <label>Draft head (if it has one) <input type=\"file\" id=\"model-draft\" accept=\".gguf\"></label>\
             <button type=\"submit\" id=\"model-send\">Upload</button></form>",
        );
    }
    html.push_str("<pre id=\"model-progress\" class=\"reply\"></pre></section>");
    html
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
    pub status: &'a Status,
    /// Its values (see [`fields`]).
    pub fields: &'a [Field],
    /// Rendered charts by name.
    pub charts: &'a [(&'static str, &'static str, String)],
    /// This session's CSRF token.
    pub csrf: &'a str,
    /// The loopback notice, if any (already HTML).
    pub notice: String,
    /// Whether the page is behind a login: without a password there is nothing to log out of
    /// (the next page would open a new session anyway), so no "Log out" button.
    pub login: bool,
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
    let model = o.status.board.model.as_deref().unwrap_or("unknown board");
    let simulated = if o.status.simulated {
        " (simulated)"
    } else {
        ""
    };
    let logout = if o.login {
        format!(
            "<form method=\"post\" action=\"/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button type=\"submit\" id=\"logout\">Log out</button></form>",
            escape(o.csrf)
        )
    } else {
        String::new()
    };
    let _ = write!(
        html,
        "<header><h1>Appliance</h1><span class=\"board\">{}{simulated}</span>\
         <span class=\"live\">live update <span id=\"live-seq\">{}</span> \
         <span id=\"live-state\">connecting…</span></span>{logout}</header><main>{}",
        escape(model),
        o.seq,
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
         <label><input type=\"checkbox\" id=\"chat-think\"> Think first (models that reason)</label>\
         <details><summary>Tools the model may call (OpenAI JSON)</summary>\
         <textarea id=\"chat-tools\" rows=\"4\" maxlength=\"8000\" \
         placeholder='[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]'>\
         </textarea><label><input type=\"checkbox\" id=\"chat-must-call\"> The model must call one</label></details>\
         <button type=\"submit\" id=\"chat-send\">Send</button></form>\
         <details id=\"chat-thinking\" hidden><summary>Thinking</summary><pre id=\"chat-reasoning\"></pre></details>\
         <pre id=\"chat-calls\" class=\"reply\" hidden></pre>\
         <pre id=\"chat-reply\" class=\"reply\"></pre></section>",
    );
    html.push_str(&models_section(o.status.models.as_ref(), o.login));
    // Installing updates needs a logged-in owner (a dashboard without a password has none).
    if o.login {
        html.push_str(
            "<section><h2>Install an update</h2>\
             <form id=\"update-form\"><input type=\"file\" id=\"update-file\" accept=\".raucb\">\
             <button type=\"submit\" id=\"update-send\">Install</button></form>\
             <pre id=\"update-progress\" class=\"reply\"></pre></section>",
        );
    }
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
        overclock_history(o.status.overclock.as_ref())
    );
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fields::test_status;
    use serde_json::json;

    #[test]
    fn everything_from_the_document_is_escaped() {
        assert_eq!(
            escape("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        let status = test_status(json!({
            "board": { "model": "<script>alert(1)</script>" },
            "steps": [{ "name": "gov<", "desired": "a", "effective": "b", "state": "failed", "reason": "<img>" }],
            "engine": { "state": "ready", "reason": "serving", "restarts": 0 }
        }));
        let fields = super::super::fields::fields(&status, &["<b>log</b>".to_string()]);
        let page = overview(&Overview {
            status: &status,
            fields: &fields,
            charts: &[],
            csrf: "\"><x",
            notice: String::new(),
            login: true,
            seq: 1,
        });
        for raw in ["<script>alert", "<img>", "<b>log", "\"><x", "gov<"] {
            assert!(!page.contains(raw), "{raw} unescaped");
        }
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn the_models_section_escapes_and_offers_changes_only_behind_a_login() {
        let models: wire::models::Models = serde_json::from_value(json!({
            "active": "a<b", "fallback": "old",
            "installed": [
                { "id": "a<b", "name": "<i>x</i>", "size": 3145728, "signed_by": "k", "verified_unix": 5 },
                { "id": "old", "size": 0, "problem": "chunk 3 <bad>" },
                { "id": "new", "size": 1048576, "draft": true }
            ],
            "history": [{ "request": 1, "to": "a<b", "from": "old", "result": "committed",
                          "reason": "<serving>", "ended_unix": 9 }]
        }))
        .expect("models");
        let page = models_section(Some(&models), true);
        assert!(!page.contains("<i>") && !page.contains("<bad>") && !page.contains("<serving>"));
        assert!(
            page.contains("a&lt;b</td><td>active</td><td>3</td>"),
            "{page}"
        );
        assert!(page.contains("old</td><td>fallback</td>"), "{page}");
        // Only a model that is neither active nor the fallback can be switched to or removed.
        assert_eq!(page.matches("class=\"model-use\"").count(), 1, "{page}");
        assert!(page.contains("data-id=\"new\""), "{page}");
        assert!(page.contains("id=\"model-form\""));
        let open = models_section(Some(&models), false);
        assert!(
            !open.contains("model-use") && !open.contains("model-form"),
            "{open}"
        );
        assert!(models_section(None, true).contains("cannot be read"));
    }

    #[test]
    fn log_out_is_offered_only_behind_a_login() {
        let status = test_status(json!({ "board": { "model": "Raspberry Pi 5" } }));
        let page = |login: bool| {
            overview(&Overview {
                status: &status,
                fields: &[],
                charts: &[],
                csrf: "token",
                notice: String::new(),
                login,
                seq: 1,
            })
        };
        for needle in ["id=\"logout\"", "action=\"/logout\"", "Log out"] {
            assert!(
                page(true).contains(needle),
                "{needle} missing behind a login"
            );
            assert!(
                !page(false).contains(needle),
                "{needle} shown without a login"
            );
        }
        // The CSRF token the page's scripts send is still there without a login.
        assert!(page(false).contains("name=\"csrf-token\" content=\"token\""));
    }

    #[test]
    fn the_overclock_history_lists_every_trial() {
        let history = |oc: serde_json::Value| {
            overclock_history(test_status(json!({ "overclock": oc })).overclock.as_ref())
        };
        let html = history(json!({ "phase": "done", "trials": [
            { "run": 1, "candidate": { "arm_freq": 2600, "over_voltage_delta": 0 }, "status": "passed", "reason": "" },
            { "run": 1, "candidate": { "arm_freq": 2800, "over_voltage_delta": 20000 }, "status": "failed", "reason": "<throttled>" }
        ]}));
        assert!(
            html.contains("<td>1</td><td>2600 MHz</td><td>0 µV</td><td>passed</td>"),
            "{html}"
        );
        assert!(
            html.contains(
                "<td>2800 MHz</td><td>20000 µV</td><td>failed</td><td>&lt;throttled&gt;</td>"
            ),
            "{html}"
        );
        assert!(history(json!({ "phase": "idle", "trials": [] })).contains("have run"));
        assert!(overclock_history(None).contains("in this build"));
    }
}
