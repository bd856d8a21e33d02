"""Gate: nothing written when run by hand, rows and the doors row when the orchestrator
asks, the exit status that agrees with the rows, env() and the canary, and the context
manager's exits."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import memra_gate as mg

SRC = Path(__file__).resolve().parents[1] / "src"


def run(program: str, tmp_path: Path, **env):
    """Runs `program` in a fresh interpreter with memra_gate importable and `env` set."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEMRA_")}
    environ.update(PYTHONPATH=str(SRC), PYTHONDONTWRITEBYTECODE="1", **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
    )


def test_run_by_hand_it_writes_nothing_but_still_counts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    gate = mg.Gate()
    assert gate.checks_path is None and gate.artifacts is None
    gate.door("backend", "cpu")
    gate.check("a", mg.PASS, "fine")
    assert gate.finish() == mg.EXIT_PASS
    gate.check("b", mg.FAIL, "broken")
    gate.check("c", mg.WARN)
    assert gate.save("logits.safetensors", {"x": np.zeros(3, np.float32)}) is None
    assert gate.failures == 1
    assert gate.finish() == mg.EXIT_FAIL
    assert list(tmp_path.iterdir()) == []
    out = capsys.readouterr().out
    assert "pass a: fine" in out and "fail b: broken" in out
    assert 'doors backend="cpu"' in out


def test_empty_variables_are_unset(monkeypatch):
    monkeypatch.setenv(mg.CHECKS, "")
    monkeypatch.setenv(mg.ARTIFACTS, "")
    gate = mg.Gate()
    assert gate.checks_path is None and gate.artifacts is None


def test_the_environment_names_the_files(tmp_path, monkeypatch):
    checks = tmp_path / "checks.jsonl"
    checks.touch()
    monkeypatch.setenv(mg.CHECKS, str(checks))
    monkeypatch.setenv(mg.ARTIFACTS, str(tmp_path / "artifacts"))
    monkeypatch.setenv(mg.NODE, "decode-batch[batch=4]")
    monkeypatch.setenv(mg.ATTEMPT, "3")
    monkeypatch.setenv(mg.REP, "2")
    gate = mg.Gate(echo=False)
    assert (gate.checks_path, gate.artifacts) == (checks, tmp_path / "artifacts")
    assert (gate.node, gate.attempt, gate.rep) == ("decode-batch[batch=4]", 3, 2)
    row = gate.check("sum", mg.PASS, "1 + 2 + 3 = 6", {"compared": 3})
    gate.door("backend", "cpu")
    gate.door("threads", 4)
    gate.door("fast_path", False)
    assert gate.finish() == 0
    assert checks.read_text() == (
        '{"check":"sum","status":"pass","metrics":{"compared":3},"message":"1 + 2 + 3 = 6"}\n'
        '{"doors":{"backend":"cpu","threads":4,"fast_path":false}}\n'
    )
    assert row == mg.read_checks(checks).checks[0]
    path = gate.save("logits.safetensors", {"x": np.arange(3, dtype=np.float32)})
    assert path == tmp_path / "artifacts" / "logits.safetensors"
    assert mg.load_file(path)["x"].tolist() == [0.0, 1.0, 2.0]


def test_explicit_paths_override_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(mg.CHECKS, str(tmp_path / "env.jsonl"))
    gate = mg.Gate(checks=None, artifacts=tmp_path, echo=False)
    assert gate.checks_path is None and gate.artifacts == tmp_path
    gate = mg.Gate(checks=tmp_path / "mine.jsonl", echo=False)
    gate.check("a", mg.PASS)
    assert (tmp_path / "mine.jsonl").exists() and not (tmp_path / "env.jsonl").exists()


def test_the_exit_status_agrees_with_the_rows(tmp_path):
    for statuses, code in (
        ((), 0),
        ((mg.PASS, mg.WARN, mg.SKIP), 0),
        ((mg.PASS, mg.FAIL), 1),
        ((mg.FAIL, mg.FAIL), 1),
    ):
        path = tmp_path / f"{code}-{len(statuses)}.jsonl"
        gate = mg.Gate(checks=path, artifacts=None, echo=False)
        for i, status in enumerate(statuses):
            gate.check(f"c{i}", status)
        assert gate.finish() == code
        report = mg.read_checks(path)
        assert (report.first_failed() is not None) == (code == mg.EXIT_FAIL)


def test_the_doors_row_is_written_once_keys_in_order(tmp_path):
    path = tmp_path / "checks.jsonl"
    gate = mg.Gate(checks=path, artifacts=None, echo=False)
    gate.finish()
    assert not path.exists(), "no doors, no doors row"
    gate.door("b", 1)
    gate.door("a", "x")
    gate.door("b", 2)  # replaced where it stands
    gate.finish()
    gate.finish()
    assert path.read_text() == '{"doors":{"b":2,"a":"x"}}\n'
    gate.door("c", True)
    gate.finish()
    assert mg.read_checks(path).doors == {"b": 2, "a": "x", "c": True}


def test_a_door_that_is_not_flat_is_refused_at_once():
    gate = mg.Gate(checks=None, artifacts=None, echo=False)
    with pytest.raises(ValueError, match="doors.pp is"):
        gate.door("pp", {"stages": 2})
    with pytest.raises(ValueError, match="doors.r is NaN"):
        gate.door("r", float("nan"))
    gate.door("n", np.int64(3))
    assert gate.doors == {"n": 3}


def test_env_records_what_was_read(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMRA_TEST_PIN", "dp4a")
    monkeypatch.setenv("MEMRA_TEST_EMPTY", "")
    monkeypatch.delenv("MEMRA_TEST_NONE", raising=False)
    path = tmp_path / "checks.jsonl"
    gate = mg.Gate(checks=path, artifacts=None, echo=False)
    assert gate.env("MEMRA_TEST_PIN") == "dp4a"
    assert gate.env("MEMRA_TEST_PIN", "other") == "dp4a"
    assert gate.env("MEMRA_TEST_EMPTY", "default") == ""
    assert gate.env("MEMRA_TEST_NONE") is None
    assert gate.env("MEMRA_TEST_NONE", "mmvq") == "mmvq"
    gate.finish()
    assert path.read_text() == (
        '{"doors":{"env.MEMRA_TEST_PIN":"dp4a","env.MEMRA_TEST_EMPTY":"","env.MEMRA_TEST_NONE":"(unset)"}}\n'
    )


def test_the_canary(monkeypatch):
    gate = mg.Gate(checks=None, artifacts=None, echo=False)
    assert gate.canary is False
    assert gate.doors == {"env.MEMRA_GATE_CANARY": "(unset)"}
    for value, planted in (("1", True), ("0", False), ("yes", False), ("", False)):
        monkeypatch.setenv(mg.CANARY, value)
        assert gate.canary is planted
        assert gate.doors["env.MEMRA_GATE_CANARY"] == value


def test_an_unwritable_checks_file_raises_naming_it(tmp_path):
    gate = mg.Gate(checks=tmp_path / "missing" / "checks.jsonl", artifacts=None, echo=False)
    with pytest.raises(mg.AppendError, match="MEMRA_ORCH_CHECKS must name a writable file"):
        gate.check("a", mg.PASS)


def test_artifact_names_stay_inside_the_folder(tmp_path):
    gate = mg.Gate(checks=None, artifacts=tmp_path, echo=False)
    assert gate.artifact_path("sub/step.3.safetensors") == tmp_path / "sub" / "step.3.safetensors"
    assert (tmp_path / "sub").is_dir()
    for bad in ("../x", "/etc/x", ""):
        with pytest.raises(ValueError, match="relative path inside"):
            gate.artifact_path(bad)
    with pytest.raises(RuntimeError, match="no artifacts folder"):
        mg.Gate(checks=None, artifacts=None).artifact_path("x")


def test_the_check_helpers_write_their_verdicts(tmp_path):
    path = tmp_path / "checks.jsonl"
    gate = mg.Gate(checks=path, artifacts=None, echo=False)
    ref = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    got = ref.copy()
    got[1, 2] = 6.5
    gate.check_bitwise("bits", ref, ref)
    gate.check_close("close", ref, got, max_abs=0.1)
    gate.check_argmax("argmax", ref, got)
    gate.check_kl("kl", ref, got, max=1.0)
    gate.check_topk("topk", ref, got, k=2)
    gate.check_tokens("tokens", [1, 2, 3], [1, 2, 4])
    assert gate.finish() == 1
    report = mg.read_checks(path)
    assert [(c["check"], c["status"]) for c in report.checks] == [
        ("bits", "pass"),
        ("close", "fail"),
        ("argmax", "pass"),
        ("kl", "pass"),
        ("topk", "pass"),
        ("tokens", "fail"),
    ]
    assert report.checks[1]["first_mismatch"] == {"row": 1, "index": 2, "ref": 6.0, "got": 6.5}
    assert report.checks[5]["first_mismatch"] == {"row": 0, "index": 2, "ref": 3.0, "got": 4.0}


def test_with_block_exits_through_finish(tmp_path):
    program = """
        import sys, memra_gate as mg
        with mg.Gate() as gate:
            gate.door("backend", "cpu")
            gate.check("a", mg.PASS)
            if len(sys.argv) > 1:
                gate.check("b", mg.FAIL)
        print("not reached")
    """
    checks = tmp_path / "checks.jsonl"
    done = run(program, tmp_path, MEMRA_ORCH_CHECKS=str(checks))
    assert done.returncode == 0, done.stderr
    assert "not reached" not in done.stdout
    assert mg.read_checks(checks).doors == {"backend": "cpu"}
    checks.unlink()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program), "fail"],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(SRC),
            "PYTHONDONTWRITEBYTECODE": "1",
            mg.CHECKS: str(checks),
        },
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    assert mg.read_checks(checks).first_failed()["check"] == "b"


def test_a_crash_in_the_with_block_is_neither_pass_nor_fail(tmp_path):
    program = """
        import memra_gate as mg
        with mg.Gate() as gate:
            gate.door("backend", "cpu")
            gate.check("a", mg.FAIL)
            {}["missing"]
    """
    checks = tmp_path / "checks.jsonl"
    done = run(program, tmp_path, MEMRA_ORCH_CHECKS=str(checks))
    assert done.returncode == mg.EXIT_ERROR
    assert "Traceback" in done.stderr and "KeyError: 'missing'" in done.stderr
    assert "exit 2 (neither pass nor fail)" in done.stderr
    report = mg.read_checks(checks)
    assert report.doors == {"backend": "cpu"}, "the doors still show what ran"


def test_an_unwritable_checks_file_in_the_with_block_exits_2(tmp_path):
    program = """
        import memra_gate as mg
        with mg.Gate() as gate:
            gate.check("a", mg.PASS)
    """
    done = run(program, tmp_path, MEMRA_ORCH_CHECKS=str(tmp_path / "missing" / "checks.jsonl"))
    assert done.returncode == 2
    assert "cannot append a check row" in done.stderr


def test_sys_exit_in_the_with_block_is_left_alone(tmp_path):
    program = """
        import sys, memra_gate as mg
        with mg.Gate() as gate:
            sys.exit(7)
    """
    assert run(program, tmp_path).returncode == 7
