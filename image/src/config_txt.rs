//! `config.txt` from `config.txt.d/*.txt`: the firmware reads one file and has no directory
//! include, so the fragments are concatenated in file-name order, each under a comment naming
//! it. This assembly is the only writer of `config.txt`.

use std::path::Path;

/// The assembled `config.txt` for the fragments in `dir`.
pub fn assemble(dir: &Path) -> Result<String, String> {
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
        if name.ends_with(".txt") {
            fragments.push(name);
        }
    }
    fragments.sort();
    if fragments.is_empty() {
        return Err(format!(
            "no config.txt fragments (*.txt) in {}: the firmware needs at least one",
            dir.display()
        ));
    }
    let mut out =
        String::from("# Assembled from config.txt.d/ at image build; do not edit here.\n");
    for name in fragments {
        let path = dir.join(&name);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if let Some(line) = text
            .lines()
            .position(|l| l.trim_start().starts_with("include"))
        {
            return Err(format!(
                "{}:{}: `include` is not allowed in a fragment; add another fragment instead",
                path.display(),
                line + 1
            ));
        }
        out.push_str(&format!("\n# --- {name} ---\n"));
        out.push_str(text.trim_end());
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::assemble;

    #[test]
    fn fragments_are_joined_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("20-b.txt"), "arm_boost=1\n").expect("write");
        std::fs::write(dir.path().join("10-a.txt"), "[all]\nkernel=vmlinuz").expect("write");
        std::fs::write(dir.path().join("README.md"), "not a fragment").expect("write");
        let text = assemble(dir.path()).expect("assembled");
        let a = text.find("kernel=vmlinuz").expect("a");
        let b = text.find("arm_boost=1").expect("b");
        assert!(a < b, "{text}");
        assert!(!text.contains("not a fragment"));
        assert!(text.contains("# --- 10-a.txt ---"));
    }

    #[test]
    fn the_shipped_fragments_boot_our_kernel() {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config.txt.d"));
        let text = assemble(dir).expect("assembled");
        assert!(text.contains("kernel=vmlinuz"), "{text}");
        assert!(text.contains("initramfs initrd.img followkernel"), "{text}");
    }

    #[test]
    fn an_empty_folder_or_an_include_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(assemble(dir.path()).is_err());
        std::fs::write(dir.path().join("10.txt"), "include extra.txt\n").expect("write");
        let err = assemble(dir.path()).expect_err("include");
        assert!(err.contains("10.txt:1"), "{err}");
    }
}
