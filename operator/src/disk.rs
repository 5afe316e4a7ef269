//! A disk image's partition table and one partition as a file of its own.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

const SECTOR: u64 = 512;

/// A partition's place on the disk, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Offset of its first byte.
    pub start: u64,
    /// Its length.
    pub len: u64,
    /// The MBR partition type byte.
    pub kind: u8,
}

/// MBR partition types of FAT filesystems (FAT12/16/32, CHS and LBA).
const FAT_TYPES: [u8; 6] = [0x01, 0x04, 0x06, 0x0b, 0x0c, 0x0e];

/// The boot partition: the first MBR partition, which must hold FAT and lie within the disk.
pub fn boot_partition(disk: &mut File, disk_len: u64) -> Result<Partition, String> {
    let mut mbr = [0u8; 512];
    disk.seek(SeekFrom::Start(0))
        .and_then(|_| disk.read_exact(&mut mbr))
        .map_err(|e| format!("reading the partition table: {e}"))?;
    if mbr[510..512] != [0x55, 0xaa] {
        return Err(
            "no MBR partition table (the Appliance image has one; is this the right file?)".into(),
        );
    }
    let entry = &mbr[446..462];
    let kind = entry[4];
    if kind == 0xee {
        return Err("the disk has a GPT partition table; Appliance images use MBR".into());
    }
    if !FAT_TYPES.contains(&kind) {
        return Err(format!(
            "partition 1 has type 0x{kind:02x}, not FAT: not an Appliance image's boot partition"
        ));
    }
    let word = |at: usize| {
        u64::from(u32::from_le_bytes([
            entry[at],
            entry[at + 1],
            entry[at + 2],
            entry[at + 3],
        ]))
    };
    let start = word(8) * SECTOR;
    let len = word(12) * SECTOR;
    if len == 0 || start.checked_add(len).is_none_or(|end| end > disk_len) {
        return Err(format!(
            "partition 1 (bytes {start}..{}) does not lie within the disk ({disk_len} bytes): a truncated image?",
            start.saturating_add(len)
        ));
    }
    Ok(Partition { start, len, kind })
}

/// A disk's or image's length (a block device's `metadata().len()` is 0, its end is not).
pub fn disk_len(file: &mut File) -> io::Result<u64> {
    file.seek(SeekFrom::End(0))
}

/// One partition of a disk read and written as if it were the whole file: every access is
/// kept inside it.
pub struct PartitionFile<'a> {
    disk: &'a mut File,
    part: Partition,
    pos: u64,
}

impl<'a> PartitionFile<'a> {
    /// `part` of `disk`, positioned at its start.
    pub fn new(disk: &'a mut File, part: Partition) -> PartitionFile<'a> {
        PartitionFile { disk, part, pos: 0 }
    }

    /// How much may be read or written at the current position, at most `want`.
    fn room(&self, want: usize) -> usize {
        let left = self.part.len.saturating_sub(self.pos);
        usize::try_from(left).map_or(want, |left| want.min(left))
    }
}

impl Read for PartitionFile<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.room(buf.len());
        self.disk
            .seek(SeekFrom::Start(self.part.start + self.pos))?;
        let read = self.disk.read(&mut buf[..n])?;
        self.pos += read as u64;
        Ok(read)
    }
}

impl Write for PartitionFile<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.room(buf.len());
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write past the end of the partition",
            ));
        }
        self.disk
            .seek(SeekFrom::Start(self.part.start + self.pos))?;
        let written = self.disk.write(&buf[..n])?;
        self.pos += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.disk.flush()
    }
}

impl Seek for PartitionFile<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.part.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(n) if n <= self.part.len => {
                self.pos = n;
                Ok(n)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek outside the partition",
            )),
        }
    }
}
