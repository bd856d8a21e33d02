"""The rows a gate writes, byte for byte as the Rust crate `memra-protocol` writes them, and
appending them to the checks file.

A check row is compact JSON with its keys in a fixed order::

    {"check":NAME,"status":"pass|fail|warn|skip","metrics":{...},"message":TEXT}

followed by ``"first_mismatch":{"step":S,"row":R,"index":I,"ref":X,"got":Y}`` when there is
one (``step`` only when there is a step). The doors row is ``{"doors":{...}}``, a flat
object of strings, numbers and booleans.

Numbers are written as serde_json writes them, not as Python's ``json`` does: a float in
its shortest round-trip digits, plain from 1e-5 up to below 1e16 (``0.00001``,
``1000000000000000.0``) and in exponent form outside (``1e-7``, ``2.5e+20``), so a row that
Python writes equals the Rust crate's row to the byte. A metric that is NaN or infinite is
written as ``null``, as serde_json does; the reference and candidate values of a first
mismatch keep theirs as text (``"NaN"``, ``"inf"``, ``"-inf"``), as Rust prints them.

Standard library only, so a bare ``python3`` can write and read rows.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

PASS = "pass"
FAIL = "fail"
WARN = "warn"
SKIP = "skip"
STATUSES = (PASS, FAIL, WARN, SKIP)

EXIT_PASS = 0
EXIT_FAIL = 1
# Neither pass nor fail: the orchestrator judges any other status a crash, which is what
# a gate that could not run at all should exit with.
EXIT_ERROR = 2

CHECKS = "MEMRA_ORCH_CHECKS"
ARTIFACTS = "MEMRA_ORCH_ARTIFACTS"
NODE = "MEMRA_ORCH_NODE"
ATTEMPT = "MEMRA_ORCH_ATTEMPT"
REP = "MEMRA_ORCH_REP"


def format_float(x: float) -> str:
    """The JSON text serde_json writes for the finite float `x` (``0.5``, ``1e-7``)."""
    r = repr(float(x))
    sign = ""
    if r.startswith("-"):
        sign, r = "-", r[1:]
    mantissa, _, exponent = r.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    significant = digits.lstrip("0")
    if not significant:
        return sign + "0.0"
    # The power of ten of the first significant digit.
    lead = int(exponent or 0) + len(whole) - 1 - (len(digits) - len(significant))
    significant = significant.rstrip("0")
    n = len(significant)
    if -5 <= lead <= 15:
        if n - 1 <= lead:
            return sign + significant + "0" * (lead + 1 - n) + ".0"
        if lead >= 0:
            return sign + significant[: lead + 1] + "." + significant[lead + 1 :]
        return sign + "0." + "0" * (-lead - 1) + significant
    head = significant[0] + ("." + significant[1:] if n > 1 else "")
    return f"{sign}{head}e{'+' if lead >= 0 else '-'}{abs(lead)}"


def float_text(x: float) -> str:
    """A float as Rust's ``f64::to_string`` spells it where it is not finite."""
    if math.isnan(x):
        return "NaN"
    return "inf" if x > 0 else "-inf"


def plain(value: Any) -> Any:
    """`value` as the plain JSON value serde_json would hold: numpy and torch scalars and
    arrays become numbers and lists (through ``tolist``), tuples lists, and a float that is
    NaN or infinite ``None``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be strings, not {type(k).__name__} {k!r}")
            out[k] = plain(v)
        return out
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):
        return plain(value.tolist())
    raise TypeError(
        f"cannot write {type(value).__name__} {value!r} in a row: use strings, numbers, "
        "booleans, lists or objects"
    )


def dumps(value: Any) -> str:
    """Compact JSON text of a plain value, as serde_json writes it."""
    out: list = []
    _encode(plain(value), out)
    return "".join(out)


def _encode(v: Any, out: list) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        out.append(str(v))
    elif isinstance(v, float):
        out.append(format_float(v))
    elif isinstance(v, str):
        out.append(_string(v))
    elif isinstance(v, dict):
        out.append("{")
        for i, (k, item) in enumerate(v.items()):
            if i:
                out.append(",")
            out.append(_string(k))
            out.append(":")
            _encode(item, out)
        out.append("}")
    else:
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")


def _string(s: str) -> str:
    # Python's escapes are serde_json's (the short forms, \u00XX in lowercase hex for other
    # control characters, nothing else). Text that is not valid Unicode (an environment
    # value of stray bytes) is written with U+FFFD, as Rust would read it.
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        try:
            data = s.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = s.encode("utf-8", "surrogatepass")
        s = data.decode("utf-8", "replace")
    return json.dumps(s, ensure_ascii=False)


@dataclass(frozen=True)
class FirstMismatch:
    """The first value that differed: at decode `step` (None for prompt programs), batch
    or program `row`, vocabulary `index`, the reference's and the candidate's values."""

    row: int
    index: int
    ref: float
    got: float
    step: int | None = None

    def to_json(self) -> dict:
        """``{"step":…,"row":…,"index":…,"ref":…,"got":…}``, `step` only when there is one;
        a value that is not finite as text (``"NaN"``, ``"inf"``)."""
        out = {}
        if self.step is not None:
            out["step"] = _count("first_mismatch.step", self.step)
        out["row"] = _count("first_mismatch.row", self.row)
        out["index"] = _count("first_mismatch.index", self.index)
        for key, v in (("ref", self.ref), ("got", self.got)):
            v = float(v)
            out[key] = v if math.isfinite(v) else float_text(v)
        return out

    @classmethod
    def from_json(cls, value: Any) -> FirstMismatch | None:
        """Reads the form `to_json` writes (text values parsed back to floats); None for
        any other shape, which a reader keeps as plain JSON."""
        if not isinstance(value, dict):
            return None

        def count(key):
            v = value.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

        def number(key):
            v = value.get(key)
            if isinstance(v, bool):
                return None
            if isinstance(v, (int, float)):
                return float(v)
            if isinstance(v, str) and v.strip() == v and "_" not in v:
                try:
                    return float(v)
                except ValueError:
                    return None
            return None

        step = None
        if "step" in value:
            step = count("step")
            if step is None:
                return None
        row, index, ref, got = count("row"), count("index"), number("ref"), number("got")
        if row is None or index is None or ref is None or got is None:
            return None
        return cls(row=row, index=index, ref=ref, got=got, step=step)

    def __str__(self) -> str:
        at = f"step {self.step}, " if self.step is not None else ""
        return (
            f"{at}row {self.row}, index {self.index}: ref {_show(self.ref)} got {_show(self.got)}"
        )


def _show(x: float) -> str:
    x = float(x)
    return format_float(x) if math.isfinite(x) else float_text(x)


def _count(what: str, v: Any) -> int:
    if hasattr(v, "item") and not isinstance(v, (int, float)):
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} must be a count (an integer >= 0), not {v!r}")
    return int(v)


def mismatch_json(first_mismatch: Any) -> dict | None:
    """A first mismatch given as a `FirstMismatch` or a dict of its keys, in wire form."""
    if first_mismatch is None:
        return None
    if isinstance(first_mismatch, FirstMismatch):
        return first_mismatch.to_json()
    if isinstance(first_mismatch, dict):
        unknown = set(first_mismatch) - {"step", "row", "index", "ref", "got"}
        if unknown:
            raise ValueError(
                f"first_mismatch has keys {sorted(unknown)}; it takes step, row, index, ref, got"
            )
        try:
            m = FirstMismatch(
                row=first_mismatch["row"],
                index=first_mismatch["index"],
                ref=first_mismatch["ref"],
                got=first_mismatch["got"],
                step=first_mismatch.get("step"),
            )
        except KeyError as e:
            raise ValueError(f"first_mismatch needs {e.args[0]!r} (row, index, ref, got)") from None
        return m.to_json()
    raise TypeError(
        f"first_mismatch must be a FirstMismatch or a dict, not {type(first_mismatch).__name__}"
    )


def check_row(
    name: str,
    status: str,
    message: str = "",
    metrics: dict | None = None,
    first_mismatch: Any = None,
) -> dict:
    """One check row in wire form: `check`, `status`, `metrics` and `message` in that
    order, then `first_mismatch` when there is one."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a check needs a name (a non-empty string), not {name!r}")
    if status not in STATUSES:
        raise ValueError(f"check {name}: status {status!r} is not one of pass, fail, warn, skip")
    if not isinstance(message, str):
        raise TypeError(f"check {name}: message must be a string, not {type(message).__name__}")
    if metrics is not None and not isinstance(metrics, dict):
        raise TypeError(f"check {name}: metrics must be a dict, not {type(metrics).__name__}")
    row = {
        "check": name,
        "status": status,
        "metrics": plain(metrics or {}),
        "message": message,
    }
    m = mismatch_json(first_mismatch)
    if m is not None:
        row["first_mismatch"] = m
    return row


def door_value(key: str, value: Any) -> Any:
    """`value` as a door (a string, a number or a boolean); ValueError naming the key for
    anything else, before a reader would report it as a protocol problem."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a door needs a key (a non-empty string), not {key!r}")
    if hasattr(value, "item") and not isinstance(value, (bool, int, float, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(
            f"doors.{key} is {float_text(value)}, which JSON writes as null; door values must be "
            "strings, numbers or booleans (a flat object)"
        )
    if not isinstance(value, (str, bool, int, float)):
        shown = dumps(value) if isinstance(value, (dict, list, tuple, type(None))) else repr(value)
        raise ValueError(
            f"doors.{key} is {shown}; door values must be strings, numbers or booleans "
            "(a flat object)"
        )
    return plain(value)


def doors_row(doors: dict) -> dict:
    """``{"doors":{…}}``, keys in the order given."""
    return {"doors": {k: door_value(k, v) for k, v in doors.items()}}


class AppendError(OSError):
    """A row could not be appended to the checks file."""

    def __init__(self, path: str, cause: OSError):
        super().__init__(cause.errno, cause.strerror)
        self.path = path
        self.cause = cause

    def __str__(self) -> str:
        reason = self.cause.strerror or str(self.cause)
        return (
            f"{self.path}: cannot append a check row: {reason}; MEMRA_ORCH_CHECKS must name "
            "a writable file"
        )


def append_row(path: os.PathLike[str] | str, row: dict) -> None:
    """Appends `row` as one line: the file is opened for appending and the line written in
    one call, because several processes of one gate may share the file."""
    data = (dumps(row) + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as e:
        raise AppendError(os.fspath(path), e) from e


def env_path(name: str) -> str | None:
    """A path from the environment; unset and empty are the same (not asked for)."""
    return os.environ.get(name) or None
