"""Cross-checks memra's GGUF files against llama.cpp's own Python package `gguf` (gguf-py).

Usage: python3 gguf_py_check.py F32_FILE QUANT_FILE...
       python3 gguf_py_check.py --dequant FILE TENSOR...

For each QUANT_FILE (a synthetic checkpoint of the same preset and seed as F32_FILE), every
tensor is read with gguf-py's GGUFReader, and the f32 values of F32_FILE are quantized with
gguf-py's reference quantizers (`gguf.quants.quantize`) to the tensor's type: the bytes must
be identical. Prints one JSON line per file; exits 1 on any mismatch, 2 when gguf-py is
missing (the caller skips).

With --dequant, prints a JSON object mapping each TENSOR of FILE to the sha256 of its values
dequantized by gguf-py (`gguf.quants.dequantize`) as little-endian f32, plus its type and
shape as gguf-py reads them.
"""
import hashlib
import json
import sys

try:
    import numpy as np
    from gguf import GGUFReader, GGMLQuantizationType
    from gguf import quants
except ImportError as e:  # pragma: no cover - environment dependent
    print(f"gguf-py not importable: {e}", file=sys.stderr)
    sys.exit(2)


def tensors(path):
    r = GGUFReader(path)
    out = {}
    for t in r.tensors:
        out[t.name] = t
    return r, out


def dequant(path, names):
    _, ts = tensors(path)
    out = {}
    for name in names:
        t = ts[name]
        values = quants.dequantize(np.asarray(t.data), t.tensor_type).astype("<f4")
        out[name] = {
            "type": t.tensor_type.name,
            "shape": [int(d) for d in t.shape],
            "offset": int(t.data_offset),
            "sha256": hashlib.sha256(values.tobytes()).hexdigest(),
        }
    print(json.dumps(out))


def main():
    if sys.argv[1] == "--dequant":
        dequant(sys.argv[2], sys.argv[3:])
        return
    f32_path, *quant_paths = sys.argv[1:]
    _, ref = tensors(f32_path)
    failed = False
    for path in quant_paths:
        reader, ts = tensors(path)
        checked = 0
        mismatches = []
        for name, t in ts.items():
            src = ref[name]
            assert src.tensor_type == GGMLQuantizationType.F32, name
            values = np.asarray(src.data, dtype=np.float32).reshape(-1, int(src.shape[0]))
            if t.tensor_type == GGMLQuantizationType.F32:
                want = values.tobytes()
            elif t.tensor_type == GGMLQuantizationType.F16:
                want = values.astype(np.float16).tobytes()
            else:
                want = quants.quantize(values, t.tensor_type).tobytes()
            got = np.asarray(t.data).tobytes()
            if got != want:
                a = np.frombuffer(got, dtype=np.uint8)
                b = np.frombuffer(want, dtype=np.uint8)
                first = int(np.argmax(a != b)) if len(a) == len(b) else -1
                mismatches.append({"tensor": name, "type": t.tensor_type.name, "first_byte": first})
            checked += 1
        fields = {k: reader.fields[k].types[0].name for k in ("general.architecture", "llama.block_count")}
        print(json.dumps({"file": path, "tensors": checked, "mismatches": mismatches[:5], "fields": fields}))
        failed |= bool(mismatches)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
