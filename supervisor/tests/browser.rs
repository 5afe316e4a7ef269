//! The dashboard in a real browser: headless Chromium driven through chromedriver (W3C
//! WebDriver, spoken here over plain HTTP), against `supervisor run` with the real engine and
//! model on a simulated board. It logs in through the form, sees the overview, watches a value
//! the board changes arrive over the live events, asks the chat box, and saves a screenshot to
//! `<target>/ci-artifacts/dashboard.png`; a wrong password, a missing session and a forged
//! CSRF token are refused in the browser too. Through the page's models section it uploads a
//! signed model (a tiny Gemma 4 and its draft head) a chunk at a time and switches to it.
//!
//! Needs `chromium` and `chromedriver` (Debian `chromium`, `chromium-driver`; `.ci/run`
//! installs them). Without them the test fails: it never skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use test_support::Owned;

mod common;

use common::{BIN, engine_binary, free_port, supervisor_with_stdin};
const PASSWORD: &str = "reception 42";
/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The cargo target directory of this build (`<target>/<profile>/deps/<test>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.ancestors().nth(3).expect("target dir").to_path_buf()
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// One WebDriver session.
struct Browser {
    base: String,
    session: String,
    agent: ureq::Agent,
    _driver: Owned,
}

impl Browser {
    fn start() -> Browser {
        let driver = which("chromedriver").expect(
            "chromedriver is not installed: apt-get install chromium chromium-driver (.ci/run does)",
        );
        let chromium = ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .find_map(|name| which(name))
            .expect("chromium is not installed: apt-get install chromium chromium-driver");
        let port = free_port();
        let mut driver = Owned::spawn(
            Command::new(driver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "chromedriver",
        );
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let base = format!("http://127.0.0.1:{port}");
        driver.wait_until(|| agent.get(&format!("{base}/status")).call().is_ok());
        let mut browser = Browser {
            base,
            session: String::new(),
            agent,
            _driver: driver,
        };
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            // A script cut off by a navigation answers after this, not the default 30 s.
            "timeouts": { "script": 5000 },
            "goog:chromeOptions": {
                "binary": chromium,
                // Root in a container has no user namespace for Chromium's sandbox.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,2000"]
            }
        }}});
        let answer = browser.call("POST", "/session", Some(caps));
        browser.session = answer["value"]["sessionId"]
            .as_str()
            .expect("session id")
            .to_string();
        browser
    }

    /// A WebDriver command; panics with the driver's message when it fails.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.attempt(method, path, body)
            .unwrap_or_else(|failure| panic!("{method} {path}: {failure}"))
    }

    /// A WebDriver command, or the driver's answer when it fails.
    fn attempt(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let response = match method {
            "GET" => self.agent.get(&url).call(),
            "DELETE" => self.agent.delete(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.unwrap_or(json!({})).to_string()),
        };
        let mut response = response.expect("webdriver request");
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .expect("webdriver body");
        if status != 200 {
            return Err(format!("{status}: {text}"));
        }
        Ok(serde_json::from_str(&text).expect("webdriver json"))
    }

    fn value(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, path, body)["value"].clone()
    }

    fn go(&self, url: &str) {
        self.value("POST", "/url", Some(json!({ "url": url })));
    }

    fn url(&self) -> String {
        self.value("GET", "/url", None)
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn find(&self, css: &str) -> String {
        let found = self.value(
            "POST",
            "/element",
            Some(json!({ "using": "css selector", "value": css })),
        );
        found[ELEMENT].as_str().expect(css).to_string()
    }

    fn text(&self, css: &str) -> String {
        let id = self.find(css);
        self.value("GET", &format!("/element/{id}/text"), None)
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// The element's text, or `None` while there is none (the page is being replaced).
    fn text_now(&self, css: &str) -> Option<String> {
        let found = self
            .attempt(
                "POST",
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .ok()?;
        let id = found["value"][ELEMENT].as_str()?.to_string();
        let text = self
            .attempt("GET", &format!("/element/{id}/text"), None)
            .ok()?;
        text["value"].as_str().map(str::to_string)
    }

    fn attribute(&self, css: &str, name: &str) -> Option<String> {
        let id = self.find(css);
        self.value("GET", &format!("/element/{id}/attribute/{name}"), None)
            .as_str()
            .map(str::to_string)
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.value("POST", &format!("/element/{id}/clear"), None);
        self.value(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn click(&self, css: &str) {
        let id = self.find(css);
        self.value("POST", &format!("/element/{id}/click"), None);
    }

    /// Runs an async script in the page; it calls its last argument with the result.
    fn run_async(&self, script: &str) -> Value {
        self.value(
            "POST",
            "/execute/async",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&Browser) -> bool) {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            assert!(Instant::now() < deadline, "not {what} within {timeout:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn screenshot(&self, to: &Path) {
        let png = self.value("GET", "/screenshot", None);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64"))
            .expect("png");
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
        std::fs::create_dir_all(to.parent().expect("dir")).expect("artifact dir");
        std::fs::write(to, bytes).expect("screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let url = format!("{}/session/{}", self.base, self.session);
            let _ = self.agent.delete(&url).call();
        }
    }
}

/// A simulated board with the default model, and `supervisor run` serving the dashboard; the
/// box trusts `key` (public, hex) for models.
fn start_supervisor(dir: &Path, port: u16, key: &str) -> Owned {
    let root = dir.join("board");
    board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
    common::install_default_model(&root);
    let config = format!(
        "[daemon]\nreverify_interval_s = 0\n\n[engine]\nbinary = \"{}\"\nport = {}\nhealth_interval_s = 2\n\n\
         [dashboard]\nlisten = \"0.0.0.0:{port}\"\npassword_hash = \"{}\"\nsample_interval_s = 1\n\n\
         [model]\ntrusted_keys = [\"{key}\"]\n",
        engine_binary().display(),
        free_port(),
        supervisor_with_stdin(&["dashboard", "hash-password"], PASSWORD).trim()
    );
    std::fs::write(root.join("etc/appliance/appliance.toml"), config).expect("config");
    let mut child = Owned::spawn(
        Command::new(BIN)
            .arg("--root")
            .arg(&root)
            .arg("run")
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "supervisor run",
    );
    child.wait_until(|| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    child
}

#[test]
fn log_in_watch_live_values_chat_and_save_a_screenshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let model = SignedModel::make(dir.path());
    let _supervisor = start_supervisor(dir.path(), port, &model.public);
    let base = format!("http://127.0.0.1:{port}");
    let browser = Browser::start();

    // A missing session: the overview sends the browser to the login form.
    browser.go(&format!("{base}/"));
    assert_eq!(browser.url(), format!("{base}/login"));

    // A wrong password: the form again, with the error, and no way in.
    browser.type_into("#password", "reception 24");
    browser.click("#login-button");
    // Read through a script, which waits for the form's navigation to load the new page; a
    // script the navigation cut off (the driver's script timeout) is only "not yet".
    let error = |b: &Browser| {
        b.attempt(
            "POST",
            "/execute/async",
            Some(
                json!({ "script": "const done = arguments[arguments.length - 1];
             const e = document.querySelector('#login-error');
             done(e ? e.textContent.trim() : '');", "args": [] }),
            ),
        )
        .map(|answer| answer["value"].clone())
        .unwrap_or(Value::Null)
    };
    browser.wait_for("told the password is wrong", Duration::from_secs(60), |b| {
        error(b) == json!("Wrong password.")
    });
    browser.go(&format!("{base}/"));
    assert_eq!(browser.url(), format!("{base}/login"));

    // The right password: the overview (the form's submission navigates; on a loaded machine
    // that can take a moment after the click returns).
    browser.type_into("#password", PASSWORD);
    browser.click("#login-button");
    let overview = format!("{base}/");
    browser.wait_for("on the overview", Duration::from_secs(60), |b| {
        b.url() == overview
    });
    assert!(
        browser
            .text("#v-model")
            .contains("smollm2-135m-instruct-q4_1")
    );
    assert!(browser.text("#h-model").contains("verified"));

    // Live: the events keep coming, and a new reading on the board reaches the page.
    let seq = |b: &Browser| b.text("#live-seq").parse::<u64>().unwrap_or(0);
    let first = seq(&browser);
    browser.wait_for("updated live", Duration::from_secs(20), |b| {
        seq(b) >= first + 2
    });
    std::fs::write(
        dir.path()
            .join("board/sys/class/thermal/thermal_zone0/temp"),
        "71234\n",
    )
    .expect("temperature");
    browser.wait_for(
        "showing the new temperature",
        Duration::from_secs(20),
        |b| b.text("#v-temp") == "71.2 °C",
    );

    // The chat box, through the supervisor to the engine on loopback.
    browser.wait_for("engine ready", Duration::from_secs(180), |b| {
        b.text("#h-engine").starts_with("engine: ready")
    });
    assert!(
        browser.text("#h-summary").starts_with("Healthy"),
        "{}",
        browser.text("#h-summary")
    );
    browser.type_into("#chat-input", "Name a colour.");
    browser.click("#chat-send");
    browser.wait_for("answered", Duration::from_secs(120), |b| {
        b.attribute("#chat-reply", "data-done").is_some()
    });
    assert_eq!(
        browser.attribute("#chat-reply", "data-done").as_deref(),
        Some("ok"),
        "{}",
        browser.text("#chat-reply")
    );
    assert!(!browser.text("#chat-reply").trim().is_empty());

    // A forged CSRF token from the logged-in page itself is refused.
    let status = browser.run_async(
        "const done = arguments[arguments.length - 1];
         fetch('/api/chat', { method: 'POST',
           headers: { 'content-type': 'application/json', 'x-csrf-token': 'forged' },
           body: JSON.stringify({ message: 'hi' }) }).then(r => done(r.status), e => done(String(e)));",
    );
    assert_eq!(status, json!(403));

    // A model from the owner's laptop: uploaded through the page a chunk at a time, then
    // switched to with the button its row offers once it is installed.
    let pick = |css: &str, file: &Path| {
        let id = browser.find(css);
        browser.value(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": file.display().to_string() })),
        );
    };
    pick("#model-manifest", &model.manifest);
    pick("#model-signature", &model.signature);
    pick("#model-weights", &model.weights);
    pick("#model-draft", &model.draft);
    browser.click("#model-send");
    browser.wait_for("uploaded", Duration::from_secs(120), |b| {
        b.attempt(
            "POST",
            "/element",
            Some(json!({ "using": "css selector", "value": ".model-use[data-id='tiny-e2b']" })),
        )
        .is_ok()
    });
    browser.click(".model-use[data-id='tiny-e2b']");
    browser.wait_for("switched", Duration::from_secs(240), |b| {
        b.text_now("#v-model")
            .is_some_and(|t| t.contains("tiny-e2b"))
    });
    let shot = target_dir().join("ci-artifacts/dashboard.png");
    browser.screenshot(&shot);
    println!("dashboard screenshot: {}", shot.display());

    // Logging out ends the session: the overview asks for the password again (the logout's
    // navigation, like the login's, can lag the click on a loaded machine).
    browser.click("#logout");
    let login = format!("{base}/login");
    browser.wait_for("on the login page", Duration::from_secs(10), |b| {
        b.url() == login
    });
    browser.go(&format!("{base}/"));
    assert_eq!(browser.url(), format!("{base}/login"));
}

/// A tiny Gemma 4 and its draft head with their manifest (made by `appliance model manifest`,
/// so the engine checked it) signed by a key of the test's own.
struct SignedModel {
    public: String,
    manifest: PathBuf,
    signature: PathBuf,
    weights: PathBuf,
    draft: PathBuf,
}

impl SignedModel {
    fn make(dir: &Path) -> SignedModel {
        let (weights, draft) = test_support::tiny::write_gemma4_pair(dir);
        let key = dir.join("fleet-key");
        let made = Command::new(BIN)
            .args(["weights", "keygen", "--out"])
            .arg(&key)
            .output()
            .expect("keygen");
        assert!(made.status.success());
        let public = std::fs::read_to_string(dir.join("fleet-key.pub")).expect("public key");
        let appliance = test_support::binary("operator", "appliance");
        let manifest = dir.join("e2b.toml");
        let template = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/gemma-4-e2b-it.template.toml"
        );
        let made = Command::new(&appliance)
            .args(["model", "manifest"])
            .args([&weights, &draft])
            .args([
                "--template",
                template,
                "--id",
                "tiny-e2b",
                "--chunk-size",
                "65536",
            ])
            .arg("--engine")
            .arg(engine_binary())
            .arg("-o")
            .arg(&manifest)
            .output()
            .expect("appliance model manifest");
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let signed = Command::new(&appliance)
            .args(["model", "sign"])
            .arg(&manifest)
            .arg("--key")
            .arg(&key)
            .output()
            .expect("appliance model sign");
        assert!(signed.status.success());
        SignedModel {
            public: public.trim().to_string(),
            signature: dir.join("e2b.toml.sig"),
            manifest,
            weights,
            draft,
        }
    }
}
