"""Safetensors files, written and read by hand: an 8-byte little-endian header length, the
JSON header (``{"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},…}``, padded
with spaces to a multiple of 8 bytes, as the format allows, so the data starts aligned),
then each tensor's little-endian bytes, in sorted-name order.

Not the `safetensors` package: this module needs numpy alone, and writes bfloat16 without
torch (`BF16`), which that package cannot do from numpy.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from .arrays import as_raw, bf16_to_float32

# safetensors dtype name -> little-endian numpy dtype (BF16 as its bit patterns).
_NUMPY = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
_METADATA = "__metadata__"
# The safetensors crate refuses larger headers.
_MAX_HEADER = 100_000_000


def encode(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file holding `tensors` (see the module's docstring)."""
    import numpy as np

    header: dict[str, Any] = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise TypeError(f"safetensors metadata maps strings to strings; not {bad[0]!r}")
        header[_METADATA] = dict(metadata)
    blobs = []
    offset = 0
    for name in sorted(tensors):
        if not isinstance(name, str) or not name or name == _METADATA:
            raise ValueError(f"{name!r} cannot name a tensor")
        dtype, array = as_raw(tensors[name])
        data = np.asarray(array).astype(_NUMPY[dtype], copy=False).tobytes(order="C")
        header[name] = {
            "dtype": dtype,
            "shape": [int(n) for n in np.shape(array)],
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text, *blobs])


def save_file(
    path: os.PathLike[str] | str,
    tensors: dict[str, Any],
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes `tensors` (numpy arrays, torch tensors or `BF16`, by name) to `path`."""
    data = encode(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)


def decode(data: bytes, where: str = "safetensors data", raw: bool = False) -> dict[str, Any]:
    """The tensors in the bytes of a safetensors file, by name (see `load_file`)."""
    import numpy as np

    def bad(why: str) -> ValueError:
        return ValueError(f"{where}: not a safetensors file: {why}")

    if len(data) < 8:
        raise bad(f"{len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise bad(f"a header of {n} bytes in a file of {len(data)}")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except ValueError as e:
        raise bad(f"the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    body = memoryview(data)[8 + n :]
    out: dict[str, Any] = {}
    for name in sorted(k for k in header if k != _METADATA):
        entry = header[name]
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name!r} lacks dtype, shape or data_offsets") from None
        if dtype not in _NUMPY:
            raise bad(f"tensor {name!r} has dtype {dtype!r}; known: {', '.join(_NUMPY)}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r} has shape {shape!r}")
        count = 1
        for d in shape:
            count *= d
        want = count * np.dtype(_NUMPY[dtype]).itemsize
        if not (0 <= start <= end <= len(body)) or end - start != want:
            raise bad(
                f"tensor {name!r} ({dtype} {shape}) has data_offsets [{start}, {end}] "
                f"for {want} bytes in a body of {len(body)}"
            )
        chunk = bytes(body[start:end])
        if raw:
            out[name] = (dtype, tuple(shape), chunk)
            continue
        array = np.frombuffer(chunk, dtype=_NUMPY[dtype]).reshape(shape)
        if dtype == "BF16":
            array = bf16_to_float32(array)
        out[name] = array.astype(array.dtype.newbyteorder("="), copy=True)
    return out


def load_file(path: os.PathLike[str] | str, raw: bool = False) -> dict[str, Any]:
    """The tensors of a safetensors file as numpy arrays, by name (BF16 widened to
    float32); with ``raw=True`` each as ``(dtype_name, shape, bytes)`` instead."""
    with open(path, "rb") as f:
        data = f.read()
    return decode(data, os.fspath(path), raw)
