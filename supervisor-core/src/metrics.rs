//! The status document as Prometheus text: what the dashboard's `GET /metrics` answers. Built
//! from the same [`Status`] that `status --json` and `/api/status` print, so the three always
//! agree; every name starts with `appliance_`.
//!
//! States are labels on a sample of value 1 (`appliance_tuning_step{step="governor",
//! state="applied"} 1`, `appliance_engine_state{state="ready"} 1`), facts that are words are
//! labels on an `_info` gauge of value 1, yes/no facts are 0 or 1. A value the status does not
//! have (no temperature sensor, no RTC, the engine not ready) is left out, never written as 0.

use metrics_text::{Exposition, Kind};

use crate::board::facts::{Facts, THROTTLE_WORDS};
use crate::clock::ClockStatus;
use crate::engine::{EngineStatus, Phase};
use crate::model::ModelStatus;
use crate::overclock::{OverclockStatus, TrialStatus};
use crate::provision::Record as ProvisionRecord;
use crate::report::{Status, boot_mode_word, word};
use crate::tune::StepReport;
use crate::update::UpdateStatus;

/// The exposition of `status`.
pub fn exposition(status: &Status) -> String {
    let mut out = Exposition::new();
    board(&mut out, &status.board, status.simulated);
    model(&mut out, &status.model);
    steps(&mut out, &status.steps);
    engine(&mut out, &status.engine);
    overclock(&mut out, &status.overclock);
    update(&mut out, &status.update);
    provision(&mut out, &status.provision);
    clock(&mut out, &status.clock);
    if let Some(m) = &status.models {
        models(&mut out, m);
    }
    if let Some(c) = &status.cluster {
        cluster(&mut out, c);
    }
    out.finish()
}

/// The cluster this box is a member of: its state, each other member's handshake and answer,
/// the bytes each member's share holds.
fn cluster(out: &mut Exposition, c: &wire::cluster::Cluster) {
    info(
        out,
        "appliance_cluster_info",
        "The cluster this box is a member of, its part and the cluster's state (starting, up, degraded, failing, stopped) (value 1).",
        &[
            ("cluster", Some(&c.name)),
            ("role", Some(&c.role)),
            ("state", Some(&c.state)),
        ],
    );
    let mut handshakes = out.family(
        Kind::Gauge,
        "appliance_cluster_handshake_age_seconds",
        "Seconds since WireGuard's last handshake with each other member.",
    );
    for m in &c.members {
        if let Some(age) = m.handshake_age_s {
            handshakes.sample(&[("member", &m.name)], age as f64);
        }
    }
    let mut answers = out.family(
        Kind::Gauge,
        "appliance_cluster_member_up",
        "The head: whether each worker's RPC server answered the last check (0 or 1).",
    );
    for m in &c.members {
        if let Some(up) = m.answers {
            answers.sample(&[("member", &m.name)], flag(up));
        }
    }
    let mut shares = out.family(
        Kind::Gauge,
        "appliance_cluster_share_bytes",
        "The head, while it serves the cluster's model: each member's share (weights and cache).",
    );
    for s in &c.layers {
        shares.sample(&[("member", &s.member)], (s.mib << 20) as f64);
    }
}

/// Each installed model: its size, whether it is the active or the fallback one, when it was
/// last verified in full; each push under way: the bytes received.
fn models(out: &mut Exposition, m: &wire::models::Models) {
    let mut installed = out.family(
        Kind::Gauge,
        "appliance_model_bytes",
        "Each installed model's files (weights and draft head), by id and role (active, fallback, installed).",
    );
    for i in &m.installed {
        installed.sample(&[("model", &i.id), ("role", m.role(&i.id))], i.size as f64);
    }
    let mut verified = out.family(
        Kind::Gauge,
        "appliance_model_verified_timestamp_seconds",
        "When each installed model's every chunk was last verified (the box's clock).",
    );
    for i in &m.installed {
        if let Some(t) = i.verified_unix {
            verified.sample(&[("model", &i.id)], t as f64);
        }
    }
    let mut pushes = out.family(
        Kind::Gauge,
        "appliance_model_push_received_bytes",
        "Bytes of each push under way the box holds, verified.",
    );
    for push in &m.incoming {
        let got: u64 = push
            .parts
            .iter()
            .map(wire::models::Part::received_bytes)
            .sum();
        pushes.sample(&[("model", &push.id)], got as f64);
    }
    if let Some(last) = m.history.last() {
        info(
            out,
            "appliance_model_last_switch_info",
            "The last model switch: the model switched to and how it ended (committed, rolled-back, refused) (value 1).",
            &[("model", Some(&last.to)), ("result", Some(&last.result))],
        );
    }
}

fn flag(yes: bool) -> f64 {
    if yes { 1.0 } else { 0.0 }
}

fn yes_no(yes: bool) -> &'static str {
    if yes { "true" } else { "false" }
}

/// A gauge written only when the value is known.
fn known(out: &mut Exposition, name: &str, help: &str, value: Option<f64>) {
    if let Some(value) = value {
        out.gauge(name, help, value);
    }
}

/// One sample of value 1 whose labels carry the facts; a label whose value is unknown is left
/// out.
fn info(out: &mut Exposition, name: &str, help: &str, labels: &[(&str, Option<&str>)]) {
    let present: Vec<(&str, &str)> = labels
        .iter()
        .filter_map(|(label, value)| value.map(|v| (*label, v)))
        .collect();
    out.family(Kind::Gauge, name, help).sample(&present, 1.0);
}

fn mib_bytes(mib: Option<u64>) -> Option<f64> {
    mib.map(|m| (m * 1024 * 1024) as f64)
}

fn board(out: &mut Exposition, f: &Facts, simulated: bool) {
    info(
        out,
        "appliance_board_info",
        "The board: its device-tree model, the operating system, the host name (value 1).",
        &[
            ("model", f.model.as_deref()),
            ("os", f.os.as_deref()),
            ("hostname", f.hostname.as_deref()),
            ("simulated", Some(yes_no(simulated))),
        ],
    );
    known(
        out,
        "appliance_soc_temperature_celsius",
        "The SoC's temperature.",
        f.temperature_c,
    );
    if let Some(t) = &f.throttle {
        out.gauge(
            "appliance_throttled_bits",
            "The firmware's get_throttled bit field (bits 0-3 now, 16-19 since boot).",
            f64::from(t.bits),
        );
        let mut throttle = out.family(
            Kind::Gauge,
            "appliance_throttle",
            "1 when the firmware reports this condition (under-voltage, arm-frequency-capped, throttled, soft-temperature-limit), now or at some time since boot.",
        );
        for (i, condition) in THROTTLE_WORDS.iter().enumerate() {
            for (when, shift) in [("now", 0), ("since-boot", 16)] {
                let set = t.bits & (1 << (i as u32 + shift)) != 0;
                throttle.sample(&[("flag", condition), ("when", when)], flag(set));
            }
        }
    }
    let hertz = |mhz: Option<u64>| mhz.map(|m| m as f64 * 1e6);
    known(
        out,
        "appliance_arm_clock_hertz",
        "The CPU clock cpufreq asks for (policy0; the firmware may run it lower when throttled).",
        hertz(f.cpu_mhz),
    );
    known(
        out,
        "appliance_arm_clock_max_hertz",
        "The highest CPU clock cpufreq allows.",
        hertz(f.cpu_max_mhz),
    );
    let mut governors = out.family(
        Kind::Gauge,
        "appliance_cpufreq_governor_info",
        "Each cpufreq policy's governor (value 1).",
    );
    for entry in &f.governors {
        if let Some((policy, governor)) = entry.split_once('=') {
            governors.sample(&[("policy", policy), ("governor", governor)], 1.0);
        }
    }
    known(
        out,
        "appliance_memory_total_bytes",
        "RAM the kernel manages.",
        mib_bytes(f.memory_total_mib),
    );
    known(
        out,
        "appliance_memory_available_bytes",
        "RAM available to new work (MemAvailable).",
        mib_bytes(f.memory_available_mib),
    );
    if let Some(swaps) = &f.swap {
        let kib = |pick: fn(&crate::board::facts::SwapArea) -> u64| {
            swaps.iter().map(|s| pick(s) * 1024).sum::<u64>() as f64
        };
        out.gauge(
            "appliance_swap_total_bytes",
            "Size of the active swap areas (0: swap is off).",
            kib(|s| s.size_kib),
        );
        out.gauge(
            "appliance_swap_used_bytes",
            "Swap in use.",
            kib(|s| s.used_kib),
        );
    }
    known(
        out,
        "appliance_numa_nodes",
        "NUMA nodes the kernel made (more than 1: NUMA emulation is on).",
        f.numa_nodes.map(|n| n as f64),
    );
    if let Some(b) = &f.boot {
        let partition = b.partition.to_string();
        let mode = boot_mode_word(b.boot_mode);
        info(
            out,
            "appliance_boot_info",
            "How the bootloader started this boot: the device and the partition (value 1).",
            &[
                ("device", Some(mode.as_str())),
                ("partition", Some(partition.as_str())),
            ],
        );
        out.gauge(
            "appliance_boot_tryboot",
            "1 when this is a one-time tryboot boot (an update or overclock trial).",
            flag(b.tryboot),
        );
        out.gauge(
            "appliance_bootloader_build_timestamp_seconds",
            "When the running bootloader was built, Unix time.",
            f64::from(b.bootloader_build_timestamp),
        );
    }
    known(
        out,
        "appliance_uptime_seconds",
        "Seconds since the kernel booted.",
        f.uptime_s.map(|s| s as f64),
    );
}

fn model(out: &mut Exposition, m: &ModelStatus) {
    out.family(
        Kind::Gauge,
        "appliance_weights_verified",
        "1 when the launch gate verified the model's weights against their approved manifest; the verdict (verified, failed, not-installed) is a label.",
    )
    .sample(
        &[("model", &m.id), ("verdict", m.state)],
        flag(m.state == "verified"),
    );
}

fn steps(out: &mut Exposition, steps: &[StepReport]) {
    let mut family = out.family(
        Kind::Gauge,
        "appliance_tuning_step",
        "One sample per tuning step, its state a label (in-place, applied, pending-reboot, not-applicable, failed, needs-apply); value 1.",
    );
    for s in steps {
        family.sample(&[("step", &s.name), ("state", &word(s.state))], 1.0);
    }
}

fn engine(out: &mut Exposition, e: &EngineStatus) {
    out.gauge(
        "appliance_engine_up",
        "1 when the engine is serving and its last health probe passed.",
        flag(e.state == Phase::Ready),
    );
    out.family(
        Kind::Gauge,
        "appliance_engine_state",
        "What the engine is doing (stopped, blocked, starting, ready, backing-off, failing) and the model it serves; value 1.",
    )
    .sample(&[("state", &word(e.state)), ("model", &e.model_id)], 1.0);
    out.counter(
        "appliance_engine_restarts_total",
        "Engine restarts since the supervisor started.",
        f64::from(e.restarts),
    );
    known(
        out,
        "appliance_engine_uptime_seconds",
        "Seconds since the running engine became ready.",
        e.uptime_s.map(|s| s as f64),
    );
    known(
        out,
        "appliance_engine_prefill_tokens_per_second",
        "Recent prompt-processing speed, from the engine's own timings.",
        e.prefill_tokens_per_second,
    );
    known(
        out,
        "appliance_engine_decode_tokens_per_second",
        "Recent generation speed, from the engine's own timings.",
        e.decode_tokens_per_second,
    );
    if let Some(t) = &e.tool_calls {
        out.counter(
            "appliance_engine_tool_call_answers_total",
            "Chat answers to requests that offered tools, since the engine started.",
            t.answers as f64,
        );
        out.counter(
            "appliance_engine_tool_calls_total",
            "Tool calls answered, since the engine started.",
            t.calls as f64,
        );
        out.counter(
            "appliance_engine_tool_call_failures_total",
            "Tool calls begun but malformed or cut off (given back as text), since the engine started.",
            t.failures as f64,
        );
    }
}

fn overclock(out: &mut Exposition, o: &OverclockStatus) {
    out.gauge(
        "appliance_overclock_enabled",
        "1 when [overclock] enabled allows starting the ladder.",
        flag(o.enabled),
    );
    out.gauge(
        "appliance_overclock_record_readable",
        "0 when the overclock record cannot be read (then nothing else of the ladder is reported).",
        flag(o.error.is_none()),
    );
    if o.error.is_some() {
        return;
    }
    let r = &o.record;
    out.family(
        Kind::Gauge,
        "appliance_overclock_phase",
        "Where the overclock ladder stands (idle, climbing, done, aborted); value 1.",
    )
    .sample(&[("phase", &word(r.phase))], 1.0);
    out.gauge(
        "appliance_overclock_run",
        "The current (or last) ladder run (0: never started).",
        f64::from(r.run),
    );
    let level = r.promoted();
    out.gauge(
        "appliance_overclock_arm_frequency_hertz",
        "The ARM clock the ladder has config.txt carry now (stock when it keeps none).",
        f64::from(level.map_or(crate::config::overclock::STOCK_ARM_FREQ, |c| c.arm_freq)) * 1e6,
    );
    out.gauge(
        "appliance_overclock_over_voltage_delta_microvolts",
        "The voltage offset that clock is run at (0: stock).",
        f64::from(level.map_or(0, |c| c.over_voltage_delta)),
    );
    let mut trials = out.family(
        Kind::Gauge,
        "appliance_overclock_trials",
        "Overclock trials of every run, by what became of them.",
    );
    for status in [
        TrialStatus::Running,
        TrialStatus::Passed,
        TrialStatus::Failed,
        TrialStatus::Aborted,
    ] {
        let n = r.trials.iter().filter(|t| t.status == status).count();
        trials.sample(&[("status", &word(status))], n as f64);
    }
}

fn update(out: &mut Exposition, u: &UpdateStatus) {
    out.gauge(
        "appliance_update_record_readable",
        "0 when the update record or the boot files could not be read.",
        flag(u.error.is_none()),
    );
    let committed = u.committed.map(|s| s.bootname());
    if let Some(booted) = u.booted {
        let version = u
            .slots
            .iter()
            .find(|s| s.slot == booted)
            .and_then(|s| s.system_version.as_deref());
        info(
            out,
            "appliance_update_info",
            "The slot running now, its system version and the slot config.txt boots (value 1).",
            &[
                ("slot", Some(booted.bootname())),
                ("version", version),
                ("committed", committed),
            ],
        );
    }
    let mut slots = out.family(
        Kind::Gauge,
        "appliance_update_slot_good",
        "Per A/B slot: 1 when it is recorded good, 0 when bad; its version a label.",
    );
    for s in &u.slots {
        let mut labels = vec![("slot", s.slot.bootname())];
        if let Some(version) = &s.system_version {
            labels.push(("version", version.as_str()));
        }
        slots.sample(&labels, flag(s.state == "good"));
    }
    out.gauge(
        "appliance_update_in_trial",
        "1 while an update is between its install and its verdict.",
        flag(u.trial.is_some()),
    );
    if let Some(t) = &u.trial {
        let stage = match (t.prepared_unix, t.rebooted_unix, t.checking_since_unix) {
            (_, _, Some(_)) => "checking",
            (_, Some(_), None) => "rebooting",
            (Some(_), None, None) => "installed",
            (None, None, None) => "writing",
        };
        info(
            out,
            "appliance_update_trial_info",
            "The update under way: its slot, version and stage (writing, installed, rebooting, checking); value 1.",
            &[
                ("slot", Some(t.slot.bootname())),
                ("version", t.system_version.as_deref()),
                ("stage", Some(stage)),
            ],
        );
    }
    if let Some(last) = &u.last {
        let result = word(last.result);
        info(
            out,
            "appliance_update_last_info",
            "How the last update ended (committed, rolled-back, cancelled): its slot and versions; value 1.",
            &[
                ("slot", Some(last.slot.bootname())),
                ("version", last.system_version.as_deref()),
                ("from_version", last.from_version.as_deref()),
                ("result", Some(result.as_str())),
            ],
        );
        out.gauge(
            "appliance_update_last_ended_timestamp_seconds",
            "When the last update ended, Unix time.",
            last.ended_unix as f64,
        );
    }
}

fn provision(out: &mut Exposition, p: &ProvisionRecord) {
    info(
        out,
        "appliance_provision_info",
        "Fleet provisioning: the state (provisioned, unprovisioned, unknown), the fleet, the box's name and host name; value 1.",
        &[
            ("state", Some(p.state.as_str())),
            ("fleet", p.fleet.as_deref()),
            ("name", p.name.as_deref()),
            ("hostname", p.hostname.as_deref()),
        ],
    );
    out.gauge(
        "appliance_provision_generation",
        "The provisioning generation applied (0: none).",
        p.generation as f64,
    );
    known(
        out,
        "appliance_provision_applied_timestamp_seconds",
        "When that generation was applied, Unix time.",
        p.applied_unix.map(|t| t as f64),
    );
    out.gauge(
        "appliance_provision_enrolled",
        "1 when this generation was enrolled with the fleet tool.",
        flag(p.enrolled_unix.is_some()),
    );
    out.gauge(
        "appliance_provision_file_refused",
        "1 when the last provisioning file was refused (see the status for why).",
        flag(p.last_error.is_some()),
    );
}

fn clock(out: &mut Exposition, c: &ClockStatus) {
    out.gauge(
        "appliance_clock_synchronized",
        "1 when network time synchronised the clock in this boot.",
        flag(c.synchronized),
    );
    out.gauge(
        "appliance_clock_time_seconds",
        "The board's time, Unix seconds (compare with the scraper's).",
        c.now_unix as f64,
    );
    known(
        out,
        "appliance_rtc_time_seconds",
        "The real-time clock's time, Unix seconds (absent: no RTC).",
        c.rtc_unix.map(|t| t as f64),
    );
    known(
        out,
        "appliance_clock_floor_seconds",
        "The earliest time the clock may show (the image's build or the last time recorded).",
        c.floor_unix.map(|t| t as f64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::facts::Throttle;

    fn facts() -> Facts {
        Facts {
            model: None,
            temperature_c: None,
            throttle: None,
            cpu_mhz: None,
            cpu_max_mhz: None,
            governors: Vec::new(),
            memory_total_mib: None,
            memory_available_mib: None,
            swap: None,
            numa_nodes: None,
            boot: None,
            uptime_s: None,
            os: None,
            hostname: None,
        }
    }

    fn board_text(f: &Facts) -> String {
        let mut out = Exposition::new();
        board(&mut out, f, true);
        out.finish()
    }

    #[test]
    fn what_the_board_does_not_report_is_left_out() {
        let text = board_text(&facts());
        assert_eq!(
            text,
            "# HELP appliance_board_info The board: its device-tree model, the operating system, the host name (value 1).\n\
             # TYPE appliance_board_info gauge\n\
             appliance_board_info{simulated=\"true\"} 1\n"
        );
    }

    #[test]
    fn every_throttle_condition_is_a_sample() {
        let f = Facts {
            temperature_c: Some(80.55),
            throttle: Some(Throttle::decode(0x5_0001)),
            cpu_mhz: Some(2400),
            governors: vec!["policy0=performance".into()],
            ..facts()
        };
        let text = board_text(&f);
        for line in [
            "appliance_soc_temperature_celsius 80.55\n",
            "appliance_throttled_bits 327681\n",
            "appliance_throttle{flag=\"under-voltage\",when=\"now\"} 1\n",
            "appliance_throttle{flag=\"under-voltage\",when=\"since-boot\"} 1\n",
            "appliance_throttle{flag=\"throttled\",when=\"now\"} 0\n",
            "appliance_throttle{flag=\"throttled\",when=\"since-boot\"} 1\n",
            "appliance_throttle{flag=\"soft-temperature-limit\",when=\"now\"} 0\n",
            "appliance_arm_clock_hertz 2400000000\n",
            "appliance_cpufreq_governor_info{policy=\"policy0\",governor=\"performance\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert_eq!(text.matches("appliance_throttle{").count(), 8, "{text}");
    }

    #[test]
    fn the_engines_tool_calls_are_counters_once_it_has_answered() {
        let mut e = EngineStatus::new("m");
        let text = |e: &EngineStatus| {
            let mut out = Exposition::new();
            engine(&mut out, e);
            out.finish()
        };
        assert!(
            !text(&e).contains("tool_call"),
            "unknown before the engine answers"
        );
        e.tool_calls = Some(wire::status::ToolCalls {
            answers: 5,
            calls: 4,
            failures: 1,
        });
        let text = text(&e);
        for line in [
            "# TYPE appliance_engine_tool_calls_total counter\n",
            "appliance_engine_tool_call_answers_total 5\n",
            "appliance_engine_tool_calls_total 4\n",
            "appliance_engine_tool_call_failures_total 1\n",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
