//! The Debian mirror: `APPLIANCE_DEBIAN_MIRROR`, else the first Debian archive the host's own
//! apt sources name (one-line `deb` entries or deb822 `URIs:`), so no mirror is written into
//! the project.

use std::path::Path;

/// The mirror URI, without a trailing slash.
pub fn mirror() -> Result<String, String> {
    if let Ok(m) = std::env::var("APPLIANCE_DEBIAN_MIRROR")
        && !m.trim().is_empty()
    {
        return Ok(m.trim().trim_end_matches('/').to_string());
    }
    let mut texts = Vec::new();
    for file in ["/etc/apt/sources.list"] {
        if let Ok(text) = std::fs::read_to_string(file) {
            texts.push(text);
        }
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            if has_extension(&path, &["list", "sources"])
                && let Ok(text) = std::fs::read_to_string(&path)
            {
                texts.push(text);
            }
        }
    }
    texts.iter().find_map(|t| from_sources(t)).ok_or_else(|| {
        "no Debian mirror in the host's apt sources; set APPLIANCE_DEBIAN_MIRROR".to_string()
    })
}

fn has_extension(path: &Path, wanted: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| wanted.contains(&e))
}

/// The first archive URI (not the security archive) in apt sources text.
pub fn from_sources(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.trim();
        let uri = if let Some(rest) = line.strip_prefix("deb ") {
            // `deb [options] URI suite components`
            let rest = match rest.trim_start().strip_prefix('[') {
                Some(options) => options.split_once(']')?.1,
                None => rest,
            };
            rest.split_whitespace().next()?
        } else {
            line.strip_prefix("URIs:")?.split_whitespace().next()?
        };
        let archive = (uri.starts_with("http://") || uri.starts_with("https://"))
            && uri.trim_end_matches('/').ends_with("/debian");
        archive.then(|| uri.trim_end_matches('/').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::from_sources;

    #[test]
    fn the_archive_is_found_in_both_formats_and_others_are_skipped() {
        let one_line = "# comment\ndeb [arch=amd64] http://example.org/other stable main\n\
                        deb http://mirror.example/debian bookworm main\n";
        assert_eq!(
            from_sources(one_line).as_deref(),
            Some("http://mirror.example/debian")
        );
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian-security\n\n\
                      Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n";
        assert_eq!(
            from_sources(deb822).as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            from_sources("deb https://example.org/apt stable main\n"),
            None
        );
    }
}
