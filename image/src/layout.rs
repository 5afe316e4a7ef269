//! The card's MBR partition table: boot (FAT32), root A, root B, data; every partition on a
//! 4 MiB boundary (erase-block friendly on SD cards).

use crate::definition::Layout;

/// Bytes per sector.
pub const SECTOR: u64 = 512;
/// Partition alignment.
const ALIGN: u64 = 4 << 20;

/// One partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// 1-based number (`PARTUUID` suffix `-0N`).
    pub number: u8,
    /// Role.
    pub role: Role,
    /// Start in bytes.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
}

/// What a partition holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Firmware, kernel, config.txt.
    Boot,
    /// Root filesystem A (the one built).
    RootA,
    /// Root filesystem B (the update slot, empty as built).
    RootB,
    /// Models, state, logs.
    Data,
}

impl Role {
    /// Filesystem label.
    pub fn label(self) -> &'static str {
        match self {
            Role::Boot => "BOOT",
            Role::RootA => "root-a",
            Role::RootB => "root-b",
            Role::Data => "data",
        }
    }

    /// MBR partition type (`c` FAT32 LBA, `83` Linux).
    fn mbr_type(self) -> &'static str {
        match self {
            Role::Boot => "c",
            _ => "83",
        }
    }
}

/// The partitions and the disk size for `layout`.
pub fn partitions(layout: &Layout) -> (Vec<Partition>, u64) {
    let mib = 1u64 << 20;
    let mut at = ALIGN;
    let mut parts = Vec::new();
    for (number, role, size) in [
        (1, Role::Boot, layout.boot_mib * mib),
        (2, Role::RootA, layout.root_mib * mib),
        (3, Role::RootB, layout.root_mib * mib),
        (4, Role::Data, layout.data_mib * mib),
    ] {
        parts.push(Partition {
            number,
            role,
            start: at,
            size,
        });
        at = (at + size).div_ceil(ALIGN) * ALIGN;
    }
    (parts, at)
}

/// The table as an `sfdisk` script.
pub fn sfdisk_script(layout: &Layout) -> String {
    let (parts, _) = partitions(layout);
    let mut out = format!(
        "label: dos\nlabel-id: 0x{:08x}\nunit: sectors\n\n",
        layout.disk_id
    );
    for p in parts {
        out.push_str(&format!(
            "start={}, size={}, type={}{}\n",
            p.start / SECTOR,
            p.size / SECTOR,
            p.role.mbr_type(),
            if p.role == Role::Boot {
                ", bootable"
            } else {
                ""
            }
        ));
    }
    out
}

/// `PARTUUID` of partition `number` on a disk with this MBR identifier.
pub fn partuuid(disk_id: u32, number: u8) -> String {
    format!("{disk_id:08x}-{number:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            boot_mib: 256,
            root_mib: 1024,
            data_mib: 256,
            disk_id: 0xa9911a0c,
        }
    }

    #[test]
    fn partitions_are_aligned_ordered_and_disjoint() {
        let (parts, size) = partitions(&layout());
        assert_eq!(parts.len(), 4);
        for pair in parts.windows(2) {
            assert!(pair[0].start + pair[0].size <= pair[1].start);
        }
        for p in &parts {
            assert_eq!(p.start % ALIGN, 0);
        }
        let last = parts[3];
        assert_eq!(size, last.start + last.size);
        assert_eq!(size, (4 + 256 + 1024 + 1024 + 256) << 20);
    }

    #[test]
    fn the_sfdisk_script_names_types_sizes_and_the_disk_id() {
        let script = sfdisk_script(&layout());
        assert!(
            script.contains("label: dos\nlabel-id: 0xa9911a0c\n"),
            "{script}"
        );
        assert!(
            script.contains("start=8192, size=524288, type=c, bootable\n"),
            "{script}"
        );
        assert_eq!(script.matches("type=83").count(), 3);
        assert_eq!(partuuid(0xa9911a0c, 2), "a9911a0c-02");
    }
}
