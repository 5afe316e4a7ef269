//! A simulated board's firmware and power supply: what happens between one boot and the next.
//!
//! On a box, `systemctl reboot` ends the running system and the firmware starts the next boot
//! from `config.txt`, or once from `tryboot.txt` when the reboot asked for `0 tryboot`. Here a
//! reboot request only leaves a marker (the process that asked is expected to end, as it would
//! when systemd stops it), and [`boot`] (`supervisor sim boot`) plays the firmware: it clears `/run` (tmpfs),
//! chooses the config file, sets `chosen/bootloader/tryboot`, and gives the board the clock the
//! chosen file asks for, with the faults a test injected:
//!
//! - `.appliance-sim-faults.toml` at the board root: `hang_from_mhz` (a boot at that clock or
//!   above hangs and the watchdog resets the board, which then boots `config.txt`),
//!   `miscompute_from_mhz` (the CPU silently computes wrong results), `hot_from_mhz` (the SoC
//!   runs at 86 °C), `throttle_from_mhz` (the firmware caps the Arm clock), `hang_slots`
//!   (a boot of these system slots hangs: a broken kernel or early userspace);
//!
//! A/B slots: the chosen file's `os_prefix` folder is what the firmware loads. A folder without
//! a kernel does not boot (a hang, for the watchdog); its `cmdline.txt` becomes the kernel's
//! command line after the firmware's own arguments ([`FIRMWARE_CMDLINE`]), and the slot's root
//! filesystem is the tree in [`SLOTS`]`/<name>`, from which the version file is taken;
//! - `.appliance-sim-power-cut` holding N: the power fails right after the Nth durable write
//!   from now (the process dies; `/run` and any reboot request are lost);
//! - `.appliance-sim-slow-writes` holding N: every write to the board (a kernel attribute, a
//!   durable replacement or removal) takes N ms longer, as on a card or a kernel under I/O
//!   pressure; read at each write, so a test can slow a running daemon down.

use std::fs;
use std::io;
use std::path::Path;

use serde::Deserialize;

use board::paths;

/// Left by a reboot request: the next `sim boot` is an orderly reboot, not a power cycle.
const REBOOT_REQUESTED: &str = ".appliance-sim-reboot";
/// Faults the test injected.
pub const FAULTS: &str = ".appliance-sim-faults.toml";
/// Durable writes left before the power fails.
pub const POWER_CUT: &str = ".appliance-sim-power-cut";
/// Milliseconds every write to the board is held up.
pub const SLOW_WRITES: &str = ".appliance-sim-slow-writes";
/// Present while the CPU miscomputes; holds the bits it flips.
const CPU_FAULT: &str = ".appliance-sim-cpu-fault";
/// One line per boot.
pub const BOOT_LOG: &str = ".appliance-sim-boots.log";
/// The firmware's own kernel arguments, which precede `cmdline.txt`'s.
pub const FIRMWARE_CMDLINE: &str = ".appliance-sim-firmware-cmdline";
/// The slots' root filesystems (`A/`, `B/`), as RAUC's devices on a simulated board.
pub const SLOTS: &str = ".appliance-sim-slots";
/// The simulated board's clock (Unix seconds), when a test set one; else it is the host's.
pub const CLOCK: &str = ".appliance-sim-clock";

/// The simulated clock, if one is set.
pub fn clock(root: &Path) -> Option<u64> {
    fs::read_to_string(root.join(CLOCK))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Sets the simulated clock.
pub fn set_clock(root: &Path, unix: u64) -> io::Result<()> {
    fs::write(root.join(CLOCK), format!("{unix}\n"))
}

/// Exit status of a process the simulated power cut ended (as if killed by SIGKILL).
pub const POWER_CUT_EXIT: i32 = 137;

const STOCK_MHZ: u32 = 2400;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Faults {
    hang_from_mhz: Option<u32>,
    miscompute_from_mhz: Option<u32>,
    hot_from_mhz: Option<u32>,
    throttle_from_mhz: Option<u32>,
    #[serde(default)]
    hang_slots: Vec<String>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn rel(box_path: &str) -> &str {
    box_path.trim_start_matches('/')
}

fn faults(root: &Path) -> io::Result<Faults> {
    match fs::read_to_string(root.join(FAULTS)) {
        Ok(text) => toml::from_str(&text).map_err(|e| invalid(format!("{FAULTS}: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Faults::default()),
        Err(e) => Err(e),
    }
}

/// Counts one durable write against an injected power cut; the process ends when it is due.
pub fn after_durable_write(root: &Path) {
    let path = root.join(POWER_CUT);
    let Ok(text) = fs::read_to_string(&path) else {
        return;
    };
    let left: u64 = text.trim().parse().unwrap_or(0);
    if left <= 1 {
        let _ = fs::remove_file(&path);
        eprintln!("simulated power cut");
        std::process::exit(POWER_CUT_EXIT);
    }
    let _ = fs::write(&path, format!("{}\n", left - 1));
}

/// Holds up the calling thread as long as an injected slow-write fault says.
pub fn before_write(root: &Path) {
    let Ok(text) = fs::read_to_string(root.join(SLOW_WRITES)) else {
        return;
    };
    if let Ok(ms) = text.trim().parse::<u64>() {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// The machine goes down for a reboot (systemd would now stop every service).
pub fn request_reboot(root: &Path) -> io::Result<()> {
    fs::write(root.join(REBOOT_REQUESTED), "")
}

/// Bits the simulated CPU flips in computed results (0: it computes correctly).
pub fn compute_corruption(root: &Path) -> u64 {
    fs::read_to_string(root.join(CPU_FAULT))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// The kernel's command line and root filesystem of the slot in `folder` (the boot partition
/// itself without slots), on a board that knows its firmware's arguments.
fn boot_slot(root: &Path, folder: &Path) -> io::Result<()> {
    let Ok(firmware) = fs::read_to_string(root.join(FIRMWARE_CMDLINE)) else {
        return Ok(());
    };
    let cmdline = fs::read_to_string(folder.join("cmdline.txt"))?;
    let line = cmdline.lines().next().unwrap_or("").trim();
    fs::write(
        root.join(rel(paths::PROC_CMDLINE)),
        format!("{} {line}\n", firmware.trim()),
    )?;
    let slot = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("rauc.slot="));
    if let Some(slot) = slot {
        let version = root.join(SLOTS).join(slot).join(rel(paths::SYSTEM_VERSION));
        if let Ok(text) = fs::read_to_string(version) {
            fs::write(root.join(rel(paths::SYSTEM_VERSION)), text)?;
        }
    }
    Ok(())
}

/// A fresh boot id, as the kernel makes one at every boot.
pub fn write_boot_id(root: &Path) -> io::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let id = format!("{:032x}", nanos ^ u128::from(std::process::id()) << 96);
    let path = root.join(rel(paths::BOOT_ID));
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(
        path,
        format!(
            "{}-{}-{}-{}-{}\n",
            &id[..8],
            &id[8..12],
            &id[12..16],
            &id[16..20],
            &id[20..]
        ),
    )
}

/// What one simulated boot did, in words (also appended to [`BOOT_LOG`]).
pub fn boot(root: &Path) -> io::Result<String> {
    let orderly = root.join(REBOOT_REQUESTED).exists();
    let param = fs::read_to_string(root.join(rel(paths::REBOOT_PARAM))).unwrap_or_default();
    let mut tryboot = orderly && param.split_whitespace().any(|w| w == "tryboot");
    // /run is a tmpfs: nothing in it survives.
    let run = root.join("run");
    if run.exists() {
        fs::remove_dir_all(&run)?;
    }
    fs::create_dir_all(&run)?;
    let _ = fs::remove_file(root.join(REBOOT_REQUESTED));
    write_boot_id(root)?;
    let faults = faults(root)?;
    let boot_dir = root.join("boot/firmware");
    let mut story = if orderly { "reboot" } else { "power on" }.to_string();
    let (file, mhz) = loop {
        // The firmware clears the flag before it starts; without tryboot.txt it reads config.txt.
        let file = if tryboot && boot_dir.join("tryboot.txt").is_file() {
            "tryboot.txt"
        } else {
            "config.txt"
        };
        let text = fs::read_to_string(boot_dir.join(file))?;
        let mhz = match config_txt::setting(&text, "arm_freq") {
            None => STOCK_MHZ,
            Some(v) => v
                .parse()
                .map_err(|_| invalid(format!("{file}: arm_freq={v} is not a number")))?,
        };
        let prefix = config_txt::setting(&text, "os_prefix")
            .unwrap_or("")
            .to_string();
        let slot = prefix.trim_end_matches('/').to_string();
        let hang = if faults.hang_from_mhz.is_some_and(|h| mhz >= h) {
            Some(format!("{file} at {mhz} MHz hung"))
        } else if !prefix.is_empty() && !boot_dir.join(&prefix).join("vmlinuz").is_file() {
            Some(format!("{file} names {prefix}, which holds no kernel"))
        } else if faults
            .hang_slots
            .iter()
            .any(|s| slot == format!("slot-{}", s.to_lowercase()))
        {
            Some(format!("{file} boots {slot}, which hangs"))
        } else {
            None
        };
        if let Some(hang) = hang {
            if !tryboot {
                return Err(invalid(format!(
                    "bricked: {hang}, and there is no tryboot to fall back from"
                )));
            }
            story.push_str(&format!("; {hang}, the watchdog reset the board"));
            tryboot = false;
            continue;
        }
        boot_slot(root, &boot_dir.join(&prefix))?;
        break (file, mhz);
    };
    let base = rel(paths::DT_BOOTLOADER);
    fs::write(
        root.join(base).join("tryboot"),
        u32::from(tryboot).to_be_bytes(),
    )?;
    let policy = root.join(rel(paths::CPUFREQ_DIR)).join("policy0");
    let khz = format!("{}\n", u64::from(mhz) * 1000);
    for name in ["cpuinfo_max_freq", "scaling_max_freq", "scaling_cur_freq"] {
        fs::write(policy.join(name), &khz)?;
    }
    let hot = faults.hot_from_mhz.is_some_and(|h| mhz >= h);
    let capped = faults.throttle_from_mhz.is_some_and(|h| mhz >= h);
    let temp = if hot { "86000" } else { "48250" };
    fs::write(
        root.join(rel(paths::THERMAL_ZONE0_TEMP)),
        format!("{temp}\n"),
    )?;
    // Arm frequency capped, now and since boot.
    let throttled = if capped { "20002" } else { "0" };
    fs::write(
        root.join(crate::GET_THROTTLED_FILE),
        format!("{throttled}\n"),
    )?;
    let miscompute = faults.miscompute_from_mhz.is_some_and(|h| mhz >= h);
    if miscompute {
        fs::write(root.join(CPU_FAULT), "4096\n")?;
    } else {
        let _ = fs::remove_file(root.join(CPU_FAULT));
    }
    story.push_str(&format!(
        "; booted {file}{} at {mhz} MHz{}{}{}",
        if tryboot { " (tryboot)" } else { "" },
        if hot { ", 86 °C" } else { "" },
        if capped { ", clock capped" } else { "" },
        if miscompute { ", miscomputing" } else { "" },
    ));
    let mut log = fs::read_to_string(root.join(BOOT_LOG)).unwrap_or_default();
    log.push_str(&story);
    log.push('\n');
    fs::write(root.join(BOOT_LOG), log)?;
    Ok(story)
}
