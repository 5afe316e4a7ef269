//! Byte-level BPE on SmolLM2 against llama.cpp's tokenization (`goldens/tokenizer-*.json`,
//! written by `goldens/record-tokens.py` with llama-tokenize).

mod common;

use common::{gemma3, smollm2};

use std::path::PathBuf;

use engine::model_file::ModelFile;
use engine::tokenizer::Tokenizer;

#[test]
fn smollm2_splits_digits_and_words() {
    let file = ModelFile::open(&smollm2()).expect("open");
    let tok = Tokenizer::load(&file).expect("tokenizer");
    assert_eq!(
        tok.encode("Hello world! 123", false),
        vec![19556, 905, 17, 216, 33, 34, 35]
    );
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", true);
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().expect("last"), 2);
    let text: Vec<u8> = tok
        .encode("naïve café 東京 🙂", false)
        .iter()
        .flat_map(|&id| tok.token_bytes(id))
        .collect();
    assert_eq!(String::from_utf8(text).expect("utf8"), "naïve café 東京 🙂");
}

fn tokenizes_like_llama_cpp(model: PathBuf, golden: &str) {
    let file = ModelFile::open(&model).expect("open");
    let tok = Tokenizer::load(&file).expect("tokenizer");
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens")
        .join(golden);
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden).expect("golden")).expect("json");
    for case in cases.as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let special = case["special"].as_bool().expect("special");
        let expected: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        assert_eq!(
            tok.encode(text, special),
            expected,
            "{text:?} (special: {special})"
        );
    }
}

#[test]
fn smollm2_tokenizes_like_llama_cpp() {
    tokenizes_like_llama_cpp(smollm2(), "smollm2-tokenizer.json");
}

#[test]
fn gemma3_tokenizes_like_llama_cpp() {
    tokenizes_like_llama_cpp(gemma3(), "gemma3-tokenizer.json");
}

/// Qwen 3.5's byte-level BPE (Qwen 2's pre-tokenizer with combining marks kept in words,
/// 248k tokens) against llama.cpp's own cases for its vocabulary
/// (`models/ggml-vocab-qwen35.gguf` with `.inp`/`.out`), and every case's text given back by
/// decoding.
#[test]
fn qwen35_tokenizes_llama_cpp_s_own_cases() {
    let vocab = common::llama_cpp_file("models/ggml-vocab-qwen35.gguf");
    let inputs =
        std::fs::read_to_string(common::llama_cpp_file("models/ggml-vocab-qwen35.gguf.inp"))
            .expect("inputs");
    let outputs =
        std::fs::read_to_string(common::llama_cpp_file("models/ggml-vocab-qwen35.gguf.out"))
            .expect("outputs");
    let file = ModelFile::open(&vocab).expect("open");
    let tok = Tokenizer::load(&file).expect("tokenizer");
    let cases: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let expected: Vec<&str> = outputs.lines().collect();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for (text, ids) in cases.iter().zip(&expected) {
        let want: Vec<u32> = ids
            .split_whitespace()
            .map(|n| n.parse().expect("id"))
            .collect();
        let got = tok.encode(text, false);
        assert_eq!(got, want, "{text:?}");
        assert_eq!(tok.decode(&got), *text, "{text:?} decoded");
    }
    // Combining marks stay in their word (which llama.cpp's cases do not show): Thai's and
    // Devanagari's vowel signs, a combining acute; ids from llama-tokenize 11434 on this vocab.
    let marks = "แก้ปัญหา नमस्ते, Cafe\u{301} über";
    assert_eq!(
        tok.encode(marks, false),
        [
            143828, 14925, 101, 87244, 78368, 30484, 97, 34370, 11, 42773, 53839, 13785
        ]
    );
}

/// Gemma 4's BPE (raw UTF-8, `▁` for spaces, runs of newlines apart) against llama.cpp's own
/// cases for its vocabulary (`models/ggml-vocab-gemma-4.gguf` with `.inp`/`.out`, tokenized
/// without special tokens), and every case's text given back by decoding.
#[test]
fn gemma4_tokenizes_llama_cpp_s_own_cases() {
    let vocab = common::llama_cpp_file("models/ggml-vocab-gemma-4.gguf");
    let inputs =
        std::fs::read_to_string(common::llama_cpp_file("models/ggml-vocab-gemma-4.gguf.inp"))
            .expect("inputs");
    let outputs =
        std::fs::read_to_string(common::llama_cpp_file("models/ggml-vocab-gemma-4.gguf.out"))
            .expect("outputs");
    let file = ModelFile::open(&vocab).expect("open");
    let tok = Tokenizer::load(&file).expect("tokenizer");
    let bos = tok.bos_id().expect("Gemma 4 adds BOS");
    let cases: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let expected: Vec<&str> = outputs.lines().collect();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let mut checked = 0;
    for (text, ids) in cases.iter().zip(&expected) {
        let want: Vec<u32> = ids
            .split_whitespace()
            .map(|n| n.parse().expect("id"))
            .collect();
        let mut got = tok.encode(text, false);
        assert_eq!(got.first(), Some(&bos), "{text:?}");
        got.remove(0);
        assert_eq!(got, want, "{text:?}");
        assert_eq!(tok.decode(&got), *text, "{text:?} decoded");
        checked += 1;
    }
    assert_eq!(checked, cases.len().min(expected.len()));
}
