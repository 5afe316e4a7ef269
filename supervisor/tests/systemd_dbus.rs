//! The systemd backend against a real `dbus-daemon` with a small fake `org.freedesktop.systemd1`
//! inside the test. The fake plays systemd's part on a simulated board (it creates the slice's
//! cgroup and writes the limits into the cgroup files), so the supervisor's read-back
//! verification runs exactly as on a box.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use board_sim as sim;
use supervisor_core::board::Board;
use supervisor_core::config::{CgroupBackend, Config, SliceName};
use supervisor_core::systemd::{PropertyValue, Systemd};
use supervisor_core::tune::{self, Applier, Backend, State};
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};

mod common;

use common::start_bus;

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Start(String, String),
    Set(String, bool, Vec<(String, Value<'static>)>),
}

/// The part of systemd's manager the supervisor uses, acting on a simulated board.
struct FakeManager {
    board: Board,
    calls: Arc<Mutex<Vec<Call>>>,
}

fn cgroup_of(unit: &str) -> String {
    let slice =
        SliceName::try_from(unit.to_string()).expect("the supervisor only names valid slices");
    format!("/sys/fs/cgroup/{}", slice.cgroup_path())
}

impl FakeManager {
    fn realize(&self, unit: &str) -> zbus::fdo::Result<()> {
        if unit.starts_with("missing") {
            return Err(zbus::fdo::Error::Failed(format!("Unit {unit} not found.")));
        }
        // Like systemd: enable the controllers down the path and create each level.
        let path = cgroup_of(unit);
        let mut current = String::from("/sys/fs/cgroup");
        for part in path.trim_start_matches("/sys/fs/cgroup/").split('/') {
            let fail =
                |e: supervisor_core::board::BoardError| zbus::fdo::Error::Failed(e.to_string());
            self.board
                .write_attribute(&format!("{current}/cgroup.subtree_control"), "+cpu +memory")
                .map_err(fail)?;
            current = format!("{current}/{part}");
            self.board.create_cgroup(&current).map_err(fail)?;
        }
        Ok(())
    }
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeManager {
    async fn start_unit(&self, name: String, mode: String) -> zbus::fdo::Result<OwnedObjectPath> {
        self.calls
            .lock()
            .expect("lock")
            .push(Call::Start(name.clone(), mode));
        self.realize(&name)?;
        OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/1")
            .map_err(|e| zbus::fdo::Error::Failed(e.to_string()))
    }

    async fn set_unit_properties(
        &self,
        name: String,
        runtime: bool,
        properties: Vec<(String, OwnedValue)>,
    ) -> zbus::fdo::Result<()> {
        let plain: Vec<(String, Value<'static>)> = properties
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.try_clone().expect("clone"))))
            .collect();
        self.calls
            .lock()
            .expect("lock")
            .push(Call::Set(name.clone(), runtime, plain.clone()));
        self.realize(&name)?;
        let dir = cgroup_of(&name);
        for (key, value) in plain {
            let file = match key.as_str() {
                "CPUWeight" => "cpu.weight",
                "MemoryMax" => "memory.max",
                "MemorySwapMax" => "memory.swap.max",
                "MemoryLow" => "memory.low",
                "CPUAccounting" | "MemoryAccounting" => continue,
                other => {
                    return Err(zbus::fdo::Error::InvalidArgs(format!(
                        "unknown property {other}"
                    )));
                }
            };
            let Value::U64(n) = value else {
                return Err(zbus::fdo::Error::InvalidArgs(format!(
                    "{key} must be of type t"
                )));
            };
            self.board
                .write_attribute(&format!("{dir}/{file}"), &n.to_string())
                .map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        }
        Ok(())
    }
}

async fn serve_fake_systemd(
    address: &str,
    board: Board,
) -> (zbus::Connection, Arc<Mutex<Vec<Call>>>) {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let manager = FakeManager {
        board,
        calls: calls.clone(),
    };
    let connection = zbus::connection::Builder::address(address)
        .expect("address")
        .name("org.freedesktop.systemd1")
        .expect("name")
        .serve_at("/org/freedesktop/systemd1", manager)
        .expect("serve")
        .build()
        .await
        .expect("fake systemd connects");
    (connection, calls)
}

fn simulated(variant: sim::Variant) -> (tempfile::TempDir, PathBuf, Board) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("board");
    sim::init(&root, variant).expect("sim init");
    let board = sim::open(&root).expect("open");
    (dir, root, board)
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel))
        .expect("read")
        .trim()
        .to_string()
}

#[tokio::test]
async fn properties_reach_systemd_with_dbus_types_for_this_boot_only() {
    let bus = start_bus();
    let (_dir, _root, board) = simulated(sim::Variant::Pi5_8gb);
    let (_fake, calls) = serve_fake_systemd(&bus.address, board).await;

    let systemd = Systemd::connect(Some(&bus.address)).await.expect("connect");
    systemd
        .set_unit_properties(
            "appliance-engine.slice",
            &[
                ("CPUWeight".into(), PropertyValue::U64(10_000)),
                ("MemoryAccounting".into(), PropertyValue::Bool(true)),
            ],
        )
        .await
        .expect("set");
    let calls = calls.lock().expect("lock").clone();
    assert_eq!(
        calls,
        vec![Call::Set(
            "appliance-engine.slice".into(),
            true,
            vec![
                ("CPUWeight".into(), Value::U64(10_000)),
                ("MemoryAccounting".into(), Value::Bool(true)),
            ]
        )]
    );
}

#[tokio::test]
async fn apply_through_systemd_is_verified_from_the_cgroup_files() {
    let bus = start_bus();
    let (_dir, root, board) = simulated(sim::Variant::Pi5_8gb);
    let (_fake, calls) = serve_fake_systemd(&bus.address, board.clone()).await;

    let mut config = Config::default();
    config.tuning.engine.backend = CgroupBackend::Systemd;
    config.tuning.engine.memory_low_mib =
        Some(supervisor_core::config::MemoryLowMib::try_from(512).expect("in range"));
    let backend = Backend::resolve(config.tuning.engine.backend, &board);
    assert_eq!(backend, Backend::Systemd);
    let steps = tune::steps(&config, backend);
    let systemd = Systemd::connect(Some(&bus.address)).await.expect("connect");
    let applier = Applier::with_systemd(&board, systemd);

    let reports = tune::apply(&board, &steps, &applier, false).await;
    for r in &reports {
        assert_ne!(r.state, State::Failed, "{r:?}");
    }
    let engine = "sys/fs/cgroup/appliance.slice/appliance-engine.slice";
    assert_eq!(read(&root, &format!("{engine}/cpu.weight")), "10000");
    assert_eq!(read(&root, &format!("{engine}/memory.swap.max")), "0");
    assert_eq!(read(&root, &format!("{engine}/memory.low")), "536870912");
    // The parent slice must grant the protection too, or the engine's would be void.
    assert_eq!(
        read(&root, "sys/fs/cgroup/appliance.slice/memory.low"),
        "536870912"
    );
    let low = reports
        .iter()
        .find(|r| r.name == "cgroup.memory_low")
        .expect("step");
    assert_eq!(
        (low.state, low.effective.as_str()),
        (State::Applied, "512 MiB")
    );

    let fake_calls = calls;
    let calls = fake_calls.lock().expect("lock").clone();
    assert!(calls.contains(&Call::Start(
        "appliance-engine.slice".into(),
        "replace".into()
    )));
    assert!(
        calls.iter().all(|c| !matches!(c, Call::Set(_, false, _))),
        "never persistent: {calls:?}"
    );

    // A second run over D-Bus changes nothing.
    let before = calls.len();
    let again = tune::apply(&board, &steps, &applier, false).await;
    assert!(
        again
            .iter()
            .all(|r| matches!(r.state, State::InPlace | State::NotApplicable)),
        "{again:?}"
    );
    let after = fake_calls.lock().expect("lock").len();
    assert_eq!(after, before, "no D-Bus call on a tuned board");
}

#[tokio::test]
async fn a_systemd_refusal_fails_the_step_with_its_message() {
    let bus = start_bus();
    let (_dir, _root, board) = simulated(sim::Variant::Pi5_8gb);
    let (_fake, _calls) = serve_fake_systemd(&bus.address, board.clone()).await;

    let config: Config = toml::from_str(
        "[tuning.engine]\nslice = \"missing-engine.slice\"\nbackend = \"systemd\"\n",
    )
    .expect("config");
    let steps = tune::steps(&config, Backend::Systemd);
    let systemd = Systemd::connect(Some(&bus.address)).await.expect("connect");
    let applier = Applier::with_systemd(&board, systemd);
    let reports = tune::apply(&board, &steps, &applier, false).await;
    let slice = reports
        .iter()
        .find(|r| r.name == "cgroup.slice")
        .expect("step");
    assert_eq!(slice.state, State::Failed);
    assert!(slice.reason.contains("not found"), "{}", slice.reason);
    assert!(!tune::all_succeeded(&reports));
}

#[tokio::test]
async fn without_a_reachable_systemd_the_steps_fail_and_say_why() {
    let (_dir, root, board) = simulated(sim::Variant::Pi5_8gb);
    let dead = format!("unix:path={}", root.join("no-bus-here").display());
    let error = match Systemd::connect(Some(&dead)).await {
        Ok(_) => panic!("connected to a socket that does not exist"),
        Err(e) => e.to_string(),
    };
    let steps = tune::steps(&Config::default(), Backend::Systemd);
    let applier = Applier::files_only(&board, format!("cannot reach systemd: {error}"));
    let reports = tune::apply(&board, &steps, &applier, false).await;
    let slice = reports
        .iter()
        .find(|r| r.name == "cgroup.slice")
        .expect("step");
    assert_eq!(slice.state, State::Failed);
    assert!(
        slice.reason.contains("cannot reach systemd") && slice.reason.contains(&error),
        "{}",
        slice.reason
    );
    // Steps that do not need systemd still ran.
    let governor = reports.iter().find(|r| r.name == "governor").expect("step");
    assert_eq!(governor.state, State::Applied);
}
