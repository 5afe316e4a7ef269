//! The `pieeprom` flash image: a chain of sections, each `magic (BE u32)`, `length (BE u32)`, data,
//! padded to 8 bytes. File sections carry a 12-byte name, 4 reserved bytes, then the content;
//! `bootconf.txt` is the one holding the configuration. Nothing in the image hashes the config, so
//! replacing it in place is all `rpi-eeprom-config --apply` does before staging.

use std::fmt;

use sha2::{Digest, Sha256};

const MAGIC: u32 = 0x55aa_f00f;
const MAGIC_MASK: u32 = 0xffff_f00f;
const FILE_MAGIC: u32 = 0x55aa_f11f;
const PAD_MAGIC: u32 = 0x55aa_feef;
const SECTION_HEADER: usize = 8;
const FILENAME_LEN: usize = 12;
/// Name, then 4 reserved bytes, before a file's content.
const FILE_HEADER: usize = SECTION_HEADER + FILENAME_LEN + 4;
/// The largest configuration the bootloader accepts.
pub const MAX_CONFIG_LEN: usize = 4076;
/// Writable files live in the partition after the read-only first 64 KiB.
const WRITABLE_START: usize = 64 * 1024;
const WRITABLE_END: usize = WRITABLE_START + 988 * 1024;
const ERASE_BLOCK: usize = 4096;
const LAST_SECTION_LIMIT: usize = 0x0010_7000;
/// Pi 4 images are 512 KiB, Pi 5 images 2 MiB.
const IMAGE_SIZES: [usize; 2] = [512 * 1024, 2 * 1024 * 1024];
const CONFIG_NAME: &str = "bootconf.txt";
const UPDATE_TIME_NAME: &str = "updatetime";

/// Why an image could not be read or changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError(String);

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ImageError {}

fn fail<T>(msg: impl Into<String>) -> Result<T, ImageError> {
    Err(ImageError(msg.into()))
}

#[derive(Debug, Clone)]
struct Section {
    offset: usize,
    magic: u32,
    length: usize,
}

impl Section {
    fn is_file(&self) -> bool {
        self.magic == FILE_MAGIC
    }
}

/// A bootloader image held in memory.
#[derive(Debug, Clone)]
pub struct Image {
    bytes: Vec<u8>,
    sections: Vec<Section>,
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

impl Image {
    /// Parses an image, checking every section header against the image's bounds.
    pub fn parse(bytes: Vec<u8>) -> Result<Image, ImageError> {
        if !IMAGE_SIZES.contains(&bytes.len()) {
            return fail(format!(
                "bootloader image is {} bytes; expected 524288 (Pi 4) or 2097152 (Pi 5)",
                bytes.len()
            ));
        }
        let mut sections = Vec::new();
        let mut offset = 0usize;
        while offset + SECTION_HEADER <= bytes.len() {
            let (Some(magic), Some(length)) = (be_u32(&bytes, offset), be_u32(&bytes, offset + 4))
            else {
                break;
            };
            if magic == 0 || magic == u32::MAX {
                break;
            }
            if magic & MAGIC_MASK != MAGIC {
                return fail(format!(
                    "bad section magic {magic:#010x} at offset {offset:#x}"
                ));
            }
            let length = length as usize;
            let end = offset
                .checked_add(SECTION_HEADER)
                .and_then(|n| n.checked_add(length))
                .filter(|&end| end <= bytes.len());
            let Some(end) = end else {
                return fail(format!(
                    "section at offset {offset:#x} claims {length} bytes, past the image end"
                ));
            };
            if magic == FILE_MAGIC && length < FILE_HEADER - SECTION_HEADER {
                return fail(format!("file section at offset {offset:#x} is too short"));
            }
            sections.push(Section {
                offset,
                magic,
                length,
            });
            offset = align8(end);
        }
        Ok(Image { bytes, sections })
    }

    /// The image's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn file_name(&self, section: &Section) -> String {
        let start = section.offset + SECTION_HEADER;
        self.bytes[start..start + FILENAME_LEN]
            .iter()
            .filter(|&&b| b != 0)
            .map(|&b| b as char)
            .collect()
    }

    fn find_file(&self, name: &str, writable_only: bool) -> Option<usize> {
        self.sections.iter().position(|s| {
            s.is_file()
                && self.file_name(s) == name
                && (!writable_only || (WRITABLE_START..WRITABLE_END).contains(&s.offset))
        })
    }

    fn content(&self, section: &Section) -> &[u8] {
        let start = section.offset + FILE_HEADER;
        &self.bytes[start..section.offset + SECTION_HEADER + section.length]
    }

    /// The configuration text stored in the image.
    pub fn config(&self) -> Result<String, ImageError> {
        let Some(index) = self.find_file(CONFIG_NAME, false) else {
            return fail("bootloader image has no bootconf.txt");
        };
        String::from_utf8(self.content(&self.sections[index]).to_vec())
            .map_err(|_| ImageError("bootconf.txt in the image is not UTF-8".into()))
    }

    /// Replaces the configuration in place, erasing the old bytes, as the bootloader tools do.
    pub fn set_config(&mut self, config: &str) -> Result<(), ImageError> {
        let new = config.as_bytes();
        if new.len() > MAX_CONFIG_LEN {
            return fail(format!(
                "bootloader config is {} bytes; the bootloader accepts at most {MAX_CONFIG_LEN}",
                new.len()
            ));
        }
        let Some(index) = self.find_file(CONFIG_NAME, true) else {
            return fail("bootloader image has no writable bootconf.txt");
        };
        let section = self.sections[index].clone();
        let following = self.sections[index + 1..]
            .iter()
            .find(|s| s.magic != PAD_MAGIC)
            .map(|s| s.offset);
        let limit =
            following.unwrap_or_else(|| (self.bytes.len() - ERASE_BLOCK).min(LAST_SECTION_LIMIT));
        let content_start = section.offset + FILE_HEADER;
        let content_end = content_start + new.len();
        if content_end > limit {
            return fail("bootloader config does not fit in the space the image leaves for it");
        }
        let length = (new.len() + FILE_HEADER - SECTION_HEADER) as u32;
        self.bytes[section.offset + 4..section.offset + 8].copy_from_slice(&length.to_be_bytes());
        self.bytes[content_start..content_end].copy_from_slice(new);
        let padded = align8(content_end).min(limit);
        self.bytes[content_end..padded].fill(0xff);
        let remaining = limit - padded;
        let is_last = index + 1 == self.sections.len();
        if !is_last && remaining >= SECTION_HEADER {
            self.bytes[padded..padded + 4].copy_from_slice(&PAD_MAGIC.to_be_bytes());
            let pad_len = (remaining - SECTION_HEADER) as u32;
            self.bytes[padded + 4..padded + 8].copy_from_slice(&pad_len.to_be_bytes());
            self.bytes[padded + SECTION_HEADER..limit].fill(0xff);
        } else {
            self.bytes[padded..limit].fill(0xff);
        }
        *self = Image::parse(std::mem::take(&mut self.bytes))?;
        Ok(())
    }

    /// Stamps the update time the bootloader compares against, as `rpi-eeprom-update` does.
    pub fn set_update_time(&mut self, unix_seconds: u32) {
        let mut stamp = [0u8; 8];
        stamp[..4].copy_from_slice(&(!unix_seconds).to_le_bytes());
        stamp[4..].copy_from_slice(&unix_seconds.to_le_bytes());
        let targets: Vec<usize> = self
            .sections
            .iter()
            .filter(|s| s.is_file() && s.length >= FILE_HEADER - SECTION_HEADER + 8)
            .filter(|s| self.file_name(s) == UPDATE_TIME_NAME)
            .map(|s| s.offset + FILE_HEADER)
            .collect();
        if targets.is_empty() {
            let end = self.bytes.len();
            self.bytes[end - 8..].copy_from_slice(&stamp);
        }
        for at in targets {
            self.bytes[at..at + 8].copy_from_slice(&stamp);
        }
    }

    /// Lowercase hex SHA-256 of the whole image, as the bootloader checks it before flashing.
    pub fn sha256_hex(&self) -> String {
        Sha256::digest(&self.bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The `pieeprom.sig` that accompanies a staged image: its SHA-256, the time, the target SoC.
    pub fn signature_file(&self, unix_seconds: u64) -> String {
        format!(
            "{}\nts: {unix_seconds}\ntarget-soc: 2712\n",
            self.sha256_hex()
        )
    }

    /// Builds a 2 MiB image from named files placed at the given offsets; the simulated board's
    /// firmware package and the tests use it. Offsets must be 8-aligned and increasing. Offset 0
    /// holds the bootloader code; an entry with an empty name elsewhere is a padding section.
    pub fn assemble(files: &[(usize, &str, &[u8])]) -> Result<Image, ImageError> {
        let mut bytes = vec![0xffu8; IMAGE_SIZES[1]];
        let mut cursor = 0usize;
        for &(offset, name, content) in files {
            if offset % 8 != 0 || offset < cursor || name.len() > FILENAME_LEN {
                return fail(format!("cannot place {name} at {offset:#x}"));
            }
            let end = offset + FILE_HEADER + content.len();
            if end > bytes.len() {
                return fail(format!("{name} does not fit"));
            }
            if cursor > 0 && offset - cursor >= SECTION_HEADER {
                let pad = (offset - cursor - SECTION_HEADER) as u32;
                bytes[cursor..cursor + 4].copy_from_slice(&PAD_MAGIC.to_be_bytes());
                bytes[cursor + 4..cursor + 8].copy_from_slice(&pad.to_be_bytes());
            }
            let magic = match (offset, name) {
                (0, _) => MAGIC,
                (_, "") => PAD_MAGIC,
                _ => FILE_MAGIC,
            };
            bytes[offset..offset + 4].copy_from_slice(&magic.to_be_bytes());
            if magic != FILE_MAGIC {
                // Code and padding sections: no name, just data.
                let length = content.len() as u32;
                bytes[offset + 4..offset + 8].copy_from_slice(&length.to_be_bytes());
                bytes[offset + 8..offset + 8 + content.len()].copy_from_slice(content);
                cursor = align8(offset + 8 + content.len());
                continue;
            }
            let length = (content.len() + FILE_HEADER - SECTION_HEADER) as u32;
            bytes[offset + 4..offset + 8].copy_from_slice(&length.to_be_bytes());
            let name_at = offset + SECTION_HEADER;
            bytes[name_at..name_at + FILENAME_LEN].fill(0);
            bytes[name_at..name_at + name.len()].copy_from_slice(name.as_bytes());
            bytes[name_at + FILENAME_LEN..offset + FILE_HEADER].fill(0);
            bytes[offset + FILE_HEADER..end].copy_from_slice(content);
            cursor = align8(end);
        }
        Image::parse(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG_AT: usize = 0xa4000;
    /// In shipped 2712 images only padding follows `bootconf.txt`, up to the next erase region.
    const NEXT_AT: usize = 0x107000;

    fn sample() -> Image {
        Image::assemble(&[
            (0, "", b"bootcode"),
            (0x10000, "updatetime", &[0u8; 8]),
            (CONFIG_AT, "bootconf.txt", b"[all]\nBOOT_UART=1\n"),
            (NEXT_AT, "", &[]),
        ])
        .expect("assemble")
    }

    #[test]
    fn reads_the_config_it_holds() {
        assert_eq!(sample().config().expect("config"), "[all]\nBOOT_UART=1\n");
    }

    #[test]
    fn replacing_the_config_keeps_every_other_byte_outside_its_slot() {
        let before = sample();
        let mut after = before.clone();
        let config = "[all]\nBOOT_UART=1\nSDRAM_BANKLOW=3\n";
        after.set_config(config).expect("set");
        assert_eq!(after.config().expect("config"), config);
        assert_eq!(&after.bytes()[..CONFIG_AT], &before.bytes()[..CONFIG_AT]);
        assert_eq!(&after.bytes()[NEXT_AT..], &before.bytes()[NEXT_AT..]);
        // The bootloader walks the chain: the padding section at NEXT_AT must still be reached.
        let reparsed = Image::parse(after.bytes().to_vec()).expect("reparse");
        assert!(
            reparsed
                .sections
                .iter()
                .any(|s| s.offset == NEXT_AT && s.magic == PAD_MAGIC)
        );
    }

    #[test]
    fn shrinking_the_config_erases_the_old_tail() {
        let mut image = sample();
        image.set_config(&"#".repeat(300)).expect("grow");
        image.set_config("[all]\n").expect("shrink");
        assert_eq!(image.config().expect("config"), "[all]\n");
        let tail = &image.bytes()[CONFIG_AT + FILE_HEADER + 6..CONFIG_AT + FILE_HEADER + 300];
        assert!(!tail.contains(&b'#'), "old config bytes left behind");
    }

    #[test]
    fn refuses_oversized_configs_and_foreign_files() {
        let mut image = sample();
        assert!(image.set_config(&"x".repeat(MAX_CONFIG_LEN + 1)).is_err());
        assert!(Image::parse(vec![0u8; 1000]).is_err());
        let mut corrupt = sample().bytes().to_vec();
        corrupt[CONFIG_AT..CONFIG_AT + 4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        assert!(Image::parse(corrupt).is_err());
        let mut overlong = sample().bytes().to_vec();
        overlong[CONFIG_AT + 4..CONFIG_AT + 8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Image::parse(overlong).is_err());
    }

    #[test]
    fn update_time_goes_into_the_updatetime_file() {
        let mut image = sample();
        image.set_update_time(0x6000_0000);
        let section = &image.sections[image.find_file("updatetime", false).expect("file")];
        let content = image.content(section);
        assert_eq!(&content[4..8], &0x6000_0000u32.to_le_bytes());
        assert_eq!(&content[..4], &(!0x6000_0000u32).to_le_bytes());
    }

    #[test]
    fn signature_names_the_sha256_of_the_image() {
        let image = sample();
        let sig = image.signature_file(1_700_000_000);
        let mut lines = sig.lines();
        let hash = lines.next().expect("hash line");
        assert_eq!(hash.len(), 64);
        assert_eq!(hash, hash.to_lowercase());
        assert_eq!(lines.next(), Some("ts: 1700000000"));
        let digest = Sha256::digest(image.bytes());
        assert_eq!(
            hash,
            digest
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
    }
}
