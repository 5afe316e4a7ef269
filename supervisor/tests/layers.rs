//! The library sits below the binary: the command line (`src/main.rs`, `src/cli/`) prints and
//! picks exit statuses; no other module of `src/` does either, or names the command line. (The
//! library cannot import the binary's modules; this keeps the CLI's work from creeping back in.)

use std::path::{Path, PathBuf};

/// What only the command line may write.
const CLI_ONLY: &[&str] = &[
    "print!(",
    "println!(",
    "eprint!(",
    "eprintln!(",
    "ExitCode",
    "process::exit",
    "mod cli",
    "cli::",
    "commands::",
];

fn library_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "cli") {
                library_sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "main.rs")
        {
            out.push(path);
        }
    }
}

#[test]
fn no_library_module_prints_exits_or_reaches_the_command_line() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    library_sources(&src, &mut files);
    assert!(files.iter().any(|f| f.ends_with("lib.rs")), "{files:?}");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file is readable");
        for (n, line) in text.lines().enumerate() {
            for word in CLI_ONLY {
                if line.contains(word) {
                    found.push(format!("{}:{}: {word}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "only src/main.rs and src/cli/ print, exit or call the CLI:\n{}",
        found.join("\n")
    );
}
