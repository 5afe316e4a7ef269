//! A response's output items (reasoning, the message, function calls) built from the chat
//! answer's parts as they come, with the typed events a stream sends for each step. A whole
//! answer is fed through the same steps, so both shapes hold the same items.

use serde_json::{Value, json};

/// The kind of the item being written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
    Call,
}

/// The item being written: its id, its text (or the call's arguments), the call's name.
struct Open {
    kind: Kind,
    id: String,
    text: String,
    call_id: String,
    name: String,
}

/// The items so far and the events not yet sent.
#[derive(Default)]
pub struct Output {
    items: Vec<Value>,
    open: Option<Open>,
    events: Vec<Value>,
}

/// A new item id: `msg_…`, `rs_…`, `fc_…`.
fn item_id(prefix: &str) -> String {
    crate::server::generation::id(prefix).replacen('-', "_", 1)
}

impl Output {
    /// A chat delta (`content`, `reasoning_content`, `tool_calls`), as the chat stream
    /// splits an answer.
    pub fn delta(&mut self, delta: &Value) {
        if let Some(r) = delta.get("reasoning_content").and_then(Value::as_str) {
            self.text(Kind::Reasoning, r);
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str) {
            self.text(Kind::Message, t);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let function = &call["function"];
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                let call_id = call.get("id").and_then(Value::as_str).unwrap_or_default();
                self.open_call(call_id, name);
            }
            if let Some(arguments) = function.get("arguments").and_then(Value::as_str) {
                self.arguments(arguments);
            }
        }
    }

    /// A whole chat message: its reasoning, text and calls, in that order.
    pub fn message(&mut self, message: &Value) {
        self.delta(&json!({
            "reasoning_content": message.get("reasoning_content"),
            "content": message.get("content"),
        }));
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.delta(&json!({ "tool_calls": [call] }));
        }
    }

    /// Closes what is open, `incomplete` when the answer was `cut` at its token limit; an
    /// answer with no item at all gets an empty message (every response holds its message).
    pub fn finish(&mut self, cut: bool) {
        if self.items.is_empty() && self.open.is_none() {
            self.open(Kind::Message);
        }
        self.close_as(if cut { "incomplete" } else { "completed" });
    }

    /// The finished items.
    pub fn items(&self) -> &[Value] {
        &self.items
    }

    /// The events since the last call.
    pub fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    fn text(&mut self, kind: Kind, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if self.open.as_ref().is_none_or(|o| o.kind != kind) {
            self.close();
            self.open(kind);
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        open.text.push_str(delta);
        let id = open.id.clone();
        let index = self.items.len();
        let mut event = json!({
            "type": "response.reasoning_text.delta", "item_id": id, "output_index": index,
            "content_index": 0, "delta": delta,
        });
        if kind == Kind::Message {
            event["type"] = json!("response.output_text.delta");
            event["logprobs"] = json!([]);
        }
        self.events.push(event);
    }

    fn open_call(&mut self, call_id: &str, name: &str) {
        self.close();
        self.open = Some(Open {
            kind: Kind::Call,
            id: item_id("fc"),
            text: String::new(),
            call_id: call_id.to_string(),
            name: name.to_string(),
        });
        self.added();
    }

    fn arguments(&mut self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        let index = self.items.len();
        let Some(open) = self.open.as_mut().filter(|o| o.kind == Kind::Call) else {
            return;
        };
        open.text.push_str(delta);
        let id = open.id.clone();
        self.events.push(json!({
            "type": "response.function_call_arguments.delta", "item_id": id,
            "output_index": index, "delta": delta,
        }));
    }

    fn open(&mut self, kind: Kind) {
        self.open = Some(Open {
            kind,
            id: item_id(if kind == Kind::Reasoning { "rs" } else { "msg" }),
            text: String::new(),
            call_id: String::new(),
            name: String::new(),
        });
        self.added();
        if let Some(open) = &self.open {
            let part = part(kind, "");
            let id = open.id.clone();
            self.events.push(json!({
                "type": "response.content_part.added", "item_id": id,
                "output_index": self.items.len(), "content_index": 0, "part": part,
            }));
        }
    }

    /// `response.output_item.added` for the item just opened.
    fn added(&mut self) {
        if let Some(open) = &self.open {
            let item = item(open, "in_progress");
            self.events.push(json!({
                "type": "response.output_item.added", "output_index": self.items.len(),
                "item": item,
            }));
        }
    }

    fn close(&mut self) {
        self.close_as("completed");
    }

    fn close_as(&mut self, status: &str) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.items.len();
        let id = open.id.clone();
        match open.kind {
            Kind::Call => self.events.push(json!({
                "type": "response.function_call_arguments.done", "item_id": id,
                "output_index": index, "name": open.name, "arguments": open.text,
            })),
            kind => {
                let done = if kind == Kind::Reasoning {
                    "response.reasoning_text.done"
                } else {
                    "response.output_text.done"
                };
                let mut event = json!({
                    "type": done, "item_id": id, "output_index": index, "content_index": 0,
                    "text": open.text,
                });
                if kind == Kind::Message {
                    event["logprobs"] = json!([]);
                }
                self.events.push(event);
                self.events.push(json!({
                    "type": "response.content_part.done", "item_id": id, "output_index": index,
                    "content_index": 0, "part": part(kind, &open.text),
                }));
            }
        }
        let item = item(&open, status);
        self.events.push(json!({
            "type": "response.output_item.done", "output_index": index, "item": item,
        }));
        self.items.push(item);
    }
}

/// A content part: the message's `output_text`, the reasoning's `reasoning_text`.
fn part(kind: Kind, text: &str) -> Value {
    match kind {
        Kind::Reasoning => json!({ "type": "reasoning_text", "text": text }),
        _ => json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] }),
    }
}

/// An output item as it stands.
fn item(open: &Open, status: &str) -> Value {
    let done = status != "in_progress";
    match open.kind {
        Kind::Message => json!({
            "type": "message", "id": open.id, "status": status, "role": "assistant",
            "content": if done { json!([part(Kind::Message, &open.text)]) } else { json!([]) },
        }),
        Kind::Reasoning => json!({
            "type": "reasoning", "id": open.id, "status": status, "summary": [],
            "content": if done { json!([part(Kind::Reasoning, &open.text)]) } else { json!([]) },
        }),
        Kind::Call => json!({
            "type": "function_call", "id": open.id, "status": status, "call_id": open.call_id,
            "name": open.name, "arguments": open.text,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(events: &[Value]) -> Vec<&str> {
        events.iter().filter_map(|e| e["type"].as_str()).collect()
    }

    #[test]
    fn streamed_parts_open_and_close_items_in_order() {
        let mut out = Output::default();
        out.delta(&json!({ "reasoning_content": "think" }));
        out.delta(&json!({ "content": "Hi" }));
        out.delta(&json!({ "content": " there" }));
        out.delta(&json!({ "tool_calls": [{ "index": 0, "id": "call_1", "type": "function", "function": { "name": "f", "arguments": "" } }] }));
        out.delta(
            &json!({ "tool_calls": [{ "index": 0, "function": { "arguments": "{\"a\":1}" } }] }),
        );
        out.finish(false);
        let events = out.take_events();
        assert_eq!(
            kinds(&events),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let items = out.items();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0]["type"], "reasoning");
        assert_eq!(items[1]["content"][0]["text"], "Hi there");
        assert!(
            items[1]["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("msg_"))
        );
        assert_eq!(items[2]["call_id"], "call_1");
        assert_eq!(items[2]["arguments"], "{\"a\":1}");
        // Each event names the item it is about, at its index.
        assert_eq!(events[8]["item_id"], items[1]["id"]);
        assert_eq!(events[8]["output_index"], 1);
    }

    #[test]
    fn a_whole_message_gives_the_same_items_and_an_empty_answer_a_message() {
        let mut out = Output::default();
        out.message(
            &json!({ "role": "assistant", "content": null, "tool_calls": [
            { "id": "c", "type": "function", "function": { "name": "f", "arguments": "{}" } },
        ] }),
        );
        out.finish(true);
        assert_eq!(out.items().len(), 1);
        assert_eq!(
            out.items()[0]["status"],
            "incomplete",
            "the item the limit cut"
        );
        assert_eq!(out.items()[0]["type"], "function_call");
        let mut empty = Output::default();
        empty.finish(false);
        assert_eq!(empty.items()[0]["type"], "message");
        assert_eq!(empty.items()[0]["content"][0]["text"], "");
    }
}
