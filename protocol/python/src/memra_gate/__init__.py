"""memra-gate: a gate for `memra-orch` in Python, speaking the memra gate protocol
(``docs/gate-protocol.md``) byte for byte as the Rust crate `memra-protocol` does.

A gate reports check rows, one doors row (the code paths it actually ran) and artifacts,
and exits 0 (pass) or 1 (fail) in agreement with its rows::

    import sys
    import memra_gate as mg

    gate = mg.Gate()
    gate.door("backend", "cpu")
    gate.check_close("logits", ref, got, max_abs=1e-3)
    sys.exit(gate.finish())

Modules: `wire` (the rows, standard library only), `read` (the reader), `gate` (`Gate`),
`compare` (the numeric checks), `arrays` (numpy, torch and `BF16` inputs) and
`safetensors` (artifacts). Importing the package needs the standard library alone; numpy
is imported by the first numeric check or artifact, torch never.
"""

from .arrays import BF16
from .compare import Verdict
from .gate import CANARY, Gate
from .read import Report, mismatch, parse_checks, read_checks
from .safetensors import load_file, save_file
from .wire import (
    ARTIFACTS,
    ATTEMPT,
    CHECKS,
    EXIT_ERROR,
    EXIT_FAIL,
    EXIT_PASS,
    FAIL,
    NODE,
    PASS,
    REP,
    SKIP,
    STATUSES,
    WARN,
    AppendError,
    FirstMismatch,
)

__all__ = [
    "ARTIFACTS",
    "ATTEMPT",
    "BF16",
    "CANARY",
    "CHECKS",
    "EXIT_ERROR",
    "EXIT_FAIL",
    "EXIT_PASS",
    "FAIL",
    "NODE",
    "PASS",
    "REP",
    "SKIP",
    "STATUSES",
    "WARN",
    "AppendError",
    "FirstMismatch",
    "Gate",
    "Report",
    "Verdict",
    "load_file",
    "mismatch",
    "parse_checks",
    "read_checks",
    "save_file",
]
