//! Models onto a fleet, end to end: two supervisors on simulated boards over HTTPS, a tiny
//! random Gemma 4 with its draft head made into a manifest the engine checked, signed with the
//! fleet key, pushed (cut mid-way and resumed, a flipped byte refused at its chunk, a stranger's
//! or no signature refused, a full disk refused before any byte), switched to with the health
//! gate, a broken model rolled back by itself, a switch cut by a crash rolled back at the next
//! start, the active model kept from removal, and a `read` token refused every change.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Box_, appliance, fleet_with, supervisor, text};
use operator::https;
use serde_json::Value;

/// The engine binary of this checkout.
fn engine() -> PathBuf {
    test_support::binary("engine", "engine")
}

/// `supervisor weights keygen`: the secret key file and its public key.
fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    let out = supervisor(
        &["weights", "keygen", "--out", key.to_str().expect("utf8")],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let public = std::fs::read_to_string(dir.join(format!("{name}.pub"))).expect("pub");
    (key, public.trim().to_string())
}

fn ask(
    b: &Box_,
    token: &str,
    method: &str,
    path: &str,
    body: Option<(&str, &[u8])>,
) -> https::Response {
    https::request_within(
        Duration::from_secs(120),
        &b.https,
        method,
        path,
        Some(token),
        body,
        None,
    )
    .expect("an answer")
}

/// `appliance model sign MANIFEST --key KEY`, which must succeed.
fn sign(manifest: &Path, key: &Path) {
    let out = appliance(
        &[
            "model",
            "sign",
            manifest.to_str().expect("utf8"),
            "--key",
            key.to_str().expect("utf8"),
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

fn json(response: &https::Response) -> Value {
    serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&response.body)))
}

/// The push request for the manifest at `manifest` with `signature`.
fn push_body(manifest: &Path, signature: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "manifest": std::fs::read_to_string(manifest).expect("manifest"),
        "signature": signature,
    }))
    .expect("json")
}

fn models(b: &Box_, token: &str) -> Value {
    json(&ask(b, token, "GET", "/api/models", None))
}

/// Waits until the box's status satisfies `done` (the engine restarts on a switch).
fn wait_status(b: &Box_, token: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let status = json(&ask(b, token, "GET", "/api/status", None));
        if done(&status) {
            return status;
        }
        assert!(start.elapsed() < test_support::HUNG, "{what}: {status:#}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_model_goes_to_every_box_and_back() {
    use test_support::tiny::{MODELS, gguf_bytes};
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (fleet_key, fleet_public) = keygen(d, "fleet-key");
    let engine = engine();
    let fleet = fleet_with(
        d,
        &["north", "south"],
        &format!("fleet_key = \"{fleet_public}\"\n"),
        &format!("binary = \"{}\"\ncontext = 512\n", engine.display()),
    );
    let (token, reader) = (fleet.token.clone(), fleet.reader.clone());
    let [mut north, mut south]: [Box_; 2] = fleet
        .boxes
        .try_into()
        .unwrap_or_else(|_| panic!("two boxes"));
    let fleet_arg = fleet.path.to_str().expect("utf8").to_string();
    let at_north = format!("north={}", north.https);
    let at_south = format!("south={}", south.https);
    // `appliance COMMAND… FLEET --at … ARGS…`.
    let reach = |command: &[&str], args: &[&str]| {
        let mut all: Vec<&str> = command.to_vec();
        all.extend([fleet_arg.as_str(), "--at", &at_north, "--at", &at_south]);
        all.extend(args);
        appliance(&all, &token)
    };
    let enrolled = reach(&["fleet", "enroll"], &[]);
    assert!(enrolled.status.success(), "{}", text(&enrolled.stderr));

    // The model: a tiny Gemma 4 and its draft head, checked by the engine, signed.
    let (model, head) = test_support::tiny::write_gemma4_pair(d);
    let manifest = d.join("e2b.toml");
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../models/gemma-4-e2b-it.template.toml"
    );
    let path = |p: &Path| p.to_str().expect("utf8").to_string();
    let made = appliance(
        &[
            "model",
            "manifest",
            &path(&model),
            &path(&head),
            "--template",
            template,
            "--id",
            "tiny-e2b",
            "--chunk-size",
            "65536",
            "--engine",
            &path(&engine),
            "-o",
            &path(&manifest),
        ],
        "",
    );
    assert!(made.status.success(), "{}", text(&made.stderr));
    assert!(
        text(&made.stderr).contains("16 GB board: fits"),
        "{}",
        text(&made.stderr)
    );
    let written = std::fs::read_to_string(&manifest).expect("manifest");
    assert!(
        written.contains("[[fits]]") && written.contains("[draft]"),
        "{written}"
    );
    sign(&manifest, &fleet_key);
    let signature = std::fs::read_to_string(d.join("e2b.toml.sig")).expect("sig");

    // Refused before anything is stored: no signature, a stranger's, a read token.
    let (stranger_key, _) = keygen(d, "stranger-key");
    let stranger = d.join("stranger.toml");
    std::fs::copy(&manifest, &stranger).expect("copy");
    sign(&stranger, &stranger_key);
    let stranger_sig = std::fs::read_to_string(d.join("stranger.toml.sig")).expect("sig");
    for (sig, why) in [
        ("", "malformed signature"),
        (stranger_sig.as_str(), "not among the box's trusted keys"),
    ] {
        let refused = ask(
            &north,
            &token,
            "POST",
            "/api/models/push",
            Some(("application/json", &push_body(&manifest, sig))),
        );
        assert_eq!(refused.status, 403, "{}", text(&refused.body));
        assert!(text(&refused.body).contains(why), "{}", text(&refused.body));
    }
    let body = push_body(&manifest, &signature);
    for (method, route, body) in [
        (
            "POST",
            "/api/models/push",
            Some(("application/json", body.as_slice())),
        ),
        (
            "PUT",
            "/api/models/incoming/tiny-e2b/model/0",
            Some(("application/octet-stream", &b"x"[..])),
        ),
        (
            "POST",
            "/api/models/use",
            Some(("application/json", &br#"{"id":"tiny-e2b"}"#[..])),
        ),
        ("DELETE", "/api/models/tiny-e2b", None),
    ] {
        let refused = ask(&north, &reader, method, route, body);
        assert_eq!(
            refused.status,
            403,
            "{method} {route}: {}",
            text(&refused.body)
        );
    }
    let incoming = |b: &Box_| b.root.join("var/lib/appliance/incoming/tiny-e2b");
    assert!(!incoming(&north).exists());

    // A full data partition (here: more must stay free than there is) is refused up front.
    let config_path = south.root.join("etc/appliance/appliance.toml");
    let config = std::fs::read_to_string(&config_path).expect("config");
    south.stop();
    std::fs::write(
        &config_path,
        format!("{config}\n[model]\nkeep_free_mib = 1048576\n"),
    )
    .expect("config");
    south.start();
    let full = ask(
        &south,
        &token,
        "POST",
        "/api/models/push",
        Some(("application/json", &body)),
    );
    assert_eq!(full.status, 507, "{}", text(&full.body));
    assert!(
        text(&full.body).contains("keep_free_mib"),
        "{}",
        text(&full.body)
    );
    assert!(!incoming(&south).exists());
    south.stop();
    std::fs::write(&config_path, &config).expect("config");
    south.start();

    // Part of the push reaches north, chunk by chunk; a flipped byte and a chunk out of turn
    // are refused on their own, a resent one acknowledged.
    let started = json(&ask(
        &north,
        &token,
        "POST",
        "/api/models/push",
        Some(("application/json", &body)),
    ));
    assert_eq!(started["parts"][0]["received"], 0, "{started:#}");
    assert_eq!(started["parts"][1]["part"], "draft", "{started:#}");
    let weights = std::fs::read(&model).expect("model");
    let chunk = |i: usize| &weights[i * 65536..((i + 1) * 65536).min(weights.len())];
    let put = |b: &Box_, i: usize, bytes: &[u8]| {
        ask(
            b,
            &token,
            "PUT",
            &format!("/api/models/incoming/tiny-e2b/model/{i}"),
            Some(("application/octet-stream", bytes)),
        )
    };
    for i in 0..3 {
        let r = put(&north, i, chunk(i));
        assert_eq!(r.status, 200, "{}", text(&r.body));
        assert_eq!(json(&r)["parts"][0]["received"], i + 1);
    }
    let mut flipped = chunk(3).to_vec();
    flipped[100] ^= 1;
    let r = put(&north, 3, &flipped);
    assert_eq!(r.status, 422, "{}", text(&r.body));
    assert!(
        text(&r.body).contains("chunk 3 of model"),
        "{}",
        text(&r.body)
    );
    // Chunks may come in any order; a resend is acknowledged.
    let r = put(&north, 5, chunk(5));
    assert_eq!(r.status, 200, "{}", text(&r.body));
    let state = json(&r);
    assert_eq!(state["parts"][0]["received"], 4, "{state:#}");
    assert_eq!(state["parts"][0]["missing"][0], 3, "{state:#}");
    assert_eq!(state["parts"][0]["missing"][1], 4, "{state:#}");
    assert_eq!(state["parts"][0]["missing"][2], 6, "{state:#}");
    assert_eq!(put(&north, 1, chunk(1)).status, 200);
    // The box goes down with chunk 3 half written (not counted) and bytes past the file's end.
    north.stop();
    let partial = incoming(&north).join("files/e2b.gguf");
    let mut bytes = std::fs::read(&partial).expect("partial");
    assert_eq!(bytes.len(), weights.len(), "made at its full size");
    bytes[3 * 65536..3 * 65536 + 1000].fill(0xAA);
    bytes.extend_from_slice(&[0xAA; 1000]);
    std::fs::write(&partial, bytes).expect("garbage");
    north.start();

    // The tool resumes north and pushes all of south, one box at a time.
    let pushed = reach(
        &["fleet", "model", "push"],
        &["--all", &path(&manifest), &path(&model), &path(&head)],
    );
    assert!(pushed.status.success(), "{}", text(&pushed.stderr));
    assert!(
        text(&pushed.stderr).contains("north: resuming"),
        "{}",
        text(&pushed.stderr)
    );
    let said = text(&pushed.stdout);
    assert!(
        said.contains("north: tiny-e2b installed") && said.contains("south: tiny-e2b installed"),
        "{said}"
    );
    assert!(!incoming(&north).exists());
    let again = reach(
        &["fleet", "model", "push"],
        &[
            "--box",
            "north",
            &path(&manifest),
            &path(&model),
            &path(&head),
        ],
    );
    assert!(
        text(&again.stdout).contains("already installed"),
        "{}",
        text(&again.stdout)
    );

    // Both switch, each proving healthy before the next.
    let used = reach(&["fleet", "model", "use"], &["--all", "tiny-e2b"]);
    assert!(used.status.success(), "{}", text(&used.stderr));
    assert!(
        text(&used.stdout).contains("south: now runs tiny-e2b"),
        "{}",
        text(&used.stdout)
    );
    for b in [&north, &south] {
        let status = wait_status(b, &token, "serving tiny-e2b", |s| {
            s["model"]["id"] == "tiny-e2b" && s["engine"]["state"] == "ready"
        });
        assert_eq!(status["model"]["speculation"], "mtp", "{status:#}");
    }
    let listed = reach(&["fleet", "model", "list"], &[]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert!(
        text(&listed.stdout)
            .lines()
            .any(|l| l.starts_with("north") && l.contains("* tiny-e2b") && l.contains("+draft")),
        "{}",
        text(&listed.stdout)
    );

    // A model whose engine cannot start: the engine refuses it, so the tool does too; signed
    // anyway and pushed, the switch rolls back by itself.
    let junk = d.join("broken.gguf");
    std::fs::write(&junk, b"GGUF not really a model".repeat(5000)).expect("junk");
    let unloadable = appliance(
        &[
            "model",
            "manifest",
            &path(&junk),
            "--engine",
            &path(&engine),
        ],
        "",
    );
    assert_eq!(
        unloadable.status.code(),
        Some(2),
        "{}",
        text(&unloadable.stderr)
    );
    assert!(
        text(&unloadable.stderr).contains("does not load"),
        "{}",
        text(&unloadable.stderr)
    );
    let broken_manifest = d.join("broken.toml");
    let out = supervisor(
        &[
            "weights",
            "manifest",
            &path(&junk),
            "--id",
            "broken",
            "--chunk-size",
            "65536",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    std::fs::write(&broken_manifest, &out.stdout).expect("manifest");
    sign(&broken_manifest, &fleet_key);
    let pushed = reach(
        &["fleet", "model", "push"],
        &["--all", &path(&broken_manifest), &path(&junk)],
    );
    assert!(pushed.status.success(), "{}", text(&pushed.stderr));
    let rolled = reach(&["fleet", "model", "use"], &["--all", "broken"]);
    assert_eq!(rolled.status.code(), Some(1), "{}", text(&rolled.stdout));
    let why = text(&rolled.stderr);
    assert!(
        why.contains("north: switch to broken rolled-back")
            && why.contains("tiny-e2b is serving again"),
        "{why}"
    );
    assert!(why.contains("stopped: 1 not touched (south)"), "{why}");
    let after = models(&north, &token);
    assert_eq!(after["active"], "tiny-e2b", "{after:#}");
    assert_eq!(
        after["history"]
            .as_array()
            .and_then(|h| h.last())
            .map(|l| l["result"].clone()),
        Some("rolled-back".into())
    );
    wait_status(&north, &token, "tiny-e2b again", |s| {
        s["model"]["id"] == "tiny-e2b" && s["engine"]["state"] == "ready"
    });

    // The active and fallback models stay; another goes.
    let kept = reach(&["fleet", "model", "rm"], &["--box", "north", "tiny-e2b"]);
    assert_eq!(kept.status.code(), Some(1));
    assert!(
        text(&kept.stderr).contains("it is the active model"),
        "{}",
        text(&kept.stderr)
    );
    let gone = reach(&["fleet", "model", "rm"], &["--box", "north", "broken"]);
    assert!(gone.status.success(), "{}", text(&gone.stderr));
    assert!(!north.root.join("var/lib/appliance/models/broken").exists());

    // A model whose manifest says it needs a bigger board is refused before anything stops.
    let huge = d.join("huge.toml");
    let text_of = std::fs::read_to_string(&broken_manifest).expect("manifest");
    std::fs::write(
        &huge,
        format!(
            "{}\n[[fits]]\nmemory_gib = 64\nmax_context = 100000\n",
            text_of.replace("id = \"broken\"", "id = \"huge\"")
        ),
    )
    .expect("huge");
    sign(&huge, &fleet_key);
    let pushed = reach(
        &["fleet", "model", "push"],
        &["--box", "north", &path(&huge), &path(&junk)],
    );
    assert!(pushed.status.success(), "{}", text(&pushed.stderr));
    let refused = reach(&["fleet", "model", "use"], &["--box", "north", "huge"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("does not fit this box's")
            && text(&refused.stderr).contains("64 GB"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(models(&north, &token)["active"], "tiny-e2b");

    // A crash in the middle of a switch: the next start goes back to the model before.
    let asked = ask(
        &south,
        &token,
        "POST",
        "/api/models/use",
        Some(("application/json", &br#"{"id":"broken"}"#[..])),
    );
    assert_eq!(asked.status, 202, "{}", text(&asked.body));
    let selection = south.root.join("var/lib/appliance/model-selection.json");
    let start = Instant::now();
    while !std::fs::read_to_string(&selection).is_ok_and(|t| t.contains("\"switching\": {")) {
        assert!(
            start.elapsed() < test_support::HUNG,
            "the switch never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    south.stop();
    south.start();
    let recovered = models(&south, &token);
    assert_eq!(recovered["active"], "tiny-e2b", "{recovered:#}");
    let last = recovered["history"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["result"], "rolled-back", "{recovered:#}");
    assert!(
        last["reason"]
            .as_str()
            .is_some_and(|r| r.contains("restarted during the switch")),
        "{last:#}"
    );
    // And the committed model survives the restart: it is what the box runs.
    wait_status(&south, &token, "tiny-e2b after a restart", |s| {
        s["model"]["id"] == "tiny-e2b" && s["engine"]["state"] == "ready"
    });

    // A USB stick with a signed model: installed and switched to through the same gate; left
    // plugged in, it changes nothing more.
    let stick = south.root.join("media/stick/models");
    std::fs::create_dir_all(&stick).expect("stick");
    let llama = MODELS
        .iter()
        .find(|t| t.gemma4.is_none() && t.qwen35.is_none())
        .expect("a tiny model");
    let weights = stick.join("tiny-llama.gguf");
    std::fs::write(&weights, gguf_bytes(llama)).expect("weights");
    let on_stick = stick.join("tiny-llama.toml");
    let made = appliance(
        &[
            "model",
            "manifest",
            &path(&weights),
            "--id",
            "tiny-llama",
            "--engine",
            &path(&engine),
            "-o",
            &path(&on_stick),
        ],
        "",
    );
    assert!(made.status.success(), "{}", text(&made.stderr));
    sign(&on_stick, &fleet_key);
    let root = path(&south.root);
    let from_stick = supervisor(
        &["--root", &root, "model", "install-stick", "/media/stick"],
        "",
    );
    assert!(from_stick.status.success(), "{}", text(&from_stick.stderr));
    assert!(
        text(&from_stick.stdout).contains("the daemon switches to it"),
        "{}",
        text(&from_stick.stdout)
    );
    wait_status(&south, &token, "tiny-llama from the stick", |s| {
        s["model"]["id"] == "tiny-llama" && s["engine"]["state"] == "ready"
    });
    let again = supervisor(
        &["--root", &root, "model", "install-stick", "/media/stick"],
        "",
    );
    assert!(
        text(&again.stdout).contains("already running"),
        "{}",
        text(&again.stdout)
    );
    assert_eq!(models(&south, &token)["fallback"], "tiny-e2b");
    // Another version of the model that runs (here: other engine settings) does not go in
    // under it: what runs changes only through a switch.
    let text_now = std::fs::read_to_string(&on_stick).expect("manifest");
    assert!(text_now.contains("threads = 4"), "{text_now}");
    std::fs::write(&on_stick, text_now.replace("threads = 4", "threads = 2")).expect("edit");
    sign(&on_stick, &fleet_key);
    let over = supervisor(
        &["--root", &root, "model", "install-stick", "/media/stick"],
        "",
    );
    assert_eq!(over.status.code(), Some(1), "{}", text(&over.stdout));
    assert!(
        text(&over.stderr).contains("installed in another version"),
        "{}",
        text(&over.stderr)
    );
}

/// A power cut after each durable write of a switch (the simulated board ends the daemon at
/// the Nth write, the engine with it), for every N until a switch runs through: after the
/// power comes back the box serves one of the two models, the one its selection names, with
/// no switch left half done.
#[test]
fn a_power_cut_after_any_write_of_a_switch_leaves_a_serving_box() {
    use test_support::tiny::{MODELS, gguf_bytes};
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let engine = engine();
    let fleet = fleet_with(
        d,
        &["east"],
        "",
        &format!("binary = \"{}\"\ncontext = 512\n", engine.display()),
    );
    let token = fleet.token.clone();
    let [mut east]: [Box_; 1] = fleet.boxes.try_into().unwrap_or_else(|_| panic!("one box"));
    let root = east.root.to_str().expect("utf8").to_string();
    // Two small models installed on the box itself.
    let plain: Vec<_> = MODELS
        .iter()
        .filter(|t| t.gemma4.is_none() && t.qwen35.is_none())
        .take(2)
        .collect();
    let ids = ["first", "second"];
    for (tiny, id) in plain.iter().zip(ids) {
        let file = d.join(format!("{id}.gguf"));
        std::fs::write(&file, gguf_bytes(tiny)).expect("model");
        let file = file.to_str().expect("utf8");
        let made = supervisor(
            &[
                "weights",
                "manifest",
                file,
                "--id",
                id,
                "--chunk-size",
                "65536",
            ],
            "",
        );
        assert!(made.status.success(), "{}", text(&made.stderr));
        let manifest = d.join(format!("{id}.toml"));
        std::fs::write(&manifest, &made.stdout).expect("manifest");
        let installed = supervisor(
            &[
                "--root",
                &root,
                "weights",
                "install",
                file,
                "--manifest",
                manifest.to_str().expect("utf8"),
            ],
            "",
        );
        assert!(installed.status.success(), "{}", text(&installed.stderr));
    }
    let switch_to = |b: &Box_, id: &str| {
        let body = format!("{{\"id\":\"{id}\"}}");
        https::request_within(
            Duration::from_secs(60),
            &b.https,
            "POST",
            "/api/models/use",
            Some(&token),
            Some(("application/json", body.as_bytes())),
            None,
        )
    };
    // Start from a committed switch to the first model.
    assert_eq!(switch_to(&east, "first").expect("asked").status, 202);
    wait_status(&east, &token, "first", |s| {
        s["model"]["id"] == "first" && s["engine"]["state"] == "ready"
    });
    // The simulated board's power-cut switch (`board_sim::firmware::POWER_CUT`).
    let power_cut = east.root.join(".appliance-sim-power-cut");
    let mut cuts = Vec::new();
    for cut_at in 1.. {
        let before = models(&east, &token)["active"]
            .as_str()
            .expect("active")
            .to_string();
        let other = if before == "first" { "second" } else { "first" };
        std::fs::write(&power_cut, format!("{cut_at}\n")).expect("arm the power cut");
        // The request itself may be the write the power goes at.
        let _ = switch_to(&east, other);
        let start = Instant::now();
        let cut = loop {
            if east
                .daemon
                .as_mut()
                .is_some_and(|d| d.try_wait().ok().flatten().is_some())
            {
                break true;
            }
            // The daemon may go down between two looks: an unanswered look is no verdict.
            let m = https::request(&east.https, "GET", "/api/models", Some(&token), None, None)
                .ok()
                .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
                .unwrap_or_default();
            if m["requested"].is_null() && m["switching"].is_null() && m["active"] == other {
                break false;
            }
            assert!(
                start.elapsed() < test_support::HUNG,
                "cut {cut_at}: the switch never ended: {m:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = std::fs::remove_file(&power_cut);
        if cut {
            cuts.push(cut_at);
            east.stop();
            east.start();
        }
        // Power back (or none cut): the box serves the model its selection names, and no
        // switch is left half done once it has settled.
        let status = wait_status(&east, &token, "serving after the cut", |s| {
            s["engine"]["state"] == "ready"
                && s["models"]["switching"].is_null()
                && s["models"]["requested"].is_null()
                && s["model"]["id"] == s["models"]["active"]
        });
        let active = status["models"]["active"].as_str().expect("active");
        assert!(ids.contains(&active), "cut {cut_at}: {status:#}");
        if !cut {
            assert_eq!(active, other, "no cut: the switch committed");
            break;
        }
    }
    // The request, the switch's start, the engine's states and the commit are writes apart.
    eprintln!("the power was cut after writes {cuts:?}");
    assert!(cuts.len() >= 4, "{cuts:?}");
    // The selection on disk names what runs, and it parses.
    let selection: Value = serde_json::from_str(
        &std::fs::read_to_string(east.root.join("var/lib/appliance/model-selection.json"))
            .expect("selection"),
    )
    .expect("json");
    assert!(selection["switching"].is_null(), "{selection:#}");
}
