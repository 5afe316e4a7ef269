//! The QEMU test's box identity: a one-box fleet stamped into the test's copy of the image, and
//! the checks that the box took it up (host name, HTTPS login with the stamped password, the
//! API token, the boot file scrubbed, nothing re-applied on the next boot), and a USB stick
//! labelled `APPLIANCE` whose file, signed by the fleet key, re-provisions it in the field.

use std::path::Path;

use operator::https;
use provision::{FleetFile, PROVISION_FILE};

/// The host name the stamped box must take.
pub const HOSTNAME: &str = "qemu-box";
/// The host name the USB stick's generation gives it.
pub const HOSTNAME_FROM_STICK: &str = "qemu-box-2";

/// What was stamped, with the secrets the checks present.
pub struct Stamped {
    /// The dashboard password.
    pub password: String,
    /// The API token.
    pub token: String,
    /// What a box must never leave on its boot partition once it has applied the file.
    secrets: Vec<String>,
    /// The fleet as stamped (generation 1).
    fleet: FleetFile,
    /// The fleet's secret the enrolment tokens come from.
    fleet_secret: String,
    /// The fleet key's secret key file (its public half is the stamped `fleet_key`).
    fleet_key: String,
}

/// Writes a fresh one-box provisioning file into the boot partition of `disk`.
pub fn stamp(disk: &Path) -> Result<Stamped, String> {
    let (password, _) = provision::secrets::new_token()?;
    let hash = provision::secrets::hash_password(&password)?;
    let (token, digest) = provision::secrets::new_token()?;
    let (fleet_key, fleet_public) = weights::sign::keygen().map_err(|e| e.to_string())?;
    let fleet = FleetFile::parse(
        &format!(
            "[fleet]\nname = \"qemu-test\"\ngeneration = 1\n\n[[box]]\nname = \"{HOSTNAME}\"\n\
             fleet_key = \"{fleet_public}\"\n\
             timezone = \"Europe/Berlin\"\npassword_hash = \"{hash}\"\napi_token_sha256 = [\"{digest}\"]\n\
             ssh_authorized_keys = [\"{}\"]\n",
            ssh_key()?
        ),
        "the QEMU test's fleet",
    )
    .map_err(|e| e.to_string())?;
    let (fleet_secret, _) = provision::secrets::new_token()?;
    let text = operator::stamp::provisioning_text(
        &fleet,
        &operator::stamp::Target::Box(HOSTNAME),
        fleet_secret.as_bytes(),
    )?;
    let enrollment = FleetFile::parse(&text, "the stamped file")
        .map_err(|e| e.to_string())?
        .boxes
        .first()
        .and_then(|b| b.enrollment_token.as_ref())
        .map(|t| t.to_string())
        .unwrap_or_default();
    operator::stamp::write_boot_file(disk, PROVISION_FILE, text.as_bytes())?;
    Ok(Stamped {
        password,
        token,
        secrets: vec![hash, digest, enrollment],
        fleet,
        fleet_secret,
        fleet_key,
    })
}

/// A 16 MiB FAT image labelled `APPLIANCE` holding generation 2 (host name
/// [`HOSTNAME_FROM_STICK`]) and its signature by the fleet key, as `appliance usb` writes them.
pub fn usb_stick(stamped: &Stamped, dir: &Path) -> Result<std::path::PathBuf, String> {
    let mut next = stamped.fleet.clone();
    next.fleet.generation = 2;
    if let Some(entry) = next.boxes.first_mut() {
        entry.hostname = Some(HOSTNAME_FROM_STICK.parse()?);
    }
    let text = operator::stamp::provisioning_text(
        &next,
        &operator::stamp::Target::Box(HOSTNAME),
        stamped.fleet_secret.as_bytes(),
    )?;
    let signature =
        weights::sign::sign(text.as_bytes(), &stamped.fleet_key).map_err(|e| e.to_string())?;
    let stick = dir.join("usb-stick.img");
    let _ = std::fs::remove_file(&stick);
    crate::run::run(
        "mkfs.vfat",
        crate::args!["-n", "APPLIANCE", "-C", &stick, "16384"],
    )?;
    for (name, contents) in [
        (PROVISION_FILE.to_string(), text),
        (format!("{PROVISION_FILE}.sig"), signature),
    ] {
        let file = dir.join(&name);
        std::fs::write(&file, contents).map_err(|e| format!("{}: {e}", file.display()))?;
        crate::run::run(
            "mcopy",
            crate::args!["-i", &stick, &file, format!("::/{name}")],
        )?;
    }
    Ok(stick)
}

/// An OpenSSH ed25519 public key line with a random key (the test only needs the server up).
fn ssh_key() -> Result<String, String> {
    use base64::Engine as _;
    let (random, _) = provision::secrets::new_token()?;
    let kind = b"ssh-ed25519";
    let mut blob = Vec::new();
    blob.extend_from_slice(&(kind.len() as u32).to_be_bytes());
    blob.extend_from_slice(kind);
    blob.extend_from_slice(&32u32.to_be_bytes());
    blob.extend_from_slice(&random.as_bytes()[..32]);
    Ok(format!(
        "ssh-ed25519 {} qemu-test",
        base64::engine::general_purpose::STANDARD.encode(blob)
    ))
}

/// The SSH server's greeting at `address`: a box stamped with keys runs one.
pub fn check_ssh(address: &str) -> Result<String, String> {
    use std::io::{BufRead, BufReader};
    let stream =
        std::net::TcpStream::connect(address).map_err(|e| format!("SSH {address}: {e}"))?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    let mut banner = String::new();
    BufReader::new(stream)
        .read_line(&mut banner)
        .map_err(|e| format!("SSH {address}: {e}"))?;
    if banner.starts_with("SSH-2.0-") {
        Ok(banner.trim().to_string())
    } else {
        Err(format!("no SSH server greeting at {address}: {banner:?}"))
    }
}

/// The id the QEMU test pushes the image's default model's file under: a model the box does
/// not have yet, which the engine surely serves.
pub const PUSHED_MODEL: &str = "smollm2-pushed";

/// Pushes `model` (a GGUF file) to the box at `https` as [`PUSHED_MODEL`], its manifest signed
/// by the fleet key (written into `dir`), over HTTPS pinned to the certificate the box presents,
/// then switches to it through the box's health gate; what `appliance fleet model push` and
/// `use` said. The box must then report the new model.
pub fn push_model(
    stamped: &Stamped,
    https: &str,
    model: &Path,
    dir: &Path,
) -> Result<String, String> {
    let manifest = weights::author::manifest(model, None, Some(PUSHED_MODEL.into()), None, None)
        .map_err(|e| e.to_string())?;
    let text = manifest.to_toml().map_err(|e| e.to_string())?;
    let path = dir.join(format!("{PUSHED_MODEL}.toml"));
    let signature =
        weights::sign::sign(text.as_bytes(), &stamped.fleet_key).map_err(|e| e.to_string())?;
    std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    let sig = weights::install::sig_path(&path);
    std::fs::write(&sig, signature).map_err(|e| format!("{}: {e}", sig.display()))?;
    let signed = operator::models::signed(&path, &[model.to_path_buf()])?;
    let pin = https::request(https, "GET", "/login", None, None, None)
        .map_err(|e| format!("HTTPS /login: {e}"))?
        .certificate_sha256;
    let on = operator::fleet::Connected {
        name: HOSTNAME.into(),
        address: https.into(),
        pin,
    };
    let pushed = operator::models::push(&on, &stamped.token, &signed, &|line| eprintln!("{line}"))?;
    let switched = operator::models::switch(
        &on,
        &stamped.token,
        PUSHED_MODEL,
        std::time::Duration::from_secs(900),
    )?;
    let status = api_status(stamped, https)?;
    if status.model.id != PUSHED_MODEL || status.model.state != "verified" {
        return Err(format!(
            "after the switch the box runs {} ({}), not {PUSHED_MODEL}",
            status.model.id, status.model.state
        ));
    }
    Ok(format!("{pushed}; {switched}"))
}

/// What the box says about itself over HTTPS: the provisioning record and the host name.
pub struct Seen {
    /// `provision.applied_unix`.
    pub applied_unix: u64,
    /// The kernel's host name.
    pub hostname: String,
}

/// The box's `/api/status` document over HTTPS with the stamped API token.
pub fn api_status(stamped: &Stamped, https: &str) -> Result<wire::Status, String> {
    let status = https::request(
        https,
        "GET",
        "/api/status",
        Some(&stamped.token),
        None,
        None,
    )
    .map_err(|e| format!("HTTPS /api/status: {e}"))?;
    if status.status != 200 {
        return Err(format!(
            "HTTPS /api/status with the stamped API token answered {}",
            status.status
        ));
    }
    wire::Status::from_json(&status.body)
        .map_err(|e| format!("/api/status is not a status document: {e}"))
}

/// Checks the running box at `https` (host:port) and `plain` (its plain HTTP port as another
/// machine sees it): provisioned with `generation` under `hostname`, the API token opens
/// `/api/status`, the password logs in with a Secure cookie, plain HTTP redirects to HTTPS.
pub fn check_running(
    stamped: &Stamped,
    https: &str,
    plain: &str,
    hostname: &str,
    generation: u64,
) -> Result<Seen, String> {
    let doc = api_status(stamped, https)?;
    let record = doc.provision.clone().unwrap_or_default();
    if record.state != "provisioned"
        || record.generation != generation
        || record.last_error.is_some()
    {
        return Err(format!(
            "the box is not provisioned with generation {generation}: {}",
            serde_json::to_string(&record).unwrap_or_default()
        ));
    }
    let seen = doc.board.hostname.clone().unwrap_or_default();
    if seen != hostname {
        return Err(format!("the host name is {seen:?}, not {hostname:?}"));
    }
    let wrong = https::request(https, "GET", "/api/status", Some("0000"), None, None)
        .map_err(|e| format!("HTTPS /api/status: {e}"))?;
    if wrong.status != 401 {
        return Err(format!("a wrong API token got {}", wrong.status));
    }
    let form = format!("password={}", stamped.password);
    let login = https::request(
        https,
        "POST",
        "/login",
        None,
        Some(("application/x-www-form-urlencoded", form.as_bytes())),
        None,
    )
    .map_err(|e| format!("HTTPS login: {e}"))?;
    let cookie = login
        .headers
        .iter()
        .find(|(n, _)| n == "set-cookie")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    if login.status != 303 || !cookie.contains("Secure") {
        return Err(format!(
            "HTTPS login with the stamped password: {} (cookie {cookie:?})",
            login.status
        ));
    }
    let redirect = plain_redirect(plain)?;
    if !redirect.starts_with("https://") {
        return Err(format!(
            "plain HTTP did not redirect to HTTPS: {redirect:?}"
        ));
    }
    Ok(Seen {
        applied_unix: record.applied_unix.unwrap_or_default(),
        hostname: seen,
    })
}

/// The `Location` plain HTTP answers with.
fn plain_redirect(plain: &str) -> Result<String, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .http_status_as_error(false)
        .max_redirects(0)
        .build()
        .into();
    let response = agent
        .get(format!("http://{plain}/"))
        .call()
        .map_err(|e| format!("plain HTTP: {e}"))?;
    if response.status().as_u16() != 308 {
        return Err(format!(
            "plain HTTP from another machine answered {}, not a redirect",
            response.status()
        ));
    }
    Ok(response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string())
}

/// After a boot: the provisioning file on the disk's boot partition holds none of the secrets.
pub fn check_scrubbed(stamped: &Stamped, disk: &Path) -> Result<(), String> {
    let text = operator::stamp::read_boot_file(disk, PROVISION_FILE)?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .ok_or("the provisioning file is gone from the boot partition")?;
    for secret in stamped.secrets.iter().filter(|s| !s.is_empty()) {
        if text.contains(secret.as_str()) {
            return Err(format!(
                "a secret is still on the boot partition after boot:\n{text}"
            ));
        }
    }
    if !text.contains(HOSTNAME) {
        return Err(format!("the scrubbed file lost its settings:\n{text}"));
    }
    // Not in the file is not enough: the medium itself, free clusters included, must hold
    // none of them (a card pulled from the box is read raw).
    let raw = boot_partition_bytes(disk)?;
    for secret in stamped.secrets.iter().filter(|s| !s.is_empty()) {
        if raw.windows(secret.len()).any(|w| w == secret.as_bytes()) {
            return Err(format!(
                "a stamped secret ({} bytes) is still readable in the boot partition's raw bytes",
                secret.len()
            ));
        }
    }
    Ok(())
}

/// Every byte of `disk`'s boot partition, free space included.
fn boot_partition_bytes(disk: &Path) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", disk.display());
    let mut file = std::fs::File::open(disk).map_err(|e| at(&e))?;
    let len = file.metadata().map_err(|e| at(&e))?.len();
    let partition = operator::disk::boot_partition(&mut file, len)?;
    let mut bytes = vec![0u8; usize::try_from(partition.len).map_err(|e| at(&e))?];
    file.seek(SeekFrom::Start(partition.start))
        .and_then(|_| file.read_exact(&mut bytes))
        .map_err(|e| at(&e))?;
    Ok(bytes)
}
