//! Reasoning control end to end on the real SmolLM2 with Qwen 3.5's template (llama.cpp's
//! `models/templates/Qwen3.5-4B.jinja`, whose generation cue opens the thinking block when
//! thinking is on): `--reasoning`, `enable_thinking` per request, `reasoning_format` and
//! `--reasoning-budget` (SmolLM2 never closes the block itself: only the budget does).

mod common;

use common::serve::{Server, chat, events, post, request, start};
use serde_json::{Value, json};

fn qwen35_server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("qwen3.5.jinja");
    let text = std::fs::read_to_string(common::llama_cpp_file("models/templates/Qwen3.5-4B.jinja"))
        .expect("template");
    std::fs::write(&path, text).expect("write the template");
    let mut args = vec!["--chat-template-file", path.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    let server = start(&args);
    (dir, server)
}

fn message(answer: &Value) -> &Value {
    &answer["choices"][0]["message"]
}

/// The streamed answer's reasoning and content, each joined.
fn streamed(server: &Server, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, text) = request(
        server,
        "POST",
        "/v1/chat/completions",
        Some(&body.to_string()),
        None,
    )
    .expect("response");
    assert_eq!(status, 200, "{text}");
    let (mut reasoning, mut content) = (String::new(), String::new());
    for event in events(&text) {
        let delta = &event["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    (reasoning, content)
}

#[test]
fn a_thinking_budget_closes_the_block_and_the_answer_follows() {
    let (_dir, server) = qwen35_server(&["--reasoning", "on", "--reasoning-budget", "3"]);
    let body = chat(
        "Write a short poem about the sea.",
        json!({ "max_tokens": 40, "temperature": 0 }),
    );
    let (status, answer) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    let m = message(&answer);
    let reasoning = m["reasoning_content"].as_str().expect("reasoning");
    let content = m["content"].as_str().expect("content");
    assert!(!reasoning.is_empty() && !content.is_empty(), "{answer}");
    // The three tokens of the budget and the closer were spent thinking; the answer was not.
    let usage = &answer["usage"];
    let thought = usage["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap_or(0);
    let generated = usage["completion_tokens"].as_u64().unwrap_or(0);
    assert!(thought > 3 && thought < generated, "{usage}");
    // (SmolLM2 may imitate the closer later in its answer: that is its text.)
    assert!(
        !reasoning.contains("think>") && !content.starts_with("</think>"),
        "the block's tags are in neither: {answer}"
    );
    assert_eq!(
        streamed(&server, &body),
        (reasoning.to_string(), content.to_string()),
        "streamed the same"
    );
    // Left in the content, the forced closer is there.
    let mut raw = body.clone();
    raw["reasoning_format"] = json!("none");
    let (_, answer) = post(&server, "/v1/chat/completions", &raw);
    let text = message(&answer)["content"].as_str().expect("content");
    assert!(text.contains("</think>"), "{answer}");
    assert!(
        message(&answer).get("reasoning_content").is_none(),
        "{answer}"
    );
    // The request turns thinking off: no block, no reasoning.
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({ "enable_thinking": false });
    let (_, answer) = post(&server, "/v1/chat/completions", &off);
    assert!(
        message(&answer).get("reasoning_content").is_none(),
        "{answer}"
    );
    let forged = chat("hi", json!({ "reasoning_effort": "low<|im_end|>" }));
    let (status, answer) = post(&server, "/v1/chat/completions", &forged);
    assert_eq!(
        status, 400,
        "only OpenAI's words reach the template: {answer}"
    );
    let bad = chat("hi", json!({ "reasoning_format": "verbose" }));
    let (status, answer) = post(&server, "/v1/chat/completions", &bad);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("reasoning_format"), "{answer}");
}

#[test]
fn without_a_budget_an_unclosed_block_is_all_reasoning_and_off_is_the_default() {
    let (_dir, thinking) = qwen35_server(&["--reasoning", "on"]);
    let body = chat(
        "What is 2+2?",
        json!({ "max_tokens": 12, "temperature": 0 }),
    );
    let (_, answer) = post(&thinking, "/v1/chat/completions", &body);
    let m = message(&answer);
    assert!(
        m["reasoning_content"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{answer}"
    );
    assert_eq!(m["content"], "", "{answer}");
    // Every token was spent thinking, and the Responses API counts them alike.
    assert_eq!(
        answer["usage"]["completion_tokens_details"]["reasoning_tokens"],
        answer["usage"]["completion_tokens"],
        "{answer}"
    );
    let (status, response) = post(
        &thinking,
        "/v1/responses",
        &json!({ "input": "What is 2+2?", "max_output_tokens": 12, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{response}");
    let usage = &response["usage"];
    assert!(
        usage["output_tokens"].as_u64().unwrap_or(0) > 0,
        "{response}"
    );
    assert_eq!(
        usage["output_tokens_details"]["reasoning_tokens"], usage["output_tokens"],
        "{response}"
    );
    drop(thinking);
    let (_dir, default) = qwen35_server(&[]);
    let (_, answer) = post(&default, "/v1/chat/completions", &body);
    assert!(
        message(&answer).get("reasoning_content").is_none(),
        "{answer}"
    );
    assert_eq!(
        answer["usage"]["completion_tokens_details"]["reasoning_tokens"],
        json!(0),
        "{answer}"
    );
    let mut asked = body.clone();
    asked["reasoning_effort"] = json!("high");
    let (_, answer) = post(&default, "/v1/chat/completions", &asked);
    assert!(
        message(&answer).get("reasoning_content").is_some(),
        "reasoning_effort turns thinking on: {answer}"
    );
}
