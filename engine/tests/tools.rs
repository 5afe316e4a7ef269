//! Tool calling end to end: the real chat templates of each family (llama.cpp's
//! `models/templates/`) told apart, a past call written by each template read back by our parser
//! for that family, and the `openai` package's full tool loop (`clients/tool_calls.py`) against
//! `engine serve` on the real SmolLM2 and Gemma 3, with their own templates (the fallback) and
//! with each family's (`--chat-template-file`).

mod common;

use std::sync::Arc;

use engine::chat::{ChatTemplate, Message, Vars};
use engine::tools::{Call, Request, Syntax, parse};
use serde_json::json;

/// Each family's real template (file in llama.cpp's `models/templates/`) and its syntax.
const FAMILIES: &[(&str, Syntax)] = &[
    ("Qwen-Qwen2.5-7B-Instruct.jinja", Syntax::Hermes),
    ("Qwen-Qwen3-0.6B.jinja", Syntax::Hermes),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        Syntax::Hermes,
    ),
    ("Qwen3.5-4B.jinja", Syntax::QwenXml),
    ("Qwen3-Coder.jinja", Syntax::QwenXml),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", Syntax::Llama3),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", Syntax::Llama3),
    ("google-gemma-4-31B-it.jinja", Syntax::Gemma4),
];

fn template_text(file: &str) -> String {
    std::fs::read_to_string(common::llama_cpp_file(&format!("models/templates/{file}")))
        .expect("template")
}

fn weather_request() -> Arc<Request> {
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]);
    Arc::new(
        Request::from_fields(Some(&tools), None, None, None, None)
            .expect("valid")
            .expect("tools"),
    )
}

#[test]
fn each_real_template_is_read_as_its_family() {
    for (file, syntax) in FAMILIES {
        assert_eq!(
            Syntax::of_template(&template_text(file)),
            Some(*syntax),
            "{file}"
        );
    }
    // Templates that take no tools get the fallback.
    for file in [
        "google-gemma-2-2b-it.jinja",
        "HuggingFaceTB-SmolLM3-3B.jinja",
    ] {
        assert_eq!(Syntax::of_template(&template_text(file)), None, "{file}");
    }
}

/// A conversation with a past call, rendered by each family's own template: the call as the
/// template writes it is what our grammar for that family allows and its parser reads back.
#[test]
fn a_past_call_written_by_each_template_is_read_back_by_its_parser() {
    let request = weather_request();
    for (file, syntax) in FAMILIES {
        let template = ChatTemplate::new(Some(template_text(file)), "<bos>".into(), "<eos>".into())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut asked = Message::new("assistant", "");
        asked.tool_calls = Some(vec![json!({"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}})]);
        let mut result = Message::new("tool", "{\"temperature\": -3}");
        result.tool_call_id = Some("call_1".into());
        result.name = Some("get_weather".into());
        let messages = vec![
            Message::new("user", "Weather in Oslo for three days?"),
            asked,
            result,
        ];
        let vars = Vars {
            tools: Some(request.tools.iter().map(|t| t.for_template()).collect()),
            ..Vars::default()
        };
        let prompt = template
            .render(&messages, true, &vars)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            prompt.contains("get_weather"),
            "{file}: the tools reach the prompt"
        );
        let opener = syntax.opener();
        // The template's own description of the tools may show the syntax; the call is the
        // last opener's.
        let at = prompt
            .rfind(opener)
            .unwrap_or_else(|| panic!("{file}: no {opener} in {prompt}"));
        // Checked against the grammar too: what the template writes is what generation may.
        let grammar = Arc::new(syntax.grammar(&request).expect("grammar"));
        let parsed = parse(*syntax, Arc::clone(&request), Some(grammar), &prompt[at..]);
        assert_eq!(
            parsed.calls.first(),
            Some(&Call {
                name: "get_weather".into(),
                arguments: json!({"city": "Oslo", "days": 3}).to_string(),
            }),
            "{file}: {}",
            &prompt[at..]
        );
    }
}

/// The `openai` package's tool loop (`clients/tool_calls.py`) against `server`.
fn openai_tool_loop(server: &common::serve::Server, what: &str) {
    common::serve::run_client("tool_calls.py", server, &[], what);
}

#[test]
fn the_openai_package_runs_the_tool_loop_on_the_fallback() {
    let smollm2 = common::serve::start(&["-c", "2048"]);
    openai_tool_loop(&smollm2, "SmolLM2 (its template takes no tools)");
    // The answers and their calls are counted.
    let (_, metrics) =
        common::serve::request(&smollm2, "GET", "/metrics", None, None).expect("metrics");
    let count = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    // Nine of the script's requests offer tools and are answered (`none` offers none).
    assert!(count("engine_tool_call_answers_total") >= 9.0, "{metrics}");
    assert!(count("engine_tool_calls_total") >= 6.0, "{metrics}");
    assert!(count("engine_tool_call_failures_total") >= 0.0, "{metrics}");
    drop(smollm2);
    let gemma3 = common::serve::start_model(&common::gemma3(), &["-c", "2048"], &[]);
    openai_tool_loop(&gemma3, "Gemma 3 270M (its template takes no tools)");
}

/// The tool loop on `model` (named `name`) with one template of each syntax.
fn tool_loops_in_each_family(model: &std::path::Path, name: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, syntax) in FAMILIES {
        // One template per syntax.
        if !matches!(
            file,
            &"Qwen-Qwen3-0.6B.jinja"
                | &"Qwen3.5-4B.jinja"
                | &"meta-llama-Llama-3.2-3B-Instruct.jinja"
                | &"google-gemma-4-31B-it.jinja"
        ) {
            continue;
        }
        let path = dir.path().join(file);
        std::fs::write(&path, template_text(file)).expect("write the template");
        let server = common::serve::start_model(
            model,
            &[
                "-c",
                "2048",
                "--chat-template-file",
                path.to_str().expect("utf-8"),
            ],
            &[],
        );
        openai_tool_loop(&server, &format!("{name} with {file} ({syntax:?})"));
    }
}

#[test]
fn the_openai_package_runs_the_tool_loop_in_each_familys_template() {
    tool_loops_in_each_family(&common::smollm2(), "SmolLM2");
}

#[test]
fn the_openai_package_runs_the_tool_loop_in_each_familys_template_on_gemma3() {
    tool_loops_in_each_family(&common::gemma3(), "Gemma 3 270M");
}

/// llama.cpp's own tool-call cases that need no particular model
/// (`clients/llama_tool_call_cases.py`, from its `test_tool_call.py`), on SmolLM2 with the
/// templates llama.cpp runs them with: a required call of its `test` tool in every template of
/// its tiny-model lists, and no call made where none is asked for (Llama 3.3's template, its
/// fast list).
#[test]
fn llama_cpps_tool_call_cases_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: &[(&str, &str)] = &[
        ("Qwen3-Coder", "required"),
        ("meta-llama-Llama-3.3-70B-Instruct", "required"),
        ("meta-llama-Llama-3.3-70B-Instruct", "without"),
        ("meta-llama-Llama-3.1-8B-Instruct", "required"),
        ("meetkai-functionary-medium-v3.1", "required"),
        ("meetkai-functionary-medium-v3.2", "required"),
        ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "required"),
        ("meta-llama-Llama-3.2-3B-Instruct", "required"),
        ("mistralai-Mistral-Nemo-Instruct-2407", "required"),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "required"),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "required"),
        ("fireworks-ai-llama-3-firefunction-v2", "required"),
    ];
    for (template, which) in cases {
        let file = format!("{template}.jinja");
        let path = dir.path().join(&file);
        std::fs::write(&path, template_text(&file)).expect("write the template");
        let server = common::serve::start(&[
            "-c",
            "4096",
            "--chat-template-file",
            path.to_str().expect("utf-8"),
        ]);
        common::serve::run_client(
            "llama_tool_call_cases.py",
            &server,
            &[which],
            &format!("{template} ({which})"),
        );
    }
}
