"""torch tensors where a gate passes them: bfloat16 bits as torch rounds them, tensors on
any device and with gradients, and no torch import by the library itself. Skipped where
torch is not installed."""

import numpy as np
import pytest

import memra_gate as mg
from memra_gate.arrays import bf16_bits

torch = pytest.importorskip("torch")


def test_bf16_rounding_is_torchs():
    rng = np.random.default_rng(3)
    words = np.concatenate(
        [
            rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32),
            [0x3F808000, 0x3F818000, 0x7F7FFFFF],
        ]
    ).astype(np.uint32)
    values = words.view(np.float32)
    # Left out: NaN, whose bits differ between torch's own code paths, and subnormals,
    # which a CPU's bfloat16 conversion instruction may flush to zero.
    keep = ~np.isnan(values) & ((np.abs(values) >= np.finfo(np.float32).tiny) | (values == 0))
    values = values[keep]
    want = (
        torch.from_numpy(values.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    )
    assert (bf16_bits(values) == want).all()


def test_torch_tensors_save_and_load(tmp_path):
    t = torch.tensor([[1.0, -2.5], [0.1, 3.0]], requires_grad=True)
    tensors = {
        "f32": t,
        "bf16": t.detach().to(torch.bfloat16),
        "i64": torch.arange(4),
        "bool": torch.tensor([True, False]),
    }
    path = tmp_path / "t.safetensors"
    mg.save_file(path, tensors)
    raw = mg.load_file(path, raw=True)
    assert [raw[k][0] for k in ("bf16", "bool", "f32", "i64")] == ["BF16", "BOOL", "F32", "I64"]
    assert raw["bf16"][2] == mg.BF16(t.detach().numpy()).bits.tobytes()
    back = mg.load_file(path)
    assert back["f32"].tolist() == t.detach().numpy().tolist()
    assert back["bf16"].tolist() == t.detach().to(torch.bfloat16).float().numpy().tolist()
    assert back["i64"].tolist() == [0, 1, 2, 3]


def test_checks_take_torch_tensors():
    t = torch.linspace(-3, 3, 12).reshape(3, 4)
    b = t.to(torch.bfloat16)
    assert mg.compare.bitwise(b, mg.BF16(t.numpy())).status == mg.PASS
    assert mg.compare.bitwise(b, t).status == mg.FAIL  # BF16 against F32
    assert mg.compare.close(t, b, max_abs=0.02).status == mg.PASS
    assert mg.compare.argmax(t, t.numpy()).status == mg.PASS
    assert mg.compare.tokens(torch.tensor([[1, 2, 3]]), [[1, 2, 3]]).status == mg.PASS
    assert mg.BF16(b).bits.tolist() == b.view(torch.int16).numpy().view(np.uint16).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_tensors_on_a_gpu_are_moved_to_the_cpu():
    t = torch.ones(3, device="cuda", dtype=torch.bfloat16)
    assert mg.compare.bitwise(t, mg.BF16(np.ones(3, np.float32))).status == mg.PASS
    assert mg.safetensors.decode(mg.safetensors.encode({"t": t}))["t"].tolist() == [1.0, 1.0, 1.0]
