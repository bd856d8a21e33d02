"""Artifacts: bfloat16 rounding (to nearest, ties to even, NaN kept a NaN), safetensors
files of every dtype written and read back, the header's form and alignment, and the
reader's errors."""

import json
import struct

import numpy as np
import pytest

import memra_gate as mg
from memra_gate.arrays import bf16_bits
from memra_gate.safetensors import decode, encode


def bits_of(words):
    return bf16_bits(np.array(words, dtype=np.uint32).view(np.float32)).tolist()


def test_bf16_rounds_to_nearest_ties_to_even():
    assert bits_of([0x3F800000]) == [0x3F80]  # 1.0
    assert bits_of([0x3F807FFF]) == [0x3F80]  # below half: down
    assert bits_of([0x3F808001]) == [0x3F81]  # above half: up
    assert bits_of([0x3F808000]) == [0x3F80]  # a tie: to the even 0x3F80
    assert bits_of([0x3F818000]) == [0x3F82]  # a tie: to the even 0x3F82
    assert bits_of([0xBF818000]) == [0xBF82]  # the same below zero
    assert bits_of([0x80000000]) == [0x8000]  # -0.0
    assert bits_of([0x00008000, 0x00018000, 0x00000001]) == [0x0000, 0x0002, 0x0000]  # subnormals
    assert bits_of([0x7F800000, 0xFF800000]) == [0x7F80, 0xFF80]  # infinities
    assert bits_of([0x7F7FFFFF]) == [0x7F80]  # the largest float32 rounds up to infinity


def test_bf16_keeps_nan_a_nan():
    # 0x7F800001 truncated would be 0x7F80, an infinity.
    assert bits_of([0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0xFF800001]) == [0x7FC0] * 4
    assert np.isnan(np.asarray(mg.BF16([np.nan]))).all()


def test_bf16_wrapper():
    b = mg.BF16(np.array([[1.0, 2.5], [-3.0, 1e-3]]))
    assert b.shape == (2, 2) and len(b) == 2 and repr(b) == "BF16(shape=[2, 2])"
    assert b.bits.dtype == np.uint16
    values = np.asarray(b)
    assert values.dtype == np.float32
    assert values[0].tolist() == [1.0, 2.5] and values[1, 0] == -3.0
    assert values[1, 1] == pytest.approx(1e-3, rel=2**-8)
    assert np.asarray(b, dtype=np.float64).dtype == np.float64
    assert mg.BF16(b).bits.tolist() == b.bits.tolist()
    assert mg.BF16(3.0).shape == ()
    again = mg.BF16.from_bits(b.bits)
    assert again.bits.tolist() == b.bits.tolist()
    assert mg.BF16.from_bits(np.array([-16512], np.int16)).bits.tolist() == [0xBF80]
    assert np.asarray(mg.BF16.from_bits([0xBF80])).tolist() == [-1.0]
    with pytest.raises(ValueError, match="0..=0xFFFF"):
        mg.BF16.from_bits([0x10000])
    with pytest.raises(ValueError, match="0..=0xFFFF"):
        mg.BF16.from_bits([1.5])


EVERY_DTYPE = {
    "f64": (np.array([[1.5, -2.25], [np.pi, 1e300]], np.float64), "F64"),
    "f32": (np.array([0.1, -0.0, np.inf], np.float32), "F32"),
    "f16": (np.array([1.0, 65504.0, 2.0**-24], np.float16), "F16"),
    "i64": (np.array([-(2**63), 2**63 - 1], np.int64), "I64"),
    "i32": (np.array([[-(2**31)], [2**31 - 1]], np.int32), "I32"),
    "i16": (np.array([-32768, 32767], np.int16), "I16"),
    "i8": (np.array([-128, 127], np.int8), "I8"),
    "u64": (np.array([2**64 - 1], np.uint64), "U64"),
    "u32": (np.array([2**32 - 1], np.uint32), "U32"),
    "u16": (np.array([65535], np.uint16), "U16"),
    "u8": (np.array([0, 255], np.uint8), "U8"),
    "bool": (np.array([True, False, True]), "BOOL"),
    "scalar": (np.array(7.0, np.float32), "F32"),
    "empty": (np.zeros((0, 3), np.float32), "F32"),
}


def test_every_dtype_round_trips(tmp_path):
    tensors = {name: array for name, (array, _) in EVERY_DTYPE.items()}
    tensors["bf16"] = mg.BF16(np.array([1.0, -2.0, 0.1, np.nan], np.float32))
    path = tmp_path / "all.safetensors"
    mg.save_file(path, tensors)
    back = mg.load_file(path)
    assert list(back) == sorted(tensors)
    for name, (array, _) in EVERY_DTYPE.items():
        assert back[name].dtype == array.dtype, name
        assert back[name].shape == array.shape, name
        assert back[name].tobytes() == array.tobytes(), name
    bf16 = back["bf16"]
    assert bf16.dtype == np.float32
    assert bf16[:2].tolist() == [1.0, -2.0] and bf16[2] == np.float32(0.10009765625)
    assert np.isnan(bf16[3])
    raw = mg.load_file(path, raw=True)
    assert raw["bf16"][:2] == ("BF16", (4,))
    assert raw["bf16"][2] == tensors["bf16"].bits.astype("<u2").tobytes()
    for name, (array, dtype) in EVERY_DTYPE.items():
        assert raw[name] == (
            dtype,
            array.shape,
            array.astype(array.dtype.newbyteorder("<")).tobytes(),
        )


def test_the_header_is_sorted_contiguous_and_padded_to_eight():
    data = encode({"b": np.array([1, 2], np.int8), "a": np.array([1.0], np.float32)})
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, "the data starts on an 8-byte boundary"
    text = data[8 : 8 + n].decode()
    assert text.rstrip(" ") == (
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        '"b":{"dtype":"I8","shape":[2],"data_offsets":[4,6]}}'
    )
    assert len(text) - len(text.rstrip(" ")) < 8
    assert data[8 + n :] == struct.pack("<f", 1.0) + bytes([1, 2])
    assert list(json.loads(text)) == ["a", "b"]


def test_metadata_comes_first_and_is_not_a_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    mg.save_file(path, {"x": np.zeros(1, np.float32)}, metadata={"format": "pt"})
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    assert data[8:].startswith(b'{"__metadata__":{"format":"pt"},"x":')
    assert list(mg.load_file(path)) == ["x"]
    with pytest.raises(TypeError, match="strings to strings"):
        encode({}, metadata={"n": 1})
    with pytest.raises(ValueError, match="cannot name a tensor"):
        encode({"__metadata__": np.zeros(1)})


def test_big_endian_and_strided_arrays_are_written_in_order():
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    back = decode(encode({"a": a, "t": np.arange(6, dtype=np.int32).reshape(2, 3).T}))
    assert back["a"].tolist() == a.tolist()
    assert back["t"].tolist() == [[0, 3], [1, 4], [2, 5]]


def test_an_empty_file_holds_no_tensors():
    data = encode({})
    assert data == struct.pack("<Q", 8) + b"{}      "
    assert decode(data) == {}


def st(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + body


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x01\x00", "shorter than the 8-byte header length"),
        (struct.pack("<Q", 100) + b"{}", "a header of 100 bytes"),
        (struct.pack("<Q", 2) + b"{x", "the header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 20) + b'{"a":{"dtype":"F32"}}'[:20], "the header is not JSON"),
        (st(b'{"a":{"dtype":"F32"}}'), "lacks dtype, shape or data_offsets"),
        (st(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(4)), "in a body of 4"),
        (
            st(b'{"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}', bytes(8)),
            "has dtype 'C64'",
        ),
        (
            st(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', bytes(4)),
            "for 8 bytes in a body of 4",
        ),
        (
            st(b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', bytes(4)),
            "has shape [-1]",
        ),
    ],
)
def test_broken_files_are_named(data, why):
    with pytest.raises(ValueError, match="x.safetensors: not a safetensors file: ") as e:
        decode(data, "x.safetensors")
    assert why in str(e.value)


def test_unsupported_arrays_are_refused():
    with pytest.raises(TypeError, match="cannot take an array of dtype"):
        encode({"c": np.zeros(1, np.complex64)})
    with pytest.raises(TypeError, match="cannot take an array of dtype"):
        encode({"s": np.array(["x"])})


def test_gate_save_writes_into_the_artifacts_folder(tmp_path):
    gate = mg.Gate(checks=None, artifacts=tmp_path, echo=False)
    path = gate.save("step.0.safetensors", {"logits": np.ones((2, 3), np.float32)})
    assert path == tmp_path / "step.0.safetensors"
    assert mg.load_file(path)["logits"].shape == (2, 3)
