// The overview's live part: every value and chart from the server-sent events, and the chat box.
// Text goes in with textContent; only the server-rendered (escaped) chart SVG uses innerHTML.
"use strict";

(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const state = document.getElementById("live-state");
  const seq = document.getElementById("live-seq");

  function apply(update) {
    for (const field of update.fields) {
      const el = document.getElementById(field.id);
      if (!el) continue;
      el.textContent = field.text;
      if (field.level) el.className = "lvl-" + field.level;
    }
    for (const [name, svg] of update.charts) {
      const el = document.getElementById("chart-" + name);
      if (el) el.innerHTML = svg;
    }
    seq.textContent = String(update.sample.seq);
    state.textContent = "at " + new Date(update.sample.unix_ms).toLocaleTimeString();
    document.body.dataset.liveSeq = String(update.sample.seq);
  }

  const events = new EventSource("/events");
  events.addEventListener("update", (e) => apply(JSON.parse(e.data)));
  events.addEventListener("error", () => { state.textContent = "reconnecting…"; });

  const form = document.getElementById("chat-form");
  const input = document.getElementById("chat-input");
  const reply = document.getElementById("chat-reply");
  const send = document.getElementById("chat-send");
  const think = document.getElementById("chat-think");
  const toolsBox = document.getElementById("chat-tools");
  const thinking = document.getElementById("chat-thinking");
  const reasoning = document.getElementById("chat-reasoning");
  const calls = document.getElementById("chat-calls");
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const message = input.value.trim();
    if (!message) return;
    const question = { message, thinking: think.checked,
      must_call: document.getElementById("chat-must-call").checked };
    if (toolsBox.value.trim()) {
      try {
        question.tools = JSON.parse(toolsBox.value);
      } catch (err) {
        reply.textContent = "The tools are not JSON: " + err.message;
        reply.dataset.done = "error";
        return;
      }
    }
    send.disabled = true;
    reply.textContent = "…";
    thinking.hidden = true;
    calls.hidden = true;
    try {
      const response = await fetch("/api/chat", {
        method: "POST",
        headers: { "content-type": "application/json", "x-csrf-token": csrf },
        body: JSON.stringify(question),
      });
      if (response.ok) {
        const answer = await response.json();
        reply.textContent = answer.reply;
        reasoning.textContent = answer.reasoning || "";
        thinking.hidden = !answer.reasoning;
        calls.textContent = (answer.tool_calls || [])
          .map((c) => "Calls " + c.name + " with " + c.arguments).join("\n");
        calls.hidden = !(answer.tool_calls || []).length;
        reply.dataset.done = "ok";
      } else {
        reply.textContent = "Error " + response.status + ": " + (await response.text());
        reply.dataset.done = "error";
      }
    } catch (err) {
      reply.textContent = "Error: " + err;
      reply.dataset.done = "error";
    } finally {
      send.disabled = false;
    }
  });

  // An update bundle: sent as the request body, then RAUC's progress polled until it ends.
  const updateForm = document.getElementById("update-form");
  if (updateForm) {
    const file = document.getElementById("update-file");
    const progress = document.getElementById("update-progress");
    const button = document.getElementById("update-send");
    const poll = async () => {
      const response = await fetch("/api/update");
      if (!response.ok) return;
      const p = await response.json();
      const last = p.error ? "failed: " + p.error : p.done ? p.done : "";
      progress.textContent = p.lines.join("\n") + (last ? "\n" + last : "");
      if (p.running) setTimeout(poll, 1000);
      else button.disabled = false;
    };
    updateForm.addEventListener("submit", async (e) => {
      e.preventDefault();
      if (!file.files.length) return;
      button.disabled = true;
      progress.textContent = "uploading " + file.files[0].name + "…";
      try {
        const response = await fetch("/api/update", {
          method: "POST",
          headers: { "content-type": "application/octet-stream", "x-csrf-token": csrf },
          body: file.files[0],
        });
        if (response.ok) {
          poll();
        } else {
          progress.textContent = "Error " + response.status + ": " + (await response.text());
          button.disabled = false;
        }
      } catch (err) {
        progress.textContent = "Error: " + err;
        button.disabled = false;
      }
    });
  }

  // Models: a switch or a removal through the API, then the page reloaded; an upload sends the
  // signed manifest, then each missing chunk of each file (a push that broke off resumes).
  const modelProgress = document.getElementById("model-progress");
  const say = (text) => {
    if (modelProgress) modelProgress.textContent = text;
  };
  const api = (method, path, body, type) =>
    fetch(path, {
      method,
      headers: { "content-type": type || "application/json", "x-csrf-token": csrf },
      body,
    });
  const failed = async (response) => "Error " + response.status + ": " + (await response.text());
  for (const button of document.querySelectorAll(".model-use")) {
    button.addEventListener("click", async () => {
      const id = button.dataset.id;
      say("switching to " + id + "…");
      const response = await api("POST", "/api/models/use", JSON.stringify({ id }));
      if (!response.ok) return say(await failed(response));
      if (response.status === 200) return location.reload();
      const { request } = await response.json();
      const wait = async () => {
        const list = await (await fetch("/api/models")).json();
        const outcome = list.history.find((s) => s.request === request);
        if (!outcome) return setTimeout(wait, 1000);
        say(outcome.result + ": " + outcome.reason);
        setTimeout(() => location.reload(), 2000);
      };
      wait();
    });
  }
  for (const button of document.querySelectorAll(".model-rm")) {
    button.addEventListener("click", async () => {
      const response = await api("DELETE", "/api/models/" + encodeURIComponent(button.dataset.id));
      if (!response.ok) return say(await failed(response));
      location.reload();
    });
  }
  const modelForm = document.getElementById("model-form");
  if (modelForm) {
    const pick = (id) => document.getElementById(id).files[0];
    modelForm.addEventListener("submit", async (e) => {
      e.preventDefault();
      const manifest = pick("model-manifest");
      const signature = pick("model-signature");
      const files = [pick("model-weights"), pick("model-draft")].filter(Boolean);
      if (!manifest || !signature || !files.length) return say("choose the manifest, its signature and the weights");
      const send = document.getElementById("model-send");
      send.disabled = true;
      try {
        const body = JSON.stringify({ manifest: await manifest.text(), signature: await signature.text() });
        let response = await api("POST", "/api/models/push", body);
        if (!response.ok) return say(await failed(response));
        let state = await response.json();
        for (;;) {
          const index = state.parts.findIndex((p) => p.missing.length > 0);
          if (index < 0) break;
          const part = state.parts[index];
          const file = files[index];
          if (!file) return say("this model has a draft head: choose its file too");
          const start = part.missing[0] * part.chunk_size;
          const chunk = file.slice(start, Math.min(start + part.chunk_size, part.size));
          const path = "/api/models/incoming/" + encodeURIComponent(state.id) + "/" + part.part + "/" + part.missing[0];
          response = await api("PUT", path, chunk, "application/octet-stream");
          if (!response.ok) return say(await failed(response));
          state = await response.json();
          const got = state.parts.reduce((n, p) => n + p.size - p.missing.length * p.chunk_size, 0);
          const all = state.parts.reduce((n, p) => n + p.size, 0);
          say("uploaded " + Math.round((100 * got) / all) + "%");
        }
        say(state.id + " installed; use it from the list");
        setTimeout(() => location.reload(), 2000);
      } catch (err) {
        say("Error: " + err + " (upload again to resume)");
      } finally {
        send.disabled = false;
      }
    });
  }
})();
