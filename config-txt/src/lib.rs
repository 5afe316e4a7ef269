//! `config.txt` from `config.txt.d/*.txt`.
//!
//! The firmware reads one file and has no directory include, so the fragments are concatenated
//! in file-name order, each under a comment naming it. The image build writes the first
//! `config.txt` this way and the supervisor regenerates it the same way when it promotes a
//! fragment (an overclock that passed its trial), so the two can never disagree about what the
//! file should hold. `include` is refused: the bootloader stage does not follow it.
//!
//! [`setting`] reads the firmware's text format (`key=value` lines under `[filter]` sections),
//! which the bootloader's `bootconf.txt` shares, so the supervisor reads both through it.

use std::path::Path;

/// The folder of fragments, beside `config.txt` on the boot partition and in the repository.
pub const FRAGMENT_DIR: &str = "config.txt.d";

/// One fragment: its file name (which orders it) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    /// File name, e.g. `10-boot.txt`.
    pub name: String,
    /// The lines it contributes.
    pub text: String,
}

/// Whether a file name in the fragment folder is a fragment.
pub fn is_fragment_name(name: &str) -> bool {
    name.ends_with(".txt") && !name.starts_with('.')
}

/// The assembled `config.txt` for `fragments` (in any order; they are sorted by name).
/// `origin` names where they came from in error messages.
pub fn assemble(fragments: &[Fragment], origin: &str) -> Result<String, String> {
    if fragments.is_empty() {
        return Err(format!(
            "no config.txt fragments (*.txt) in {origin}: the firmware needs at least one"
        ));
    }
    let mut sorted: Vec<&Fragment> = fragments.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::from("# Assembled from config.txt.d/; do not edit here.\n");
    for fragment in sorted {
        if let Some(line) = fragment
            .text
            .lines()
            .position(|l| l.trim_start().starts_with("include"))
        {
            return Err(format!(
                "{origin}/{}:{}: `include` is not allowed in a fragment; add another fragment instead",
                fragment.name,
                line + 1
            ));
        }
        out.push_str(&format!("\n# --- {} ---\n", fragment.name));
        out.push_str(fragment.text.trim_end());
        out.push('\n');
    }
    Ok(out)
}

/// The fragments in a folder on the build host.
pub fn read_dir(dir: &Path) -> Result<Vec<Fragment>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "cannot list the config.txt fragments in {}: {e}",
            dir.display()
        )
    })?;
    let mut fragments = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_fragment_name(&name) {
            let path = dir.join(&name);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            fragments.push(Fragment { name, text });
        }
    }
    Ok(fragments)
}

/// The last value `key` is given in `text` outside any conditional section other than `[all]`
/// (what the firmware applies on every boot), e.g. `arm_freq`.
pub fn setting<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut applies = true;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(section) = section_name(line) {
            applies = section.eq_ignore_ascii_case("all");
            continue;
        }
        if !applies {
            continue;
        }
        if let Some((name, value)) = line.split_once('=')
            && name.trim() == key
        {
            found = Some(value.trim());
        }
    }
    found
}

/// The name of a `[section]` line (a conditional filter, or `all`), trimmed.
pub fn section_name(line: &str) -> Option<&str> {
    line.strip_prefix('[')?.strip_suffix(']').map(str::trim)
}

/// Every value `key` is given anywhere in `text`, whatever conditional section it is in.
pub fn values<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|line| line.trim().split_once('='))
        .filter(|(name, _)| name.trim() == key)
        .map(|(_, value)| value.trim())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(name: &str, text: &str) -> Fragment {
        Fragment {
            name: name.into(),
            text: text.into(),
        }
    }

    #[test]
    fn fragments_are_joined_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("20-b.txt"), "arm_boost=1\n").expect("write");
        std::fs::write(dir.path().join("10-a.txt"), "[all]\nkernel=vmlinuz").expect("write");
        std::fs::write(dir.path().join("README.md"), "not a fragment").expect("write");
        let fragments = read_dir(dir.path()).expect("read");
        let text = assemble(&fragments, "x").expect("assembled");
        let a = text.find("kernel=vmlinuz").expect("a");
        let b = text.find("arm_boost=1").expect("b");
        assert!(a < b, "{text}");
        assert!(!text.contains("not a fragment"));
        assert!(text.contains("# --- 10-a.txt ---"));
    }

    #[test]
    fn the_shipped_fragments_boot_our_kernel() {
        let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config.txt.d"));
        let text = assemble(&read_dir(dir).expect("read"), "config.txt.d").expect("assembled");
        assert!(text.contains("kernel=vmlinuz"), "{text}");
        assert!(text.contains("initramfs initrd.img followkernel"), "{text}");
    }

    #[test]
    fn nothing_or_an_include_is_refused() {
        assert!(assemble(&[], "boot").is_err());
        let err =
            assemble(&[fragment("10.txt", "include extra.txt\n")], "boot").expect_err("include");
        assert!(err.contains("boot/10.txt:1"), "{err}");
    }

    #[test]
    fn settings_are_read_as_the_firmware_applies_them() {
        let text = "[all]\narm_freq=2600\n[pi4]\narm_freq=2000\n[all]\n# c\narm_freq = 2800\n[tryboot]\narm_freq=9\n";
        assert_eq!(setting(text, "arm_freq"), Some("2800"));
        assert_eq!(setting(text, "over_voltage_delta"), None);
        assert_eq!(values(text, "arm_freq"), ["2600", "2000", "2800", "9"]);
    }
}
