"""Arrays as the gate library takes them: numpy arrays, anything numpy reads, torch
tensors (any device; bfloat16 included) and `BF16`, a bfloat16 array for numpy, which has
no such dtype.

numpy is imported when an array is first handled, and torch never: a torch tensor is
recognised by its type, so a gate without torch never loads it.
"""

from __future__ import annotations

from typing import Any

# numpy dtype name -> safetensors dtype name.
_SAFETENSORS = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}


def _np():
    import numpy

    return numpy


def is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def _torch_bf16_bits(t: Any):
    import torch  # already loaded: `t` is one of its tensors

    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(_np().uint16)


def bf16_bits(values: Any):
    """float32 values rounded to bfloat16, as uint16 bit patterns: to nearest, ties to
    even (torch's rounding); NaN becomes the quiet NaN 0x7FC0, keeping it a NaN where
    plain truncation could turn a NaN into an infinity."""
    np = _np()
    f = np.array(values, dtype=np.float32, order="C")
    u = f.view(np.uint32)
    bias = np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    rounded = ((u + bias) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded).astype(np.uint16)


def bf16_to_float32(bits: Any):
    """bfloat16 bit patterns widened to float32 (exact)."""
    np = _np()
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


class BF16:
    """A bfloat16 array: its 16-bit patterns in `bits` (a uint16 numpy array).

    ``BF16(values)`` rounds float values to bfloat16 (float64 through float32 first, as
    torch does; see `bf16_bits`); a torch bfloat16 tensor keeps its bits.
    ``BF16.from_bits(u16)`` takes bit patterns as they are. numpy reads it as float32
    (``np.asarray(BF16(...))``), which holds every bfloat16 value exactly.
    """

    __slots__ = ("bits",)

    def __init__(self, values: Any):
        if isinstance(values, BF16):
            self.bits = values.bits.copy()
        elif is_torch(values) and str(values.dtype) == "torch.bfloat16":
            self.bits = _torch_bf16_bits(values)
        else:
            self.bits = bf16_bits(as_values(values))

    @classmethod
    def from_bits(cls, bits: Any) -> BF16:
        np = _np()
        b = np.array(bits)
        if b.dtype == np.int16:
            b = b.view(np.uint16)
        if b.dtype.kind not in "ui" or (b.size and (b.min() < 0 or b.max() > 0xFFFF)):
            raise ValueError(
                f"bfloat16 bit patterns must be integers in 0..=0xFFFF (or int16), not {b.dtype}"
            )
        out = cls.__new__(cls)
        out.bits = b.astype(np.uint16)
        return out

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)

    def to_float32(self):
        return bf16_to_float32(self.bits)

    def __array__(self, dtype=None, copy=None):
        a = self.to_float32()
        return a if dtype is None else a.astype(dtype)

    def __len__(self) -> int:
        return len(self.bits)

    def __repr__(self) -> str:
        return f"BF16(shape={list(self.shape)})"


def as_values(x: Any):
    """The values of `x` as a numpy array (bfloat16 widened to float32)."""
    if isinstance(x, BF16):
        return x.to_float32()
    if is_torch(x):
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.numpy()
    return _np().asarray(x)


def as_raw(x: Any):
    """``(dtype_name, array)``: the safetensors dtype name of `x` (``F32``, ``BF16`` …)
    and its elements in their own numpy dtype (uint16 bit patterns for BF16)."""
    if isinstance(x, BF16):
        return "BF16", x.bits
    if is_torch(x):
        if str(x.dtype) == "torch.bfloat16":
            return "BF16", _torch_bf16_bits(x)
        try:
            x = x.detach().cpu().numpy()
        except TypeError as e:
            raise TypeError(f"cannot take a torch tensor of dtype {x.dtype}: {e}") from None
    a = _np().asarray(x)
    name = _SAFETENSORS.get(a.dtype.name)
    if name is None:
        raise TypeError(
            f"cannot take an array of dtype {a.dtype}; use float64/32/16, bfloat16 (BF16), "
            "int64/32/16/8, uint64/32/16/8 or bool"
        )
    return name, a
