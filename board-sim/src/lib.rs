//! `board-sim`: a simulated Raspberry Pi 5 for tests and local runs. It writes the files the
//! supervisor reads on a real board ([`init`]), plays the kernel's part for the few writes that
//! are more than storing bytes (cgroup controllers, cgroup creation, swapoff, value validation),
//! and the firmware's between boots ([`firmware`]), so the same supervisor code runs on both.
//!
//! Only tests, `supervisor sim ...` and `scripts/run-local` use it: the supervisor depends on it
//! through its `sim` feature, off in the production build, so the binary on a box carries none
//! of this code (`supervisor/tests/crate_graph.rs` checks the dependency graph). [`open`] is
//! how a build with the simulator opens a board: a marked tree through [`Simulated`], anything
//! else as the live board.

pub mod firmware;

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use board::bootloader::image::Image;
use board::slot::{self, Slot};
use board::{Board, BoardResult, paths};

/// Where a Pi 5 kernel puts the firmware's `get_throttled` (relative to the board root).
pub const GET_THROTTLED_FILE: &str =
    "sys/devices/platform/soc@107c000000/soc@107c000000:firmware/get_throttled";

/// Marker file at the root of a simulated board; its contents name the variant.
pub const MARKER: &str = board::SIM_MARKER;

/// The kernel and firmware of a simulated board, as [`Board`] asks them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Simulated;

impl board::Simulation for Simulated {
    fn kernel_write(&self, path: &Path, value: &str) -> io::Result<()> {
        kernel_write(path, value)
    }

    fn create_cgroup(&self, path: &Path) -> io::Result<()> {
        kernel_mkdir_cgroup(path)
    }

    fn swap_off(&self, root: &Path, device: &str) -> io::Result<()> {
        kernel_swapoff(root, device)
    }

    fn before_write(&self, root: &Path) {
        firmware::before_write(root);
    }

    fn after_durable_write(&self, root: &Path) {
        firmware::after_durable_write(root);
    }

    fn request_reboot(&self, root: &Path) -> io::Result<()> {
        firmware::request_reboot(root)
    }

    fn compute_corruption(&self, root: &Path) -> u64 {
        firmware::compute_corruption(root)
    }

    fn clock(&self, root: &Path) -> Option<u64> {
        firmware::clock(root)
    }

    fn set_clock(&self, root: &Path, unix: u64) -> io::Result<()> {
        firmware::set_clock(root, unix)
    }
}

/// Opens the board rooted at `root`: a tree written by [`init`] (recognised by its [`MARKER`])
/// as a simulated board, anything else as the live one ([`Board::open`]).
pub fn open(root: &Path) -> BoardResult<Board> {
    if root.join(MARKER).is_file() {
        Board::simulated(root, Arc::new(Simulated))
    } else {
        Board::open(root)
    }
}

/// Page size of the Raspberry Pi 5 kernel (`bcm2712` builds use 16 KiB pages); memory limits
/// written to cgroup files read back rounded down to it.
pub const PAGE_SIZE: u64 = 16 * 1024;

/// The board states `sim init --variant` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// A freshly flashed 8 GB Pi 5: ondemand governor, NUMA-emulation kernel, default bootloader config.
    Pi5_8gb,
    /// The same with 4 GB of RAM.
    Pi5_4gb,
    /// A kernel booted with `cgroup_disable=memory` and no `cgroup_enable=memory` in cmdline.txt.
    NoMemcg,
    /// A kernel built without NUMA emulation: `numa=fake` is on the command line but ignored.
    NoNuma,
    /// A bootloader pinned to `SDRAM_BANKLOW=3` under a NUMA-emulation kernel.
    WrongInterleave,
    /// zram swap active, as Raspberry Pi OS sets it up.
    Zram,
    /// An 80 °C board the firmware is throttling.
    Hot,
    /// A bootloader from 2024-06, before SDRAM_BANKLOW and NUMA emulation by default: no
    /// `numa=fake` on the command line, one NUMA node.
    OldBootloader,
}

impl Variant {
    /// Every variant, with its command-line name.
    pub const ALL: [(&'static str, Variant); 8] = [
        ("pi5-8gb", Variant::Pi5_8gb),
        ("pi5-4gb", Variant::Pi5_4gb),
        ("no-memcg", Variant::NoMemcg),
        ("no-numa", Variant::NoNuma),
        ("wrong-interleave", Variant::WrongInterleave),
        ("zram", Variant::Zram),
        ("hot", Variant::Hot),
        ("old-bootloader", Variant::OldBootloader),
    ];

    /// Looks a variant up by its command-line name.
    pub fn from_name(name: &str) -> Option<Variant> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }

    /// The variant's command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, v)| *v == self)
            .map(|&(n, _)| n)
            .unwrap_or("pi5-8gb")
    }
}

const KERNEL_RELEASE: &str = "6.12.47+rpt-rpi-2712";
const FIRMWARE_CMDLINE: &str = "reboot=w coherent_pool=1M 8250.nr_uarts=1 pci=pcie_bus_safe cgroup_disable=memory smsc95xx.macaddr=2C:CF:67:00:00:01 vc_mem.mem_base=0x3fc00000 vc_mem.mem_size=0x40000000";
/// What a bootloader with banklow 1 adds for the kernel's NUMA emulation.
const FIRMWARE_NUMA_ARGS: &str =
    "numa_policy=interleave numa=fake=8 system_heap.max_order=0 iommu_dma_numa_policy=interleave";
const CMDLINE_TXT: &str = "console=serial0,115200 console=tty1 root=PARTUUID=feed0001-02 rootfstype=ext4 fsck.repair=yes ro rootwait";
const BOOTLOADER_CONFIG: &str = "[all]\nBOOT_UART=1\nPOWER_OFF_ON_HALT=0\nBOOT_ORDER=0xf461\n";
const BOOTLOADER_IMAGE: &str =
    "usr/lib/firmware/raspberrypi/bootloader-2712/default/pieeprom-2025-05-08.bin";
const BLCONFIG_NODE: &str = "reserved-memory/nvram@0";
const ALL_CONTROLLERS: &str = "cpuset cpu io memory hugetlb pids rdma misc";
const GOVERNORS: &str = "conservative ondemand userspace powersave performance schedutil";

/// Writes a simulated board of the given variant into `dir`, which must be empty, absent, or an
/// earlier simulation (which is replaced).
pub fn init(dir: &Path, variant: Variant) -> io::Result<()> {
    if dir.exists() {
        let empty = fs::read_dir(dir)?.next().is_none();
        if !empty {
            if !dir.join(MARKER).is_file() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} is not empty and is not a simulated board; choose an empty directory",
                        dir.display()
                    ),
                ));
            }
            fs::remove_dir_all(dir)?;
        }
    }
    fs::create_dir_all(dir)?;
    let tree = Tree(dir.to_path_buf());
    write_proc(&tree, variant)?;
    write_cpufreq(&tree)?;
    write_thermal(&tree, variant)?;
    write_numa(&tree, variant)?;
    write_cgroups(&tree, variant)?;
    write_device_tree(&tree, variant)?;
    write_boot_partition(&tree, variant)?;
    write_firmware(&tree)?;
    write_system(&tree)?;
    tree.file(MARKER, &format!("{}\n", variant.name()))
}

/// The simulated board's serial number (a test may rewrite the device-tree file).
pub const SERIAL: &str = "10000000a5a5a5a5";

/// What the OS brings that provisioning touches: the kernel's host name, a few time zones.
fn write_system(tree: &Tree) -> io::Result<()> {
    tree.file("proc/sys/kernel/hostname", "appliance\n")?;
    for zone in ["UTC", "Europe/Berlin", "America/New_York"] {
        tree.file(&format!("usr/share/zoneinfo/{zone}"), "TZif2\n")?;
    }
    Ok(())
}

struct Tree(PathBuf);

impl Tree {
    fn file(&self, rel: &str, contents: &str) -> io::Result<()> {
        self.bytes(rel, contents.as_bytes())
    }

    fn bytes(&self, rel: &str, contents: &[u8]) -> io::Result<()> {
        let path = self.0.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, contents)
    }

    fn dir(&self, rel: &str) -> io::Result<()> {
        fs::create_dir_all(self.0.join(rel))
    }

    fn link(&self, rel: &str, target: &str) -> io::Result<()> {
        let path = self.0.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        symlink(target, path)
    }

    /// A device-tree integer property: one big-endian u32.
    fn dt_u32(&self, rel: &str, value: u32) -> io::Result<()> {
        self.bytes(rel, &value.to_be_bytes())
    }
}

fn write_proc(tree: &Tree, variant: Variant) -> io::Result<()> {
    let user_part = if variant == Variant::NoMemcg {
        CMDLINE_TXT.to_string()
    } else {
        format!("{CMDLINE_TXT} cgroup_enable=memory")
    };
    let numa = if variant == Variant::OldBootloader {
        String::new()
    } else {
        format!(" {FIRMWARE_NUMA_ARGS}")
    };
    // As the image lays it out, the running slot (A) is named on the command line.
    tree.file(
        "proc/cmdline",
        &format!("{FIRMWARE_CMDLINE}{numa} {user_part} rauc.slot=A\n"),
    )?;
    firmware::write_boot_id(&tree.0)?;
    tree.file(
        firmware::FIRMWARE_CMDLINE,
        &format!("{FIRMWARE_CMDLINE}{numa}\n"),
    )?;
    let (total_kb, available_kb) = if variant == Variant::Pi5_4gb {
        (4_045_104, 3_702_336)
    } else {
        (8_245_168, 7_801_520)
    };
    let swap_kb = if variant == Variant::Zram {
        2_097_136
    } else {
        0
    };
    tree.file(
        "proc/meminfo",
        &format!(
            "MemTotal:       {total_kb} kB\nMemFree:        {available_kb} kB\nMemAvailable:   {available_kb} kB\nSwapTotal:      {swap_kb} kB\nSwapFree:       {swap_kb} kB\n"
        ),
    )?;
    let mut swaps = String::from("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n");
    if variant == Variant::Zram {
        swaps.push_str("/dev/zram0                              partition\t2097136\t\t0\t\t100\n");
        tree.file("sys/block/zram0/disksize", "2147483648\n")?;
        tree.file("sys/block/zram0/comp_algorithm", "lzo lzo-rle lz4 [zstd]\n")?;
    }
    tree.file("proc/swaps", &swaps)?;
    // Seconds since boot, and idle seconds summed over the cores.
    tree.file("proc/uptime", "412.37 1530.02\n")?;
    tree.file(
        "etc/os-release",
        "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"13\"\nID=debian\n",
    )?;
    tree.file("proc/sys/kernel/osrelease", &format!("{KERNEL_RELEASE}\n"))?;
    tree.link("proc/device-tree", "../sys/firmware/devicetree/base")
}

fn write_cpufreq(tree: &Tree) -> io::Result<()> {
    // All four Cortex-A76 cores share one clock, so the Pi 5 has a single policy covering them.
    let policy = "sys/devices/system/cpu/cpufreq/policy0";
    let frequencies: Vec<String> = (15..=24).map(|f| (f * 100_000).to_string()).collect();
    for (name, value) in [
        ("affected_cpus", "0 1 2 3"),
        ("related_cpus", "0 1 2 3"),
        ("scaling_available_governors", GOVERNORS),
        ("scaling_governor", "ondemand"),
        ("scaling_driver", "cpufreq-dt"),
        ("scaling_cur_freq", "1500000"),
        ("scaling_min_freq", "1500000"),
        ("scaling_max_freq", "2400000"),
        ("cpuinfo_min_freq", "1500000"),
        ("cpuinfo_max_freq", "2400000"),
        ("scaling_available_frequencies", &frequencies.join(" ")),
    ] {
        tree.file(&format!("{policy}/{name}"), &format!("{value}\n"))?;
    }
    for cpu in 0..4 {
        tree.link(
            &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq"),
            "../cpufreq/policy0",
        )?;
    }
    tree.file("sys/devices/system/cpu/online", "0-3\n")
}

fn write_thermal(tree: &Tree, variant: Variant) -> io::Result<()> {
    let (temp, throttled) = if variant == Variant::Hot {
        // Arm frequency capped, throttled and soft temperature limit: now and since boot.
        ("80550", "e000e")
    } else {
        ("48250", "0")
    };
    // systemd's RuntimeWatchdogSec has the hardware watchdog open and armed.
    for (name, value) in [
        ("identity", "bcm2835-wdt"),
        ("state", "active"),
        ("timeout", "30"),
    ] {
        tree.file(
            &format!("sys/class/watchdog/watchdog0/{name}"),
            &format!("{value}\n"),
        )?;
    }
    tree.file("sys/class/thermal/thermal_zone0/type", "cpu-thermal\n")?;
    tree.file("sys/class/thermal/thermal_zone0/temp", &format!("{temp}\n"))?;
    tree.file(GET_THROTTLED_FILE, &format!("{throttled}\n"))
}

fn write_numa(tree: &Tree, variant: Variant) -> io::Result<()> {
    let nodes = if matches!(variant, Variant::NoNuma | Variant::OldBootloader) {
        1
    } else {
        8
    };
    for node in 0..nodes {
        tree.file(
            &format!("sys/devices/system/node/node{node}/cpulist"),
            "0-3\n",
        )?;
    }
    let emulation = if variant == Variant::NoNuma {
        "# CONFIG_NUMA_EMULATION is not set"
    } else {
        "CONFIG_NUMA_EMULATION=y"
    };
    tree.file(
        &format!("boot/config-{KERNEL_RELEASE}"),
        &format!("CONFIG_ARM64=y\nCONFIG_NUMA=y\n{emulation}\nCONFIG_MEMCG=y\n"),
    )
}

fn write_cgroups(tree: &Tree, variant: Variant) -> io::Result<()> {
    let (controllers, enabled) = if variant == Variant::NoMemcg {
        ("cpuset cpu io hugetlb pids rdma misc", "cpu io pids")
    } else {
        (ALL_CONTROLLERS, "cpu io memory pids")
    };
    tree.file(
        "sys/fs/cgroup/cgroup.controllers",
        &format!("{controllers}\n"),
    )?;
    tree.file(
        "sys/fs/cgroup/cgroup.subtree_control",
        &format!("{enabled}\n"),
    )?;
    tree.file("sys/fs/cgroup/cgroup.procs", "1\n")?;
    for child in ["init.scope", "system.slice", "user.slice"] {
        kernel_mkdir_cgroup(&tree.0.join("sys/fs/cgroup").join(child))?;
    }
    Ok(())
}

fn write_device_tree(tree: &Tree, variant: Variant) -> io::Result<()> {
    let base = "sys/firmware/devicetree/base";
    tree.file(&format!("{base}/model"), "Raspberry Pi 5 Model B Rev 1.0\0")?;
    tree.file(&format!("{base}/serial-number"), &format!("{SERIAL}\0"))?;
    tree.file(
        &format!("{base}/compatible"),
        "raspberrypi,5-model-b\0brcm,bcm2712\0",
    )?;
    let chosen = format!("{base}/chosen/bootloader");
    tree.dt_u32(&format!("{chosen}/tryboot"), 0)?;
    tree.dt_u32(&format!("{chosen}/partition"), 1)?;
    tree.dt_u32(&format!("{chosen}/boot-mode"), 1)?;
    // 2025-05-08: a bootloader that knows SDRAM_BANKLOW and enables banklow 1 by default;
    // 2024-06-01 for the old one.
    let built = if variant == Variant::OldBootloader {
        1_717_200_000
    } else {
        1_746_662_400
    };
    tree.dt_u32(&format!("{chosen}/build-timestamp"), built)?;
    tree.file(
        &format!("{base}/aliases/blconfig"),
        &format!("/{BLCONFIG_NODE}\0"),
    )?;
    tree.file(&format!("{base}/{BLCONFIG_NODE}/name"), "nvram\0")?;
    let mut config = BOOTLOADER_CONFIG.to_string();
    if variant == Variant::WrongInterleave {
        config.push_str("SDRAM_BANKLOW=3\n");
    }
    // The nvmem cell is a fixed-size region; the text is NUL-padded.
    let mut cell = config.into_bytes();
    cell.resize(4096, 0);
    tree.bytes("sys/bus/nvmem/devices/rmem0/nvmem", &cell)?;
    tree.link(
        "sys/bus/nvmem/devices/rmem0/of_node",
        &format!("../../../../firmware/devicetree/base/{BLCONFIG_NODE}"),
    )
}

fn write_boot_partition(tree: &Tree, variant: Variant) -> io::Result<()> {
    // As the image lays it out: the fragments (one of them choosing slot A's folder), config.txt
    // assembled from them, and each installed slot's kernel, initramfs and cmdline.txt.
    let fragments = [
        config_txt::Fragment {
            name: "10-boot.txt".into(),
            text: "[all]\narm_64bit=1\nkernel=vmlinuz\ninitramfs initrd.img followkernel\n".into(),
        },
        config_txt::Fragment {
            name: slot::FRAGMENT_NAME.into(),
            text: Slot::A.fragment_text(),
        },
    ];
    for fragment in &fragments {
        tree.file(
            &format!(
                "boot/firmware/{}/{}",
                config_txt::FRAGMENT_DIR,
                fragment.name
            ),
            &fragment.text,
        )?;
    }
    let config = config_txt::assemble(&fragments, "config.txt.d").map_err(invalid)?;
    tree.file("boot/firmware/config.txt", &config)?;
    let cmdline = if variant == Variant::NoMemcg {
        CMDLINE_TXT.to_string()
    } else {
        format!("{CMDLINE_TXT} cgroup_enable=memory")
    };
    tree.file(
        "boot/firmware/slot-a/cmdline.txt",
        &format!("{cmdline} rauc.slot=A\n"),
    )?;
    write_slot_system(tree, "A", "1")?;
    for name in ["vmlinuz", "initrd.img", "version"] {
        let from = tree
            .0
            .join(firmware::SLOTS)
            .join("A")
            .join(SLOT_BOOT_DIR)
            .join(name);
        fs::copy(from, tree.0.join("boot/firmware/slot-a").join(name))?;
    }
    tree.file(paths::SYSTEM_VERSION.trim_start_matches('/'), "1\n")
}

/// Where a system keeps its boot folder's files (the image build puts them there).
const SLOT_BOOT_DIR: &str = paths::SLOT_BOOT_DIR;

/// Writes a system of `version` into slot `name`'s root filesystem on the simulated board at
/// `root`, as RAUC would (`sim write-slot`).
pub fn write_slot(root: &Path, name: &str, version: &str) -> io::Result<()> {
    Slot::from_bootname(name).map_err(invalid)?;
    write_slot_system(&Tree(root.to_path_buf()), name, version)
}

fn write_slot_system(tree: &Tree, name: &str, version: &str) -> io::Result<()> {
    let base = format!("{}/{name}", firmware::SLOTS);
    tree.file(
        &format!("{base}/{SLOT_BOOT_DIR}/vmlinuz"),
        &format!("simulated kernel of version {version}\n"),
    )?;
    tree.file(
        &format!("{base}/{SLOT_BOOT_DIR}/initrd.img"),
        "simulated initramfs\n",
    )?;
    tree.file(
        &format!("{base}/{SLOT_BOOT_DIR}/version"),
        &format!("{version}\n"),
    )?;
    tree.file(
        &format!("{base}{}", paths::SYSTEM_VERSION),
        &format!("{version}\n"),
    )
}

fn write_firmware(tree: &Tree) -> io::Result<()> {
    let image = Image::assemble(&[
        (0, "", b"simulated bootloader code"),
        (0x1_0000, "updatetime", &[0u8; 8]),
        (0xa_4000, "bootconf.txt", BOOTLOADER_CONFIG.as_bytes()),
        (0x10_7000, "", &[]),
    ])
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    tree.bytes(BOOTLOADER_IMAGE, image.bytes())?;
    tree.file(
        "usr/lib/firmware/raspberrypi/bootloader-2712/default/recovery.bin",
        "simulated recovery loader\n",
    )?;
    tree.dir("etc/appliance")
}

// ---- The kernel's part -------------------------------------------------------------------

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

/// Default contents of a controller's interface files in a new cgroup.
fn controller_files(controller: &str) -> &'static [(&'static str, &'static str)] {
    match controller {
        "cpu" => &[("cpu.weight", "100"), ("cpu.max", "max 100000")],
        "memory" => &[
            ("memory.max", "max"),
            ("memory.high", "max"),
            ("memory.low", "0"),
            ("memory.min", "0"),
            ("memory.swap.max", "max"),
            ("memory.current", "0"),
        ],
        "pids" => &[("pids.max", "max")],
        "io" => &[("io.weight", "default 100")],
        _ => &[],
    }
}

/// `mkdir` in the cgroup filesystem: the new group inherits its parent's enabled controllers.
pub fn kernel_mkdir_cgroup(path: &Path) -> io::Result<()> {
    let parent = path
        .parent()
        .ok_or_else(|| invalid("a cgroup needs a parent"))?;
    let enabled = fs::read_to_string(parent.join("cgroup.subtree_control"))?;
    match fs::create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        other => other?,
    }
    fs::write(
        path.join("cgroup.controllers"),
        format!("{}\n", enabled.trim()),
    )?;
    fs::write(path.join("cgroup.subtree_control"), "\n")?;
    fs::write(path.join("cgroup.procs"), "")?;
    fs::write(path.join("cgroup.type"), "domain\n")?;
    for controller in words(&enabled) {
        for (name, value) in controller_files(&controller) {
            fs::write(path.join(name), format!("{value}\n"))?;
        }
    }
    Ok(())
}

/// A write to a kernel attribute, validated and interpreted the way the kernel does it.
pub fn kernel_write(path: &Path, value: &str) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let value = value.trim();
    match name.as_str() {
        "cgroup.subtree_control" => write_subtree_control(path, value),
        // Moving a process in adds it to the list; the file keeps every member.
        "cgroup.procs" => {
            let pid: u32 = value.parse().map_err(|_| invalid("not a process id"))?;
            let mut members = fs::read_to_string(path)?;
            members.push_str(&format!("{pid}\n"));
            fs::write(path, members)
        }
        "cpu.weight" => {
            let weight: u32 = value.parse().map_err(|_| invalid("not a number"))?;
            if !(1..=10_000).contains(&weight) {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "out of range"));
            }
            fs::write(path, format!("{weight}\n"))
        }
        "memory.max" | "memory.high" | "memory.swap.max" | "memory.low" | "memory.min" => {
            let stored = if value == "max" {
                "max".to_string()
            } else {
                let bytes: u64 = value.parse().map_err(|_| invalid("not a number or max"))?;
                (bytes / PAGE_SIZE * PAGE_SIZE).to_string()
            };
            fs::write(path, format!("{stored}\n"))
        }
        "scaling_governor" => {
            let dir = path.parent().ok_or_else(|| invalid("no policy"))?;
            let available = fs::read_to_string(dir.join("scaling_available_governors"))?;
            if !words(&available).iter().any(|g| g == value) {
                return Err(invalid(format!("governor {value} not available")));
            }
            fs::write(path, format!("{value}\n"))
        }
        _ => fs::write(path, format!("{value}\n")),
    }
}

fn write_subtree_control(path: &Path, request: &str) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| invalid("no cgroup"))?;
    let available = words(&fs::read_to_string(dir.join("cgroup.controllers"))?);
    let mut enabled = words(&fs::read_to_string(path)?);
    for token in request.split_whitespace() {
        let (add, controller) = match (token.strip_prefix('+'), token.strip_prefix('-')) {
            (Some(c), _) => (true, c),
            (_, Some(c)) => (false, c),
            _ => return Err(invalid(format!("bad token {token}"))),
        };
        if !available.iter().any(|c| c == controller) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("controller {controller} not available"),
            ));
        }
        enabled.retain(|c| c != controller);
        if add {
            enabled.push(controller.to_string());
        }
    }
    // Keep the kernel's canonical order.
    let order = words(ALL_CONTROLLERS);
    enabled.sort_by_key(|c| order.iter().position(|o| o == c));
    let line = enabled.join(" ");
    fs::write(path, format!("{line}\n"))?;
    for entry in fs::read_dir(dir)? {
        let child = entry?.path();
        if !child.is_dir() {
            continue;
        }
        fs::write(child.join("cgroup.controllers"), format!("{line}\n"))?;
        for controller in &enabled {
            for (name, value) in controller_files(controller) {
                let file = child.join(name);
                if !file.exists() {
                    fs::write(file, format!("{value}\n"))?;
                }
            }
        }
    }
    Ok(())
}

/// `swapoff`: the device leaves `/proc/swaps`.
pub fn kernel_swapoff(root: &Path, device: &str) -> io::Result<()> {
    let path = root.join("proc/swaps");
    let text = fs::read_to_string(&path)?;
    let mut found = false;
    let kept: Vec<&str> = text
        .lines()
        .filter(|line| {
            let hit = line.split_whitespace().next() == Some(device);
            found |= hit;
            !hit
        })
        .collect();
    if !found {
        return Err(invalid(format!("{device} is not an active swap area")));
    }
    fs::write(path, format!("{}\n", kept.join("\n")))
}
