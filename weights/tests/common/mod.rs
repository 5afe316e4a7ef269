//! Shared test helpers: small model files and their manifests, made with the product's own
//! manifest builder (whose hashes the tests check independently with sha256sum where it matters).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use weights::Manifest;
use weights::install::Approval;
use weights::manifest::{EngineSettings, Template};
use weights::sign::{Signed, Trust};

pub const CHUNK: u64 = 64 * 1024;

/// A GGUF model-like file of about `tensor_floats` × 4 bytes of tensor data.
pub fn gguf_file(tensor_floats: usize) -> Vec<u8> {
    let values: Vec<f32> = (0..tensor_floats).map(|i| i as f32 * 0.25).collect();
    gguf::testfile::Builder::new()
        .string("general.architecture", "llama")
        .u32("tokenizer.ggml.eos_token_id", 2)
        .strings("tokenizer.ggml.tokens", &["<s>", "</s>", "<eot>", "hi"])
        .f32_tensor("token_embd.weight", &values)
        .build()
}

pub fn template(patches: &str) -> Template {
    let text = format!(
        "id = \"test-model\"\nname = \"Test\"\nfile = \"model.gguf\"\n[engine]\nthreads = 2\ncontext = 512\n{patches}"
    );
    toml::from_str(&text).expect("template")
}

pub fn manifest_for(bytes: &[u8], patches: &str) -> Manifest {
    template(patches)
        .build(bytes, "model.gguf", CHUNK)
        .expect("manifest")
}

pub fn approval(manifest: &Manifest) -> Approval {
    Approval {
        text: manifest.to_toml().expect("toml"),
        manifest: manifest.clone(),
        signature: None,
        signed: Signed::Unsigned,
    }
}

pub fn open_trust() -> Trust {
    Trust::new(&[], false).expect("trust")
}

pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

pub fn engine() -> EngineSettings {
    EngineSettings {
        threads: 2,
        context: 512,
        temperature: None,
        top_p: None,
        top_k: None,
        min_p: None,
    }
}

pub const EOT_PATCH: &str = r#"
[[patches]]
kind = "gguf-metadata"
why = "test"
edits = [
    { op = "set", key = "tokenizer.ggml.eot_token_id", type = "u32", value = 2 },
    { op = "replace", key = "tokenizer.ggml.eos_token_id", type = "u32", value = 1 },
    { op = "set", key = "tokenizer.chat_template", type = "string", value = "{{ messages }}" },
]
"#;

/// Every file under `dir`, relative, sorted.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).expect("prefix").display().to_string());
            if p.is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A model installed into a fresh data directory.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub data: PathBuf,
    pub manifest: Manifest,
    pub installed: weights::install::Installed,
}

/// Installs an unpatched test model of `floats` tensor values.
pub fn fixture(floats: usize) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bytes = gguf_file(floats);
    let manifest = manifest_for(&bytes, "");
    let installed =
        weights::install::install(&write(dir.path(), "m", &bytes), &approval(&manifest), &data)
            .expect("install");
    Fixture {
        dir,
        data,
        manifest,
        installed,
    }
}
