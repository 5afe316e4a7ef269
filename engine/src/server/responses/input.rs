//! A Responses request as the chat request it means: `instructions` and `input` (a text, or
//! items: messages, the model's past calls and their outputs; past reasoning is taken and left
//! out) become `messages`; `max_output_tokens`, flat function tools, `tool_choice`, `text.format` and
//! `reasoning.effort` their chat names. Fields with no chat meaning are refused by name.

use serde_json::{Map, Value, json};

use crate::server::error::ApiError;

/// Fields of a Responses request that this module turns into chat fields (or echoes only).
const OWN: &[&str] = &[
    "input",
    "instructions",
    "max_output_tokens",
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "previous_response_id",
    "store",
    "metadata",
    "include",
    "truncation",
    "background",
    "conversation",
    "prompt",
    "max_tool_calls",
    "stream_options",
    "service_tier",
    "user",
    "safety_identifier",
    "prompt_cache_key",
];

/// Chat fields a Responses request may not use, and what it uses instead.
const CHAT_ONLY: &[(&str, &str)] = &[
    ("messages", "input"),
    ("max_tokens", "max_output_tokens"),
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("functions", "tools"),
    ("function_call", "tool_choice"),
    ("n", "one request per answer"),
    (
        "logprobs",
        "none: log-probabilities are not given in responses",
    ),
    (
        "top_logprobs",
        "none: log-probabilities are not given in responses",
    ),
    ("reasoning_effort", "reasoning.effort"),
];

/// The chat request `asked` means.
pub fn to_chat(asked: &Value) -> Result<Value, ApiError> {
    let fields = asked
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    refuse_unkept(fields)?;
    for (field, instead) in CHAT_ONLY {
        if fields
            .get(*field)
            .is_some_and(|v| !v.is_null() && v != &json!(0))
        {
            return Err(ApiError::unsupported(
                field,
                &format!("the Responses API's way is {instead}"),
            ));
        }
    }
    let mut chat = Map::new();
    // llama.cpp's own knobs (`n_probs`, `timings_per_token`, …) and OpenAI's sampling ones
    // have the same names in both: the chat request checks them.
    for (name, value) in fields {
        if !OWN.contains(&name.as_str()) {
            chat.insert(name.clone(), value.clone());
        }
    }
    let mut messages = Vec::new();
    match fields.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => messages.push(json!({ "role": "system", "content": text })),
        Some(_) => return Err(ApiError::bad_request("instructions must be a string")),
    }
    match fields.get("input") {
        Some(Value::String(text)) => messages.push(json!({ "role": "user", "content": text })),
        Some(Value::Array(items)) => items_to_messages(items, &mut messages)?,
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "input is missing: give the conversation as a string or a list of items",
            ));
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "input must be a string or a list of items",
            ));
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(n) = fields.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), n.clone());
    }
    if let Some(tools) = fields.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = fields.get("tool_choice").filter(|v| !v.is_null()) {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(format) = fields
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|v| !v.is_null())
    {
        chat.insert("response_format".into(), response_format(format)?);
    }
    // Reasoning becomes reasoning items: split from the text, never left in it.
    let format = fields.get("reasoning_format").and_then(Value::as_str);
    if format.is_none_or(|f| f == "deepseek-legacy") {
        chat.insert("reasoning_format".into(), json!("deepseek"));
    }
    if let Some(effort) = fields
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|v| !v.is_null())
    {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    Ok(Value::Object(chat))
}

/// What would need a response kept on the server, or work done in the background: refused,
/// saying what to send instead.
fn refuse_unkept(fields: &Map<String, Value>) -> Result<(), ApiError> {
    let given = |name: &str| fields.get(name).is_some_and(|v| !v.is_null());
    if given("previous_response_id") || given("conversation") {
        return Err(ApiError::unsupported(
            if given("conversation") {
                "conversation"
            } else {
                "previous_response_id"
            },
            "responses are not kept on this server: send the whole conversation in `input`",
        ));
    }
    if given("prompt") {
        return Err(ApiError::unsupported(
            "prompt",
            "stored prompt templates are not kept on this server: send `instructions`",
        ));
    }
    if fields.get("max_tool_calls").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::unsupported(
            "max_tool_calls",
            "an answer's calls are not counted against a limit here",
        ));
    }
    if fields.get("background").is_some_and(|v| v == &json!(true)) {
        return Err(ApiError::unsupported(
            "background",
            "responses run while the request waits (use `stream` to read them as they come)",
        ));
    }
    Ok(())
}

/// `input`'s items as chat messages. A model's calls join the assistant message before them
/// (or start one). Past reasoning items are taken and left out: the chat path gives templates
/// no past reasoning either (the thinking templates drop it from earlier turns themselves).
fn items_to_messages(items: &[Value], messages: &mut Vec<Value>) -> Result<(), ApiError> {
    for (i, item) in items.iter().enumerate() {
        let at = |what: &str| format!("input[{i}]: {what}");
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => {
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad_request(at("a message needs a role")))?;
                let role = if role == "developer" { "system" } else { role };
                let content = message_text(item.get("content"), &at)?;
                messages.push(json!({ "role": role, "content": content }));
            }
            Some("function_call") => {
                let text = |field: &str| {
                    item.get(field)
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::bad_request(at(&format!("needs `{field}`"))))
                };
                let call = json!({
                    "id": text("call_id")?, "type": "function",
                    "function": { "name": text("name")?, "arguments": text("arguments")? },
                });
                match messages.last_mut().filter(|m| m["role"] == "assistant") {
                    Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => last["tool_calls"] = json!([call]),
                    },
                    None => messages.push(
                        json!({ "role": "assistant", "content": null, "tool_calls": [call] }),
                    ),
                }
            }
            Some("function_call_output") => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad_request(at("needs `call_id`")))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => message_text(other, &at)?,
                };
                messages
                    .push(json!({ "role": "tool", "tool_call_id": call_id, "content": output }));
            }
            Some("reasoning") => {}
            Some(other) => {
                return Err(ApiError::bad_request(at(&format!(
                    "items of type {:?} are not taken (messages, function_call, \
                     function_call_output and reasoning are)",
                    other.chars().take(40).collect::<String>()
                ))));
            }
        }
    }
    Ok(())
}

/// A message's content as text: a string, or its text parts joined (`input_text`,
/// `output_text`, `text`); images and files are refused, naming where.
fn message_text(content: Option<&Value>, at: &dyn Fn(&str) -> String) -> Result<String, ApiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        let piece = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::bad_request(at(&format!("content[{j}] needs `text`")))
                        })?;
                        text.push_str(piece);
                    }
                    Some("refusal") => {}
                    Some(other) => {
                        return Err(ApiError::bad_request(at(&format!(
                            "content[{j}] is {:?}: the model takes text only",
                            other.chars().take(40).collect::<String>()
                        ))));
                    }
                    None => {
                        return Err(ApiError::bad_request(at(&format!(
                            "content[{j}] needs a `type`"
                        ))));
                    }
                }
            }
            Ok(text)
        }
        None | Some(Value::Null) => Ok(String::new()),
        Some(_) => Err(ApiError::bad_request(at(
            "content must be a string or a list of parts",
        ))),
    }
}

/// The Responses API's flat function tools (`{"type": "function", "name", "parameters"}`) as
/// chat tools; its hosted tools (web search, files, …) are refused by name.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_request("tools must be a list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = Map::new();
                for field in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
                        function.insert(field.into(), v.clone());
                    }
                }
                out.push(json!({ "type": "function", "function": function }));
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "tools[{i}]: only function tools are served here, not {:?} (the box \
                     reaches nothing outside it)",
                    other
                        .unwrap_or("untyped")
                        .chars()
                        .take(40)
                        .collect::<String>()
                )));
            }
        }
    }
    Ok(Value::Array(out))
}

/// `tool_choice`: the words as they are; `{"type": "function", "name"}` in the chat shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_request("tool_choice of type function needs `name`")
            })?;
            Ok(json!({ "type": "function", "function": { "name": name } }))
        }
        _ => Err(ApiError::bad_request(
            "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": …}",
        )),
    }
}

/// `text.format` as the chat's `response_format`.
fn response_format(format: &Value) -> Result<Value, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({ "type": "text" })),
        Some("json_object") => Ok(json!({ "type": "json_object" })),
        Some("json_schema") => {
            let schema = format.get("schema").ok_or_else(|| {
                ApiError::bad_request("text.format of type json_schema needs `schema`")
            })?;
            Ok(json!({
                "type": "json_schema",
                "json_schema": { "name": format.get("name"), "schema": schema, "strict": format.get("strict") },
            }))
        }
        _ => Err(ApiError::bad_request(
            "text.format.type must be text, json_object or json_schema",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_calls_becomes_chat_messages() {
        let chat = to_chat(&json!({
            "instructions": "Be brief.",
            "input": [
                { "role": "user", "content": [{ "type": "input_text", "text": "Weather in " }, { "type": "input_text", "text": "Oslo?" }] },
                { "type": "reasoning", "summary": [{ "type": "summary_text", "text": "look it up" }] },
                { "type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}" },
                { "type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}" },
                { "type": "function_call_output", "call_id": "c1", "output": "rain" },
            ],
            "max_output_tokens": 12,
            "tools": [{ "type": "function", "name": "weather", "parameters": { "type": "object" } }],
            "tool_choice": { "type": "function", "name": "weather" },
            "temperature": 0,
        }))
        .expect("converted");
        let messages = chat["messages"].as_array().expect("messages");
        assert_eq!(
            messages[0],
            json!({ "role": "system", "content": "Be brief." })
        );
        assert_eq!(messages[1]["content"], "Weather in Oslo?");
        assert_eq!(messages[2]["role"], "assistant");
        let calls = messages[2]["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 2, "both calls in one assistant message");
        assert_eq!(calls[0]["function"]["name"], "weather");
        assert_eq!(
            messages[3],
            json!({ "role": "tool", "tool_call_id": "c1", "content": "rain" })
        );
        assert_eq!(chat["max_tokens"], 12);
        assert_eq!(chat["temperature"], 0);
        assert_eq!(chat["tools"][0]["function"]["name"], "weather");
        assert_eq!(chat["tool_choice"]["function"]["name"], "weather");
        assert!(chat.get("input").is_none() && chat.get("max_output_tokens").is_none());
    }

    #[test]
    fn what_needs_a_kept_response_or_a_hosted_tool_is_refused_by_name() {
        for (body, named) in [
            (
                json!({ "input": "hi", "previous_response_id": "resp_1" }),
                "previous_response_id",
            ),
            (json!({ "input": "hi", "background": true }), "background"),
            (
                json!({ "input": "hi", "tools": [{ "type": "web_search" }] }),
                "web_search",
            ),
            (
                json!({ "input": [{ "type": "item_reference", "id": "x" }] }),
                "item_reference",
            ),
            (
                json!({ "input": [{ "role": "user", "content": [{ "type": "input_image" }] }] }),
                "input_image",
            ),
            (json!({ "instructions": "no input" }), "input"),
            (
                json!({ "input": "hi", "max_tokens": 4 }),
                "max_output_tokens",
            ),
            (json!({ "input": "hi", "messages": [] }), "messages"),
            (
                json!({ "input": "hi", "max_tool_calls": 2 }),
                "max_tool_calls",
            ),
        ] {
            let e = to_chat(&body).expect_err("refused");
            assert!(e.body().to_string().contains(named), "{body}: {}", e.body());
        }
    }
}
