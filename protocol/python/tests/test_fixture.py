"""wire_fixture.py, the Python side of protocol/tests/python_wire.rs, run as that test runs
it (a bare interpreter, here with numpy made unimportable): the file it writes is the text
the Rust crate writes for the same rows, and its summary reads it back."""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

# What memra-protocol's ChecksWriter writes for the fixture's rows.
EXPECTED = (
    '{"check":"sum","status":"pass","metrics":{"compared":3,"maxdiff":0.0,"ratio":0.5,'
    '"scale":1.25,"small":1e-7,"tiny":0.00001,"big":2.5e+20,"policy":"bitwise","exact":true},'
    '"message":"1 + 2 + 3 = 6"}\n'
    '{"check":"gate2","status":"fail","metrics":{"mismatches":2},"message":"rows differ",'
    '"first_mismatch":{"step":3,"row":1,"index":811,"ref":1.25,"got":1.2500001}}\n'
    '{"check":"drift","status":"warn","metrics":{"agree":0.98,"rows":102},'
    '"message":"2 of 102 rows differ, within tolerance",'
    '"first_mismatch":{"step":0,"row":4,"index":2,"ref":"-inf","got":0.5}}\n'
    '{"check":"cuda-only","status":"skip","metrics":{},"message":"no GPU"}\n'
    '{"check":"nan","status":"fail","metrics":{"max_abs":null},'
    '"message":"ünï \\"q\\" \\\\ \\t 模型 ✓",'
    '"first_mismatch":{"row":0,"index":7,"ref":"NaN","got":"inf"}}\n'
    '{"doors":{"backend":"cpu","threads":4,"ratio":0.5,"fast_path":false,'
    '"label":"ünï \\"q\\" \\\\ \\t 模型 ✓",'
    '"env.MEMRA_WIRE_TEST_PIN":"on","env.MEMRA_WIRE_TEST_UNSET":"(unset)"}}\n'
)


def fixture(*args, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEMRA_")}
    environ.update(
        PYTHONPATH=str(SRC), PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8", **env
    )
    program = (
        "import runpy, sys\n"
        "sys.modules['numpy'] = None\n"
        f"sys.argv = [{str(HERE / 'wire_fixture.py')!r}, *sys.argv[1:]]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    return subprocess.run([sys.executable, "-c", program, *args], env=environ, capture_output=True)


def test_the_fixture_writes_what_rust_writes(tmp_path):
    path = tmp_path / "checks.jsonl"
    done = fixture("write", MEMRA_ORCH_CHECKS=str(path), MEMRA_WIRE_TEST_PIN="on")
    assert done.returncode == 1, done.stderr.decode()
    assert path.read_bytes().decode("utf-8") == EXPECTED


def test_the_fixture_reads_and_summarises(tmp_path):
    path = tmp_path / "checks.jsonl"
    path.write_text(
        EXPECTED + "\n" + '{"check":"extra","status":"pass","elapsed_s":1.5}\nnot json\n',
        encoding="utf-8",
    )
    done = fixture("read", str(path))
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    rows = [json.loads(line) for line in EXPECTED.splitlines()]
    assert summary["checks"] == rows[:5] + [{"check": "extra", "status": "pass", "elapsed_s": 1.5}]
    assert summary["doors"] == rows[5]["doors"]
    assert summary["mismatches"] == [r.get("first_mismatch") for r in rows[:5]] + [None]
    assert len(summary["problems"]) == 1 and summary["problems"][0].startswith(
        "checks.jsonl line 9: not JSON ("
    )
    assert summary["first_failed"] == "gate2" and summary["speaks_protocol"] is True


def test_the_fixture_names_its_usage():
    done = fixture("nonsense")
    assert done.returncode == 1 and b"usage:" in done.stderr
