//! What `status` and `apply` print: the stable JSON document and the human table.
//!
//! JSON (`status --json`, the dashboard's `/api/status`): [`wire::Status`], the document's
//! one definition, shared with the `appliance` tool (its layout, versioning rule and required
//! fields are documented there). [`Status`] is what the supervisor collects, in its own types;
//! [`Status::to_wire`] is the one place they become the document. Keys are only ever added.

use std::fmt::Write;

use serde::Serialize;

use crate::clock::{civil_date, civil_time};

use crate::board::Board;
use crate::board::facts::Facts;
use crate::engine::EngineStatus;
use crate::model::ModelStatus;
use crate::tune::StepReport;

/// Version of the JSON layout; bumped only if a key changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = wire::SCHEMA_VERSION;

/// The status as collected, in the supervisor's types (for the human tables and `/metrics`);
/// [`Status::to_wire`] makes the `status --json` document of it.
#[derive(Debug)]
pub struct Status {
    /// Layout version.
    pub schema_version: u32,
    /// The board root.
    pub root: String,
    /// Whether the board is simulated.
    pub simulated: bool,
    /// Facts about the board.
    pub board: Facts,
    /// The model the engine runs, as the launch gate sees it.
    pub model: crate::model::ModelStatus,
    /// Every tuning step.
    pub steps: Vec<StepReport>,
    /// The engine, as the running daemon last published it.
    pub engine: crate::engine::EngineStatus,
    /// The overclock ladder: phase, every trial with its checks, the clock kept.
    pub overclock: crate::overclock::OverclockStatus,
    /// A/B updates: both slots, which runs, the update under way, the last outcome.
    pub update: crate::update::UpdateStatus,
    /// Fleet provisioning: what was applied and when, the device key, why a file was refused.
    pub provision: crate::provision::Record,
    /// The clock: the time, whether network time synchronised it, the RTC, the floor.
    pub clock: crate::clock::ClockStatus,
    /// Every model on the box, the active and fallback one, pushes and switches; `None`
    /// when they cannot be read (the reason is logged).
    pub models: Option<wire::models::Models>,
    /// The cluster this box is a member of; `None` when it serves alone.
    pub cluster: Option<wire::cluster::Cluster>,
}

impl Status {
    /// The `status --json` document: every part in the wire's types, field for field.
    pub fn to_wire(&self) -> wire::Status {
        wire::Status {
            schema_version: self.schema_version,
            schema_minor: wire::SCHEMA_MINOR,
            root: self.root.clone(),
            simulated: self.simulated,
            board: wire_board(&self.board),
            model: wire_model(&self.model),
            steps: self.steps.iter().map(wire_step).collect(),
            engine: wire_engine(&self.engine),
            overclock: Some(wire_overclock(&self.overclock)),
            update: Some(wire_update(&self.update)),
            provision: Some(wire_provision(&self.provision)),
            clock: Some(wire_clock(&self.clock)),
            models: self.models.clone(),
            cluster: self.cluster.clone(),
        }
    }
}

fn wire_board(f: &Facts) -> wire::status::Board {
    let words = |w: &[&str]| w.iter().map(|w| w.to_string()).collect();
    wire::status::Board {
        model: f.model.clone(),
        temperature_c: f.temperature_c,
        throttle: f.throttle.as_ref().map(|t| wire::status::Throttle {
            raw: t.raw.clone(),
            now: words(&t.now),
            since_boot: words(&t.since_boot),
        }),
        cpu_mhz: f.cpu_mhz,
        cpu_max_mhz: f.cpu_max_mhz,
        governors: f.governors.clone(),
        memory_total_mib: f.memory_total_mib,
        memory_available_mib: f.memory_available_mib,
        swap: f.swap.as_ref().map(|areas| {
            areas
                .iter()
                .map(|s| wire::status::SwapArea {
                    device: s.device.clone(),
                    kind: s.kind.clone(),
                    size_kib: s.size_kib,
                    used_kib: s.used_kib,
                })
                .collect()
        }),
        numa_nodes: f.numa_nodes.map(|n| n as u64),
        boot: f.boot.as_ref().map(|b| wire::status::BootInfo {
            tryboot: b.tryboot,
            partition: b.partition,
            boot_mode: b.boot_mode,
            bootloader_build_timestamp: b.bootloader_build_timestamp,
        }),
        uptime_s: f.uptime_s,
        os: f.os.clone(),
        hostname: f.hostname.clone(),
    }
}

fn wire_model(m: &ModelStatus) -> wire::status::Model {
    wire::status::Model {
        id: m.id.clone(),
        state: m.state.to_string(),
        path: m.path.clone(),
        draft: m.draft.clone(),
        speculation: m.speculation.to_string(),
        reason: m.reason.clone(),
    }
}

fn wire_step(s: &StepReport) -> wire::status::Step {
    wire::status::Step {
        name: s.name.clone(),
        desired: s.desired.clone(),
        effective: s.effective.clone(),
        state: word(s.state),
        reason: s.reason.clone(),
    }
}

fn wire_engine(e: &EngineStatus) -> wire::status::Engine {
    wire::status::Engine {
        state: word(e.state),
        reason: e.reason.clone(),
        pid: e.pid,
        model_id: e.model_id.clone(),
        model_sha256: e.model_sha256.clone(),
        url: e.url.clone(),
        uptime_s: e.uptime_s,
        ready_unix: e.ready_unix,
        restarts: e.restarts,
        last_exit: e.last_exit.clone(),
        prefill_tokens_per_second: e.prefill_tokens_per_second,
        decode_tokens_per_second: e.decode_tokens_per_second,
        tool_calls: e.tool_calls,
        recent_log: e.recent_log.clone(),
        supervisor_pid: e.supervisor_pid,
    }
}

fn wire_check(c: &crate::overclock::CheckReport) -> wire::status::Check {
    wire::status::Check {
        passed: c.passed,
        inconclusive: c.inconclusive,
        reason: c.reason.clone(),
        clock_mhz: c.clock_mhz,
        seconds: c.seconds,
        threads: c.threads as u64,
        units: c.units,
        wrong_units: c.wrong_units,
        max_temperature_c: c.max_temperature_c,
        throttle: c.throttle.clone(),
        engine_sha256: c.engine_sha256.clone(),
    }
}

fn wire_candidate(c: &crate::config::overclock::Candidate) -> wire::status::Candidate {
    wire::status::Candidate {
        arm_freq: c.arm_freq,
        over_voltage_delta: c.over_voltage_delta,
    }
}

fn wire_overclock(s: &crate::overclock::OverclockStatus) -> wire::status::Overclock {
    let r = &s.record;
    wire::status::Overclock {
        enabled: s.enabled,
        error: s.error.clone(),
        version: r.version,
        phase: word(r.phase),
        run: r.run,
        reference: r.reference.as_ref().map(wire_check),
        trials: r
            .trials
            .iter()
            .map(|t| wire::status::Trial {
                run: t.run,
                candidate: wire_candidate(&t.candidate),
                status: word(t.status),
                reason: t.reason.clone(),
                started_unix: t.started_unix,
                checking_since_unix: t.checking_since_unix,
                ended_unix: t.ended_unix,
                checks: t.checks.as_ref().map(wire_check),
            })
            .collect(),
        result: r.result.as_ref().map(wire_candidate),
        message: r.message.clone(),
        stock_reboot_tried: r.stock_reboot_tried,
    }
}

fn wire_update(s: &crate::update::UpdateStatus) -> wire::status::Update {
    let slot = |s: crate::update::slot::Slot| s.bootname().to_string();
    wire::status::Update {
        booted: s.booted.map(slot),
        committed: s.committed.map(slot),
        slots: s
            .slots
            .iter()
            .map(|x| wire::status::Slot {
                slot: slot(x.slot),
                system_version: x.system_version.clone(),
                state: x.state.to_string(),
                booted: x.booted,
            })
            .collect(),
        trial: s.trial.as_ref().map(|t| wire::status::UpdateTrial {
            slot: slot(t.slot),
            system_version: t.system_version.clone(),
            from: slot(t.from),
            from_version: t.from_version.clone(),
            failing_before: t.failing_before.clone(),
            armed_unix: t.armed_unix,
            prepared_unix: t.prepared_unix,
            rebooted_unix: t.rebooted_unix,
            checking_since_unix: t.checking_since_unix,
            checking_boot_id: t.checking_boot_id.clone(),
        }),
        last: s.last.as_ref().map(|l| wire::status::Ended {
            slot: slot(l.slot),
            system_version: l.system_version.clone(),
            from_version: l.from_version.clone(),
            result: word(l.result),
            reason: l.reason.clone(),
            ended_unix: l.ended_unix,
        }),
        error: s.error.clone(),
    }
}

fn wire_provision(r: &crate::provision::Record) -> wire::status::Provision {
    wire::status::Provision {
        state: r.state.clone(),
        fleet: r.fleet.clone(),
        name: r.name.clone(),
        generation: r.generation,
        applied_unix: r.applied_unix,
        serial: r.serial.clone(),
        hostname: r.hostname.clone(),
        device_public_key: r.device_public_key.clone(),
        certificate_sha256: r.certificate_sha256.clone(),
        enrolled_unix: r.enrolled_unix,
        last_error: r.last_error.clone(),
    }
}

fn wire_clock(c: &crate::clock::ClockStatus) -> wire::status::Clock {
    wire::status::Clock {
        now_unix: c.now_unix,
        synchronized: c.synchronized,
        rtc_unix: c.rtc_unix,
        floor_unix: c.floor_unix,
    }
}

/// Updates in words: each slot, then the update under way and the last one.
pub fn update_text(s: &crate::update::UpdateStatus) -> String {
    let mut out = String::new();
    if let Some(e) = &s.error {
        let _ = writeln!(out, "update: {e}");
    }
    for slot in &s.slots {
        let _ = writeln!(
            out,
            "slot {}: {:14} {:4}{}{}",
            slot.slot,
            slot.system_version.as_deref().unwrap_or("(unknown)"),
            slot.state,
            if slot.booted { "  running" } else { "" },
            if s.committed == Some(slot.slot) {
                "  committed"
            } else {
                ""
            },
        );
    }
    if let Some(t) = &s.trial {
        let stage = match (t.prepared_unix, t.rebooted_unix, t.checking_since_unix) {
            (_, _, Some(_)) => "being checked in its trial boot",
            (_, Some(_), None) => "rebooting into it",
            (Some(_), None, None) => "installed, waiting for the reboot",
            (None, None, None) => "being written",
        };
        let _ = writeln!(
            out,
            "update: version {} in slot {}: {stage}",
            t.system_version.as_deref().unwrap_or("?"),
            t.slot
        );
    }
    if let Some(last) = &s.last {
        let _ = writeln!(
            out,
            "last update: version {} to slot {}: {} ({})",
            last.system_version.as_deref().unwrap_or("?"),
            last.slot,
            match last.result {
                crate::update::UpdateResult::Committed => "committed",
                crate::update::UpdateResult::RolledBack => "rolled back",
                crate::update::UpdateResult::Cancelled => "cancelled",
            },
            last.reason
        );
    }
    out
}

/// The overclock ladder in words: where it stands, then one line per trial.
pub fn overclock_text(s: &crate::overclock::OverclockStatus) -> String {
    let mut out = String::new();
    let r = &s.record;
    if let Some(e) = &s.error {
        let _ = writeln!(out, "overclock: unreadable record: {e}");
        return out;
    }
    let phase = word(r.phase);
    let _ = writeln!(
        out,
        "overclock: {phase}{} (run {}): {}",
        if s.enabled {
            ""
        } else {
            ", disabled in config"
        },
        r.run,
        r.message
    );
    let kept = r
        .result
        .map_or_else(|| "stock".to_string(), |c| c.to_string());
    let _ = writeln!(out, "kept: {kept}");
    for t in &r.trials {
        let status = word(t.status);
        let _ = writeln!(
            out,
            "  run {} {:>16}  {status:8}  {}",
            t.run,
            t.candidate.to_string(),
            t.reason
        );
    }
    out
}

/// The status document from what the caller knows about model, steps and engine, with the
/// board's facts read now. `status --json` and the dashboard's `/api/status` both come from here,
/// so they are the same document.
pub fn collect(
    board: &Board,
    config: &crate::config::Config,
    model: ModelStatus,
    steps: Vec<StepReport>,
    engine: EngineStatus,
) -> Status {
    Status {
        schema_version: SCHEMA_VERSION,
        root: board.root().display().to_string(),
        simulated: board.is_simulated(),
        board: board.facts(),
        model,
        steps,
        cluster: crate::cluster::read(board, config, &engine),
        engine,
        overclock: crate::overclock::status(board, config),
        update: crate::update::status(board, config),
        provision: provision_record(board),
        clock: crate::clock::status(board),
        models: crate::models::catalog::list(board, config)
            .map_err(|e| tracing::warn!("listing the models: {e}"))
            .ok(),
    }
}

/// The status document read from the board now, for `supervisor status`: the model through
/// the gate, the steps observed, the engine as it published itself.
pub fn read(board: &Board, config: &crate::config::Config) -> Status {
    let backend = crate::tune::Backend::resolve(config.tuning.engine.backend, board);
    // The gate as configured: `full` hashes every chunk, `fast` trusts an unchanged file.
    let gate = crate::model::check(board, config, crate::model::reverify(config));
    let model = crate::model::ModelStatus::from_gate(&config.model.id, &gate);
    // In the running daemon's words where the board is as its last pass left it, so this says
    // what the dashboard says at the same moment.
    let last_pass = crate::tune::last_pass::read(board);
    let steps = crate::tune::status_after(
        board,
        &crate::tune::steps(config, backend),
        last_pass.as_deref(),
    );
    let engine = crate::engine::read_status(board, &config.model.id);
    collect(board, config, model, steps, engine)
}

/// The provisioning record; an unreadable one is reported as such rather than hidden.
fn provision_record(board: &Board) -> crate::provision::Record {
    match crate::provision::read_record(board) {
        Ok(Some(record)) => record,
        Ok(None) => crate::provision::Record {
            state: "unprovisioned".into(),
            ..Default::default()
        },
        Err(e) => crate::provision::Record {
            state: "unknown".into(),
            last_error: Some(e),
            ..Default::default()
        },
    }
}

/// The provisioning record in words: one line, and the refusal when there was one.
pub fn provision_text(r: &crate::provision::Record) -> String {
    let mut out = String::new();
    match (&r.fleet, &r.name) {
        (Some(fleet), name) => {
            let _ = writeln!(
                out,
                "provisioning: box {} of fleet {fleet}, generation {}, applied {}; host name {}; device key {}",
                name.as_deref().unwrap_or("(unnamed)"),
                r.generation,
                r.applied_unix
                    .map_or_else(|| "at an unknown time".into(), civil_date),
                r.hostname.as_deref().unwrap_or("unchanged"),
                r.device_public_key.as_deref().unwrap_or("none"),
            );
        }
        (None, _) => {
            let _ = writeln!(
                out,
                "provisioning: {}",
                if r.state.is_empty() {
                    "unprovisioned"
                } else {
                    &r.state
                }
            );
        }
    }
    if let Some(e) = &r.last_error {
        let _ = writeln!(out, "provisioning file refused: {e}");
    }
    out
}

/// The word a state enum is written as in the JSON (`in-place`, `ready`, `climbing`, ...).
pub fn word(value: impl Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The steps as an aligned table, one line each plus an indented reason.
pub fn steps_table(steps: &[StepReport]) -> String {
    let mut out = String::new();
    let width = steps.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in steps {
        let state = word(s.state);
        let _ = writeln!(
            out,
            "{:width$}  {:14}  desired: {}  effective: {}",
            s.name, state, s.desired, s.effective
        );
        if !s.reason.is_empty() {
            let _ = writeln!(out, "{:width$}  {}", "", s.reason);
        }
    }
    out
}

/// The board facts in words.
pub fn facts_text(f: &Facts, simulated: bool) -> String {
    let unknown = || "unknown".to_string();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "board: {}{}",
        f.model.clone().unwrap_or_else(unknown),
        if simulated { " (simulated)" } else { "" }
    );
    let temperature = f
        .temperature_c
        .map(|t| format!("{t:.1} °C"))
        .unwrap_or_else(unknown);
    let throttle = match &f.throttle {
        Some(t) => format!(
            "now: {}; since boot: {} ({})",
            words_or_none(&t.now),
            words_or_none(&t.since_boot),
            t.raw
        ),
        None => unknown(),
    };
    let _ = writeln!(out, "temperature: {temperature}; throttling {throttle}");
    let mhz = |m: Option<u64>| m.map(|m| format!("{m} MHz")).unwrap_or_else(unknown);
    let _ = writeln!(
        out,
        "clock: {} (max {}); governor: {}",
        mhz(f.cpu_mhz),
        mhz(f.cpu_max_mhz),
        if f.governors.is_empty() {
            unknown()
        } else {
            f.governors.join(", ")
        }
    );
    let mib = |m: Option<u64>| m.map(|m| format!("{m} MiB")).unwrap_or_else(unknown);
    let swap = match &f.swap {
        None => unknown(),
        Some(areas) if areas.is_empty() => "off".to_string(),
        Some(areas) => areas
            .iter()
            .map(|s| format!("{} {} MiB", s.device, s.size_kib / 1024))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let _ = writeln!(
        out,
        "memory: {} total, {} available; swap: {swap}; NUMA nodes: {}",
        mib(f.memory_total_mib),
        mib(f.memory_available_mib),
        f.numa_nodes.map(|n| n.to_string()).unwrap_or_else(unknown)
    );
    if let Some(b) = &f.boot {
        let mode = boot_mode_word(b.boot_mode);
        let _ = writeln!(
            out,
            "boot: {mode}, partition {}, tryboot {}, bootloader built {}",
            b.partition,
            if b.tryboot { "yes" } else { "no" },
            civil_date(u64::from(b.bootloader_build_timestamp))
        );
    }
    out
}

/// The boot device a bootloader boot mode (a `BOOT_ORDER` code) names: `SD`, `USB`, ...
pub fn boot_mode_word(mode: u32) -> String {
    match mode {
        1 => "SD".to_string(),
        4 => "USB".to_string(),
        6 => "NVMe".to_string(),
        2 => "network".to_string(),
        n => format!("mode {n}"),
    }
}

fn words_or_none(words: &[&str]) -> String {
    if words.is_empty() {
        "none".into()
    } else {
        words.join(", ")
    }
}

/// The clock in words: the time, whether network time synchronised it, the RTC.
pub fn clock_text(c: &crate::clock::ClockStatus) -> String {
    format!(
        "clock: {}, {}; RTC {}\n",
        civil_time(c.now_unix),
        if c.synchronized {
            "synchronised with network time"
        } else {
            "NOT synchronised with network time in this boot (check the NTP servers)"
        },
        c.rtc_unix.map_or_else(
            || "absent".to_string(),
            |t| format!("reads {}", civil_time(t))
        )
    )
}

#[cfg(test)]
mod tests {

    /// Every part of the wire document is written byte for byte as the supervisor's own type
    /// writes it (the document before the wire crate), filled in as far as each part goes.
    #[test]
    fn the_wire_document_is_the_supervisors_types_byte_for_byte() {
        let dir = tempfile::tempdir().expect("dir");
        board_sim::init(dir.path(), board_sim::Variant::Pi5_8gb).expect("sim");
        let board = board_sim::open(dir.path()).expect("board");
        let config = crate::config::Config::default();
        let model = crate::model::ModelStatus {
            id: "m".into(),
            state: "verified",
            path: Some("/data/m.gguf".into()),
            draft: None,
            speculation: "ngram",
            reason: "every chunk".into(),
        };
        let step = crate::tune::StepReport {
            name: "governor".into(),
            desired: "performance".into(),
            effective: "ondemand".into(),
            state: crate::tune::State::NeedsApply,
            reason: "would write".into(),
        };
        let mut engine = crate::engine::EngineStatus::new("m");
        engine.state = crate::engine::Phase::BackingOff;
        engine.pid = Some(7);
        engine.decode_tokens_per_second = Some(83.94);
        engine.prefill_tokens_per_second = Some(400.0);
        engine.recent_log = vec!["line".into()];
        let mut status = super::collect(&board, &config, model, vec![step], engine);
        let check = crate::overclock::CheckReport {
            passed: false,
            inconclusive: true,
            reason: "hot".into(),
            clock_mhz: Some(2800),
            seconds: 60.0,
            threads: 4,
            units: 100,
            wrong_units: 1,
            max_temperature_c: Some(84.5),
            throttle: Some("0x0".into()),
            engine_sha256: None,
        };
        let candidate = crate::config::overclock::Candidate {
            arm_freq: 2800,
            over_voltage_delta: 20_000,
        };
        let record = &mut status.overclock.record;
        record.reference = Some(check.clone());
        record.result = Some(candidate);
        record.trials.push(crate::overclock::Trial {
            run: 1,
            candidate,
            status: crate::overclock::TrialStatus::Failed,
            reason: "hot".into(),
            started_unix: 1,
            checking_since_unix: Some(2),
            ended_unix: None,
            checks: Some(check),
        });
        status.overclock.error = Some("unreadable".into());
        use crate::update::slot::Slot;
        status.update.booted = Some(Slot::B);
        status.update.slots.push(crate::update::SlotStatus {
            slot: Slot::A,
            system_version: Some("3".into()),
            state: "bad",
            booted: false,
        });
        status.update.trial = Some(crate::update::Trial {
            slot: Slot::A,
            system_version: Some("4".into()),
            from: Slot::B,
            from_version: None,
            failing_before: vec!["swap".into()],
            armed_unix: 10,
            prepared_unix: Some(11),
            rebooted_unix: None,
            checking_since_unix: None,
            checking_boot_id: Some("boot".into()),
        });
        status.update.last = Some(crate::update::Ended {
            slot: Slot::A,
            system_version: Some("3".into()),
            from_version: Some("2".into()),
            result: crate::update::UpdateResult::RolledBack,
            reason: "failing".into(),
            ended_unix: 9,
        });
        status.provision.fleet = Some("shops".into());
        status.provision.last_error = Some("refused".into());
        status.clock.rtc_unix = Some(5);

        let wire = status.to_wire();
        fn json(v: &impl serde::Serialize) -> String {
            serde_json::to_string(v).expect("encodes")
        }
        let same = |ours: String, theirs: String| assert_eq!(ours, theirs);
        same(json(&status.board), json(&wire.board));
        same(json(&status.model), json(&wire.model));
        same(json(&status.steps), json(&wire.steps));
        same(json(&status.engine), json(&wire.engine));
        same(json(&status.overclock), json(&wire.overclock));
        same(json(&status.update), json(&wire.update));
        same(json(&status.provision), json(&wire.provision));
        same(json(&status.clock), json(&wire.clock));
        same(json(&status.models), json(&wire.models));
        // The simulated board's facts were read, so the comparison covers them.
        assert!(wire.board.memory_total_mib.is_some(), "{:?}", wire.board);
        assert!(json(&wire.overclock).contains("\"checks\":{\"passed\":false"));
        let text = serde_json::to_string(&wire).expect("encodes");
        assert!(
            text.starts_with("{\"schema_version\":1,\"schema_minor\":3,\"root\":"),
            "{text}"
        );
        assert_eq!(
            wire::Status::from_json(text.as_bytes()).expect("reads"),
            wire
        );
    }
}
