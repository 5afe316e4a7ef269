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
