"""The reader's side of the checks file: `parse_checks` turns JSON lines into a `Report` of
check rows and merged doors, with one located message for every line that breaks the
protocol, as the Rust crate's reader does.

It reads leniently, as any gate (older ones included) wrote its rows: blank lines are
ignored, unknown keys are kept, and a check row stays the plain dict it was written as.

Standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from .wire import FAIL, STATUSES, FirstMismatch, dumps

_EXPECTED = 'expected {"check":NAME,"status":"pass|fail|warn|skip",…} or {"doors":{…}}'


@dataclass
class Report:
    """Everything a gate reported through its checks file."""

    checks: list[dict] = field(default_factory=list)
    # The code paths the gate ran, merged over all doors rows (a later row wins); None
    # when there was no doors row.
    doors: dict | None = None
    # Lines that break the protocol, each naming its line number.
    problems: list[str] = field(default_factory=list)

    def speaks_protocol(self) -> bool:
        """Whether the gate wrote anything at all (only such gates are held to the
        protocol's consistency rule)."""
        return bool(self.checks) or self.doors is not None or bool(self.problems)

    def first_failed(self) -> dict | None:
        return next((c for c in self.checks if c["status"] == FAIL), None)

    def add_line(self, n: int, line: str) -> None:
        """Adds line `n` (counted from 1): a check row, a doors row merged into `doors`,
        or a problem naming the line. Blank lines are ignored."""
        line = line.strip()
        if not line:
            return
        try:
            value = json.loads(line, parse_constant=_no_constant, parse_float=_finite_float)
        except ValueError as e:
            self.problems.append(f"checks.jsonl line {n}: not JSON ({e})")
            return
        if not isinstance(value, dict):
            self.problems.append(f"checks.jsonl line {n}: not a JSON object")
            return
        if "doors" in value:
            problem = _doors_problem(value["doors"])
            if problem:
                self.problems.append(f"checks.jsonl line {n}: {problem}")
            else:
                if self.doors is None:
                    self.doors = {}
                self.doors.update(value["doors"])
            return
        problem = _check_problem(value)
        if problem:
            self.problems.append(f"checks.jsonl line {n}: not a check row ({problem}); {_EXPECTED}")
            return
        self.checks.append(value)


def mismatch(row: dict) -> FirstMismatch | None:
    """The first mismatch of a check row in the shape `FirstMismatch` writes, if the row
    has one in it."""
    return FirstMismatch.from_json(row.get("first_mismatch"))


def parse_checks(text: str) -> Report:
    """Parses JSON-lines check output. Blank lines are ignored."""
    report = Report()
    # Lines end at "\n" only (a "\r" before it is whitespace), as Rust's `str::lines`.
    for i, line in enumerate(text.split("\n")):
        report.add_line(i + 1, line)
    return report


def read_checks(path: os.PathLike[str] | str) -> Report:
    """Reads a checks file; a missing file is an empty report (the gate wrote no rows)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Report()
    except OSError as e:
        reason = f"{e.strerror} (os error {e.errno})" if e.strerror else str(e)
        return Report(problems=[f"{os.fspath(path)}: cannot read: {reason}"])
    return parse_checks(data.decode("utf-8", "replace"))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    x = float(text)
    if x in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text}")
    return x


def _doors_problem(doors: Any) -> str | None:
    if not isinstance(doors, dict):
        return '"doors" must be an object of strings, numbers and booleans'
    for k, v in doors.items():
        if v is None or isinstance(v, (dict, list)):
            return (
                f"doors.{k} is {dumps(v)}; door values must be strings, numbers or booleans "
                "(a flat object)"
            )
    return None


def _unexpected(v: Any) -> str:
    """A value in the words serde uses for an unexpected one."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{dumps(v)}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{dumps(v)}`"
    if isinstance(v, str):
        return f"string {json.dumps(v, ensure_ascii=False)}"
    return "map" if isinstance(v, dict) else "sequence"


def _check_problem(row: dict) -> str | None:
    """Why `row` is not a check row, in the words of the Rust reader where they matter."""
    for key in ("check", "status"):
        if key not in row:
            return f"missing field `{key}`"
    if not isinstance(row["check"], str):
        return f"invalid type: {_unexpected(row['check'])}, expected a string"
    status = row["status"]
    if not isinstance(status, str):
        return f"invalid type: {_unexpected(status)}, expected a status"
    if status not in STATUSES:
        return f"unknown variant `{status}`, expected one of `pass`, `fail`, `warn`, `skip`"
    if "metrics" in row and not isinstance(row["metrics"], dict):
        return f"invalid type: {_unexpected(row['metrics'])}, expected a map"
    message = row.get("message")
    if message is not None and not isinstance(message, str):
        return f"invalid type: {_unexpected(message)}, expected a string"
    return None
