//! Reading the bootloader's state off the board: the configuration it booted with, the newest
//! bootloader image the rootfs ships, and an update already staged on the boot partition.

use super::{Board, BoardError, BoardResult, paths};
use crate::bootloader::image::Image;
use std::io;

/// File name of a staged bootloader update on the boot partition.
pub const STAGED_IMAGE: &str = "pieeprom.upd";
/// File name of a staged update's hash file.
pub const STAGED_SIGNATURE: &str = "pieeprom.sig";

fn invalid(op: &'static str, path: &str, msg: String) -> BoardError {
    BoardError {
        op,
        path: path.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidData, msg),
    }
}

impl Board {
    /// The mounted boot partition: the first candidate holding a `config.txt`.
    pub fn boot_dir(&self) -> BoardResult<&'static str> {
        paths::BOOT_PARTITION_CANDIDATES
            .into_iter()
            .find(|dir| self.path(dir).join("config.txt").is_file())
            .ok_or_else(|| BoardError {
                op: "finding",
                path: "the boot partition (/boot/firmware or /boot with config.txt)".into(),
                source: io::Error::from(io::ErrorKind::NotFound),
            })
    }

    /// The configuration the bootloader ran with, from the nvmem cell the `blconfig` alias names.
    pub fn bootloader_config(&self) -> BoardResult<String> {
        let alias = self.read_value(paths::DT_BLCONFIG_ALIAS)?;
        let node = format!("{}/{}", paths::DEVICE_TREE, alias.trim_start_matches('/'));
        let wanted = self.canonical(&node)?;
        for name in self.list(paths::NVMEM_DEVICES)? {
            let device = format!("{}/{name}", paths::NVMEM_DEVICES);
            let Ok(of_node) = self.canonical(&format!("{device}/of_node")) else {
                continue;
            };
            if of_node == wanted {
                let text = self.read(&format!("{device}/nvmem"))?;
                return Ok(text.trim_end_matches('\0').to_string());
            }
        }
        Err(BoardError {
            op: "finding",
            path: format!(
                "the nvmem device for {alias} under {}",
                paths::NVMEM_DEVICES
            ),
            source: io::Error::from(io::ErrorKind::NotFound),
        })
    }

    /// The newest shipped `pieeprom-YYYY-MM-DD.bin` of the `default` release channel: its box
    /// path and its release day (days since 1970-01-01, from the name).
    pub fn shipped_bootloader_image(&self) -> BoardResult<(String, i64)> {
        for dir in paths::BOOTLOADER_FIRMWARE_DIRS {
            let channel = format!("{dir}/default");
            let newest = self
                .list(&channel)?
                .into_iter()
                .filter_map(|n| release_day(&n).map(|day| (day, n)))
                .max();
            if let Some((day, name)) = newest {
                return Ok((format!("{channel}/{name}"), day));
            }
        }
        Err(BoardError {
            op: "finding",
            path: format!(
                "a bootloader image (pieeprom-*.bin) in {}/default",
                paths::BOOTLOADER_FIRMWARE_DIRS[0]
            ),
            source: io::Error::from(io::ErrorKind::NotFound),
        })
    }

    /// The configuration inside an update staged on the boot partition, if one is staged and its
    /// hash file matches (the bootloader ignores an update whose hash does not).
    pub fn staged_bootloader_config(&self) -> BoardResult<Option<String>> {
        let boot = self.boot_dir()?;
        let path = format!("{boot}/{STAGED_IMAGE}");
        let sig_path = format!("{boot}/{STAGED_SIGNATURE}");
        if !self.exists(&path) {
            return Ok(None);
        }
        let image = Image::parse(self.read_bytes(&path)?)
            .map_err(|e| invalid("parsing", &path, e.to_string()))?;
        let signed_hash = self.read_optional(&sig_path)?.unwrap_or_default();
        if signed_hash.lines().next().map(str::trim) != Some(image.sha256_hex().as_str()) {
            tracing::warn!(
                "{path} does not match the hash in {sig_path}; the bootloader would ignore it"
            );
            return Ok(None);
        }
        image
            .config()
            .map(Some)
            .map_err(|e| invalid("parsing", &path, e.to_string()))
    }
}

/// Seconds since the epoch for the update stamp; `SOURCE_DATE_EPOCH` pins it for reproducible runs.
fn now_unix() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        })
}

impl Board {
    fn shipped_bootloader(&self) -> BoardResult<(String, Image)> {
        let (path, _) = self.shipped_bootloader_image()?;
        let image = Image::parse(self.read_bytes(&path)?)
            .map_err(|e| invalid("parsing", &path, e.to_string()))?;
        Ok((path, image))
    }

    /// Stages a bootloader update carrying `config`, as `rpi-eeprom-config --apply` does: the
    /// newest shipped image with its `bootconf.txt` replaced, written with its hash file to the
    /// boot partition, where the bootloader flashes it at the next boot. The image is written
    /// before its hash, so a power cut in between leaves a pair the bootloader ignores.
    pub fn stage_bootloader_config(&self, config: &str) -> BoardResult<()> {
        let boot = self.boot_dir()?;
        let (path, mut image) = self.shipped_bootloader()?;
        image
            .set_config(config)
            .map_err(|e| invalid("updating the config in", &path, e.to_string()))?;
        let now = now_unix();
        image.set_update_time(u32::try_from(now).unwrap_or(u32::MAX));
        self.replace_file(&format!("{boot}/{STAGED_IMAGE}"), image.bytes())?;
        self.replace_file(
            &format!("{boot}/{STAGED_SIGNATURE}"),
            image.signature_file(now).as_bytes(),
        )?;
        // A running bootloader without self-update cannot flash itself; recovery.bin, run by
        // the boot ROM, does it instead (as rpi-eeprom-update decides).
        let running = self.bootloader_config()?;
        if crate::bootloader::conf::get(&running, "ENABLE_SELF_UPDATE") == Some("0") {
            let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or(&path);
            let recovery = self.read_bytes(&format!("{dir}/recovery.bin"))?;
            self.replace_file(&format!("{boot}/recovery.bin"), &recovery)?;
        }
        Ok(())
    }
}

/// Days since 1970-01-01 of a `pieeprom-YYYY-MM-DD.bin` file name.
fn release_day(name: &str) -> Option<i64> {
    let date = name.strip_prefix("pieeprom-")?.strip_suffix(".bin")?;
    let mut parts = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (parts.next()??, parts.next()??, parts.next()??);
    if parts.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Howard Hinnant's days-from-civil algorithm.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

#[cfg(test)]
mod tests {
    use super::release_day;

    #[test]
    fn release_days_come_from_the_file_name() {
        assert_eq!(release_day("pieeprom-1970-01-02.bin"), Some(1));
        assert_eq!(
            release_day("pieeprom-2025-05-08.bin"),
            Some(1_746_662_400 / 86_400)
        );
        assert_eq!(release_day("pieeprom-2025-13-08.bin"), None);
        assert_eq!(release_day("recovery.bin"), None);
    }
}
