//! What clients written for llama.cpp's server and OpenAI's API rely on, against `engine serve`
//! on the real SmolLM2: routes with and without `/v1`, CORS and `X-Api-Key`, JSON errors for
//! every refusal, `n`, log-probabilities, `logit_bias`, output constrained to JSON, token-array
//! prompts, llama.cpp's tokenizer and template endpoints, its context-size error, server-wide
//! defaults, assistant prefill, refusals of what is not implemented, and `/metrics` read by a
//! real Prometheus parser.

mod common;

use std::process::Command;

use common::serve::{Server, chat, events, exchange, post, request, start};
use serde_json::{Value, json};

fn json_body(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

fn content(answer: &Value, choice: usize) -> String {
    answer["choices"][choice]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {answer}"))
        .to_string()
}

#[test]
fn routes_cors_keys_and_errors_are_what_clients_expect() {
    let server = start(&[
        "--api-key",
        "k3y",
        "--cors-origins",
        "http://app.lan:3000",
        "--alias",
        "tinyllama-2, fim,code,fim",
    ]);
    let port = server.port;
    let auth = "Authorization: Bearer k3y\r\nContent-Type: application/json\r\n";
    let body = chat("Hi", json!({ "max_tokens": 2 })).to_string();
    for path in ["/v1/chat/completions", "/chat/completions"] {
        let (status, _, answer) = exchange(port, "POST", path, auth, &body);
        assert_eq!(status, 200, "{path}: {answer}");
        assert_eq!(json_body(&answer)["object"], "chat.completion");
    }
    let prompt = json!({ "prompt": "Hi", "max_tokens": 2 }).to_string();
    for path in ["/v1/completions", "/completions"] {
        let (status, _, answer) = exchange(port, "POST", path, auth, &prompt);
        assert_eq!(status, 200, "{path}: {answer}");
        assert_eq!(json_body(&answer)["object"], "text_completion");
    }
    for path in ["/v1/models", "/models"] {
        let (status, _, answer) = exchange(port, "GET", path, auth, "");
        assert_eq!(status, 200, "{path}: {answer}");
        // Every alias, once; the id the first in alphabetical order, as llama-server says.
        let model = &json_body(&answer)["data"][0];
        assert_eq!(
            model["aliases"],
            json!(["code", "fim", "tinyllama-2"]),
            "{model}"
        );
        assert_eq!(model["id"], "code");
    }

    // Without `--slots`, /slots is not served: 501 in the error shape, as llama-server.
    let (status, _, answer) = exchange(port, "GET", "/slots", auth, "");
    assert_eq!(status, 501, "{answer}");
    assert_eq!(json_body(&answer)["error"]["type"], "not_supported_error");

    // The key as X-Api-Key; a wrong one refused in OpenAI's shape.
    let (status, _, _) = exchange(
        port,
        "POST",
        "/v1/chat/completions",
        "X-Api-Key: k3y\r\nContent-Type: application/json\r\n",
        &body,
    );
    assert_eq!(status, 200);
    let (status, _, refused) = exchange(
        port,
        "POST",
        "/v1/chat/completions",
        "X-Api-Key: nope\r\n",
        &body,
    );
    assert_eq!(status, 401);
    assert_eq!(json_body(&refused)["error"]["type"], "authentication_error");

    // A browser's preflight is answered before any key is asked for, for the allowed origin
    // only; the answer itself carries the origin too.
    let preflight = |origin: &str| {
        exchange(
            port,
            "OPTIONS",
            "/v1/chat/completions",
            &format!(
                "Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: authorization, content-type\r\n"
            ),
            "",
        )
    };
    let (status, head, _) = preflight("http://app.lan:3000");
    assert!((200..300).contains(&status), "{status} {head}");
    assert!(
        head.contains("access-control-allow-origin: http://app.lan:3000"),
        "{head}"
    );
    assert!(head.contains("authorization"), "{head}");
    let (_, head, _) = preflight("http://evil.example");
    assert!(!head.contains("access-control-allow-origin"), "{head}");
    let (status, head, _) = exchange(
        port,
        "POST",
        "/v1/chat/completions",
        &format!("Origin: http://app.lan:3000\r\n{auth}"),
        &body,
    );
    assert_eq!(status, 200);
    assert!(head.contains("access-control-allow-origin: http://app.lan:3000"));

    // Every refusal is a JSON error: an unknown route, a wrong method, a body over the limit
    // (sent chunked, so only the body limit can catch it).
    let (status, head, answer) = exchange(port, "GET", "/v2/nothing", auth, "");
    assert_eq!(status, 404);
    assert!(head.contains("application/json"), "{head}");
    assert!(json_body(&answer)["error"]["message"].is_string());
    let (status, _, answer) = exchange(port, "GET", "/v1/chat/completions", auth, "");
    assert_eq!(status, 405);
    assert_eq!(json_body(&answer)["error"]["code"], 405);
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(2 << 20));
    let (status, _, answer) = exchange(port, "POST", "/v1/completions", auth, &big);
    assert_eq!(status, 413);
    assert_eq!(json_body(&answer)["error"]["code"], 413);
}

#[test]
fn n_logprobs_and_logit_bias() {
    let server = start(&[]);
    let (status, two) = post(
        &server,
        "/v1/chat/completions",
        &chat(
            "Name a fruit.",
            json!({ "max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 3 }),
        ),
    );
    assert_eq!(status, 200, "{two}");
    let choices = two["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2);
    assert_eq!(
        (choices[0]["index"].clone(), choices[1]["index"].clone()),
        (json!(0), json!(1))
    );
    // Each choice generates at most 6 tokens: more than 6 in all means both were counted.
    assert!(
        two["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 6,
        "both choices are counted: {two}"
    );
    let (status, _) = post(
        &server,
        "/v1/chat/completions",
        &chat("x", json!({ "n": 9 })),
    );
    assert_eq!(status, 400);

    let (_, probed) = post(
        &server,
        "/v1/chat/completions",
        &chat(
            "Name a fruit.",
            json!({ "max_tokens": 5, "logprobs": true, "top_logprobs": 3 }),
        ),
    );
    let tokens = probed["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("logprobs: {probed}"));
    assert_eq!(
        tokens.len() as u64,
        probed["usage"]["completion_tokens"].as_u64().unwrap_or(0)
    );
    let mut text = String::new();
    for t in tokens {
        let top = t["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 3);
        let lps: Vec<f64> = top
            .iter()
            .map(|x| x["logprob"].as_f64().unwrap_or(1.0))
            .collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0, "{t}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], t["token"]);
        assert_eq!(top[0]["logprob"], t["logprob"]);
        text.push_str(t["token"].as_str().unwrap_or(""));
    }
    assert_eq!(text, content(&probed, 0));

    // Legacy completions and llama.cpp's n_probs report the same numbers.
    let (_, legacy) = post(
        &server,
        "/v1/completions",
        &json!({ "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "logprobs": 2 }),
    );
    let lp = &legacy["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(3), "{legacy}");
    assert_eq!(lp["text_offset"][0], 0);
    let (_, native) = post(
        &server,
        "/completion",
        &json!({ "prompt": "The capital of France is", "n_predict": 3, "temperature": 0, "n_probs": 2 }),
    );
    let probs = native["completion_probabilities"]
        .as_array()
        .expect("probs");
    assert_eq!(probs.len(), 3);
    let close = |a: &Value, b: &Value| {
        (a.as_f64().unwrap_or(9.0) - b.as_f64().unwrap_or(-9.0)).abs() < 1e-6
    };
    assert!(
        close(&probs[0]["logprob"], &lp["token_logprobs"][0]),
        "{native} {legacy}"
    );
    assert_eq!(probs[0]["token"], lp["tokens"][0]);

    // Banning the greedy first token changes it; a large bias forces another.
    let first = probs[0]["id"].as_u64().expect("id");
    let (_, banned) = post(
        &server,
        "/completion",
        &json!({ "prompt": "The capital of France is", "n_predict": 1, "temperature": 0,
                 "logit_bias": { first.to_string(): -100 }, "return_tokens": true }),
    );
    assert_ne!(banned["tokens"][0].as_u64(), Some(first), "{banned}");
    let (_, forced) = post(
        &server,
        "/v1/completions",
        &json!({ "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0,
                 "logit_bias": [[" banana", 100]] }),
    );
    assert_eq!(forced["choices"][0]["text"], " banana", "{forced}");
}

#[test]
fn probabilities_after_sampling_are_those_the_draw_chose_among() {
    let server = start(&[]);
    let ask = |extra: Value| {
        let mut body = json!({
            "prompt": "The capital of France is", "n_predict": 4, "n_probs": 10,
            "temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0.0, "seed": 5,
        });
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (status, answer) = post(&server, "/completion", &body);
        assert_eq!(status, 200, "{answer}");
        answer["completion_probabilities"]
            .as_array()
            .unwrap_or_else(|| panic!("probabilities: {answer}"))
            .clone()
    };
    let model = ask(json!({}));
    let sampled = ask(json!({ "post_sampling_probs": true }));
    assert_eq!(model.len(), 4);
    assert_eq!(sampled.len(), 4);
    let number = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    for (m, s) in model.iter().zip(&sampled) {
        // Reporting changes nothing of the draw: the same seed gives the same tokens.
        assert_eq!(m["id"], s["id"], "{m} {s}");
        assert!(
            s.get("logprob").is_none() && s.get("top_logprobs").is_none(),
            "{s}"
        );
        let top = s["top_probs"].as_array().expect("top_probs");
        // top_k = 3: the draw was among three tokens, and they are all there is.
        assert_eq!(top.len(), 3, "{s}");
        let total: f64 = top.iter().map(|t| number(&t["prob"])).sum();
        assert!((total - 1.0).abs() < 1e-9, "{s}");
        let chosen = top
            .iter()
            .find(|t| t["id"] == s["id"])
            .unwrap_or_else(|| panic!("the chosen token is a candidate: {s}"));
        assert_eq!(chosen["prob"], s["prob"]);
        assert!(number(&s["prob"]) > 0.0 && number(&s["prob"]) <= 1.0, "{s}");
        // Three candidates share what the whole vocabulary had: each is more likely than the
        // model alone said.
        let model_top = m["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(model_top.len(), 10);
        assert_eq!(model_top[0]["id"], top[0]["id"]);
        assert!(
            number(&top[0]["prob"]) > number(&model_top[0]["logprob"]).exp(),
            "{m} {s}"
        );
    }

    // Greedy draws nothing: the chosen token was certain.
    let greedy = ask(json!({ "post_sampling_probs": true, "temperature": 0 }));
    for s in &greedy {
        assert_eq!(s["prob"], json!(1.0), "{s}");
        assert_eq!(s["top_probs"].as_array().map(Vec::len), Some(1), "{s}");
    }

    // The chat dialect names them as llama.cpp does.
    let (status, chat_answer) = post(
        &server,
        "/v1/chat/completions",
        &chat(
            "Name a fruit.",
            json!({ "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "top_k": 2,
                    "top_p": 1.0, "min_p": 0.0, "temperature": 1.0,
                    "post_sampling_probs": true }),
        ),
    );
    assert_eq!(status, 200, "{chat_answer}");
    let first = &chat_answer["choices"][0]["logprobs"]["content"][0];
    let top = first["top_probs"].as_array().expect("top_probs");
    assert_eq!(top.len(), 2, "{first}");
    let total: f64 = top.iter().map(|t| number(&t["prob"])).sum();
    assert!((total - 1.0).abs() < 1e-9, "{first}");
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": { "type": "string" },
            "population": { "type": "integer" },
            "capital": { "type": "boolean" }
        },
        "required": ["city", "population", "capital"]
    })
}

fn satisfies(answer: &Value) -> bool {
    answer["city"].is_string() && answer["population"].is_i64() && answer["capital"].is_boolean()
}

#[test]
fn json_output_follows_its_grammar() {
    let server = start(&[]);
    let ask = "Describe Paris as JSON.";
    let (status, object) = post(
        &server,
        "/v1/chat/completions",
        &chat(
            ask,
            json!({ "max_tokens": 60, "response_format": { "type": "json_object" } }),
        ),
    );
    assert_eq!(status, 200, "{object}");
    let parsed: Value = serde_json::from_str(&content(&object, 0))
        .unwrap_or_else(|e| panic!("json_object answer does not parse ({e}): {object}"));
    assert!(parsed.is_object());

    let format =
        json!({ "type": "json_schema", "json_schema": { "name": "city", "schema": schema() } });
    for temperature in [0.0, 1.0] {
        let (status, typed) = post(
            &server,
            "/v1/chat/completions",
            &chat(
                ask,
                json!({ "max_tokens": 80, "temperature": temperature, "seed": 11, "response_format": format }),
            ),
        );
        assert_eq!(status, 200, "{typed}");
        let parsed: Value = serde_json::from_str(&content(&typed, 0))
            .unwrap_or_else(|e| panic!("json_schema answer does not parse ({e}): {typed}"));
        assert!(satisfies(&parsed), "{parsed}");
    }
    let (_, native) = post(
        &server,
        "/completion",
        &json!({ "prompt": "Paris as JSON:", "n_predict": 80, "temperature": 0, "json_schema": schema() }),
    );
    let parsed: Value = serde_json::from_str(native["content"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("/completion json_schema does not parse ({e}): {native}"));
    assert!(satisfies(&parsed), "{parsed}");
    let (_, yes_no) = post(
        &server,
        "/completion",
        &json!({ "prompt": "Is Paris in France? Answer:", "n_predict": 8, "temperature": 0,
                 "grammar": "root ::= \" yes\" | \" no\"" }),
    );
    assert!(
        [" yes", " no"].contains(&yes_no["content"].as_str().unwrap_or("")),
        "{yes_no}"
    );
    let (status, bad) = post(
        &server,
        "/v1/chat/completions",
        &chat(
            ask,
            json!({ "response_format": { "type": "json_schema", "json_schema": { "schema": { "type": "object", "patternProperties": {} } } } }),
        ),
    );
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("patternProperties")),
        "{bad}"
    );
}

/// `return_progress`: a streamed prompt's prefill reported before its first pass and after
/// each (the cache's share first, the whole prompt last); `timings_per_token`: every piece
/// carries the timings so far. In each dialect's stream.
#[test]
fn prefill_progress_and_timings_per_token_are_streamed() {
    let server = start(&["-c", "1024"]);
    let prompt = "The history of the printing press, told in detail: ".repeat(12);
    let progress_of = |events: &[Value]| -> Vec<Value> {
        events
            .iter()
            .filter_map(|e| e.get("prompt_progress").cloned())
            .collect()
    };
    let ask = |path: &str, body: Value| {
        let (status, raw) =
            request(&server, "POST", path, Some(&body.to_string()), None).expect("response");
        assert_eq!(status, 200, "{raw}");
        events(&raw)
    };
    let native = json!({ "prompt": prompt, "n_predict": 4, "temperature": 0, "stream": true,
                         "return_progress": true, "timings_per_token": true, "cache_prompt": false });
    let first = ask("/completion", native.clone());
    let progress = progress_of(&first);
    let last = first.last().expect("the final chunk");
    let total = last["tokens_evaluated"].as_u64().expect("tokens_evaluated");
    assert!(
        total as usize > 2 * engine::model::MAX_BATCH,
        "a prompt of several passes"
    );
    assert_eq!(
        progress[0]["processed"], progress[0]["cache"],
        "before the first pass"
    );
    assert_eq!(
        progress.last().map(|p| &p["processed"]),
        Some(&json!(total))
    );
    let passes = (total as usize).div_ceil(engine::model::MAX_BATCH);
    assert_eq!(
        progress.len(),
        passes + 1,
        "once before, then after each pass"
    );
    for pair in progress.windows(2) {
        assert!(pair[1]["processed"].as_u64() > pair[0]["processed"].as_u64());
        assert_eq!(pair[1]["total"], json!(total));
    }
    // Every piece of text carries the timings so far; the count of generated tokens grows.
    let generated: Vec<u64> = first
        .iter()
        .filter(|e| e["content"].as_str().is_some_and(|c| !c.is_empty()) && e["stop"] == false)
        .map(|e| {
            e["timings"]["predicted_n"]
                .as_u64()
                .expect("timings on a piece")
        })
        .collect();
    assert!(
        !generated.is_empty() && generated.windows(2).all(|w| w[0] < w[1]),
        "{generated:?}"
    );
    // The same prompt again, reusing the cache: its first report says how much was kept.
    let mut again = native.clone();
    again["cache_prompt"] = json!(true);
    ask("/completion", again.clone());
    let reused = progress_of(&ask("/completion", again));
    assert!(
        reused[0]["cache"].as_u64().is_some_and(|c| c > 0),
        "{reused:?}"
    );
    assert_eq!(reused[0]["cache"], reused[0]["processed"]);
    // Without the flag, no progress.
    let mut quiet = native.clone();
    quiet["return_progress"] = json!(false);
    assert!(progress_of(&ask("/completion", quiet)).is_empty());
    // Chat, completions and responses streams report it too.
    for (path, body) in [
        (
            "/v1/chat/completions",
            chat(
                &prompt,
                json!({ "max_tokens": 2, "stream": true,
            "return_progress": true }),
            ),
        ),
        (
            "/v1/completions",
            json!({ "prompt": prompt, "max_tokens": 2, "stream": true,
            "return_progress": true }),
        ),
        (
            "/v1/responses",
            json!({ "input": prompt, "max_output_tokens": 2, "stream": true,
            "return_progress": true }),
        ),
    ] {
        let events = ask(path, body);
        let progress = progress_of(&events);
        assert!(progress.len() >= 2, "{path}: {progress:?}");
        assert_eq!(
            progress.last().map(|p| &p["processed"]),
            progress.last().map(|p| &p["total"])
        );
    }
}

/// llama.cpp's `/completion` conveniences: several prompts answered as a list, a prompt as
/// `{"prompt_string"}` (images refused), `response_fields`, and `truncated` when the answer
/// filled the context.
#[test]
fn completion_prompts_fields_and_truncation() {
    let server = start(&["-c", "64"]);
    let greedy = |prompt: Value| json!({ "prompt": prompt, "n_predict": 4, "temperature": 0 });
    let (status, one) = post(
        &server,
        "/completion",
        &greedy(json!("The capital of France is")),
    );
    assert_eq!(status, 200, "{one}");
    let (status, list) = post(
        &server,
        "/completion",
        &greedy(json!(["The capital of France is", "One, two, three,"])),
    );
    assert_eq!(status, 200, "{list}");
    let list = list.as_array().expect("a list of answers");
    assert_eq!(list.len(), 2);
    assert_eq!(
        list[0]["content"], one["content"],
        "each prompt answered as alone"
    );
    // Ids, a text and an object: three prompts, the same one each time.
    let (_, ids) = post(
        &server,
        "/tokenize",
        &json!({ "content": "The capital of France is" }),
    );
    let (status, mixed) = post(
        &server,
        "/completion",
        &greedy(json!([ids["tokens"], "The capital of France is",
                       { "prompt_string": "The capital of France is" }])),
    );
    assert_eq!(status, 200, "{mixed}");
    let mixed = mixed.as_array().expect("a list");
    assert!(
        mixed.len() == 3 && mixed.iter().all(|a| a["content"] == one["content"]),
        "{mixed:?}"
    );
    assert_eq!(
        (&list[0]["index"], &list[1]["index"]),
        (&json!(0), &json!(1))
    );
    let (status, object) = post(
        &server,
        "/completion",
        &greedy(json!({ "prompt_string": "The capital of France is" })),
    );
    assert_eq!(status, 200, "{object}");
    assert_eq!(object["content"], one["content"]);
    let (status, image) = post(
        &server,
        "/completion",
        &greedy(json!({ "prompt_string": "<__media__>", "multimodal_data": ["iVBORw0KGgo="] })),
    );
    assert_eq!(status, 400, "{image}");
    let mut fields = greedy(json!("The capital of France is"));
    fields["response_fields"] = json!(["content", "generation_settings/n_predict"]);
    let (_, picked) = post(&server, "/completion", &fields);
    assert_eq!(
        picked,
        json!({ "content": one["content"], "generation_settings/n_predict": 4 })
    );
    let mut many = greedy(json!("The capital of France is"));
    many["response_fields"] = json!(vec!["content"; 65]);
    let (status, refused) = post(&server, "/completion", &many);
    assert_eq!(status, 400, "{refused}");
    assert_eq!(one["truncated"], false);
    // Until the context is full: cut there, and said so.
    let (_, full) = post(
        &server,
        "/completion",
        &json!({ "prompt": "Count: 1, 2, 3,", "n_predict": -1, "temperature": 0,
                 "ignore_eos": true }),
    );
    assert_eq!(full["truncated"], true, "{full}");
    assert_eq!(
        full["tokens_evaluated"].as_u64().unwrap_or(0)
            + full["tokens_predicted"].as_u64().unwrap_or(0),
        64
    );
}

/// `--context-shift`: an answer longer than the context goes on past it, the older half after
/// the kept tokens dropped each time the context fills, and says it was truncated; whole and
/// streamed alike (the same greedy tokens).
#[test]
fn a_shifted_context_lets_an_answer_run_past_it() {
    let server = start(&["-c", "64", "--context-shift"]);
    let asked = |extra: Value| {
        let mut body = json!({ "prompt": "Count: 1, 2, 3,", "n_predict": 150, "temperature": 0,
                               "ignore_eos": true });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        body
    };
    let (status, long) = post(&server, "/completion", &asked(json!({})));
    assert_eq!(status, 200, "{long}");
    assert_eq!(
        long["tokens_predicted"], 150,
        "past the context of 64: {long}"
    );
    assert_eq!(long["truncated"], true);
    assert_eq!(long["tokens"].as_array().map(Vec::len), Some(150));
    let (status, raw) = request(
        &server,
        "POST",
        "/completion",
        Some(&asked(json!({ "stream": true })).to_string()),
        None,
    )
    .expect("response");
    assert_eq!(status, 200, "{raw}");
    let text: String = events(&raw)
        .iter()
        .filter_map(|e| e["content"].as_str())
        .collect();
    assert_eq!(text, long["content"].as_str().unwrap_or_default());
    // The whole prompt kept (`n_keep: -1`) still leaves room to shift.
    let (status, kept) = post(&server, "/completion", &asked(json!({ "n_keep": -1 })));
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["tokens_predicted"], 150);
    let (status, bad) = post(&server, "/completion", &asked(json!({ "n_keep": -2 })));
    assert_eq!(status, 400, "{bad}");
    // An answer without a limit of its own stops after a few contexts' worth.
    let (status, unbounded) = post(&server, "/completion", &asked(json!({ "n_predict": -1 })));
    assert_eq!(status, 200, "{unbounded}");
    let n = unbounded["tokens_predicted"].as_u64().unwrap_or(0);
    assert!((4 * 64..=5 * 64).contains(&n), "{n} tokens");
}

#[test]
fn prompts_as_tokens_ignore_eos_fingerprint_and_cached_tokens() {
    let server = start(&[]);
    let (_, tokens) = post(
        &server,
        "/tokenize",
        &json!({ "content": "The capital of France is", "with_pieces": true }),
    );
    let pieces = tokens["tokens"].as_array().expect("tokens");
    let joined: String = pieces.iter().filter_map(|p| p["piece"].as_str()).collect();
    assert_eq!(joined, "The capital of France is");
    let ids: Vec<Value> = pieces.iter().map(|p| p["id"].clone()).collect();
    let (_, back) = post(&server, "/detokenize", &json!({ "tokens": ids }));
    assert_eq!(back["content"], "The capital of France is");

    let by_text =
        json!({ "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0 });
    let by_ids = json!({ "prompt": ids, "max_tokens": 6, "temperature": 0 });
    let (_, a) = post(&server, "/v1/completions", &by_text);
    let (_, b) = post(&server, "/v1/completions", &by_ids);
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "{a} {b}");
    assert_eq!(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
    let (_, c) = post(
        &server,
        "/completion",
        &json!({ "prompt": [[ids[0]], ], "n_predict": 1 }),
    );
    assert!(c["content"].is_string(), "{c}");
    // Same prompt again: most of it comes from the prefix cache.
    assert!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{b}"
    );
    assert!(
        a["system_fingerprint"]
            .as_str()
            .is_some_and(|f| f.starts_with(&format!("b{}-", env!("CARGO_PKG_VERSION"))))
    );

    // Streamed, each chunk carries the tokens of its text: together the whole answer's.
    let body = json!({ "prompt": ids, "n_predict": 6, "temperature": 0, "stream": true });
    let (_, raw) = request(
        &server,
        "POST",
        "/completion",
        Some(&body.to_string()),
        None,
    )
    .expect("stream");
    let chunks = events(&raw);
    let (last, pieces) = chunks.split_last().expect("chunks");
    assert_eq!(last["stop"], true, "{raw}");
    let streamed: Vec<Value> = pieces
        .iter()
        .inspect(|c| assert!(c["tokens"].as_array().is_some_and(|t| !t.is_empty()), "{c}"))
        .flat_map(|c| c["tokens"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(json!(streamed), last["tokens"], "{raw}");
    let text: String = pieces
        .iter()
        .filter_map(|c| c["content"].as_str())
        .collect();
    assert_eq!(
        text,
        a["choices"][0]["text"].as_str().unwrap_or(""),
        "{raw}"
    );

    let (_, long) = post(
        &server,
        "/v1/chat/completions",
        &chat("Say hi.", json!({ "max_tokens": 40, "ignore_eos": true })),
    );
    assert_eq!(long["usage"]["completion_tokens"], 40, "{long}");
    assert_eq!(long["choices"][0]["finish_reason"], "length");
}

#[test]
fn llama_cpp_endpoints_and_its_context_error() {
    let server = start(&[]);
    let (status, props) = request(&server, "GET", "/props", None, None).expect("props");
    assert_eq!(status, 200);
    let props = json_body(&props);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 512);
    assert!(
        props["chat_template"]
            .as_str()
            .is_some_and(|t| t.contains("im_start"))
    );
    assert_eq!(props["total_slots"], 1);

    let messages = json!([{ "role": "user", "content": "Hello there" }]);
    let (_, applied) = post(&server, "/apply-template", &json!({ "messages": messages }));
    let prompt = applied["prompt"].as_str().expect("prompt");
    assert!(
        prompt.contains("Hello there") && prompt.ends_with("<|im_start|>assistant\n"),
        "{prompt}"
    );

    let (_, done) = post(
        &server,
        "/completion",
        &json!({ "prompt": "The capital of France is", "n_predict": 4, "temperature": 0 }),
    );
    assert_eq!(done["tokens"].as_array().map(Vec::len), Some(4), "{done}");
    assert_eq!(done["truncated"], false);
    assert_eq!(done["generation_settings"]["n_predict"], 4);
    assert_eq!(done["generation_settings"]["temperature"], 0.0);

    let (status, over) = post(
        &server,
        "/v1/completions",
        &json!({ "prompt": "word ".repeat(700), "max_tokens": 4 }),
    );
    assert_eq!(status, 400, "{over}");
    assert_eq!(over["error"]["type"], "exceed_context_size_error");
    assert_eq!(over["error"]["n_ctx"], 512);
    assert!(
        over["error"]["n_prompt_tokens"].as_u64().unwrap_or(0) > 512,
        "{over}"
    );

    // A completions stream with include_usage ends with a usage chunk of its own.
    let body = json!({ "prompt": "Hi", "max_tokens": 3, "stream": true,
                       "stream_options": { "include_usage": true } });
    let (_, raw) = request(
        &server,
        "POST",
        "/v1/completions",
        Some(&body.to_string()),
        None,
    )
    .expect("stream");
    let chunks = events(&raw);
    let n = chunks.len();
    assert_eq!(chunks[n - 1], json!("[DONE]"));
    assert_eq!(chunks[n - 2]["choices"], json!([]), "{raw}");
    assert_eq!(chunks[n - 2]["usage"]["completion_tokens"], 3);
    assert!(
        chunks[..n - 2].iter().all(|c| c.get("usage").is_none()),
        "{raw}"
    );
}

#[test]
fn server_defaults_and_assistant_prefill() {
    let dir = tempfile::tempdir().expect("dir");
    let template = dir.path().join("plain.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}",
    )
    .expect("template");
    let template = template.to_string_lossy().into_owned();
    let server = start(&[
        "--n-predict",
        "3",
        "--temp",
        "0",
        "--seed",
        "5",
        "--chat-template-file",
        &template,
    ]);
    let (_, applied) = post(
        &server,
        "/apply-template",
        &json!({ "messages": [{ "role": "user", "content": "Hi" }] }),
    );
    assert_eq!(applied["prompt"], "user: Hi\nassistant:");
    // Without the cue the prompt ends after the last turn, and the answer goes on from there.
    let hi = json!([{ "role": "user", "content": "Hi" }]);
    let (_, bare) = post(
        &server,
        "/apply-template",
        &json!({ "messages": hi, "add_generation_prompt": false }),
    );
    assert_eq!(bare["prompt"], "user: Hi\n");
    let (status, went_on) = post(
        &server,
        "/v1/chat/completions",
        &json!({ "messages": hi, "add_generation_prompt": false }),
    );
    let (_, reference) = post(&server, "/completion", &json!({ "prompt": "user: Hi\n" }));
    assert_eq!(status, 200, "{went_on}");
    assert_eq!(
        content(&went_on, 0),
        reference["content"].as_str().unwrap_or("?"),
        "{went_on}"
    );
    let (_, a) = post(
        &server,
        "/v1/chat/completions",
        &json!({ "messages": [{ "role": "user", "content": "Tell me a story." }], "ignore_eos": true }),
    );
    assert_eq!(a["usage"]["completion_tokens"], 3, "--n-predict: {a}");
    let (_, b) = post(
        &server,
        "/v1/chat/completions",
        &json!({ "messages": [{ "role": "user", "content": "Tell me a story." }], "ignore_eos": true }),
    );
    assert_eq!(content(&a, 0), content(&b, 0), "--temp 0 is greedy");
    let (_, props) = request(&server, "GET", "/props", None, None).expect("props");
    assert_eq!(
        json_body(&props)["default_generation_settings"]["params"]["seed"],
        5
    );
    drop(server);

    // A final assistant message is continued: the answer is what /completion gives for the
    // rendered prompt cut after that message.
    let server = start(&[]);
    let question = json!({ "role": "user", "content": "What is the capital of France?" });
    let begun = "The capital of France is";
    let (_, cue) = post(
        &server,
        "/apply-template",
        &json!({ "messages": [question] }),
    );
    let prefix = format!("{}{begun}", cue["prompt"].as_str().expect("prompt"));
    let (_, continued) = post(
        &server,
        "/v1/chat/completions",
        &json!({ "messages": [question, { "role": "assistant", "content": begun }], "max_tokens": 6, "temperature": 0 }),
    );
    let (_, reference) = post(
        &server,
        "/completion",
        &json!({ "prompt": prefix, "n_predict": 6, "temperature": 0 }),
    );
    assert_eq!(
        content(&continued, 0),
        reference["content"].as_str().unwrap_or("?"),
        "{continued}"
    );
    // Asked for by name (llama.cpp's and vLLM's fields), the same; asked with the cue on, or
    // of a message that is not the assistant's, a 400 that says why.
    let messages = json!([question, { "role": "assistant", "content": begun }]);
    let (status, asked) = post(
        &server,
        "/v1/chat/completions",
        &json!({ "messages": messages, "max_tokens": 6, "temperature": 0,
                 "continue_final_message": true, "add_generation_prompt": false }),
    );
    assert_eq!(status, 200, "{asked}");
    assert_eq!(content(&asked, 0), content(&continued, 0));
    // An empty message to continue is the answer's start: answered as the question alone is.
    let (status, empty) = post(
        &server,
        "/v1/chat/completions",
        &json!({ "messages": [question, { "role": "assistant", "content": "" }],
                 "max_tokens": 6, "temperature": 0,
                 "continue_final_message": true, "add_generation_prompt": false }),
    );
    let (_, answered) = post(
        &server,
        "/v1/chat/completions",
        &json!({ "messages": [question], "max_tokens": 6, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{empty}");
    assert_eq!(content(&empty, 0), content(&answered, 0), "{empty}");
    for (body, named) in [
        (
            json!({ "messages": messages, "continue_final_message": true }),
            "add_generation_prompt",
        ),
        (
            json!({ "messages": [question], "continue_final_message": true,
                    "add_generation_prompt": false }),
            "the assistant's",
        ),
        (
            json!({ "messages": messages, "continue_final_message": "reasoning_content",
                    "add_generation_prompt": false }),
            "reasoning_content",
        ),
    ] {
        let (status, refused) = post(&server, "/v1/chat/completions", &body);
        assert_eq!(status, 400, "{body}: {refused}");
        assert!(refused.to_string().contains(named), "{refused}");
    }
}

#[test]
fn what_is_not_implemented_is_refused_by_name() {
    let server = start(&[]);
    let tool = json!([{ "type": "function", "function": { "name": "f", "parameters": {} } }]);
    let image = json!([{ "role": "user", "content": [{ "type": "image_url", "image_url": { "url": "data:," } }] }]);
    let cases = [
        (
            "/v1/completions",
            json!({ "prompt": "hi", "tools": tool }),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({ "messages": image }),
            "image_url",
        ),
        (
            "/v1/completions",
            json!({ "prompt": "hi", "echo": true }),
            "echo",
        ),
        (
            "/v1/completions",
            json!({ "prompt": "hi", "suffix": "end" }),
            "suffix",
        ),
        ("/v1/completions", json!({ "prompt": ["a", "b"] }), "prompt"),
        (
            "/completion",
            json!({ "prompt": "hi", "mirostat": 2 }),
            "mirostat",
        ),
    ];
    for (path, body, field) in cases {
        let (status, answer) = post(&server, path, &body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field)),
            "the refusal names {field}: {answer}"
        );
    }
}

/// The exposition parsed by Python's `prometheus_client`: `{name: {type, samples}}`.
fn scrape(server: &Server) -> Value {
    let (status, text) = request(server, "GET", "/metrics", None, None).expect("metrics");
    assert_eq!(status, 200, "{text}");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/clients/prom_parse.py"
    );
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "prometheus_client refused the exposition:\n{text}"
    );
    serde_json::from_slice(&out.stdout).expect("parser output")
}

fn sample(metrics: &Value, family: &str, sample: &str) -> f64 {
    metrics[family]["samples"]
        .as_array()
        .and_then(|s| s.iter().find(|x| x["name"] == sample))
        .and_then(|x| x["value"].as_f64())
        .unwrap_or_else(|| panic!("no sample {sample} in {family}: {metrics}"))
}

#[test]
fn metrics_count_what_requests_did() {
    let server = start(&[]);
    let before = scrape(&server);
    assert_eq!(
        before["llamacpp:prompt_tokens"]["type"], "counter",
        "{before}"
    );
    let (_, answer) = post(
        &server,
        "/v1/completions",
        &json!({ "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "ignore_eos": true }),
    );
    let after = scrape(&server);
    let grew = |family: &str, sample_name: &str| {
        sample(&after, family, sample_name) - sample(&before, family, sample_name)
    };
    assert_eq!(
        grew(
            "llamacpp:tokens_predicted",
            "llamacpp:tokens_predicted_total"
        ),
        answer["usage"]["completion_tokens"]
            .as_f64()
            .unwrap_or(-1.0)
    );
    assert_eq!(
        grew("llamacpp:prompt_tokens", "llamacpp:prompt_tokens_total"),
        answer["usage"]["prompt_tokens"].as_f64().unwrap_or(-1.0)
    );
    assert_eq!(
        sample(
            &after,
            "llamacpp:requests_processing",
            "llamacpp:requests_processing"
        ),
        0.0
    );
    assert_eq!(
        sample(
            &after,
            "llamacpp:requests_deferred",
            "llamacpp:requests_deferred"
        ),
        0.0
    );
    assert_eq!(
        grew(
            "engine_time_to_first_token_seconds",
            "engine_time_to_first_token_seconds_count"
        ),
        1.0
    );
    assert_eq!(
        grew(
            "engine_inter_token_latency_seconds",
            "engine_inter_token_latency_seconds_count"
        ),
        19.0
    );
    assert!(
        sample(
            &after,
            "engine_decode_tokens_per_second",
            "engine_decode_tokens_per_second"
        ) > 0.0
    );
}

/// The suite written against llama.cpp's own server, run against ours.
#[test]
fn the_llama_cpp_compatibility_suite_passes() {
    let server = start(&[
        "--api-key",
        "suite-key",
        "--cors-origins",
        "http://localhost:5173",
        "-c",
        "2048",
        "--slots",
    ]);
    // `--slots`: the one slot, its context the whole, idle; behind the key.
    let key = "Authorization: Bearer suite-key\r\n";
    let (status, _, slots) = exchange(server.port, "GET", "/slots", key, "");
    assert_eq!(status, 200, "{slots}");
    let slots = json_body(&slots);
    assert_eq!(slots.as_array().map(Vec::len), Some(1), "{slots}");
    assert_eq!(slots[0]["n_ctx"], 2048);
    assert_eq!(slots[0]["is_processing"], false);
    assert!(slots[0].get("params").is_none());
    let (status, _, _) = exchange(server.port, "GET", "/slots", "", "");
    assert_eq!(status, 401);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/compat_suite.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--base", &format!("http://127.0.0.1:{}", server.port)])
        .args([
            "--api-key",
            "suite-key",
            "--cors-origin",
            "http://localhost:5173",
            "--cors-disallowed-origin",
            "http://elsewhere.example",
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
