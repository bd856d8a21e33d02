"""The Python side of the cross-language wire test (protocol/tests/python_wire.rs), run with
a bare python3 and PYTHONPATH on protocol/python/src: it needs no numpy.

    wire_fixture.py write        writes the rows below through a Gate from the environment
                                 (MEMRA_ORCH_CHECKS) and exits with gate.finish()
    wire_fixture.py read PATH    reads PATH with read_checks and prints a summary as one
                                 JSON object: checks, doors, problems, each check's first
                                 mismatch as FirstMismatch reads and writes it back,
                                 the first failed check, speaks_protocol

The Rust test writes the same rows with its ChecksWriter and compares; keep the two lists in
step.
"""

import sys

import memra_gate as mg
from memra_gate.wire import dumps

# Escapes and non-ASCII text in one string.
LABEL = 'ünï "q" \\ \t 模型 ✓'
PIN = "MEMRA_WIRE_TEST_PIN"
UNSET = "MEMRA_WIRE_TEST_UNSET"


def write() -> int:
    gate = mg.Gate()
    gate.door("backend", "cpu")
    gate.door("threads", 4)
    gate.door("ratio", 0.5)
    gate.door("fast_path", False)
    gate.door("label", LABEL)
    gate.env(PIN)
    gate.env(UNSET)
    gate.check(
        "sum",
        mg.PASS,
        "1 + 2 + 3 = 6",
        metrics={
            "compared": 3,
            "maxdiff": 0.0,
            "ratio": 0.5,
            "scale": 1.25,
            "small": 1e-7,
            "tiny": 0.00001,
            "big": 2.5e20,
            "policy": "bitwise",
            "exact": True,
        },
    )
    gate.check(
        "gate2",
        mg.FAIL,
        "rows differ",
        metrics={"mismatches": 2},
        first_mismatch=mg.FirstMismatch(step=3, row=1, index=811, ref=1.25, got=1.2500001),
    )
    gate.check(
        "drift",
        mg.WARN,
        "2 of 102 rows differ, within tolerance",
        metrics={"agree": 0.98, "rows": 102},
        first_mismatch={"step": 0, "row": 4, "index": 2, "ref": float("-inf"), "got": 0.5},
    )
    gate.check("cuda-only", mg.SKIP, "no GPU")
    gate.check(
        "nan",
        mg.FAIL,
        LABEL,
        metrics={"max_abs": float("nan")},
        first_mismatch=mg.FirstMismatch(row=0, index=7, ref=float("nan"), got=float("inf")),
    )
    return gate.finish()


def read(path: str) -> int:
    report = mg.read_checks(path)
    mismatches = []
    for row in report.checks:
        m = mg.mismatch(row)
        mismatches.append(None if m is None else m.to_json())
    failed = report.first_failed()
    summary = {
        "checks": report.checks,
        "doors": report.doors,
        "problems": report.problems,
        "mismatches": mismatches,
        "first_failed": None if failed is None else failed["check"],
        "speaks_protocol": report.speaks_protocol(),
    }
    print(dumps(summary))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["write"]:
        sys.exit(write())
    if len(sys.argv) == 3 and sys.argv[1] == "read":
        sys.exit(read(sys.argv[2]))
    sys.exit(f"usage: {sys.argv[0]} write | read PATH")
