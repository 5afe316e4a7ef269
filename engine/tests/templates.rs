//! Gemma 4's and Qwen 3.5's chat templates (`models/templates/google-gemma-4-31B-it.jinja`,
//! `Qwen3.5-4B.jinja` of llama.cpp's sdist) render as llama.cpp 11434 renders them
//! (`--jinja`, `/apply-template`, recorded by `goldens/record_template.py`): turns, a system turn, a past answer, whitespace, with
//! thinking off and on; thinking is off when a request does not ask for it; a request asks
//! with `chat_template_kwargs`.

mod common;

use std::path::PathBuf;

use engine::chat::{ChatTemplate, Message, Vars};

fn golden(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden")).expect("json")
}

fn template(file: &str, bos: &str, eos: &str) -> ChatTemplate {
    let source =
        std::fs::read_to_string(common::llama_cpp_file(&format!("models/templates/{file}")))
            .expect("the template");
    ChatTemplate::new(Some(source), bos.into(), eos.into()).expect("compiles")
}

fn gemma4_template() -> ChatTemplate {
    template("google-gemma-4-31B-it.jinja", "<bos>", "<eos>")
}

/// Every recorded case renders as llama.cpp rendered it, thinking off and on; asked nothing,
/// thinking is off.
fn renders_as_llama_cpp(template: &ChatTemplate, golden: &serde_json::Value) {
    let cases = golden["cases"].as_array().expect("cases");
    assert!(cases.len() >= 6);
    for case in cases {
        let messages: Vec<Message> =
            serde_json::from_value(case["messages"].clone()).expect("messages");
        let thinking = case["enable_thinking"]
            .as_bool()
            .expect("recorded on or off");
        let expected = case["prompt"].as_str().expect("prompt");
        let vars = Vars {
            enable_thinking: Some(thinking),
            ..Vars::default()
        };
        let rendered = template.render(&messages, true, &vars).expect("renders");
        // llama.cpp's /apply-template leaves out the BOS the tokenizer adds anyway.
        assert_eq!(
            template.strip_bos(&rendered),
            expected,
            "{messages:?}, thinking {thinking}"
        );
        if !thinking {
            // Unasked, thinking is off.
            let unasked = template
                .render(&messages, true, &Vars::default())
                .expect("renders");
            assert_eq!(template.strip_bos(&unasked), expected, "{messages:?}");
        }
    }
}

#[test]
fn gemma4_renders_as_llama_cpp_renders_it() {
    renders_as_llama_cpp(&gemma4_template(), &golden("gemma4-template.json"));
}

/// Qwen 3.5's template (`models/templates/Qwen3.5-4B.jinja`): its thinking block, closed
/// empty when thinking is off (as it is unasked), past answers written without it.
#[test]
fn qwen35_renders_as_llama_cpp_renders_it() {
    let qwen35 = template("Qwen3.5-4B.jinja", "", "<|im_end|>");
    renders_as_llama_cpp(&qwen35, &golden("qwen35-template.json"));
}

/// `chat_template_kwargs.enable_thinking` reaches the template: the prompt a server builds
/// opens the thinking channel empty unless the request turns thinking on; other variables are
/// refused by name.
#[test]
fn a_chat_asks_for_thinking_with_template_kwargs() {
    use common::serve::{post, start_with_env};
    use serde_json::json;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gemma4.jinja");
    std::fs::write(&path, &gemma4_template().source).expect("write the template");
    let server = start_with_env(&["--chat-template-file", path.to_str().expect("utf8")], &[]);
    let body = |kwargs: serde_json::Value| json!({ "messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": kwargs });
    let (status, off) = post(&server, "/apply-template", &body(json!({})));
    assert_eq!(status, 200, "{off}");
    let off = off["prompt"].as_str().expect("prompt").to_string();
    assert!(
        off.ends_with("<|turn>model\n<|channel>thought\n<channel|>"),
        "{off}"
    );
    let (_, on) = post(
        &server,
        "/apply-template",
        &body(json!({"enable_thinking": true})),
    );
    let on = on["prompt"].as_str().expect("prompt").to_string();
    assert!(
        on.contains("<|think|>") && on.ends_with("<|turn>model\n"),
        "{on}"
    );
    let (status, refused) = post(
        &server,
        "/apply-template",
        &body(json!({"tools_in_user": 1})),
    );
    assert_eq!(status, 400, "{refused}");
    assert!(refused.to_string().contains("tools_in_user"), "{refused}");
}
