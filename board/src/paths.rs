//! Where things live on a Raspberry Pi 5 running our image, as absolute box paths.
//! [`super::Board::path`] resolves them under the board root.

/// Kernel command line the running kernel was booted with.
pub const PROC_CMDLINE: &str = "/proc/cmdline";
/// Active swap areas.
pub const PROC_SWAPS: &str = "/proc/swaps";
/// Memory totals.
pub const PROC_MEMINFO: &str = "/proc/meminfo";
/// Seconds since boot (first field).
pub const PROC_UPTIME: &str = "/proc/uptime";
/// The operating system's identification (`PRETTY_NAME`, `VERSION_ID`, ...).
pub const OS_RELEASE: &str = "/etc/os-release";
/// A random id the kernel makes at every boot: tells a restart of the supervisor from a reboot.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// Running kernel's release, to find its build config.
pub const PROC_OSRELEASE: &str = "/proc/sys/kernel/osrelease";

/// cpufreq policy directories (`policy0`, ...).
pub const CPUFREQ_DIR: &str = "/sys/devices/system/cpu/cpufreq";
/// NUMA nodes (`node0`, `node1`, ...).
pub const NODE_DIR: &str = "/sys/devices/system/node";
/// The SoC temperature sensor, in millidegrees Celsius.
pub const THERMAL_ZONE0_TEMP: &str = "/sys/class/thermal/thermal_zone0/temp";
/// Where the firmware's `get_throttled` attribute is searched for (its parent node differs between
/// kernels: `soc:firmware` on Pi 4 kernels, under `soc@107c000000` on Pi 5).
pub const PLATFORM_DIR: &str = "/sys/devices/platform";
/// Name of the firmware's throttle-status attribute.
pub const GET_THROTTLED: &str = "get_throttled";

/// The hardware watchdog as the kernel's watchdog core reports it (`state`, `timeout`).
pub const WATCHDOG0: &str = "/sys/class/watchdog/watchdog0";
/// The argument systemd passes to the reboot syscall (`0 tryboot` asks the firmware for one
/// tryboot boot); on tmpfs, so a power cut forgets it.
pub const REBOOT_PARAM: &str = "/run/systemd/reboot-param";

/// The cgroup v2 root.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Device tree as the kernel exposes it.
pub const DEVICE_TREE: &str = "/sys/firmware/devicetree/base";
/// The board model string.
pub const DT_MODEL: &str = "/sys/firmware/devicetree/base/model";
/// The bootloader's report of how this boot happened.
pub const DT_BOOTLOADER: &str = "/sys/firmware/devicetree/base/chosen/bootloader";
/// Alias naming the device-tree node of the bootloader-config nvmem cell.
pub const DT_BLCONFIG_ALIAS: &str = "/sys/firmware/devicetree/base/aliases/blconfig";
/// nvmem devices, one of which holds the bootloader config the bootloader ran with.
pub const NVMEM_DEVICES: &str = "/sys/bus/nvmem/devices";

/// Boot partition mount points, newest convention first.
pub const BOOT_PARTITION_CANDIDATES: [&str; 2] = ["/boot/firmware", "/boot"];
/// Bootloader images shipped in the rootfs (`pieeprom-YYYY-MM-DD.bin`), per release channel.
pub const BOOTLOADER_FIRMWARE_DIRS: [&str; 2] = [
    "/usr/lib/firmware/raspberrypi/bootloader-2712",
    "/lib/firmware/raspberrypi/bootloader-2712",
];

/// The board's serial number as the firmware puts it in the device tree.
pub const DT_SERIAL_NUMBER: &str = "/sys/firmware/devicetree/base/serial-number";
/// The running kernel's host name.
pub const KERNEL_HOSTNAME: &str = "/proc/sys/kernel/hostname";
/// Time zone files; the image's `/etc/localtime` points at [`RUN_LOCALTIME`] (the root is
/// read-only), which provisioning points into here.
pub const ZONEINFO: &str = "/usr/share/zoneinfo";
/// The link to the provisioned time zone.
pub const RUN_LOCALTIME: &str = "/run/appliance/localtime";
/// systemd-networkd's runtime configuration, read before the image's `/usr/lib` and `/etc` ones
/// of a later name.
pub const RUN_NETWORK_DIR: &str = "/run/systemd/network";
/// systemd-timesyncd's runtime drop-ins.
pub const RUN_TIMESYNCD_DIR: &str = "/run/systemd/timesyncd.conf.d";
/// Provisioned files for other daemons (Wi-Fi, SSH), in RAM, made again at every boot.
pub const RUN_APPLIANCE: &str = "/run/appliance";
/// The engine's control socket's directory: the supervisor's user only.
pub const ENGINE_CONTROL_DIR: &str = "/run/appliance/engine";
/// The engine's control socket: the supervisor's own way in to the engine's API.
pub const ENGINE_CONTROL_SOCKET: &str = "/run/appliance/engine/control.sock";

/// The version of the system in the booted slot, as its image build stamped it.
pub const SYSTEM_VERSION: &str = "/usr/share/appliance/version";
/// Where a system keeps the files of its slot's boot folder (the image build puts them there),
/// relative to that system's root: the update handler copies them onto the boot partition.
pub const SLOT_BOOT_DIR: &str = "usr/lib/appliance/boot";
/// When the image was built (Unix seconds): the box's clock never starts earlier.
pub const BUILD_TIME: &str = "/usr/share/appliance/build-time";
/// The last time the box knew (Unix seconds), on the data partition: the clock never goes back
/// behind it across a reboot without network time.
pub const SAVED_CLOCK: &str = "/var/lib/appliance/clock";
/// systemd-timesyncd creates this once it has synchronised the clock in this boot.
pub const TIMESYNC_SYNCHRONIZED: &str = "/run/systemd/timesync/synchronized";
/// The real-time clock (the Pi 5's keeps time with a battery on J5).
pub const RTC0: &str = "/sys/class/rtc/rtc0";
