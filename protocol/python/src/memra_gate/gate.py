"""`Gate`: one gate's report to `memra-orch`: its check rows, its doors row, its artifacts
and the exit status that agrees with the rows.

Run by hand (``MEMRA_ORCH_CHECKS`` and ``MEMRA_ORCH_ARTIFACTS`` unset or empty) it writes
nothing and only prints its report.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

from . import compare
from .wire import (
    ARTIFACTS,
    ATTEMPT,
    CHECKS,
    EXIT_ERROR,
    EXIT_FAIL,
    EXIT_PASS,
    FAIL,
    NODE,
    REP,
    FirstMismatch,
    append_row,
    check_row,
    door_value,
    dumps,
    env_path,
)

CANARY = "MEMRA_GATE_CANARY"
UNSET = "(unset)"

# The default of `Gate`'s paths: take them from the environment.
_FROM_ENV: Any = object()


def _path(value: Any) -> Path | None:
    if value is None or value == "":
        return None
    return Path(os.fspath(value))


def _number(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


class Gate:
    """A gate's report. ``Gate()`` writes where the orchestrator says (the environment);
    ``Gate(checks=path_or_None, artifacts=dir_or_None)`` where it is told (each argument
    left out is still taken from the environment). With ``echo=False`` nothing is printed.

    Use it as ``sys.exit(gate.finish())``, or as a context manager, which exits for you::

        with mg.Gate() as gate:
            gate.check_close("logits", ref, got, max_abs=1e-3)

    Leaving the ``with`` block exits the process with ``gate.finish()``; an uncaught
    exception in it prints its traceback and exits 2, so that a crash is never read as a
    pass or a fail (plain Python exits 1 on one, which reads as a fail).
    """

    def __init__(self, checks: Any = _FROM_ENV, artifacts: Any = _FROM_ENV, *, echo: bool = True):
        self.checks_path = _path(env_path(CHECKS) if checks is _FROM_ENV else checks)
        self.artifacts = _path(env_path(ARTIFACTS) if artifacts is _FROM_ENV else artifacts)
        self.node = os.environ.get(NODE) or None
        self.attempt = _number(ATTEMPT)
        self.rep = _number(REP)
        self.echo = echo
        self.rows: list[dict] = []
        self.failures = 0
        self.doors: dict[str, Any] = {}
        self._doors_written = True

    # Doors.

    def door(self, key: str, value: Any) -> None:
        """Records one door (a string, number or boolean): a code path the gate actually
        ran, as read back from the engine. A later value of a key replaces the earlier."""
        self.doors[key] = door_value(key, value)
        self._doors_written = False

    def env(self, name: str, default: str | None = None) -> str | None:
        """``os.environ[name]``, or `default` when it is unset; records the door
        ``env.<name>`` as the value read, or ``(unset)``."""
        value = os.environ.get(name)
        self.door(f"env.{name}", UNSET if value is None else value)
        return default if value is None else value

    @property
    def canary(self) -> bool:
        """Whether ``MEMRA_GATE_CANARY`` is ``1``: the gate should plant the defect its
        checks must catch. Reading it records the door ``env.MEMRA_GATE_CANARY``."""
        return self.env(CANARY) == "1"

    # Checks.

    def check(
        self,
        name: str,
        status: str,
        message: str = "",
        metrics: dict | None = None,
        first_mismatch: Any = None,
    ) -> dict:
        """Writes one check row (status `PASS`, `FAIL`, `WARN` or `SKIP`; `first_mismatch`
        a `FirstMismatch` or a dict of its keys) and returns it in wire form. A fail counts
        towards `finish` even when run by hand."""
        row = check_row(name, status, message, metrics, first_mismatch)
        if status == FAIL:
            self.failures += 1
        if self.checks_path is not None:
            append_row(self.checks_path, row)
        self.rows.append(row)
        if self.echo:
            self._print(row)
        return row

    def _record(self, name: str, verdict: compare.Verdict) -> dict:
        return self.check(
            name, verdict.status, verdict.message, verdict.metrics, verdict.first_mismatch
        )

    def check_bitwise(self, name: str, ref: Any, got: Any) -> dict:
        """Raw bits equal (see `compare.bitwise`)."""
        return self._record(name, compare.bitwise(ref, got))

    def check_close(
        self,
        name: str,
        ref: Any,
        got: Any,
        max_abs: float | None = None,
        max_rel: float | None = None,
    ) -> dict:
        """Values within bounds, in float64 (see `compare.close`)."""
        return self._record(name, compare.close(ref, got, max_abs, max_rel))

    def check_argmax(self, name: str, ref: Any, got: Any, min_agree: float = 1.0) -> dict:
        """Argmax agreement per row (see `compare.argmax`)."""
        return self._record(name, compare.argmax(ref, got, min_agree))

    def check_kl(
        self,
        name: str,
        ref_logits: Any,
        got_logits: Any,
        max_mean: float | None = None,
        max: float | None = None,  # noqa: A002 - the metric it bounds is kl_max
    ) -> dict:
        """KL(softmax(ref) || softmax(got)) per row (see `compare.kl`)."""
        return self._record(name, compare.kl(ref_logits, got_logits, max_mean, max))

    def check_topk(
        self, name: str, ref: Any, got: Any, k: int = 5, min_overlap: float = 1.0
    ) -> dict:
        """Top-k overlap per row (see `compare.topk`)."""
        return self._record(name, compare.topk(ref, got, k, min_overlap))

    def check_tokens(self, name: str, ref_tokens: Any, got_tokens: Any) -> dict:
        """Token streams equal (see `compare.tokens`)."""
        return self._record(name, compare.tokens(ref_tokens, got_tokens))

    # Artifacts.

    def save(
        self, filename: str, tensors: dict[str, Any], metadata: dict[str, str] | None = None
    ) -> Path | None:
        """Writes `tensors` as a safetensors file into the artifacts folder and returns its
        path; None, writing nothing, when there is no artifacts folder (run by hand)."""
        if self.artifacts is None:
            return None
        path = self.artifact_path(filename)
        from .safetensors import save_file

        save_file(path, tensors, metadata)
        return path

    def artifact_path(self, filename: str) -> Path:
        """Where the artifact `filename` goes (its folder made); for artifacts of other
        kinds. Only while there is an artifacts folder."""
        if self.artifacts is None:
            raise RuntimeError("no artifacts folder: MEMRA_ORCH_ARTIFACTS is unset (run by hand)")
        rel = Path(filename)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(
                f"artifact name {filename!r} must be a relative path inside the artifacts folder"
            )
        path = self.artifacts / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # The end.

    def finish(self) -> int:
        """Writes the doors row (when doors were recorded and are not written yet) and
        returns the exit status that agrees with the rows: 1 when a check failed, else 0."""
        self._write_doors()
        code = EXIT_FAIL if self.failures else EXIT_PASS
        if self.echo:
            verdict = "fail" if self.failures else "pass"
            print(f"{verdict}: {len(self.rows)} checks, {self.failures} failed", flush=True)
        return code

    def _write_doors(self) -> None:
        if self._doors_written or not self.doors:
            return
        if self.checks_path is not None:
            append_row(self.checks_path, {"doors": dict(self.doors)})
        self._doors_written = True
        if self.echo:
            print("doors " + " ".join(f"{k}={dumps(v)}" for k, v in self.doors.items()), flush=True)

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and not issubclass(exc_type, Exception):
            # SystemExit and KeyboardInterrupt end the process as they would without us.
            return False
        if exc_type is None:
            try:
                code = self.finish()
            except Exception:
                traceback.print_exc()
                code = EXIT_ERROR
            raise SystemExit(code)
        traceback.print_exception(exc_type, exc, tb)
        try:
            # The doors still tell which code paths ran up to the crash.
            self._write_doors()
        except Exception:
            traceback.print_exc()
        print(
            f"memra-gate: the gate raised {exc_type.__name__}; "
            f"exit {EXIT_ERROR} (neither pass nor fail)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(EXIT_ERROR)

    def _print(self, row: dict) -> None:
        line = f"{row['status']:<4} {row['check']}"
        if row["message"]:
            line += f": {row['message']}"
        if row["metrics"]:
            line += "  [" + " ".join(f"{k}={dumps(v)}" for k, v in row["metrics"].items()) + "]"
        m = FirstMismatch.from_json(row.get("first_mismatch"))
        if m is not None and str(m) not in row["message"]:
            line += f"  first mismatch: {m}"
        print(line, flush=True)
