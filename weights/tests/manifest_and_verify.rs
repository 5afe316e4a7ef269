//! Manifests are checked whole, and files are verified against them chunk by chunk.

mod common;

use common::*;
use weights::verify::{verify_bytes, verify_file};
use weights::{ErrorKind, Manifest};

#[test]
fn a_manifest_round_trips_and_matches_sha256sum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = gguf_file(100_000);
    let path = write(dir.path(), "model.gguf", &bytes);
    let manifest = manifest_for(&bytes, "");
    let sum = std::process::Command::new("sha256sum")
        .arg(&path)
        .output()
        .expect("sha256sum");
    assert_eq!(
        String::from_utf8_lossy(&sum.stdout)
            .split_whitespace()
            .next(),
        Some(manifest.sha256.as_str())
    );
    assert_eq!(
        manifest.chunks.len() as u64,
        bytes.len().div_ceil(CHUNK as usize) as u64
    );
    let text = manifest.to_toml().expect("toml");
    assert_eq!(Manifest::parse(&text, "m").expect("parse"), manifest);
    verify_file(&path, &manifest).expect("matches");
}

#[test]
fn the_first_bad_chunk_is_named_with_its_byte_range() {
    let bytes = gguf_file(100_000);
    let manifest = manifest_for(&bytes, "");
    let mut corrupt = bytes.clone();
    let at = 3 * CHUNK as usize + 17;
    corrupt[at] ^= 0x40;
    corrupt[bytes.len() - 1] ^= 1;
    let err = verify_bytes(&corrupt, &manifest).expect_err("corrupt");
    assert_eq!(err.kind, ErrorKind::Mismatch);
    assert_eq!(err.bad_chunk, Some((3, 3 * CHUNK, 4 * CHUNK)));
    assert!(
        err.message
            .contains(&format!("bytes {}..{}", 3 * CHUNK, 4 * CHUNK)),
        "{err}"
    );
}

#[test]
fn wrong_sizes_say_what_they_probably_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bytes = gguf_file(100_000);
    let manifest = manifest_for(&bytes, "");
    let truncated = write(dir.path(), "short.gguf", &bytes[..bytes.len() / 2]);
    let err = verify_file(&truncated, &manifest).expect_err("short");
    assert!(err.message.contains("truncated"), "{err}");
    let patched = manifest_for(&bytes, EOT_PATCH);
    let source = write(dir.path(), "source.gguf", &bytes);
    let err = verify_file(&source, &patched).expect_err("unpatched");
    assert!(err.message.contains("unpatched source"), "{err}");
    let err = verify_file(&dir.path().join("absent.gguf"), &manifest).expect_err("absent");
    assert_eq!(err.kind, ErrorKind::Io);
}

#[test]
fn malformed_manifests_are_refused_with_the_field() {
    let bytes = gguf_file(1000);
    let good = manifest_for(&bytes, EOT_PATCH).to_toml().expect("toml");
    let cases = [
        (
            good.replacen("id = ", "colour = \"red\"\nid = ", 1),
            "colour",
        ),
        (
            good.replacen("chunk_size = 65536", "chunk_size = 12", 1),
            "chunk_size",
        ),
        (
            good.replacen("id = \"test-model\"", "id = \"../etc\"", 1),
            "id",
        ),
        (
            good.replacen("file = \"model.gguf\"", "file = \"a/b.gguf\"", 1),
            "file",
        ),
        (
            good.replacen(
                "kind = \"gguf-metadata\"",
                "kind = \"gguf-metadata\"\nsneaky = 1",
                1,
            ),
            "sneaky",
        ),
        (good.replacen("threads = 2", "threads = 0", 1), "threads"),
    ];
    for (text, field) in cases {
        let err = Manifest::parse(&text, "m.toml").expect_err(field);
        assert_eq!(err.kind, ErrorKind::BadManifest);
        assert!(
            err.message.contains(field) && err.message.contains("m.toml"),
            "{field}: {err}"
        );
    }
    // A patch chain that does not connect is refused before any byte is read.
    let mut broken = manifest_for(&bytes, EOT_PATCH);
    broken.patches[0].set_hashes("ab".repeat(32), broken.sha256.clone());
    assert!(
        broken
            .check()
            .expect_err("chain")
            .message
            .contains("input_sha256")
    );
    let mut lying = manifest_for(&bytes, "");
    lying.chunks.pop();
    assert!(lying.check().is_err());
}

/// Deterministic mutation fuzzing of the manifest parser: no input panics.
#[test]
fn fuzz_manifest_parser_never_panics() {
    let seed = manifest_for(&gguf_file(50_000), EOT_PATCH)
        .to_toml()
        .expect("toml")
        .into_bytes();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet = b"=[]{}\"'#\n 0123456789abcdefxyz-_.,";
    for _ in 0..5_000 {
        let mut text = seed.clone();
        for _ in 0..(next() % 6 + 1) {
            let at = (next() as usize) % text.len();
            match next() % 3 {
                0 => text[at] = alphabet[(next() as usize) % alphabet.len()],
                1 => {
                    text.remove(at);
                }
                _ => text.insert(at, alphabet[(next() as usize) % alphabet.len()]),
            }
        }
        if let Ok(s) = String::from_utf8(text) {
            let _ = Manifest::parse(&s, "fuzz");
        }
    }
}

/// A model with a draft head: the manifest names both files, round-trips, and checks the head
/// chunk by chunk; a head named like the weights, or with a chunk missing, is refused.
#[test]
fn a_draft_head_is_part_of_the_manifest_and_verified_with_it() {
    use weights::manifest::Template;
    let dir = tempfile::tempdir().expect("tempdir");
    let weights_bytes = vec![7u8; 200_000];
    let head_bytes: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
    let manifest = Template::default()
        .build_with_draft(
            &weights_bytes,
            "model.gguf",
            65_536,
            Some((&head_bytes, "head.gguf")),
        )
        .expect("manifest");
    let draft = manifest.draft.clone().expect("a draft part");
    assert_eq!((draft.file.as_str(), draft.size), ("head.gguf", 150_000));
    assert_eq!(draft.chunks.len(), 3);
    let text = manifest.to_toml().expect("toml");
    assert_eq!(Manifest::parse(&text, "test").expect("parses"), manifest);
    let head = write(dir.path(), "head.gguf", &head_bytes);
    weights::verify::verify_draft(&head, &manifest).expect("the head verifies");
    let mut changed = head_bytes.clone();
    changed[140_000] ^= 1;
    let bad = write(dir.path(), "bad.gguf", &changed);
    let e = weights::verify::verify_draft(&bad, &manifest).expect_err("a changed head");
    assert_eq!(e.kind, ErrorKind::Mismatch);
    assert!(e.message.contains("draft head chunk 2"), "{e}");
    let same_name = text.replace("file = \"head.gguf\"", "file = \"model.gguf\"");
    let e = Manifest::parse(&same_name, "test").expect_err("two files of one name");
    assert!(e.message.contains("draft.file"), "{e}");
    let short = text.replacen(&format!("\"{}\",\n", draft.chunks[2]), "", 1);
    assert_ne!(short, text);
    let e = Manifest::parse(&short, "test").expect_err("a chunk missing");
    assert!(e.message.contains("draft.chunk"), "{e}");
}
