#!/usr/bin/env python3
"""A float64 model of a llama-architecture GGUF checkpoint held against memra's logits.

A measurement aid, not a gate and not part of any test: it answers "how far are memra's
logits from the exact model of the quantized weights". The float64 model is independent of
memra's code: gguf-py (llama.cpp's own reader) parses the file, this script dequantizes every
block exactly in float64 (Q4_0 `d·(q−8)`, Q4_1 `d·q + m`, Q8_0 `d·q`, f16/f32 widened) and
runs the llama forward pass in float64 with no activation quantization: rmsnorm, "normal"
RoPE (adjacent pairs, `pos·base^(−2i/head_dim)`), causal grouped-query attention with an
exact softmax, SwiGLU, the tied or untied output head. memra's side is
`memra-engine dump` (CPU backend unless MEMRA_BACKEND says otherwise, default doors); the
tokens come from `memra-engine tokenize`, so both sides see the same ids.

Reports, over every position of every prompt: how often memra's argmax equals the float64
model's, and |Δlogit| at the float64 model's five largest logits of each position (median
and max).

Needs numpy and gguf (`pip install numpy gguf`).

Usage: scripts/f64-logits.py MEMRA_ENGINE_BINARY MODEL.gguf [PROMPT...]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n <= 1:\n        return n",
    "Once upon a time, in a small village,",
    "1 + 1 = 2, 2 + 2 = 4, 3 + 3 =",
]


def f16(raw):
    return raw.view(np.float16).astype(np.float64)


def dequantize(t):
    """The tensor's values in float64, shape (ne1, ne0) (or (ne0,) for vectors)."""
    kind = t.tensor_type.name
    raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
    if kind == "F32":
        v = raw.view(np.float32).astype(np.float64)
    elif kind == "F16":
        v = f16(raw)
    elif kind in ("Q4_0", "Q4_1", "Q8_0"):
        size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
        b = raw.reshape(-1, size)
        d = f16(b[:, 0:2].copy().reshape(-1))[:, None]
        if kind == "Q8_0":
            v = d * b[:, 2:].view(np.int8).astype(np.float64)
        else:
            qs = b[:, size - 16 :]
            q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
            if kind == "Q4_0":
                v = d * (q - 8.0)
            else:
                m = f16(b[:, 2:4].copy().reshape(-1))[:, None]
                v = d * q + m
        v = v.reshape(-1)
    else:
        sys.exit(f"f64-logits: tensor {t.name} has type {kind}, which this script does not read")
    ne = [int(n) for n in t.shape]
    return v.reshape(ne[::-1]) if len(ne) > 1 else v


class Model:
    def __init__(self, path):
        r = GGUFReader(path)

        def field(name):
            f = r.fields[name]
            return f.parts[f.data[0]][0]

        self.n_layer = int(field("llama.block_count"))
        self.n_head = int(field("llama.attention.head_count"))
        self.n_kv = int(field("llama.attention.head_count_kv"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.base = float(field("llama.rope.freq_base"))
        self.w = {t.name: dequantize(t) for t in r.tensors}
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def norm(self, x, g):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x, hd):
        # x: [T, heads, hd]; adjacent pairs (2i, 2i+1).
        t = x.shape[0]
        i = np.arange(hd // 2, dtype=np.float64)
        theta = np.arange(t, dtype=np.float64)[:, None] * self.base ** (-2.0 * i / hd)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = a * c - b * s
        y[..., 1::2] = a * s + b * c
        return y

    def logits(self, tokens):
        w = self.w
        x = w["token_embd.weight"][tokens]
        t = len(tokens)
        for layer in range(self.n_layer):
            p = f"blk.{layer}."
            h = self.norm(x, w[p + "attn_norm.weight"])
            q = h @ w[p + "attn_q.weight"].T
            k = h @ w[p + "attn_k.weight"].T
            v = h @ w[p + "attn_v.weight"].T
            hd = q.shape[1] // self.n_head
            q = self.rope(q.reshape(t, self.n_head, hd), hd)
            k = self.rope(k.reshape(t, self.n_kv, hd), hd)
            v = v.reshape(t, self.n_kv, hd)
            group = self.n_head // self.n_kv
            k = np.repeat(k, group, axis=1)
            v = np.repeat(v, group, axis=1)
            sc = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
            sc = np.where(np.tril(np.ones((t, t), dtype=bool))[None], sc, -np.inf)
            sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
            sc /= sc.sum(axis=-1, keepdims=True)
            o = np.einsum("hts,shd->thd", sc, v).reshape(t, -1)
            x = x + o @ w[p + "attn_output.weight"].T
            h = self.norm(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
        return self.norm(x, w["output_norm.weight"]) @ self.out.T


def read_logits(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    meta = header["logits"]
    a, b = meta["data_offsets"]
    return np.frombuffer(data[a:b], dtype="<f4").reshape(meta["shape"]).astype(np.float64)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    engine, model_path = sys.argv[1], sys.argv[2]
    prompts = sys.argv[3:] or PROMPTS
    model = Model(model_path)
    agree, total, deltas = 0, 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for n, prompt in enumerate(prompts):
            ids = json.loads(
                subprocess.run(
                    [engine, "tokenize", "--text", prompt, model_path],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            out = os.path.join(tmp, f"{n}.safetensors")
            subprocess.run(
                [engine, "dump", model_path, "--tokens", ",".join(map(str, ids)), "--out", out],
                check=True,
                capture_output=True,
            )
            mine = read_logits(out)
            exact = model.logits(np.array(ids))
            top = np.argsort(-exact, axis=1)[:, :5]
            rows = np.arange(len(ids))[:, None]
            d = np.abs(mine[rows, top] - exact[rows, top])
            a = int((mine.argmax(axis=1) == exact.argmax(axis=1)).sum())
            agree += a
            total += len(ids)
            deltas.extend(d.reshape(-1).tolist())
            print(
                f"{json.dumps(prompt)}: {len(ids)} positions, argmax {a}/{len(ids)}, "
                f"top-5 |dlogit| median {np.median(d):.3f} max {d.max():.3f}"
            )
    deltas = np.array(deltas)
    print(
        f"all: argmax {agree}/{total}, top-5 |dlogit| median {np.median(deltas):.3f} "
        f"max {deltas.max():.3f}"
    )


if __name__ == "__main__":
    main()
