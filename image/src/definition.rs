//! The image definition (`image/appliance-rpi5.toml`): typed, unknown keys refused, every
//! value checked before anything runs.

use std::path::Path;

use serde::Deserialize;

/// What goes on the card.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    /// Image name: `out/<name>.img`.
    pub name: String,
    /// The root filesystem's packages.
    pub rootfs: Rootfs,
    /// The cross-compiling build chroot.
    pub builder: Builder,
    /// Partition sizes.
    pub layout: Layout,
    /// What is copied from the repository.
    pub overlays: Overlays,
}

/// The arm64 root filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rootfs {
    /// Debian suite.
    pub suite: String,
    /// The kernel package, optionally `package/suite`.
    pub kernel: String,
    /// Archive components the packages come from (`main`, `non-free-firmware` for device
    /// firmware). Default `["main"]`.
    #[serde(default = "main_only")]
    pub components: Vec<String>,
    /// Further packages.
    pub packages: Vec<String>,
    /// Device-tree blobs for the boot partition, from the kernel package.
    pub device_trees: Vec<String>,
}

fn main_only() -> Vec<String> {
    vec!["main".to_string()]
}

/// The build chroot.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Builder {
    /// Debian suite.
    pub suite: String,
    /// rustc and cargo from `<suite>-backports`.
    pub rust_from_backports: bool,
    /// Further packages (cross linker, ...).
    pub packages: Vec<String>,
    /// Rust target triple.
    pub target: String,
    /// `-C target-cpu`.
    pub target_cpu: String,
}

/// Partition sizes in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    /// FAT32 boot partition.
    pub boot_mib: u64,
    /// Each of root A and root B.
    pub root_mib: u64,
    /// Data partition as built (it grows on first boot).
    pub data_mib: u64,
    /// MBR disk identifier (the `PARTUUID` prefix).
    pub disk_id: u32,
}

/// Repository folders copied onto the card.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlays {
    /// Root filesystem overlays, in order.
    pub rootfs: Vec<String>,
    /// systemd units.
    pub units: String,
    /// Units enabled for multi-user.target.
    pub enable: Vec<String>,
    /// config.txt fragments.
    pub config_txt: String,
    /// Boot partition files.
    pub boot: String,
}

impl Definition {
    /// Reads and checks a definition file.
    pub fn load(path: &Path) -> Result<Definition, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the image definition {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("invalid image definition {}: {e}", path.display()))
    }

    /// Parses and checks definition text.
    pub fn parse(text: &str) -> Result<Definition, String> {
        let definition: Definition = toml::from_str(text).map_err(|e| e.to_string())?;
        definition.check()?;
        Ok(definition)
    }

    fn check(&self) -> Result<(), String> {
        let word = |what: &str, value: &str| {
            let ok = !value.is_empty()
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{what} \"{value}\": use letters, digits, '-', '_' and '.' only"
                ))
            }
        };
        word("name", &self.name)?;
        word("rootfs.suite", &self.rootfs.suite)?;
        word("builder.suite", &self.builder.suite)?;
        word("builder.target", &self.builder.target)?;
        word("builder.target_cpu", &self.builder.target_cpu)?;
        let packages = std::iter::once(&self.rootfs.kernel)
            .chain(&self.rootfs.packages)
            .chain(&self.builder.packages);
        for package in packages {
            // Debian package names, optionally with `/suite` or `:arch`.
            let ok = package
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
                && package
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.:/".contains(c));
            if !ok {
                return Err(format!(
                    "package \"{package}\" is not a Debian package name"
                ));
            }
        }
        if self.rootfs.components.is_empty() {
            return Err("rootfs.components is empty: list at least \"main\"".into());
        }
        for component in &self.rootfs.components {
            word("rootfs.components entry", component)?;
        }
        for dtb in &self.rootfs.device_trees {
            word("rootfs.device_trees entry", dtb)?;
        }
        for unit in &self.overlays.enable {
            word("overlays.enable entry", unit)?;
        }
        let l = &self.layout;
        for (what, mib, least) in [
            ("layout.boot_mib", l.boot_mib, 64),
            ("layout.root_mib", l.root_mib, 256),
            ("layout.data_mib", l.data_mib, 64),
        ] {
            if !(least..=1 << 20).contains(&mib) {
                return Err(format!(
                    "{what} = {mib}: allowed is {least} to {} MiB",
                    1u64 << 20
                ));
            }
        }
        for dir in self.overlays.rootfs.iter().chain([
            &self.overlays.units,
            &self.overlays.config_txt,
            &self.overlays.boot,
        ]) {
            let relative = Path::new(dir);
            if relative.is_absolute() || relative.components().any(|c| c.as_os_str() == "..") {
                return Err(format!(
                    "overlay folder \"{dir}\": give a path inside the repository"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Definition;

    const SHIPPED: &str = include_str!("../appliance-rpi5.toml");

    #[test]
    fn the_shipped_definition_is_valid() {
        let d = Definition::parse(SHIPPED).expect("valid");
        assert_eq!(d.name, "appliance-rpi5");
        assert!(
            d.rootfs.kernel.ends_with("-backports"),
            "the Pi 5 needs the RP1 drivers"
        );
    }

    #[test]
    fn bad_definitions_are_refused_with_the_key() {
        let cases = [
            ("name = \"x\"", "missing"),
            (
                &SHIPPED.replace("boot_mib = 256", "boot_mib = 8"),
                "layout.boot_mib",
            ),
            (
                &SHIPPED.replace("\"dbus\"", "\"dbus; rm -rf /\""),
                "not a Debian package",
            ),
            (
                &SHIPPED.replace("suite = \"trixie\"", "suite = \"../x\""),
                "rootfs.suite",
            ),
            (
                &SHIPPED.replace("units = \"systemd\"", "units = \"/etc\""),
                "inside the repository",
            ),
            (
                &SHIPPED.replace("[layout]", "[layout]\nextra = 1"),
                "unknown field",
            ),
        ];
        for (text, wanted) in cases {
            let err = Definition::parse(text).expect_err(wanted);
            assert!(err.contains(wanted), "{err} should mention {wanted}");
        }
    }
}
