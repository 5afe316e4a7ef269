//! The library sits below the binary: the command line (`src/main.rs`, `src/cli/`) prints and
//! picks exit statuses; no other module of `src/` does either, or names the command line. (The
//! library cannot import the binary's modules; this keeps the CLI's work from creeping back in.)
//! And the library's modules import each other one way: no circle of more than two.

use std::collections::{BTreeMap, BTreeSet};
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

/// The library's top-level module a source file belongs to (`src/tune/cgroup.rs`: `tune`).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src/");
    let first = relative.components().next().expect("a path in src/");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// Which top-level modules each one names as `crate::<module>`, outside its tests.
fn module_imports(src: &Path, files: &[PathBuf]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = module_of(src, file);
        let text = std::fs::read_to_string(file).expect("a source file is readable");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let names = graph.entry(module.clone()).or_default();
        for piece in code.split("crate::").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != module {
                names.insert(name);
            }
        }
    }
    graph
}

/// The modules that reach each other (strongly connected), largest first.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (m, from_m) in &reached {
        let circle: BTreeSet<String> = from_m
            .iter()
            .filter(|other| reached.get(other).is_some_and(|back| back.contains(*m)))
            .cloned()
            .collect();
        if circle.len() > 1 && !found.contains(&circle) {
            found.push(circle);
        }
    }
    found.sort_by_key(|c| std::cmp::Reverse(c.len()));
    found
}

#[test]
fn the_library_modules_import_each_other_one_way() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    library_sources(&src, &mut files);
    let graph = module_imports(&src, &files);
    assert!(
        graph["daemon"].contains("tune"),
        "the scan reads imports: {graph:?}"
    );
    let too_large: Vec<_> = circles(&graph)
        .into_iter()
        .filter(|c| c.len() > 2)
        .collect();
    assert!(
        too_large.is_empty(),
        "modules that import each other in a circle of more than two (move what both need \
         into the lower one): {too_large:?}"
    );
}
