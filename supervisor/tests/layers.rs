//! The libraries sit below the binary: the command line (`supervisor/src/main.rs`, `src/cli/`)
//! prints and picks exit statuses; no module of `supervisor-core` or `dashboard` does either, or
//! names the command line. (Cargo already keeps a library from importing the binary's modules;
//! this keeps the CLI's work from creeping back in.) And each library's modules import each other
//! one way: no circle of more than two.

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

/// The source folders of the supervisor's libraries.
fn library_roots() -> [PathBuf; 2] {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    [
        workspace.join("supervisor-core/src"),
        workspace.join("dashboard/src"),
    ]
}

fn library_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            library_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_library_module_prints_exits_or_reaches_the_command_line() {
    let mut files = Vec::new();
    for root in library_roots() {
        library_sources(&root, &mut files);
    }
    assert!(
        files.iter().filter(|f| f.ends_with("lib.rs")).count() == 2,
        "{files:?}"
    );
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
        "only supervisor/src/main.rs and src/cli/ print, exit or call the CLI:\n{}",
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

/// The modules a path after `crate::` starts with: `tune::Step` names `tune`, and a group
/// `{a::{b, c}, d}` names `a` and `d` (not what is nested deeper).
fn top_level_names(path: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = path.strip_prefix('{') else {
        return vec![ident(path)]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect();
    };
    let (mut names, mut depth, mut item_start) = (Vec::new(), 0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                names.push(ident(&group[item_start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.push(ident(&group[item_start..i]));
                item_start = i + 1;
            }
            _ => {}
        }
    }
    names.retain(|n| !n.is_empty());
    names
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
            for name in top_level_names(piece) {
                if name != module && name != "self" {
                    names.insert(name);
                }
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
    let mut too_large = Vec::new();
    for src in library_roots() {
        let mut files = Vec::new();
        library_sources(&src, &mut files);
        let graph = module_imports(&src, &files);
        assert!(
            graph.values().any(|names| !names.is_empty()),
            "the scan reads imports: {graph:?}"
        );
        too_large.extend(circles(&graph).into_iter().filter(|c| c.len() > 2));
    }
    assert!(
        too_large.is_empty(),
        "modules that import each other in a circle of more than two (move what both need \
         into the lower one): {too_large:?}"
    );
}
