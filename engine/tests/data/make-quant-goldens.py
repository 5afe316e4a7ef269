#!/usr/bin/env python3
"""Writes quant-goldens.json: raw blocks of every tensor type the engine reads, with the values
llama.cpp's own gguf-py dequantizes them to. The engine's scalar reference is tested against it.

Blocks come from the real models where they have the type (SmolLM2 Q4_1/Q8_0, Gemma 3 Q4_K/Q5_0/
Q6_K/Q8_0), from gguf-py's quantizer where it has one, and otherwise from seeded random bytes with
sane f16 scales. Usage: pip install gguf numpy; make-quant-goldens.py SMOLLM2.gguf GEMMA3.gguf
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

BLOCKS = 6
rng = np.random.default_rng(20261129)


def real_blocks(readers, ty):
    for r in readers:
        for t in r.tensors:
            if t.tensor_type == ty:
                block_bytes = GGML_QUANT_SIZES[ty][1]
                raw = np.asarray(t.data).view(np.uint8).reshape(-1)
                start = (raw.size // block_bytes // 2) * block_bytes  # from the middle of the tensor
                return raw[start:start + BLOCKS * block_bytes].tobytes()
    return None


def random_blocks(ty, scale_offsets):
    block_elems, block_bytes = GGML_QUANT_SIZES[ty]
    raw = bytearray(rng.integers(0, 256, size=BLOCKS * block_bytes, dtype=np.uint8).tobytes())
    for b in range(BLOCKS):
        for off in scale_offsets:
            scale = np.float16(rng.uniform(-0.05, 0.05)).view(np.uint16)
            raw[b * block_bytes + off:b * block_bytes + off + 2] = int(scale).to_bytes(2, "little")
    return bytes(raw)


def quantized(ty):
    values = rng.normal(0.0, 1.0, size=BLOCKS * GGML_QUANT_SIZES[ty][0]).astype(np.float32)
    return quants.quantize(values.reshape(1, -1), ty).tobytes()


def main():
    readers = [GGUFReader(p) for p in sys.argv[1:]]
    out = []
    sources = {
        T.F32: lambda: rng.normal(0, 1, size=BLOCKS * 8).astype(np.float32).tobytes(),
        T.F16: lambda: rng.normal(0, 1, size=BLOCKS * 8).astype(np.float16).tobytes(),
        T.BF16: lambda: quantized(T.BF16),
        T.Q4_0: lambda: quantized(T.Q4_0),
        T.Q4_1: lambda: real_blocks(readers, T.Q4_1),
        T.Q5_0: lambda: real_blocks(readers, T.Q5_0),
        T.Q5_1: lambda: quantized(T.Q5_1),
        T.Q8_0: lambda: real_blocks(readers, T.Q8_0),
        T.Q4_K: lambda: real_blocks(readers, T.Q4_K),
        T.Q5_K: lambda: random_blocks(T.Q5_K, [0, 2]),
        T.Q6_K: lambda: real_blocks(readers, T.Q6_K),
        T.IQ4_NL: lambda: random_blocks(T.IQ4_NL, [0]),
    }
    for ty, make in sources.items():
        raw = make()
        if raw is None:
            sys.exit(f"no {ty.name} tensor in the given models")
        if ty in (T.F32, T.F16, T.BF16):
            width = {T.F32: np.float32, T.F16: np.float16, T.BF16: None}[ty]
            values = (quants.dequantize(np.frombuffer(raw, dtype=np.uint8), ty) if width is None
                      else np.frombuffer(raw, dtype=width).astype(np.float32))
        else:
            values = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), ty)
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        out.append({"type": ty.name, "id": int(ty), "bytes": raw.hex(),
                    "values": [float(v) for v in values]})
    json.dump(out, sys.stdout, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
