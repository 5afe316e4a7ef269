//! Reading what the board *is* and *does* right now: model, temperature, throttling, clocks,
//! memory, swap, NUMA and how it booted. Tuning steps and `status` share these readers.

use serde::Serialize;

use super::{Board, BoardError, BoardResult, paths};
use std::io;

/// One active swap area from `/proc/swaps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SwapArea {
    /// Device or file path, e.g. `/dev/zram0`.
    pub device: String,
    /// `partition` or `file`.
    pub kind: String,
    /// Size in KiB.
    pub size_kib: u64,
    /// Used in KiB.
    pub used_kib: u64,
}

/// The firmware's throttle report, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Throttle {
    /// The raw bit field as `vcgencmd get_throttled` prints it.
    pub raw: String,
    /// Conditions active now.
    pub now: Vec<&'static str>,
    /// Conditions that occurred since boot.
    pub since_boot: Vec<&'static str>,
    /// The bit field itself (`raw` in JSON).
    #[serde(skip)]
    pub bits: u32,
}

/// The conditions of the throttle report, in bit order: bit `i` is the condition now, bit
/// `i + 16` the condition at some time since boot.
pub const THROTTLE_WORDS: [&str; 4] = [
    "under-voltage",
    "arm-frequency-capped",
    "throttled",
    "soft-temperature-limit",
];

impl Throttle {
    /// Decodes the `get_throttled` bit field (bits 0–3 live, 16–19 sticky).
    pub fn decode(bits: u32) -> Throttle {
        let pick = |shift: u32| {
            THROTTLE_WORDS
                .iter()
                .enumerate()
                .filter(|(i, _)| bits & (1 << (*i as u32 + shift)) != 0)
                .map(|(_, w)| *w)
                .collect()
        };
        Throttle {
            raw: format!("{bits:#x}"),
            now: pick(0),
            since_boot: pick(16),
            bits,
        }
    }
}

/// How the bootloader started this boot, from `chosen/bootloader`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootInfo {
    /// Whether this is a one-shot tryboot boot.
    pub tryboot: bool,
    /// The partition the boot files came from.
    pub partition: u32,
    /// The boot mode (BOOT_ORDER code): 1 SD, 4 USB, 6 NVMe, ...
    pub boot_mode: u32,
    /// The bootloader's build time, Unix seconds.
    pub bootloader_build_timestamp: u32,
}

/// Facts about the board for `status`; a reading that fails is `null` rather than an error.
#[derive(Debug, Clone, Serialize)]
pub struct Facts {
    /// Device-tree model string.
    pub model: Option<String>,
    /// SoC temperature in °C.
    pub temperature_c: Option<f64>,
    /// Firmware throttle state.
    pub throttle: Option<Throttle>,
    /// Requested CPU clock of policy0 in MHz (firmware throttling can make the real clock lower).
    pub cpu_mhz: Option<u64>,
    /// Maximum CPU clock in MHz.
    pub cpu_max_mhz: Option<u64>,
    /// Governor of each cpufreq policy, e.g. `policy0=performance`.
    pub governors: Vec<String>,
    /// Total RAM in MiB.
    pub memory_total_mib: Option<u64>,
    /// Available RAM in MiB.
    pub memory_available_mib: Option<u64>,
    /// Active swap areas (empty: swap is off).
    pub swap: Option<Vec<SwapArea>>,
    /// NUMA nodes the kernel created (more than one means NUMA emulation is active).
    pub numa_nodes: Option<usize>,
    /// How this boot happened.
    pub boot: Option<BootInfo>,
    /// Seconds since the kernel booted.
    pub uptime_s: Option<u64>,
    /// The operating system's `PRETTY_NAME` from `/etc/os-release`.
    pub os: Option<String>,
    /// The running kernel's host name (provisioning sets it).
    pub hostname: Option<String>,
}

fn parse_failure(path: &str, what: &str) -> BoardError {
    BoardError {
        op: "parsing",
        path: path.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidData, what.to_string()),
    }
}

impl Board {
    /// A field of `/proc/meminfo` in KiB.
    pub fn meminfo_kib(&self, field: &str) -> BoardResult<u64> {
        let text = self.read(paths::PROC_MEMINFO)?;
        text.lines()
            .find_map(|line| {
                let (name, rest) = line.split_once(':')?;
                if name.trim() != field {
                    return None;
                }
                rest.split_whitespace().next()?.parse().ok()
            })
            .ok_or_else(|| parse_failure(paths::PROC_MEMINFO, &format!("no {field} line")))
    }

    /// Active swap areas.
    pub fn active_swaps(&self) -> BoardResult<Vec<SwapArea>> {
        let text = self.read(paths::PROC_SWAPS)?;
        let mut areas = Vec::new();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.is_empty() {
                continue;
            }
            let number = |i: usize| -> BoardResult<u64> {
                fields
                    .get(i)
                    .and_then(|f| f.parse().ok())
                    .ok_or_else(|| parse_failure(paths::PROC_SWAPS, &format!("bad line {line:?}")))
            };
            areas.push(SwapArea {
                device: fields[0].to_string(),
                kind: fields.get(1).copied().unwrap_or("").to_string(),
                size_kib: number(2)?,
                used_kib: number(3)?,
            });
        }
        Ok(areas)
    }

    /// Words of the running kernel's command line.
    pub fn kernel_cmdline(&self) -> BoardResult<Vec<String>> {
        Ok(self
            .read(paths::PROC_CMDLINE)?
            .split_whitespace()
            .map(str::to_string)
            .collect())
    }

    /// NUMA nodes the kernel created.
    pub fn numa_nodes(&self) -> BoardResult<usize> {
        Ok(self
            .list(paths::NODE_DIR)?
            .iter()
            .filter(|n| {
                n.strip_prefix("node")
                    .is_some_and(|i| i.parse::<u32>().is_ok())
            })
            .count())
    }

    /// The running kernel's build setting for `option` (e.g. `CONFIG_NUMA_EMULATION`), from
    /// `/boot/config-<release>`; `None` when that file is not there to ask.
    pub fn kernel_config_enabled(&self, option: &str) -> BoardResult<Option<bool>> {
        let release = self.read_value(paths::PROC_OSRELEASE)?;
        let Some(config) = self.read_optional(&format!("/boot/config-{release}"))? else {
            return Ok(None);
        };
        let set = config.lines().any(|line| {
            line.split_once('=')
                .is_some_and(|(k, v)| k == option && (v == "y" || v == "m"))
        });
        Ok(Some(set))
    }

    /// cpufreq policy directories as box paths, in order.
    pub fn cpufreq_policies(&self) -> BoardResult<Vec<String>> {
        Ok(self
            .list(paths::CPUFREQ_DIR)?
            .into_iter()
            .filter(|n| n.starts_with("policy"))
            .map(|n| format!("{}/{n}", paths::CPUFREQ_DIR))
            .collect())
    }

    /// A big-endian u32 device-tree property.
    pub fn dt_u32(&self, box_path: &str) -> BoardResult<u32> {
        let bytes = self.read_bytes(box_path)?;
        let raw: [u8; 4] = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| parse_failure(box_path, "expected a 4-byte big-endian integer"))?;
        Ok(u32::from_be_bytes(raw))
    }

    /// How the bootloader started this boot.
    pub fn boot_info(&self) -> BoardResult<BootInfo> {
        let prop = |name: &str| self.dt_u32(&format!("{}/{name}", paths::DT_BOOTLOADER));
        Ok(BootInfo {
            tryboot: prop("tryboot")? != 0,
            partition: prop("partition")?,
            boot_mode: prop("boot-mode")?,
            bootloader_build_timestamp: prop("build-timestamp")?,
        })
    }

    /// The firmware's throttle report, decoded.
    pub fn throttle(&self) -> BoardResult<Throttle> {
        self.throttle_bits().map(Throttle::decode)
    }

    /// The SoC temperature in °C.
    pub fn temperature_c(&self) -> BoardResult<f64> {
        let text = self.read_value(paths::THERMAL_ZONE0_TEMP)?;
        let milli: f64 = text.parse().map_err(|_| {
            parse_failure(paths::THERMAL_ZONE0_TEMP, "expected millidegrees Celsius")
        })?;
        Ok(milli / 1000.0)
    }

    /// Whether the hardware watchdog is armed (someone, normally systemd, holds it open), and
    /// its timeout in seconds.
    pub fn watchdog(&self) -> BoardResult<(bool, u64)> {
        let state = self.read_value(&format!("{}/state", paths::WATCHDOG0))?;
        let timeout = format!("{}/timeout", paths::WATCHDOG0);
        let seconds = self
            .read_value(&timeout)?
            .parse()
            .map_err(|_| parse_failure(&timeout, "expected seconds"))?;
        Ok((state == "active", seconds))
    }

    /// The firmware's throttle bits, wherever this kernel exposes `get_throttled`.
    pub fn throttle_bits(&self) -> BoardResult<u32> {
        let path = self.find_get_throttled()?.ok_or_else(|| BoardError {
            op: "finding",
            path: format!("{}/**/{}", paths::PLATFORM_DIR, paths::GET_THROTTLED),
            source: io::Error::from(io::ErrorKind::NotFound),
        })?;
        let text = self.read_value(&path)?;
        u32::from_str_radix(text.trim_start_matches("0x"), 16)
            .map_err(|_| parse_failure(&path, "expected a hexadecimal bit field"))
    }

    fn find_get_throttled(&self) -> BoardResult<Option<String>> {
        // The firmware node sits one or two levels below the platform bus.
        let mut frontier = vec![paths::PLATFORM_DIR.to_string()];
        for _ in 0..3 {
            let mut next = Vec::new();
            for dir in frontier {
                for name in self.list(&dir)? {
                    let child = format!("{dir}/{name}");
                    if name == paths::GET_THROTTLED {
                        return Ok(Some(child));
                    }
                    if self.path(&child).is_dir() && !self.path(&child).is_symlink() {
                        next.push(child);
                    }
                }
            }
            frontier = next;
        }
        Ok(None)
    }

    /// Whole seconds since boot, from `/proc/uptime`.
    pub fn uptime_s(&self) -> BoardResult<u64> {
        let text = self.read(paths::PROC_UPTIME)?;
        text.split_whitespace()
            .next()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| s as u64)
            .ok_or_else(|| parse_failure(paths::PROC_UPTIME, "expected seconds since boot"))
    }

    /// The OS's `PRETTY_NAME` (quotes removed) from `/etc/os-release`.
    pub fn os_pretty_name(&self) -> BoardResult<String> {
        let text = self.read(paths::OS_RELEASE)?;
        text.lines()
            .find_map(|line| line.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| parse_failure(paths::OS_RELEASE, "no PRETTY_NAME line"))
    }

    /// Everything `status` reports about the board itself.
    pub fn facts(&self) -> Facts {
        let khz_to_mhz = |path: String| -> Option<u64> {
            self.read_value(&path)
                .ok()?
                .parse::<u64>()
                .ok()
                .map(|k| k / 1000)
        };
        let policies = self.cpufreq_policies().unwrap_or_default();
        let first = policies.first().cloned();
        Facts {
            model: self.read_value(paths::DT_MODEL).ok(),
            temperature_c: self.temperature_c().ok().map(|c| (c * 10.0).round() / 10.0),
            throttle: self.throttle().ok(),
            cpu_mhz: first
                .as_ref()
                .and_then(|p| khz_to_mhz(format!("{p}/scaling_cur_freq"))),
            cpu_max_mhz: first.and_then(|p| khz_to_mhz(format!("{p}/cpuinfo_max_freq"))),
            governors: policies
                .iter()
                .map(|p| {
                    let name = p.rsplit('/').next().unwrap_or(p);
                    let governor = self
                        .read_value(&format!("{p}/scaling_governor"))
                        .unwrap_or_else(|_| "unreadable".into());
                    format!("{name}={governor}")
                })
                .collect(),
            memory_total_mib: self.meminfo_kib("MemTotal").ok().map(|k| k / 1024),
            memory_available_mib: self.meminfo_kib("MemAvailable").ok().map(|k| k / 1024),
            swap: self.active_swaps().ok(),
            numa_nodes: self.numa_nodes().ok(),
            boot: self.boot_info().ok(),
            uptime_s: self.uptime_s().ok(),
            os: self.os_pretty_name().ok(),
            hostname: self.read_value(paths::KERNEL_HOSTNAME).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_bits_decode_into_words() {
        let t = Throttle::decode(0x5_0005);
        assert_eq!(t.raw, "0x50005");
        assert_eq!(t.now, vec!["under-voltage", "throttled"]);
        assert_eq!(t.since_boot, vec!["under-voltage", "throttled"]);
        assert!(Throttle::decode(0).now.is_empty());
        let sticky_only = Throttle::decode(0x8_0000);
        assert!(sticky_only.now.is_empty());
        assert_eq!(sticky_only.since_boot, vec!["soft-temperature-limit"]);
    }
}
