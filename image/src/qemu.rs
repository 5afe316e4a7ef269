//! The boot smoke test: the built image on QEMU's `virt` machine (Cortex-A76, its own kernel and
//! initramfs), a copy grown by 2 GiB so first boot has room to grow the data partition (and a
//! pushed model room beside `[model] keep_free_mib`), and stamped for one box
//! ([`crate::stamped`]). PID 1 logs to the serial console (its status lines
//! stop once a getty owns it): that is how the test sees multi-user.target (which waits for the
//! supervisor's READY) and that no unit failed. It passes when the engine the supervisor
//! launched answers a completion through a port forwarded to 127.0.0.1, the data partition
//! filled the disk, the box took its stamped identity (host name, HTTPS login, API token, plain
//! HTTP redirected), a model pushed over the fleet API was switched to, the boot partition kept
//! none of the stamped secrets, and a second boot applied nothing again. Only the QEMU process
//! it started is ever stopped.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::args;
use crate::definition::Definition;
use crate::layout;
use crate::pipeline::Paths;
use crate::run::run;
use crate::stamped::{HOSTNAME, HOSTNAME_FROM_STICK};

/// What the smoke test saw.
#[derive(Debug)]
pub struct Report {
    /// From QEMU start to multi-user.target.
    pub boot_to_multi_user: Duration,
    /// From QEMU start to the engine's first healthy answer.
    pub boot_to_engine: Duration,
    /// The completion's text.
    pub completion: String,
    /// Size of the data partition after first boot, in bytes.
    pub data_bytes: u64,
    /// The host name the box took from its stamped file.
    pub hostname: String,
    /// The SSH server's greeting (the stamped file gave the box a key).
    pub ssh_banner: String,
    /// From the second boot's QEMU start to HTTPS answering as provisioned.
    pub second_boot_to_https: Duration,
    /// From the third boot's QEMU start (the signed USB stick plugged in) to HTTPS answering
    /// as the stick's generation.
    pub usb_to_https: Duration,
    /// What pushing a model to the first boot and switching to it said.
    pub model_push: String,
}

/// Kills the QEMU child on every path out.
pub(crate) struct Guest(pub(crate) Child);

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the test runs on the host: the emulator, FAT tools (kernel out of the boot partition,
/// the USB stick), the partition table reader.
const HOST_TOOLS: [(&str, &str); 4] = [
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("mcopy", "mtools"),
    ("mkfs.vfat", "dosfstools"),
    ("sfdisk", "fdisk"),
];

/// Host ports forwarded to the guest: the engine (through the test proxy), HTTPS, plain HTTP,
/// SSH.
pub(crate) struct Ports {
    pub(crate) engine: u16,
    pub(crate) https: u16,
    pub(crate) plain: u16,
    pub(crate) ssh: u16,
}

/// Boots `image` (a stamped copy of it) three times and checks the engine, the provisioning
/// and a model pushed (the file `model`) and switched to; `port` is the host side of the
/// engine's forward, the next two HTTPS and plain HTTP.
pub fn smoke_test(
    definition: &Definition,
    paths: &Paths,
    image: &Path,
    port: u16,
    timeout: Duration,
    model: &Path,
) -> Result<Report, String> {
    let Prepared {
        dir,
        disk,
        stamped,
        ports,
    } = prepare(paths, "qemu", image, port)?;
    let https = format!("127.0.0.1:{}", ports.https);
    let plain = format!("127.0.0.1:{}", ports.plain);

    let (mut guest, started, serial) = start(definition, &dir, &disk, &ports, None, false)?;
    let deadline = started + timeout;
    let boot_to_multi_user = wait_multi_user(&mut guest, &serial, started, deadline, timeout)?;
    let base = format!("http://127.0.0.1:{}", ports.engine);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(120)))
        .http_status_as_error(false)
        .build()
        .into();
    let boot_to_engine = loop {
        exited(&mut guest, &serial)?;
        if let Ok(response) = agent.get(format!("{base}/health")).call()
            && response.status().as_u16() == 200
        {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the engine did not answer within {} s; see {}",
                timeout.as_secs(),
                serial.display()
            ));
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let body = r#"{"prompt":"The capital of France is","max_tokens":4,"temperature":0}"#;
    let mut response = agent
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .send(body)
        .map_err(|e| format!("completion: {e}"))?;
    let text = response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    if response.status().as_u16() != 200 {
        return Err(format!("completion answered {}: {text}", response.status()));
    }
    let completion = text;
    let first = crate::stamped::check_running(&stamped, &https, &plain, HOSTNAME, 1)?;
    let ssh_banner = crate::stamped::check_ssh(&format!("127.0.0.1:{}", ports.ssh))?;
    // A model pushed over the fleet API and switched to: the next boots run it.
    let model_push = crate::stamped::push_model(&stamped, &https, model, &dir)?;
    no_failed_units(&serial)?;
    // Growing the data partition runs before the supervisor starts, so it is done by now.
    drop(guest);
    let data_bytes = data_partition_bytes(&disk)?;
    crate::stamped::check_scrubbed(&stamped, &disk)?;

    // The second boot must find the generation applied and apply nothing.
    let (mut guest, started, serial) = start(definition, &dir, &disk, &ports, None, false)?;
    let deadline = started + timeout;
    wait_multi_user(&mut guest, &serial, started, deadline, timeout)?;
    let check = || crate::stamped::check_running(&stamped, &https, &plain, HOSTNAME, 1);
    let second = serving(&mut guest, &serial, deadline, "the second boot", &check)?;
    let second_boot_to_https = started.elapsed();
    no_failed_units(&serial)?;
    drop(guest);
    if second.applied_unix != first.applied_unix {
        return Err(format!(
            "the second boot applied the provisioning again (applied at {}, then at {})",
            first.applied_unix, second.applied_unix
        ));
    }

    // In the field: a USB stick labelled APPLIANCE with generation 2, signed by the fleet key.
    let stick = crate::stamped::usb_stick(&stamped, &dir)?;
    let (mut guest, started, serial) = start(definition, &dir, &disk, &ports, Some(&stick), false)?;
    let deadline = started + timeout;
    wait_multi_user(&mut guest, &serial, started, deadline, timeout)?;
    let check = || crate::stamped::check_running(&stamped, &https, &plain, HOSTNAME_FROM_STICK, 2);
    serving(
        &mut guest,
        &serial,
        deadline,
        "the USB stick's generation",
        &check,
    )?;
    let usb_to_https = started.elapsed();
    no_failed_units(&serial)?;
    drop(guest);
    Ok(Report {
        boot_to_multi_user,
        boot_to_engine,
        completion,
        data_bytes,
        hostname: first.hostname,
        ssh_banner,
        second_boot_to_https,
        usb_to_https,
        model_push,
    })
}

/// A test's working copy of the image: in `out/<name>/`, grown by 2 GiB (first boot grows the
/// data partition into it; a pushed model needs room beside the 1 GiB a push leaves free), stamped for one box, with the host ports forwarded to it.
pub(crate) struct Prepared {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) disk: std::path::PathBuf,
    pub(crate) stamped: crate::stamped::Stamped,
    pub(crate) ports: Ports,
}

/// Copies, grows and stamps `image` for a test under `out/<name>/`; `port` is the host side of
/// the engine's forward, the next three HTTPS, plain HTTP and SSH.
pub(crate) fn prepare(
    paths: &Paths,
    name: &str,
    image: &Path,
    port: u16,
) -> Result<Prepared, String> {
    crate::pipeline::host_tools(&HOST_TOOLS)?;
    let dir = paths.out.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let disk = dir.join("disk.img");
    run("cp", args!["--sparse=always", image, &disk])?;
    let grown = std::fs::metadata(&disk).map_err(|e| e.to_string())?.len() + (2 << 30);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&disk)
        .and_then(|f| f.set_len(grown))
        .map_err(|e| format!("growing {}: {e}", disk.display()))?;
    let stamped = crate::stamped::stamp(&disk)?;
    let ports = Ports {
        engine: port,
        https: port.checked_add(1).ok_or("--port too high")?,
        plain: port.checked_add(2).ok_or("--port too high")?,
        ssh: port.checked_add(3).ok_or("--port too high")?,
    };
    Ok(Prepared {
        dir,
        disk,
        stamped,
        ports,
    })
}

/// Polls `check` until it passes (the box serves as expected), QEMU exits or `deadline` passes.
pub(crate) fn serving<T>(
    guest: &mut Guest,
    serial: &Path,
    deadline: Instant,
    what: &str,
    check: &dyn Fn() -> Result<T, String>,
) -> Result<T, String> {
    loop {
        exited(guest, serial)?;
        let last = match check() {
            Ok(seen) => return Ok(seen),
            Err(e) => e,
        };
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: the box did not serve as expected in time: {last}; see {}",
                serial.display()
            ));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// What the Pi 5 firmware boots from `disk`: `tryboot.txt` once when the last reboot asked for
/// `0 tryboot` (and the file exists), else `config.txt`; the kernel, initramfs and
/// `cmdline.txt` of the slot folder its `os_prefix` names, copied into `dir`.
pub(crate) struct Firmware {
    /// The boot partition's file it read.
    pub file: &'static str,
    /// The slot folder (`os_prefix`).
    pub prefix: String,
    /// The kernel command line for QEMU: the slot's `cmdline.txt`, with the console on the
    /// `virt` machine's UART.
    pub cmdline: String,
}

pub(crate) fn firmware(
    definition: &Definition,
    dir: &Path,
    disk: &Path,
    tryboot: bool,
) -> Result<Firmware, String> {
    let from = format!("{}@@{}", disk.display(), boot_offset(definition));
    let read = |name: &str, to: &Path| {
        run(
            "mcopy",
            args!["-n", "-o", "-i", &from, format!("::/{name}"), to],
        )
    };
    let file = if tryboot && read("tryboot.txt", &dir.join("boot-config.txt")).is_ok() {
        "tryboot.txt"
    } else {
        read("config.txt", &dir.join("boot-config.txt"))?;
        "config.txt"
    };
    let config = std::fs::read_to_string(dir.join("boot-config.txt"))
        .map_err(|e| format!("reading {file}: {e}"))?;
    let prefix = config_txt::setting(&config, "os_prefix")
        .unwrap_or("")
        .to_string();
    for name in ["vmlinuz", "initrd.img", "cmdline.txt"] {
        read(&format!("{prefix}{name}"), &dir.join(name))
            .map_err(|e| format!("{file} boots {prefix:?}, which the firmware cannot load: {e}"))?;
    }
    let cmdline = std::fs::read_to_string(dir.join("cmdline.txt"))
        .map_err(|e| format!("reading {prefix}cmdline.txt: {e}"))?;
    let cmdline = cmdline
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(|w| {
            if w.starts_with("console=") {
                "console=ttyAMA0"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Firmware {
        file,
        prefix,
        cmdline,
    })
}

/// Whether the guest's last shutdown asked the firmware for a tryboot (the kernel logs the
/// reboot command on the console).
pub(crate) fn asked_for_tryboot(serial: &Path) -> bool {
    console_text(serial).contains("Restarting system with command '0 tryboot'")
}

/// Starts QEMU on `disk` with a fresh serial log, with `stick` as a USB mass-storage device,
/// booting what the firmware would (`tryboot`: the last reboot asked for one).
pub(crate) fn start(
    definition: &Definition,
    dir: &Path,
    disk: &Path,
    ports: &Ports,
    stick: Option<&Path>,
    tryboot: bool,
) -> Result<(Guest, Instant, std::path::PathBuf), String> {
    let boot = firmware(definition, dir, disk, tryboot)?;
    eprintln!("firmware: {} boots {:?}", boot.file, boot.prefix);
    let append = format!(
        "{} systemd.wants=appliance-qemu-test-proxy.socket systemd.log_target=console \
         systemd.log_level=info systemd.journald.forward_to_console=1",
        boot.cmdline
    );
    let serial = dir.join("serial.log");
    // A previous boot's console must not satisfy this one.
    if serial.exists() {
        std::fs::remove_file(&serial).map_err(|e| format!("removing {}: {e}", serial.display()))?;
    }
    let started = Instant::now();
    let forwards = format!(
        "user,id=n0,hostfwd=tcp:127.0.0.1:{}-:18080,hostfwd=tcp:127.0.0.1:{}-:8443,hostfwd=tcp:127.0.0.1:{}-:8000,\
         hostfwd=tcp:127.0.0.1:{}-:22",
        ports.engine, ports.https, ports.plain, ports.ssh
    );
    let mut qemu = Command::new("qemu-system-aarch64");
    if let Some(stick) = stick {
        qemu.args(["-device", "qemu-xhci,id=xhci"])
            .arg("-drive")
            .arg(format!(
                "if=none,file={},format=raw,id=stick",
                stick.display()
            ))
            .args(["-device", "usb-storage,bus=xhci.0,drive=stick"]);
    }
    let child = qemu
        .args([
            "-M",
            "virt",
            "-cpu",
            "cortex-a76",
            "-accel",
            "tcg",
            "-smp",
            "2",
            "-m",
            "2048",
        ])
        .args(["-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", serial.display()))
        .arg("-kernel")
        .arg(dir.join("vmlinuz"))
        .arg("-initrd")
        .arg(dir.join("initrd.img"))
        .args(["-append", &append])
        .arg("-drive")
        .arg(format!("if=none,file={},format=raw,id=hd0", disk.display()))
        .args(["-device", "virtio-blk-pci,drive=hd0"])
        .args(["-netdev", &forwards])
        .args(["-device", "virtio-net-pci,netdev=n0,romfile="])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start qemu-system-aarch64: {e}"))?;
    eprintln!(
        "QEMU started (pid {}); serial log {}",
        child.id(),
        serial.display()
    );
    Ok((Guest(child), started, serial))
}

pub(crate) fn wait_multi_user(
    guest: &mut Guest,
    serial: &Path,
    started: Instant,
    deadline: Instant,
    timeout: Duration,
) -> Result<Duration, String> {
    loop {
        exited(guest, serial)?;
        // PID 1 logs this when the default target (multi-user) is reached.
        if console_text(serial).contains("Startup finished in") {
            return Ok(started.elapsed());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "multi-user.target not reached within {} s; see {}",
                timeout.as_secs(),
                serial.display()
            ));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

pub(crate) fn no_failed_units(serial: &Path) -> Result<(), String> {
    let log = console_text(serial);
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[FAILED]") || l.contains("Failed to start "))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("units failed during boot:\n{}", failed.join("\n")))
    }
}

fn boot_offset(definition: &Definition) -> u64 {
    layout::partitions(&definition.layout).0[0].start
}

/// The data partition's size in the disk's partition table.
fn data_partition_bytes(disk: &Path) -> Result<u64, String> {
    let output = Command::new("sfdisk")
        .args(["--dump"])
        .arg(disk)
        .output()
        .map_err(|e| format!("sfdisk --dump: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .filter(|l| l.contains(" : start="))
        .nth(3)
        .ok_or_else(|| format!("no fourth partition in {}", disk.display()))?;
    let sectors = line
        .split(',')
        .find_map(|f| f.trim().strip_prefix("size="))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("cannot read the data partition size from: {line}"))?;
    Ok(sectors * layout::SECTOR)
}

/// An error if QEMU has exited, with its stderr.
pub(crate) fn exited(guest: &mut Guest, serial: &Path) -> Result<(), String> {
    if let Ok(Some(status)) = guest.0.try_wait() {
        let mut err = String::new();
        if let Some(mut e) = guest.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(format!(
            "QEMU exited ({status}): {err}; see {}",
            serial.display()
        ));
    }
    Ok(())
}

/// The serial console so far, terminal escapes removed.
fn console_text(serial: &Path) -> String {
    let raw = std::fs::read(serial).unwrap_or_default();
    let text = String::from_utf8_lossy(&raw);
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // CSI sequences: ESC [ parameters final byte.
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}
