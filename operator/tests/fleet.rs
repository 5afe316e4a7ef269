//! `appliance fleet enroll` and `appliance fleet status` against two real supervisors, each on
//! its own simulated board and ports, provisioned from one fleet file: both enrol and show up,
//! the box whose device key is replaced afterwards is flagged and not trusted, HTTPS login works
//! with the provisioned password.

mod common;

use common::{Box_, Fleet, appliance, fleet_of, supervisor, text};
use operator::https;
use serde_json::Value;

#[test]
fn an_enrolment_token_answers_once_even_to_requests_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Fleet { token, boxes, .. } = fleet_of(dir.path(), &["east"]);
    let address = boxes[0].https.clone();
    let answers: Vec<u16> = std::thread::scope(|scope| {
        let asking: Vec<_> = (0..8)
            .map(|i| {
                let (address, token) = (&address, &token);
                scope.spawn(move || {
                    let nonce = format!("{i:0>32}");
                    https::request(
                        address,
                        "POST",
                        "/api/enroll",
                        Some(token),
                        Some((
                            "application/json",
                            format!("{{\"nonce\": \"{nonce}\"}}").as_bytes(),
                        )),
                        None,
                    )
                    .expect("an answer")
                    .status
                })
            })
            .collect();
        asking
            .into_iter()
            .map(|a| a.join().expect("thread"))
            .collect()
    });
    assert_eq!(
        answers.iter().filter(|&&s| s == 200).count(),
        1,
        "{answers:?}"
    );
    assert!(answers.iter().all(|&s| s == 200 || s == 409), "{answers:?}");
}

#[test]
fn enrolled_boxes_show_up_and_a_replaced_identity_is_flagged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Fleet {
        token,
        path: fleet_path,
        file: fleet,
        secret,
        boxes,
        ..
    } = fleet_of(dir.path(), &["north", "south"]);
    let [mut north, mut south]: [Box_; 2] =
        boxes.try_into().unwrap_or_else(|_| panic!("two boxes"));
    let fleet_arg = fleet_path.to_str().expect("utf8");
    let at_north = format!("north={}", north.https);
    let at_south = format!("south={}", south.https);

    // HTTPS login with the provisioned password; the cookie is Secure.
    let login = https::request(
        &north.https,
        "POST",
        "/login",
        None,
        Some((
            "application/x-www-form-urlencoded",
            b"password=front+desk+42".as_slice(),
        )),
        None,
    )
    .expect("login over HTTPS");
    assert_eq!(login.status, 303, "{}", text(&login.body));
    let cookie = login
        .headers
        .iter()
        .find(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v.clone())
        .expect("a session cookie");
    assert!(
        cookie.contains("Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    // The box itself is still served on the plain port (loopback is not redirected).
    let answer = {
        use std::io::{Read, Write};
        let mut plain = std::net::TcpStream::connect(&north.plain).expect("plain port");
        plain
            .write_all(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .expect("request");
        let mut answer = String::new();
        plain.read_to_string(&mut answer).expect("answer");
        answer
    };
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "plain HTTP serves loopback, not a redirect: {}",
        answer.lines().next().unwrap_or_default()
    );

    // A wrong API token enrols nothing.
    let refused = appliance(
        &[
            "fleet", "enroll", fleet_arg, "--at", &at_north, "--at", &at_south,
        ],
        "not-the-token",
    );
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stdout));
    assert!(!dir.path().join("fleet.lock").exists());

    let enrolled = appliance(
        &[
            "fleet", "enroll", fleet_arg, "--at", &at_north, "--at", &at_south,
        ],
        &token,
    );
    assert!(
        enrolled.status.success(),
        "{}{}",
        text(&enrolled.stdout),
        text(&enrolled.stderr)
    );
    let lock = std::fs::read_to_string(dir.path().join("fleet.lock")).expect("fleet.lock");
    for b in [&north, &south] {
        let record: Value = serde_json::from_str(
            &std::fs::read_to_string(b.root.join("var/lib/appliance/provision.json"))
                .expect("record"),
        )
        .expect("json");
        let key = record["device_public_key"].as_str().expect("device key");
        assert!(lock.contains(key), "fleet.lock records {key}");
        assert!(record["enrolled_unix"].is_u64(), "the token is spent");
    }

    // The token is one-time: enrolling again (lock lost) is refused by the box.
    std::fs::rename(
        dir.path().join("fleet.lock"),
        dir.path().join("fleet.lock.kept"),
    )
    .expect("move");
    let again = appliance(&["fleet", "enroll", fleet_arg, "--at", &at_north], &token);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stdout).contains("spent"),
        "{}",
        text(&again.stdout)
    );
    std::fs::rename(
        dir.path().join("fleet.lock.kept"),
        dir.path().join("fleet.lock"),
    )
    .expect("move back");

    let status = appliance(&["fleet", "status", fleet_arg, "--json"], &token);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let rows: Value = serde_json::from_slice(&status.stdout).expect("json");
    for (i, name) in ["north", "south"].iter().enumerate() {
        let row = &rows[i];
        assert_eq!(row["name"], *name);
        assert_eq!(row["reachable"], true, "{row}");
        assert_eq!(row["identity"], "matches", "{row}");
        assert_eq!(row["generation"], 1, "{row}");
        assert!(
            row["engine"].is_string() && row["temperature_c"].is_f64(),
            "{row}"
        );
        assert_eq!(row["slot"], "A", "{row}");
        assert_eq!(row["system_version"], "1", "{row}");
    }

    // A rollout stops at the first box that fails: these boards have no RAUC on their bus, so
    // north's install fails and south is never touched.
    let bundle = dir.path().join("appliance-rpi5-2.raucb");
    std::fs::write(&bundle, b"not reached by RAUC").expect("bundle");
    let rollout = appliance(
        &[
            "fleet",
            "update",
            fleet_arg,
            bundle.to_str().expect("utf8"),
            "--wait",
            "60",
        ],
        &token,
    );
    assert_eq!(rollout.status.code(), Some(1), "{}", text(&rollout.stderr));
    let said = text(&rollout.stderr);
    assert!(said.contains("north: the install failed"), "{said}");
    assert!(said.contains("RAUC"), "{said}");
    assert!(
        said.contains("stopped: 1 box(es) not updated (south)"),
        "{said}"
    );
    assert!(!said.contains("updating south"), "{said}");

    // Re-provisioning north (a new generation) renews its certificate; its device key vouches
    // for the new one, so it is still trusted.
    let before = std::fs::read(north.root.join("var/lib/appliance/provision/tls-cert.der"))
        .expect("certificate");
    north.stop();
    let mut next = fleet.clone();
    next.fleet.generation = 2;
    let gen2 =
        operator::stamp::provisioning_text(&next, &operator::stamp::Target::Box("north"), &secret)
            .expect("stamp");
    std::fs::write(
        north.root.join("boot/firmware/appliance-provision.toml"),
        gen2,
    )
    .expect("card");
    let north_root = north.root.to_str().expect("utf8").to_string();
    assert!(
        supervisor(&["--root", &north_root, "provision", "apply"], "")
            .status
            .success()
    );
    north.start();
    let after = std::fs::read(north.root.join("var/lib/appliance/provision/tls-cert.der"))
        .expect("certificate");
    assert_ne!(before, after, "a new generation renews the certificate");
    let status = appliance(&["fleet", "status", fleet_arg, "--json"], &token);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let rows: Value = serde_json::from_slice(&status.stdout).expect("json");
    assert_eq!(rows[0]["identity"], "matches", "{}", rows[0]);
    assert_eq!(rows[0]["generation"], 2, "{}", rows[0]);

    // South's device key and certificate are replaced (a swapped board, a wiped data
    // partition, an impostor): it is flagged, and the token is not sent to it.
    south.stop();
    for file in ["device.key", "tls-key.der", "tls-cert.der"] {
        std::fs::remove_file(south.root.join("var/lib/appliance/provision").join(file))
            .expect("remove");
    }
    let south_root = south.root.to_str().expect("utf8").to_string();
    assert!(
        supervisor(&["--root", &south_root, "provision", "apply"], "")
            .status
            .success()
    );
    south.start();
    let status = appliance(&["fleet", "status", fleet_arg], &token);
    assert_eq!(
        status.status.code(),
        Some(1),
        "an untrusted box fails the run"
    );
    let table = text(&status.stdout);
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("north").contains("matches"), "{table}");
    assert!(line("south").contains("MISMATCH"), "{table}");
    assert!(line("south").contains("enrolled was"), "says why: {table}");
    assert!(
        text(&status.stderr).contains("not trusted"),
        "{}",
        text(&status.stderr)
    );

    // A box that is down gets a clear line of its own.
    south.stop();
    let status = appliance(&["fleet", "status", fleet_arg], &token);
    let table = text(&status.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("south") && l.contains("unreachable")),
        "{table}"
    );
}
