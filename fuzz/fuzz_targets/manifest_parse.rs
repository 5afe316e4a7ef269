//! Any text: a manifest parses into a checked manifest or an error, never a panic; a parsed
//! manifest writes back to text that parses to the same manifest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weights::Manifest;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(manifest) = Manifest::parse(text, "fuzz") else {
        return;
    };
    let written = manifest.to_toml().expect("a checked manifest writes");
    assert_eq!(
        Manifest::parse(&written, "fuzz").expect("it parses again"),
        manifest
    );
});
