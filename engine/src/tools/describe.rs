//! The fallback for chat templates that take no tools (Gemma 3, SmolLM2, ChatML): the tools
//! are described in the system turn, calls are asked for in the `<tool_call>` JSON syntax
//! ([`Syntax::Hermes`](super::Syntax::Hermes)), past calls are written into the assistant's
//! text in that syntax, and tool results come back as user turns in `<tool_response>` tags.
//! Consecutive turns of one role are joined, for templates that insist roles alternate.

use serde_json::Value;

use super::{Request, ToolChoice};
use crate::chat::Message;

/// `messages` as a template without tools takes them, the `offered` tools described first.
pub fn describe(messages: Vec<Message>, offered: Option<&Request>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    if let Some(request) = offered.filter(|r| r.choice != ToolChoice::None) {
        let tools = instructions(request);
        match messages.first() {
            Some(first) if first.role == "system" => {}
            _ => out.push(Message::new("system", &tools)),
        }
        if out.is_empty() {
            // The chat's own system turn comes first, then the tools.
            let mut iter = messages.into_iter();
            if let Some(mut system) = iter.next() {
                system.content = format!("{}\n\n{tools}", system.content);
                out.push(system);
            }
            return join(out, iter);
        }
    }
    join(out, messages.into_iter())
}

/// `out` followed by `rest` rewritten without tool fields, turns of one role joined.
fn join(mut out: Vec<Message>, rest: impl Iterator<Item = Message>) -> Vec<Message> {
    for m in rest {
        let m = plain(m);
        match out.last_mut() {
            Some(last) if last.role == m.role && m.role != "system" => {
                last.content = format!("{}\n{}", last.content, m.content);
            }
            _ => out.push(m),
        }
    }
    out
}

/// A message with its calls or result written as text.
fn plain(m: Message) -> Message {
    match m.role.as_str() {
        "tool" => Message::new(
            "user",
            &format!("<tool_response>\n{}\n</tool_response>", m.content),
        ),
        _ => {
            let mut text = m.content.clone();
            for call in m.tool_calls.iter().flatten() {
                let function = call.get("function").unwrap_or(call);
                let name = function.get("name").cloned().unwrap_or(Value::Null);
                let arguments = function.get("arguments").cloned().unwrap_or(Value::Null);
                if !text.is_empty() {
                    text.push('\n');
                }
                // Name first, as the syntax is taught (serde_json would sort the keys).
                text.push_str(&format!(
                    "<tool_call>\n{{\"name\": {name}, \"arguments\": {arguments}}}\n</tool_call>"
                ));
            }
            Message::new(&m.role, &text)
        }
    }
}

/// The system turn's description of the tools and of how to call them.
fn instructions(request: &Request) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in request.callable() {
        text.push('\n');
        text.push_str(&tool.for_template().to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    match &request.choice {
        ToolChoice::Required => text.push_str("\n\nYou must call at least one function."),
        ToolChoice::Named(name) => text.push_str(&format!("\n\nCall the function {name}.")),
        _ => {}
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_go_into_the_system_turn_and_results_come_back_as_user_turns() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
        let request = Request::from_fields(Some(&tools), None, None, None, None)
            .expect("valid")
            .expect("tools");
        let mut asked = Message::new("assistant", "");
        asked.tool_calls = Some(vec![json!({"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]);
        let mut answered = Message::new("tool", "-3 C");
        answered.tool_call_id = Some("call_1".into());
        let messages = vec![
            Message::new("system", "Be brief."),
            Message::new("user", "Weather in Oslo?"),
            asked,
            answered.clone(),
            answered,
        ];
        let out = describe(messages, Some(&request));
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"], "{out:?}");
        assert!(
            out[0].content.starts_with("Be brief.\n\n# Tools"),
            "{}",
            out[0].content
        );
        assert!(out[0].content.contains("\"name\":\"get_weather\""));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>"
        );
        assert_eq!(
            out[3].content,
            "<tool_response>\n-3 C\n</tool_response>\n<tool_response>\n-3 C\n</tool_response>"
        );
        assert!(out.iter().all(|m| m.tool_calls.is_none()));
        let without = describe(vec![Message::new("user", "hi")], Some(&request));
        assert_eq!(without[0].role, "system");
        assert_eq!(without[1].content, "hi");
    }
}
