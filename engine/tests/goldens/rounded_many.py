#!/usr/bin/env python3
"""The float64 model of exact_forward.py with one rounding put back: the input of every matrix
product quantized to 8-bit blocks of 32 as ggml (and the engine) does for Q4_1 and Q8_0 weights
(Q8_1 and Q8_0 activations: an f32 scale from the block's largest value, rounded to f16, values
rounded to nearest; Q8_1 also keeps the block's sum times its scale in f16 for the weights'
offsets). Scored on exact_many.py's sequences like the engine is, it says how far from the
exact values that rounding alone puts a model: the bound goldens.rs holds the engine to.

Usage: rounded_many.py MODEL.gguf MANY.exact.json (SmolLM2: Q4_1 with a Q8_0 head)
"""
import json
import sys

import numpy as np

import exact_forward
from exact_forward import Weights, forward


def f16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def blocks(w, name):
    """(the weight's d·q, its per-block offsets m or None) for Q4_1 and Q8_0 rows."""
    t = w.tensors[name]
    raw = np.asarray(t.data, dtype=np.uint8)
    rows = raw.shape[0]
    kind = t.tensor_type.name
    if kind == "Q4_1":
        b = raw.reshape(rows, -1, 20)
        d = b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
        m = b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        nibbles = b[:, :, 4:20]
        q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=2).astype(np.float64)
        return (d[..., None] * q).reshape(rows, -1), m
    if kind == "Q8_0":
        b = raw.reshape(rows, -1, 34)
        d = b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
        q = b[:, :, 2:34].copy().view(np.int8).astype(np.float64)
        return (d[..., None] * q).reshape(rows, -1), None
    sys.exit(f"{name}: {kind} is not written here (Q4_1, Q8_0)")


CACHE = {}


def rounded_product(w, x, name):
    if name not in CACHE:
        CACHE[name] = blocks(w, name)
    scaled, offsets = CACHE[name]
    x32 = x.astype(np.float32)
    t, n = x32.shape
    b = x32.reshape(t, n // 32, 32)
    amax = np.abs(b).max(axis=2)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((b * inverse[..., None]).astype(np.float32)), -128, 127)
    y = (f16(d)[..., None] * q.astype(np.float64)).reshape(t, n) @ scaled.T
    if offsets is not None:
        sums = f16((d * q.sum(axis=2).astype(np.float32)).astype(np.float32))
        y = y + sums @ offsets.T
    return y


def main():
    model, many = sys.argv[1:3]
    exact_forward.product = rounded_product
    weights = Weights(model)
    data = json.load(open(many))
    distances = []
    for s in data["sequences"]:
        lp = forward(weights, s["ids"][:-1])
        for g, top in enumerate(s["exact_top"]):
            row = lp[s["from"] + g]
            distances.extend(abs(row[t] - exact) for t, exact in top)
    d = np.array(distances)
    print(f"{len(d)} entries: mean {d.mean():.4f}, over 0.5 nats {(d > 0.5).mean():.4f}, "
          f"over 1 nat {(d > 1).mean():.5f}, worst {d.max():.3f}")


if __name__ == "__main__":
    main()
