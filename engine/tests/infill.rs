//! Fill-in-the-middle against `engine serve`: `/infill` as code editors' plugins send it and
//! `suffix` on `/v1/completions`, on a tiny random model carrying StarCoder's real vocabulary
//! (llama.cpp's `models/ggml-vocab-starcoder.gguf`, whose FIM tokens are `<fim_prefix>` …), and
//! refused by name on a model whose vocabulary has none (SmolLM2). How other families spell
//! their FIM tokens is the tokenizer's unit test.

mod common;

use common::serve::{events, post, request, start, start_model};
use serde_json::{Value, json};

const PREFIX: &str = "#include \"llama.h\"\n\nint main() {\n";
const TYPED: &str = "    int n_threads = llama_";
const SUFFIX: &str = "}\n";
const HEADER: &str = "LLAMA_API int32_t llama_n_threads();\n";

#[test]
fn infill_lays_out_the_gap_with_the_vocabulary_s_fim_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The tiny model's trained context.
    let server = start_model(
        &common::starcoder_vocabulary_model(dir.path()),
        &["-c", "512"],
        &[],
    );
    let asked = json!({
        "input_extra": [{ "filename": "llama.h", "text": HEADER }],
        "input_prefix": PREFIX, "prompt": TYPED, "input_suffix": SUFFIX,
        "n_predict": 6, "temperature": 0, "verbose": true,
    });
    let (status, answer) = post(&server, "/infill", &asked);
    assert_eq!(status, 200, "{answer}");
    // llama.cpp's layout for a vocabulary with no file separator: the other file after a
    // snippet line, then prefix and what is typed, suffix, and the middle the answer follows.
    let expected = format!(
        "\n\n--- snippet ---\n\n{HEADER}<fim_prefix>{PREFIX}{TYPED}<fim_suffix>{SUFFIX}<fim_middle>"
    );
    assert_eq!(answer["__verbose"]["prompt"], expected.as_str());
    // Each FIM marker is one token, not its text: the prompt is the expected text tokenized
    // with special tokens recognised, id for id in count.
    let (_, tokenized) = post(
        &server,
        "/tokenize",
        &json!({ "content": expected, "parse_special": true }),
    );
    let ids = tokenized["tokens"].as_array().expect("tokens");
    assert_eq!(answer["tokens_evaluated"], ids.len(), "{answer}");
    for marker in ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"] {
        let (_, one) = post(&server, "/tokenize", &json!({ "content": marker }));
        assert_eq!(one["tokens"].as_array().map(Vec::len), Some(1), "{marker}");
        assert!(ids.contains(&one["tokens"][0]), "{marker} in the prompt");
    }
    assert_eq!(answer["tokens_predicted"], 6, "{answer}");
    let content = answer["content"].as_str().expect("content").to_string();

    // Streamed, the same text.
    let mut streamed = asked.clone();
    streamed["stream"] = json!(true);
    let (status, body) = request(
        &server,
        "POST",
        "/infill",
        Some(&streamed.to_string()),
        None,
    )
    .expect("response");
    assert_eq!(status, 200, "{body}");
    let text: String = events(&body)
        .iter()
        .filter_map(|e| e["content"].as_str())
        .collect();
    assert_eq!(text, content);

    // `suffix` on /v1/completions: the gap between the prompt and the suffix, the same
    // prompt as /infill without files or typed text.
    let (status, completion) = post(
        &server,
        "/v1/completions",
        &json!({ "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 6, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{completion}");
    let (_, plain) = post(
        &server,
        "/infill",
        &json!({ "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                 "temperature": 0 }),
    );
    assert_eq!(completion["choices"][0]["text"], plain["content"]);
    assert_eq!(
        completion["usage"]["prompt_tokens"],
        plain["tokens_evaluated"]
    );

    // What llama.vim sends with every request: llama.cpp's sampler list with its FIM sampler
    // and a time limit, taken as advice.
    let (status, editor) = post(
        &server,
        "/infill",
        &json!({
            "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [], "prompt": "",
            "n_predict": 6, "top_k": 40, "top_p": 0.99, "stream": false,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": true,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "temperature": 0,
        }),
    );
    assert_eq!(status, 200, "{editor}");
    assert_eq!(editor["content"], plain["content"]);

    // Malformed requests are refused, naming the field.
    for (bad, named) in [
        (json!({ "input_suffix": SUFFIX }), "input_prefix"),
        (json!({ "input_prefix": PREFIX }), "input_suffix"),
        (
            json!({ "input_prefix": 1, "input_suffix": SUFFIX }),
            "input_prefix",
        ),
        (
            json!({ "input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": [1] }),
            "prompt",
        ),
        (
            json!({ "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": {} }),
            "input_extra",
        ),
        (
            json!({ "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [{}] }),
            "text",
        ),
        (
            json!({ "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [{ "filename": 1, "text": "x" }] }),
            "filename",
        ),
    ] {
        let (status, refused) = post(&server, "/infill", &bad);
        assert_eq!(status, 400, "{bad}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(named), "{bad}: {message}");
    }
}

/// StarCoder 2's convention on the same vocabulary, named by the file's keys: a repository
/// token and a file separator lay out the other files by name (the repository-level pattern).
#[test]
fn a_file_separator_names_each_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plain = std::fs::read(common::starcoder_vocabulary_model(dir.path())).expect("model");
    let header = gguf::Header::parse(&plain).expect("header");
    let named = |key: &str, id: u32| {
        gguf::rewrite::Edit::Set(
            format!("tokenizer.ggml.{key}_token_id"),
            gguf::Value::U32(id),
        )
    };
    // `<repo_name>` and `<file_sep>` in StarCoder's vocabulary.
    let edits = [named("fim_rep", 5), named("fim_sep", 6)];
    let mut file = gguf::rewrite::with_edits(&plain, &header, &edits).expect("rewrite");
    file.extend_from_slice(&plain[header.data_start..]);
    let path = dir.path().join("tiny-starcoder2-convention.gguf");
    std::fs::write(&path, file).expect("write");
    let server = start_model(&path, &["-c", "512"], &[]);
    let (status, answer) = post(
        &server,
        "/infill",
        &json!({
            "input_extra": [{ "filename": "llama.h", "text": HEADER }, { "text": "int x;\n" }],
            "input_prefix": PREFIX, "prompt": TYPED, "input_suffix": SUFFIX,
            "n_predict": 2, "temperature": 0, "verbose": true,
        }),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["__verbose"]["prompt"],
        format!(
            "<repo_name>myproject\n<file_sep>llama.h\n{HEADER}<file_sep>tmp\nint x;\n\
             <file_sep>filename\n<fim_prefix>{PREFIX}{TYPED}<fim_suffix>{SUFFIX}<fim_middle>"
        )
        .as_str()
    );
}

#[test]
fn a_vocabulary_without_fim_tokens_is_refused_by_name() {
    let server = start(&[]);
    let (status, refused) = post(
        &server,
        "/infill",
        &json!({ "input_prefix": PREFIX, "input_suffix": SUFFIX }),
    );
    assert_eq!(status, 501, "{refused}");
    assert_eq!(refused["error"]["type"], "not_supported_error");
    let (status, refused) = post(
        &server,
        "/v1/completions",
        &json!({ "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4 }),
    );
    assert_eq!(status, 400, "{refused}");
    let message: &Value = &refused["error"]["message"];
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("fill-in-the-middle")),
        "{refused}"
    );
}
