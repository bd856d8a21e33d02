"""The rows' exact bytes: the strings the Rust crate memra-protocol writes for the same
rows, serde_json's float text, escapes, NaN and infinities, and appending to the file."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import memra_gate as mg
from memra_gate.wire import append_row, check_row, doors_row, dumps, format_float

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize(
    "x, text",
    [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (0.5, "0.5"),
        (1.25, "1.25"),
        (3.0, "3.0"),
        (1.2500001, "1.2500001"),
        (0.98, "0.98"),
        (100.0, "100.0"),
        (43210.0, "43210.0"),
        (43210.1, "43210.1"),
        (0.0001, "0.0001"),
        # Python's own json writes these three as 1e-05, 1.25e-05 and 1e-07.
        (0.00001, "0.00001"),
        (1.25e-05, "0.0000125"),
        (1e-7, "1e-7"),
        (1e-6, "1e-6"),
        (1000000000000000.0, "1000000000000000.0"),
        (-5942736479622170.0, "-5942736479622170.0"),
        (5.444310685350916e14, "544431068535091.6"),
        (1e16, "1e+16"),
        (2.5e20, "2.5e+20"),
        (-1.5e300, "-1.5e+300"),
        # The cases of zmij's own tests (serde_json's float writer).
        (6.62607015e-34, "6.62607015e-34"),
        (5e-324, "5e-324"),
        (1.2e-322, "1.2e-322"),
        (2.2250738585072004e-308, "2.2250738585072004e-308"),
        (-4.932096661796888e-226, "-4.932096661796888e-226"),
        (3.439070283483335e35, "3.439070283483335e+35"),
        (6.606854224493745e-17, "6.606854224493745e-17"),
        (2.9802322387695312e-08, "2.9802322387695312e-8"),
        (9.03725590277404e162, "9.03725590277404e+162"),
        (5.960464477539062e-07, "5.960464477539062e-7"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
    ],
)
def test_floats_are_written_as_serde_json_writes_them(x, text):
    assert format_float(x) == text
    assert float(text) == x


def test_float_text_round_trips_over_many_magnitudes():
    rng = np.random.default_rng(7)
    for x in np.concatenate(
        [rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000), [1e-5, 1e-4, 9.999e15]]
    ):
        text = format_float(float(x))
        assert float(text) == float(x)
        assert "e+0" not in text and "e-0" not in text


def test_the_rust_crates_example_rows_to_the_byte():
    row = check_row("sum", mg.PASS, "1 + 2 + 3 = 6", {"compared": 3})
    assert (
        dumps(row)
        == '{"check":"sum","status":"pass","metrics":{"compared":3},"message":"1 + 2 + 3 = 6"}'
    )
    doors = doors_row({"backend": "cpu", "threads": 4, "fast_path": False})
    assert dumps(doors) == '{"doors":{"backend":"cpu","threads":4,"fast_path":false}}'
    row = check_row(
        "gate2",
        mg.PASS,
        "…",
        {"maxdiff": 0.0, "compared": 49152},
        mg.FirstMismatch(step=3, row=1, index=811, ref=1.25, got=1.2500001),
    )
    assert dumps(row) == (
        '{"check":"gate2","status":"pass","metrics":{"maxdiff":0.0,"compared":49152},"message":"…",'
        '"first_mismatch":{"step":3,"row":1,"index":811,"ref":1.25,"got":1.2500001}}'
    )


def test_a_bare_check_and_a_non_finite_mismatch():
    assert (
        dumps(check_row("bare", mg.PASS))
        == '{"check":"bare","status":"pass","metrics":{},"message":""}'
    )
    row = check_row(
        "nan", mg.FAIL, first_mismatch={"row": 1, "index": 811, "ref": math.inf, "got": math.nan}
    )
    assert dumps(row) == (
        '{"check":"nan","status":"fail","metrics":{},"message":"",'
        '"first_mismatch":{"row":1,"index":811,"ref":"inf","got":"NaN"}}'
    )
    row = check_row(
        "neg", mg.WARN, first_mismatch=mg.FirstMismatch(row=0, index=0, ref=-math.inf, got=5)
    )
    assert row["first_mismatch"] == {"row": 0, "index": 0, "ref": "-inf", "got": 5.0}
    assert dumps(row).endswith('"first_mismatch":{"row":0,"index":0,"ref":"-inf","got":5.0}}')


def test_metrics_that_are_not_finite_are_null_and_numpy_values_plain():
    row = check_row(
        "m",
        mg.PASS,
        metrics={
            "nan": math.nan,
            "inf": math.inf,
            "list": [1.5, math.nan],
            "f32": np.float32(0.5),
            "i64": np.int64(7),
            "flag": np.bool_(True),
            "arr": np.array([1, 2]),
        },
    )
    assert (
        dumps(row["metrics"])
        == '{"nan":null,"inf":null,"list":[1.5,null],"f32":0.5,"i64":7,"flag":true,"arr":[1,2]}'
    )
    assert row["metrics"]["nan"] is None
    text = dumps(row)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["metrics"]["f32"] == 0.5


def test_strings_are_escaped_as_serde_json_escapes_them():
    text = 'ünï "q" \\ \t\n\r\b\f \x01\x1f\x7f 模型 ✓ \u2028'
    assert dumps(text) == '"ünï \\"q\\" \\\\ \\t\\n\\r\\b\\f \\u0001\\u001f\x7f 模型 ✓ \u2028"'
    # Text that is not valid Unicode (stray bytes from the environment) is written with U+FFFD.
    stray = b"ok\xff".decode("utf-8", "surrogateescape")
    assert dumps(stray) == '"ok\ufffd"'


def test_rows_are_checked_before_they_are_written():
    with pytest.raises(ValueError, match="status 'ok' is not one of pass, fail, warn, skip"):
        check_row("x", "ok")
    with pytest.raises(ValueError, match="needs a name"):
        check_row("", mg.PASS)
    with pytest.raises(TypeError, match="message must be a string"):
        check_row("x", mg.PASS, message=3)
    with pytest.raises(TypeError, match="metrics must be a dict"):
        check_row("x", mg.PASS, metrics=[1])
    with pytest.raises(TypeError, match="keys must be strings"):
        check_row("x", mg.PASS, metrics={1: 2})
    with pytest.raises(TypeError, match="cannot write object"):
        check_row("x", mg.PASS, metrics={"o": object()})
    with pytest.raises(ValueError, match="first_mismatch.row must be a count"):
        check_row("x", mg.FAIL, first_mismatch={"row": -1, "index": 0, "ref": 0, "got": 1})
    with pytest.raises(ValueError, match="needs 'got'"):
        check_row("x", mg.FAIL, first_mismatch={"row": 0, "index": 0, "ref": 0})
    with pytest.raises(ValueError, match="keys \\['tensor'\\]"):
        check_row(
            "x", mg.FAIL, first_mismatch={"row": 0, "index": 0, "ref": 0, "got": 1, "tensor": "l"}
        )


def test_doors_are_flat():
    assert doors_row({"n": np.int32(2), "x": 0.5, "on": True}) == {
        "doors": {"n": 2, "x": 0.5, "on": True}
    }
    for bad, shown in ((None, "null"), ([1], "[1]"), ({"stages": 2}, '{"stages":2}')):
        with pytest.raises(ValueError) as e:
            doors_row({"pp": bad})
        assert str(e.value) == (
            f"doors.pp is {shown}; door values must be strings, numbers or booleans (a flat object)"
        )
    with pytest.raises(ValueError, match="doors.x is NaN, which JSON writes as null"):
        doors_row({"x": math.nan})


def test_first_mismatch_reads_what_it_writes_and_nothing_else():
    for m in (
        mg.FirstMismatch(step=3, row=1, index=811, ref=1.25, got=1.2500001),
        mg.FirstMismatch(row=0, index=2, ref=-math.inf, got=math.inf),
    ):
        assert mg.FirstMismatch.from_json(json.loads(dumps(m.to_json()))) == m
    back = mg.FirstMismatch.from_json({"row": 0, "index": 1, "ref": "NaN", "got": 1})
    assert math.isnan(back.ref) and back.got == 1.0 and back.step is None
    for other in (
        {"tensor": "logits", "row": 0},
        {"row": 0, "index": 1, "ref": "x", "got": 1},
        {"row": 0, "index": 1, "ref": " 1", "got": 1},
        {"row": 1.0, "index": 1, "ref": 1, "got": 1},
        {"row": True, "index": 1, "ref": 1, "got": 1},
        {"step": None, "row": 0, "index": 1, "ref": 1, "got": 1},
        [1, 2],
        None,
    ):
        assert mg.FirstMismatch.from_json(other) is None
    assert str(mg.FirstMismatch(step=3, row=1, index=811, ref=1.25, got=math.nan)) == (
        "step 3, row 1, index 811: ref 1.25 got NaN"
    )


def test_each_row_is_one_appended_line(tmp_path):
    path = tmp_path / "checks.jsonl"
    path.write_text('{"check":"earlier","status":"pass"}\n')
    append_row(path, check_row("a", mg.PASS))
    append_row(str(path), doors_row({"k": "v"}))
    assert path.read_text().splitlines() == [
        '{"check":"earlier","status":"pass"}',
        '{"check":"a","status":"pass","metrics":{},"message":""}',
        '{"doors":{"k":"v"}}',
    ]
    assert path.read_bytes().endswith(b"}\n")


def test_an_unwritable_checks_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "missing" / "checks.jsonl"
    with pytest.raises(mg.AppendError) as e:
        append_row(path, check_row("a", mg.PASS))
    text = str(e.value)
    assert text.startswith(f"{path}: cannot append a check row: ")
    assert text.endswith("; MEMRA_ORCH_CHECKS must name a writable file")
    assert isinstance(e.value, OSError)


def test_rows_and_the_reader_need_no_numpy(tmp_path):
    path = tmp_path / "checks.jsonl"
    program = (
        "import sys; sys.modules['numpy'] = None\n"
        "import memra_gate as mg\n"
        f"g = mg.Gate(checks={str(path)!r}, artifacts=None, echo=False)\n"
        "g.door('backend', 'cpu')\n"
        "g.check('a', mg.FAIL, first_mismatch=mg.FirstMismatch(row=0, index=1, ref=1.0, got=2.0))\n"
        f"r = mg.read_checks({str(path)!r})\n"
        "assert r.checks[0]['check'] == 'a' and r.doors is None\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(g.finish())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert path.read_text().splitlines()[-1] == '{"doors":{"backend":"cpu"}}'
