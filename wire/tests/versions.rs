//! Boxes and tools of different ages read each other's documents: the current reader on a
//! document as today's box writes it, as a newer box writes it (fields this build does not
//! know, a higher minor version) and as an older box wrote it (parts and fields missing).

use wire::status::{Stage, Status};

/// A status document as a box writes it today (compact; keys in the order the box writes).
const TODAY: &str = r#"{"schema_version":1,"root":"/","simulated":false,"board":{"model":"Raspberry Pi 5 Model B Rev 1.0","temperature_c":51.25,"throttle":{"raw":"0x50000","now":[],"since_boot":["under-voltage","throttled"]},"cpu_mhz":2400,"cpu_max_mhz":2400,"governors":["policy0=performance"],"memory_total_mib":8063,"memory_available_mib":5120,"swap":[{"device":"/dev/zram0","kind":"partition","size_kib":2097148,"used_kib":1024}],"numa_nodes":8,"boot":{"tryboot":false,"partition":1,"boot_mode":1,"bootloader_build_timestamp":1746662400},"uptime_s":90061,"os":"Debian GNU/Linux 13 (trixie)","hostname":"north-1"},"model":{"id":"smollm2-135m-instruct-q4_1","state":"verified","path":"/var/lib/appliance/models/m/model.gguf","draft":null,"speculation":"ngram","reason":"every chunk verified"},"steps":[{"name":"governor","desired":"performance","effective":"performance","state":"in-place","reason":""}],"engine":{"state":"ready","reason":"serving","pid":812,"model_id":"smollm2-135m-instruct-q4_1","model_sha256":"ab12","url":"http://127.0.0.1:8080","uptime_s":600,"ready_unix":1746662400,"restarts":1,"last_exit":"killed by signal 9","prefill_tokens_per_second":412.5,"decode_tokens_per_second":83.94,"recent_log":["listening"],"supervisor_pid":700},"overclock":{"enabled":true,"error":null,"version":1,"phase":"done","run":1,"reference":{"passed":true,"inconclusive":false,"reason":"stock","clock_mhz":2400,"seconds":60.0,"threads":4,"units":1200,"wrong_units":0,"max_temperature_c":70.5,"throttle":"0x0","engine_sha256":"cd34"},"trials":[{"run":1,"candidate":{"arm_freq":2800,"over_voltage_delta":20000},"status":"failed","reason":"throttled","started_unix":1,"checking_since_unix":2,"ended_unix":3,"checks":null}],"result":{"arm_freq":2600,"over_voltage_delta":0},"message":"2600 MHz passed every check","stock_reboot_tried":true},"update":{"booted":"B","committed":"B","slots":[{"slot":"A","system_version":"3","state":"bad","booted":false},{"slot":"B","system_version":"2","state":"good","booted":true}],"trial":null,"last":{"slot":"A","system_version":"3","from_version":"2","result":"rolled-back","reason":"the engine is failing","ended_unix":1746662500},"error":null},"provision":{"state":"provisioned","fleet":"shops","name":"north-1","generation":2,"applied_unix":1746662000,"serial":"10000000abcdef","hostname":"north-1","device_public_key":"aa","certificate_sha256":"bb","enrolled_unix":1746662100,"last_error":null},"clock":{"now_unix":1746663000,"synchronized":true,"rtc_unix":null,"floor_unix":1746600000}}"#;

fn document(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("test document is JSON")
}

#[test]
fn todays_document_round_trips_byte_for_byte() {
    let status = Status::from_json(TODAY.as_bytes()).expect("today's document reads");
    assert_eq!(status.schema_version, 1);
    assert_eq!(status.schema_minor, 0);
    assert_eq!(status.engine.decode_tokens_per_second, Some(83.94));
    assert_eq!(
        status.board.throttle.as_ref().map(|t| t.since_boot.len()),
        Some(2)
    );
    let written = serde_json::to_string(&status).expect("encodes");
    assert_eq!(written, TODAY, "the document a box writes is unchanged");
}

#[test]
fn a_newer_box_is_read_by_this_reader() {
    let mut newer = document(TODAY);
    newer["schema_minor"] = 7.into();
    newer["accelerator"] = serde_json::json!({ "kind": "npu", "tops": 13 });
    newer["engine"]["queue_depth"] = 3.into();
    newer["engine"]["state"] = "draining".into();
    newer["board"]["fan_rpm"] = 3100.into();
    newer["update"]["slots"][1]["signed_by"] = "fleet key".into();
    newer["update"]["channel"] = "stable".into();
    newer["provision"]["site"] = "Hamburg".into();
    newer["steps"][0]["since_unix"] = 5.into();
    let body = serde_json::to_vec(&newer).expect("encodes");
    let status = Status::from_json(&body).expect("a newer minor version reads");
    assert_eq!(status.schema_minor, 7);
    // A state word this build does not know reads as itself.
    assert_eq!(status.engine.state, "draining");
    assert_eq!(status.engine.restarts, 1);
    assert_eq!(
        status
            .update
            .as_ref()
            .and_then(|u| u.booted_slot())
            .and_then(|s| s.system_version.as_deref()),
        Some("2")
    );
    assert_eq!(
        status
            .provision
            .as_ref()
            .and_then(|p| p.device_public_key.as_deref()),
        Some("aa")
    );
    assert_eq!(status.steps[0].state, "in-place");
}

#[test]
fn an_older_box_is_read_with_defaults() {
    // Version 1 as the first boxes wrote it: no overclock, update, provision or clock part,
    // and parts without the fields added to them since.
    let older = r#"{"schema_version":1,"root":"/","simulated":true,
        "board":{"model":"Raspberry Pi 5","temperature_c":48.0,"cpu_mhz":2400},
        "model":{"id":"m","state":"not-installed"},
        "steps":[{"name":"swap","state":"applied"}],
        "engine":{"state":"blocked","reason":"model refused"}}"#;
    let status = Status::from_json(older.as_bytes()).expect("an older document reads");
    assert!(status.simulated);
    assert_eq!(status.overclock, None);
    assert_eq!(status.update, None);
    assert_eq!(status.provision, None);
    assert_eq!(status.clock, None);
    assert_eq!(status.board.uptime_s, None);
    assert_eq!(status.board.os, None);
    assert!(status.board.governors.is_empty());
    assert_eq!(status.board.swap, None);
    assert_eq!(status.model.speculation, "");
    assert_eq!(status.model.path, None);
    assert_eq!(status.steps[0].desired, "");
    assert_eq!(status.engine.restarts, 0);
    assert_eq!(status.engine.decode_tokens_per_second, None);
    assert!(status.engine.recent_log.is_empty());

    // A trial from before `checking_since_unix` was recorded.
    let mut with_trial = document(TODAY);
    with_trial["update"]["trial"] =
        serde_json::json!({ "slot": "A", "system_version": "4", "prepared_unix": 9 });
    let body = serde_json::to_vec(&with_trial).expect("encodes");
    let status = Status::from_json(&body).expect("reads");
    let trial = status.update.and_then(|u| u.trial).expect("a trial");
    assert_eq!(trial.armed_unix, 0);
    assert_eq!(trial.stage(), Stage::Installed);
}

#[test]
fn a_document_without_a_required_field_is_refused_by_name() {
    for (part, field) in [
        (None, "schema_version"),
        (None, "engine"),
        (None, "board"),
        (Some("engine"), "state"),
        (Some("model"), "id"),
    ] {
        let mut doc = document(TODAY);
        let map = match part {
            Some(p) => doc[p].as_object_mut(),
            None => doc.as_object_mut(),
        }
        .expect("an object");
        map.remove(field);
        let body = serde_json::to_vec(&doc).expect("encodes");
        let e = Status::from_json(&body).expect_err("a required field is missing");
        assert!(
            e.to_string().contains(&format!("missing field `{field}`")),
            "{part:?}.{field}: {e}"
        );
    }
    for garbage in [
        &b"<html>busy</html>"[..],
        b"",
        b"[]",
        b"{\"schema_version\":\"one\"}",
    ] {
        assert!(Status::from_json(garbage).is_err());
    }
    let e = Status::from_json(b"\"busy\"").expect_err("a string is no document");
    assert!(e.to_string().contains("expected a status document"), "{e}");
}

#[test]
fn a_newer_major_version_is_refused_as_such() {
    let mut doc = document(TODAY);
    doc["schema_version"] = 2.into();
    // What a major bump may do: a field changes its shape.
    doc["engine"]["state"] = serde_json::json!({ "phase": "ready" });
    let body = serde_json::to_vec(&doc).expect("encodes");
    let e = Status::from_json(&body).expect_err("version 2 is not read as version 1");
    assert!(e.to_string().contains("status schema version 2"), "{e}");
}

#[test]
fn the_trial_stage_follows_the_recorded_times() {
    let mut trial = wire::status::UpdateTrial {
        slot: "A".into(),
        ..Default::default()
    };
    assert_eq!(trial.stage(), Stage::Writing);
    trial.prepared_unix = Some(2);
    assert_eq!(trial.stage(), Stage::Installed);
    trial.rebooted_unix = Some(3);
    assert_eq!(trial.stage(), Stage::Rebooting);
    trial.checking_since_unix = Some(4);
    assert_eq!(trial.stage(), Stage::Checking);
}

#[test]
fn the_other_documents_round_trip_and_ignore_new_fields() {
    let progress = r#"{"running":false,"received":1048576,"lines":["received 1048576 bytes"],"done":null,"error":"not signed"}"#;
    let p: wire::Progress = serde_json::from_str(progress).expect("progress reads");
    assert_eq!(p.error.as_deref(), Some("not signed"));
    assert_eq!(serde_json::to_string(&p).expect("encodes"), progress);
    let newer: wire::Progress =
        serde_json::from_str(r#"{"running":true,"percent":40}"#).expect("newer progress reads");
    assert!(newer.running && newer.lines.is_empty() && newer.error.is_none());

    let identity = r#"{"device_public_key":"aa","certificate_sha256":"bb","signature":"cc"}"#;
    let i: wire::Identity = serde_json::from_str(identity).expect("identity reads");
    assert_eq!(serde_json::to_string(&i).expect("encodes"), identity);
    let e = serde_json::from_str::<wire::Identity>(r#"{"device_public_key":"aa"}"#)
        .expect_err("an identity needs its certificate and signature");
    assert!(
        e.to_string().contains("missing field `certificate_sha256`"),
        "{e}"
    );

    let answer = r#"{"name":"north-1","fleet":"shops","generation":2,"serial":null,"device_public_key":"aa","certificate_sha256":"bb","proof":"dd","signature":"cc"}"#;
    let a: wire::Answer = serde_json::from_str(answer).expect("answer reads");
    assert_eq!(serde_json::to_string(&a).expect("encodes"), answer);
    let request = wire::NonceRequest {
        nonce: "00ff".into(),
    };
    assert_eq!(
        serde_json::to_string(&request).expect("encodes"),
        r#"{"nonce":"00ff"}"#
    );
}
