//! What the fleet tests share: boxes that are real supervisors on simulated boards, provisioned
//! from one fleet file, each on its own ports.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use operator::https;
use test_support::Owned;

pub const APPLIANCE: &str = env!("CARGO_BIN_EXE_appliance");
pub const PASSWORD: &str = "front desk 42";

/// The `supervisor` binary of this checkout with its simulator (feature `sim`: every box here is
/// a simulated board), brought up to date by cargo.
pub fn supervisor_binary() -> PathBuf {
    test_support::binary_with_features("supervisor", "supervisor", &["sim"])
}

pub fn supervisor(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(supervisor_binary())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("supervisor");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("stdin");
    child.wait_with_output().expect("wait")
}

/// A fresh API token with `scopes` (none: every scope) and its digest for a fleet file, from
/// `supervisor dashboard new-token`.
pub fn new_token(scopes: &[&str]) -> (String, String) {
    let mut args = vec!["dashboard", "new-token"];
    for scope in scopes {
        args.extend(["--scope", scope]);
    }
    let printed = text(&supervisor(&args, "").stdout);
    let field = |name: &str| {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .expect(name)
            .trim()
            .to_string()
    };
    (field("token "), field("sha256 "))
}

pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One box: a simulated board provisioned from the fleet file, its supervisor running.
pub struct Box_ {
    pub root: PathBuf,
    pub https: String,
    pub plain: String,
    pub daemon: Option<Owned>,
}

impl Box_ {
    /// `engine` holds lines for its `[engine]` table, `extra` more tables.
    pub fn new(dir: &Path, name: &str, provisioning: &str, engine: &str, extra: &str) -> Box_ {
        let root = dir.join(name);
        let root_arg = root.to_str().expect("utf8");
        assert!(supervisor(&["sim", "init", root_arg], "").status.success());
        std::fs::write(
            root.join("boot/firmware/appliance-provision.toml"),
            provisioning,
        )
        .expect("stamp");
        let applied = supervisor(&["--root", root_arg, "provision", "apply"], "");
        assert!(applied.status.success(), "{}", text(&applied.stderr));
        let (plain, https) = (free_port(), free_port());
        std::fs::write(
            root.join("etc/appliance/appliance.toml"),
            format!(
                "[daemon]\nreverify_interval_s = 0\n\n[engine]\nport = {}\n{engine}\n\n[dashboard]\n\
                 listen = \"127.0.0.1:{plain}\"\nhttps_listen = \"127.0.0.1:{https}\"\n\
                 sample_interval_s = 1\n{extra}",
                free_port()
            ),
        )
        .expect("config");
        let mut b = Box_ {
            root,
            https: format!("127.0.0.1:{https}"),
            plain: format!("127.0.0.1:{plain}"),
            daemon: None,
        };
        b.start();
        b
    }

    pub fn start(&mut self) {
        let mut child = Owned::spawn(
            Command::new(supervisor_binary())
                .args(["--root", self.root.to_str().expect("utf8"), "run"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "supervisor run",
        );
        let https = &self.https;
        child.wait_until(|| https::request(https, "GET", "/login", None, None, None).is_ok());
        self.daemon = Some(child);
    }

    /// Kills the daemon (a power cut, as far as the box's state is concerned).
    pub fn stop(&mut self) {
        self.daemon = None;
    }
}

pub fn appliance(args: &[&str], token: &str) -> Output {
    Command::new(APPLIANCE)
        .args(args)
        .env("APPLIANCE_API_TOKEN", token)
        .output()
        .expect("appliance")
}

/// A fleet of boxes, each a supervisor started from its stamped card.
pub struct Fleet {
    /// The API token every box takes.
    pub token: String,
    /// A token that may only read.
    pub reader: String,
    /// `fleet.toml`.
    pub path: PathBuf,
    pub file: provision::FleetFile,
    /// The fleet secret cards are stamped with.
    pub secret: Vec<u8>,
    pub boxes: Vec<Box_>,
}

/// A fleet file `fleet.toml` in `dir` with boxes `names` (the password [`PASSWORD`], one API
/// token) and each box's supervisor started from its stamped card.
pub fn fleet_of(dir: &Path, names: &[&str]) -> Fleet {
    fleet_with(dir, names, "", "")
}

/// [`fleet_of`] with more `[fleet.defaults]` lines, and `engine` lines for each box's
/// `[engine]` table.
pub fn fleet_with(dir: &Path, names: &[&str], defaults: &str, engine: &str) -> Fleet {
    let hash = text(&supervisor(&["dashboard", "hash-password"], PASSWORD).stdout)
        .trim()
        .to_string();
    let (token, digest) = new_token(&[]);
    let (reader, read_digest) = new_token(&["read"]);
    let fleet_path = dir.join("fleet.toml");
    let boxes: String = names
        .iter()
        .map(|n| format!("\n[[box]]\nname = \"{n}\"\n"))
        .collect();
    std::fs::write(
        &fleet_path,
        format!(
            "[fleet]\nname = \"clinics\"\ngeneration = 1\n\n[fleet.defaults]\n\
             password_hash = \"{hash}\"\napi_token_sha256 = [\"{digest}\", \"{read_digest}\"]\n{defaults}\n{boxes}"
        ),
    )
    .expect("fleet");
    let fleet_text = std::fs::read_to_string(&fleet_path).expect("read");
    let fleet = provision::FleetFile::parse(&fleet_text, "fleet.toml").expect("parse");
    let secret =
        operator::fleet::secret(&operator::fleet::Paths::beside(&fleet_path)).expect("secret");
    let started = names
        .iter()
        .map(|name| {
            let card = operator::stamp::provisioning_text(
                &fleet,
                &operator::stamp::Target::Box(name),
                &secret,
            )
            .expect("stamp");
            Box_::new(dir, name, &card, engine, "")
        })
        .collect();
    Fleet {
        token,
        reader,
        path: fleet_path,
        file: fleet,
        secret,
        boxes: started,
    }
}
