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
})();
