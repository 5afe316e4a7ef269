//! `supervisor update install` against a real `dbus-daemon` with a fake RAUC
//! (`de.pengutronix.rauc`) inside the test. The fake plays RAUC's part as RAUC 1.13 does it:
//! `Info` checks the bundle (here a small text file saying what it is; an unsigned one is
//! refused with RAUC's words), `InstallBundle` marks the target slot bad through the
//! supervisor's backend, writes it, makes it primary, runs the post-install handler with RAUC's
//! environment and signals `Completed`. So the supervisor's own checks (compatible, version),
//! the D-Bus exchange and the arming of the trial are tested as on a box, and a refused bundle
//! must change nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use zbus::object_server::SignalEmitter;
use zbus::zvariant::OwnedValue;

mod common;

use common::{BIN, start_bus};

/// The fake's record of what it was asked.
#[derive(Default)]
struct Seen {
    installs: Vec<String>,
}

struct FakeRauc {
    root: PathBuf,
    seen: Arc<Mutex<Seen>>,
    last_error: Arc<Mutex<String>>,
}

/// A fake bundle's contents: `compatible=`, `version=`, `signed=` lines.
fn describe(bundle: &str) -> Result<(String, String), String> {
    let text = std::fs::read_to_string(bundle).map_err(|e| format!("{bundle}: {e}"))?;
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or("")
            .to_string()
    };
    if get("signed") != "yes" {
        return Err(
            "signature verification failed: CMS_verify: no signer certificate found".into(),
        );
    }
    Ok((get("compatible"), get("version")))
}

fn supervisor(root: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("supervisor")
}

impl FakeRauc {
    /// What RAUC does for an install into slot B, calling the supervisor where RAUC calls it.
    fn install(&self, bundle: &str) -> Result<(), String> {
        let (_, version) = describe(bundle)?;
        let run = |args: &[&str]| {
            let out = supervisor(&self.root, args);
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        };
        run(&["update", "backend", "set-state", "B", "bad"])?;
        let out = Command::new(BIN)
            .args(["sim", "write-slot"])
            .arg(&self.root)
            .args(["B", &version])
            .output()
            .expect("write-slot");
        assert!(out.status.success());
        run(&["update", "backend", "set-primary", "B"])?;
        let out = Command::new(BIN)
            .arg("--root")
            .arg(&self.root)
            .args(["update", "post-install"])
            .env("RAUC_SLOTS", "1 2")
            .env("RAUC_TARGET_SLOTS", "2")
            .env("RAUC_SLOT_BOOTNAME_2", "B")
            .env("RAUC_SLOT_DEVICE_2", "/.appliance-sim-slots/B")
            .output()
            .expect("post-install");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }
}

// zbus's macro adds undocumented methods (signal emitters, property change notifiers).
#[allow(missing_docs)]
mod interface {
    use super::*;

    #[zbus::interface(name = "de.pengutronix.rauc.Installer")]
    impl FakeRauc {
        async fn info(&self, bundle: String) -> zbus::fdo::Result<(String, String)> {
            describe(&bundle).map_err(zbus::fdo::Error::Failed)
        }

        async fn install_bundle(
            &self,
            #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
            source: String,
            _args: std::collections::HashMap<String, OwnedValue>,
        ) -> zbus::fdo::Result<()> {
            self.seen
                .lock()
                .expect("lock")
                .installs
                .push(source.clone());
            let result = self.install(&source);
            *self.last_error.lock().expect("lock") = result.clone().err().unwrap_or_default();
            let code = if result.is_ok() { 0 } else { 1 };
            // As RAUC: the call returns at once; the signal follows.
            let emitter = emitter.into_owned();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                let _ = FakeRauc::completed(&emitter, code).await;
            });
            Ok(())
        }

        /// The end of an install: 0 on success.
        #[zbus(signal)]
        async fn completed(emitter: &SignalEmitter<'_>, result: i32) -> zbus::Result<()>;

        #[zbus(property)]
        async fn progress(&self) -> (i32, String, i32) {
            (50, "Installing".into(), 1)
        }

        #[zbus(property)]
        async fn last_error(&self) -> String {
            self.last_error.lock().expect("lock").clone()
        }

        #[zbus(property)]
        async fn compatible(&self) -> String {
            "appliance-rpi5".into()
        }
    }
}

struct Appliance {
    _dir: tempfile::TempDir,
    root: PathBuf,
    bundles: PathBuf,
    bus: common::Bus,
    seen: Arc<Mutex<Seen>>,
    _runtime: tokio::runtime::Runtime,
    _connection: zbus::Connection,
}

impl Appliance {
    fn new() -> Appliance {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("board");
        board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
        let bundles = dir.path().join("bundles");
        std::fs::create_dir_all(&bundles).expect("dir");
        let bus = start_bus();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let fake = FakeRauc {
            root: root.clone(),
            seen: Arc::clone(&seen),
            last_error: Arc::default(),
        };
        let connection = runtime.block_on(async {
            zbus::connection::Builder::address(bus.address.as_str())
                .expect("address")
                .name("de.pengutronix.rauc")
                .expect("name")
                .serve_at("/", fake)
                .expect("serve")
                .build()
                .await
                .expect("fake RAUC connects")
        });
        Appliance {
            _dir: dir,
            root,
            bundles,
            bus,
            seen,
            _runtime: runtime,
            _connection: connection,
        }
    }

    fn bundle(&self, name: &str, text: &str) -> String {
        let path = self.bundles.join(name);
        std::fs::write(&path, text).expect("bundle");
        path.display().to_string()
    }

    fn install(&self, bundle: &str, extra: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--root")
            .arg(&self.root)
            .args(["update", "install", bundle])
            .args(extra)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address)
            .output()
            .expect("update install")
    }

    /// The boot partition and the update record, to show a refusal changed nothing.
    fn snapshot(&self) -> (String, String, String) {
        let read = |rel: &str| std::fs::read_to_string(self.root.join(rel)).unwrap_or_default();
        (
            read("boot/firmware/config.txt"),
            read("boot/firmware/tryboot.txt"),
            read("var/lib/appliance/update.json"),
        )
    }

    fn installs(&self) -> usize {
        self.seen.lock().expect("lock").installs.len()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_good_bundle_is_installed_and_the_box_reboots_into_it_once() {
    let b = Appliance::new();
    let bundle = b.bundle(
        "v2.raucb",
        "compatible=appliance-rpi5\nversion=2\nsigned=yes\n",
    );
    let out = b.install(&bundle, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("installing version 2 into slot B"),
        "{}",
        stderr(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("rebooting into slot B once"));
    assert_eq!(b.installs(), 1);
    let tryboot =
        std::fs::read_to_string(b.root.join("boot/firmware/tryboot.txt")).expect("tryboot");
    assert_eq!(config_txt::setting(&tryboot, "os_prefix"), Some("slot-b/"));
    let param = std::fs::read_to_string(b.root.join("run/systemd/reboot-param")).expect("param");
    assert_eq!(param, "0 tryboot");
    let config = std::fs::read_to_string(b.root.join("boot/firmware/config.txt")).expect("config");
    assert_eq!(
        config_txt::setting(&config, "os_prefix"),
        Some("slot-a/"),
        "not committed yet"
    );
}

#[test]
fn bad_bundles_are_refused_with_a_reason_and_change_nothing() {
    let b = Appliance::new();
    let before = b.snapshot();
    let cases = [
        (
            "unsigned.raucb",
            "compatible=appliance-rpi5\nversion=2\nsigned=no\n",
            "signature verification failed",
        ),
        (
            "other.raucb",
            "compatible=someone-elses-box\nversion=2\nsigned=yes\n",
            "built for another product",
        ),
        (
            "old.raucb",
            "compatible=appliance-rpi5\nversion=0.9\nsigned=yes\n",
            "older than the running 1",
        ),
    ];
    for (name, text, reason) in cases {
        let bundle = b.bundle(name, text);
        let out = b.install(&bundle, &[]);
        assert!(!out.status.success(), "{name} was accepted");
        assert!(stderr(&out).contains(reason), "{name}: {}", stderr(&out));
        assert_eq!(b.snapshot(), before, "{name} changed the box");
    }
    let out = b.install("/nonexistent.raucb", &[]);
    assert!(stderr(&out).contains("no such file"), "{}", stderr(&out));
    assert_eq!(
        b.installs(),
        0,
        "RAUC was never asked to install a refused bundle"
    );
    // Going back is allowed when asked for.
    let bundle = b.bundle(
        "old.raucb",
        "compatible=appliance-rpi5\nversion=0.9\nsigned=yes\n",
    );
    let out = b.install(&bundle, &["--force", "--in-window"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !b.root.join("run/systemd/reboot-param").exists(),
        "--in-window leaves the reboot to the daemon"
    );
}

#[test]
fn a_bundle_uploaded_to_the_dashboard_is_installed_and_rebooted_into() {
    use sha2::Digest;
    let b = Appliance::new();
    let token = "0123456789abcdef0123456789abcdef";
    let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    let port = common::free_port();
    std::fs::write(
        b.root.join("etc/appliance/appliance.toml"),
        format!(
            "[daemon]\nreverify_interval_s = 0\n\n[engine]\nport = {}\n\n[dashboard]\nlisten = \"127.0.0.1:{port}\"\napi_token_sha256 = [\"{digest}\"]\n",
            common::free_port()
        ),
    )
    .expect("config");
    let mut daemon = test_support::Owned::spawn(
        Command::new(BIN)
            .arg("--root")
            .arg(&b.root)
            .arg("run")
            .env("DBUS_SYSTEM_BUS_ADDRESS", &b.bus.address)
            .env_remove("NOTIFY_SOCKET")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
        "supervisor run",
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(20)))
        .build()
        .into();
    let url = format!("http://127.0.0.1:{port}/api/update");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let bundle = b"compatible=appliance-rpi5\nversion=2\nsigned=yes\n".to_vec();
    // Without a token or a session nothing is taken.
    let refused = loop {
        match agent.post(&url).send(&bundle[..]) {
            Ok(r) => break r.status().as_u16(),
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("the dashboard never answered: {e}"),
        }
    };
    assert_eq!(refused, 403, "a POST without a session's CSRF token");
    let wrong = agent
        .post(&url)
        .header("authorization", "Bearer 0000")
        .send(&bundle[..])
        .expect("post");
    assert_eq!(wrong.status().as_u16(), 401);
    assert_eq!(b.installs(), 0);
    let accepted = agent
        .post(&url)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/octet-stream")
        .send(&bundle[..])
        .expect("post");
    assert_eq!(accepted.status().as_u16(), 202);
    let progress = loop {
        let mut r = agent
            .get(&url)
            .header("authorization", format!("Bearer {token}"))
            .call()
            .expect("progress");
        let p: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().expect("body")).expect("json");
        if p["running"] == false {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the install never ended: {p}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(progress["error"].is_null(), "{progress}");
    assert!(
        progress["done"]
            .as_str()
            .unwrap_or("")
            .contains("rebooting into slot B"),
        "{progress}"
    );
    assert_eq!(b.installs(), 1);
    assert!(
        b.root.join(".appliance-sim-reboot").exists(),
        "the box reboots into it"
    );
    assert!(
        !b.root
            .join("var/lib/appliance/update-upload.raucb")
            .exists(),
        "the upload's space is given back"
    );
}

/// The real `rauc service` (the RAUC 1.8 that Debian ships; the image's is newer) on the
/// private bus, with two file-backed slots and `box`'s certificate as its keyring: the
/// supervisor's own install path must refuse what RAUC's signature check refuses, with RAUC's
/// words, and take a bundle RAUC verified.
#[test]
fn the_real_rauc_refuses_unsigned_and_wrongly_signed_bundles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let at = |name: &str| dir.path().join(name).display().to_string();
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} must be installed (scripts/test does): {e}"));
        assert!(out.status.success(), "{program} {args:?}: {}", stderr(&out));
    };
    for name in ["box", "stranger"] {
        test_support::signing_pair(dir.path(), name);
    }
    // One bundle's contents, signed by each key and not at all. Version 0.5 is older than the
    // box's 1: a bundle that passes RAUC's check is then refused by the supervisor's own.
    let content = dir.path().join("content");
    std::fs::create_dir(&content).expect("content");
    std::fs::write(
        content.join("manifest.raucm"),
        "[update]\ncompatible=appliance-rpi5\nversion=0.5\n\n[image.rootfs]\nfilename=rootfs.img\n",
    )
    .expect("manifest");
    std::fs::write(content.join("rootfs.img"), vec![0x5a; 64 << 10]).expect("image");
    for name in ["box", "stranger"] {
        run(
            "rauc",
            &[
                &format!("--cert={}", at(&format!("{name}.cert.pem"))),
                &format!("--key={}", at(&format!("{name}.key.pem"))),
                "bundle",
                content.to_str().expect("utf8"),
                &at(&format!("{name}.raucb")),
            ],
        );
    }
    run(
        "mksquashfs",
        &[
            content.to_str().expect("utf8"),
            &at("unsigned.raucb"),
            "-quiet",
            "-all-root",
            "-noappend",
        ],
    );
    for slot in ["slot-a.img", "slot-b.img"] {
        std::fs::write(dir.path().join(slot), vec![0; 1 << 20]).expect("slot");
    }
    std::fs::create_dir(dir.path().join("rauc-data")).expect("data");
    let conf = dir.path().join("system.conf");
    std::fs::write(
        &conf,
        format!(
            "[system]\ncompatible=appliance-rpi5\nbootloader=noop\ndata-directory={}\n\n\
             [keyring]\npath={}\n\n\
             [slot.rootfs.0]\ndevice={}\ntype=raw\nbootname=A\n\n\
             [slot.rootfs.1]\ndevice={}\ntype=raw\nbootname=B\n",
            at("rauc-data"),
            at("box.cert.pem"),
            at("slot-a.img"),
            at("slot-b.img"),
        ),
    )
    .expect("system.conf");

    let root = dir.path().join("board");
    board_sim::init(&root, board_sim::Variant::Pi5_8gb).expect("sim");
    let bus = start_bus();
    let mut rauc = test_support::Owned::spawn(
        Command::new("rauc")
            .arg(format!("--conf={}", conf.display()))
            .args(["service", "--override-boot-slot=A"])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
        "rauc service",
    );
    let install = |bundle: &str| {
        Command::new(BIN)
            .arg("--root")
            .arg(&root)
            .args(["update", "install", bundle])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)
            .output()
            .expect("update install")
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (_connection, names) = runtime.block_on(async {
        let connection = zbus::connection::Builder::address(bus.address.as_str())
            .expect("address")
            .build()
            .await
            .expect("the bus");
        let names = zbus::fdo::DBusProxy::new(&connection)
            .await
            .expect("the bus's names");
        (connection, names)
    });
    rauc.wait_until(|| {
        runtime
            .block_on(names.name_has_owner("de.pengutronix.rauc".try_into().expect("name")))
            .unwrap_or(false)
    });
    // RAUC 1.8 says only "rauc info error" over D-Bus; the supervisor says what it means.
    for bundle in ["stranger.raucb", "unsigned.raucb"] {
        let refused = install(&at(bundle));
        assert!(!refused.status.success(), "{bundle} was accepted");
        assert!(
            stderr(&refused).contains("RAUC refused the bundle")
                && stderr(&refused).contains("not signed by the key this image trusts"),
            "{bundle}: {}",
            stderr(&refused)
        );
    }
    // Signed by the box's key: RAUC vouches for its manifest, whose version the supervisor
    // then refuses as a downgrade.
    let verified = install(&at("box.raucb"));
    assert!(!verified.status.success());
    assert!(
        stderr(&verified).contains("older than the running 1"),
        "a verified bundle: {}",
        stderr(&verified)
    );
    let image = std::fs::read(dir.path().join("slot-b.img")).expect("slot B");
    assert!(
        image.iter().all(|&b| b == 0),
        "nothing was written to slot B"
    );
}
