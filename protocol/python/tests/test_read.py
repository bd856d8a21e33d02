"""The reader: leniency (blank lines, unknown keys, other shapes of first_mismatch), merged
doors, and one located problem per line that breaks the protocol, in the Rust reader's
words."""

import math

import memra_gate as mg
from memra_gate.wire import append_row, check_row


def test_rows_written_are_rows_read(tmp_path):
    path = tmp_path / "checks.jsonl"
    written = [
        check_row(
            f"c{i}",
            status,
            f"message {i}",
            {"compared": 49152, "maxdiff": 0.5, "policy": "bitwise"},
            mg.FirstMismatch(step=i, row=1, index=811, ref=1.25, got=1.2500001),
        )
        for i, status in enumerate(mg.STATUSES)
    ]
    for row in written:
        append_row(path, row)
    report = mg.read_checks(path)
    assert report.problems == []
    assert report.checks == written
    assert report.first_failed()["check"] == "c1"
    assert report.speaks_protocol()
    assert report.doors is None
    assert mg.mismatch(report.checks[2]) == mg.FirstMismatch(
        step=2, row=1, index=811, ref=1.25, got=1.2500001
    )


def test_non_finite_mismatches_read_back_as_floats():
    report = mg.parse_checks(
        '{"check":"nan","status":"fail","metrics":{"max_abs":null},"message":"",'
        '"first_mismatch":{"row":1,"index":811,"ref":"inf","got":"NaN"}}\n'
    )
    m = mg.mismatch(report.checks[0])
    assert (m.step, m.row, m.index, m.ref) == (None, 1, 811, math.inf)
    assert math.isnan(m.got)
    assert report.checks[0]["metrics"] == {"max_abs": None}


def test_doors_rows_merge_a_later_row_winning():
    report = mg.parse_checks(
        '{"doors":{"backend":"cpu","pp_stages":2,"ratio":0.5,"fa3":true}}\n'
        '{"doors":{"backend":"cuda"}}\n'
    )
    assert report.problems == []
    assert report.checks == []
    assert report.speaks_protocol()
    assert report.doors == {"backend": "cuda", "pp_stages": 2, "ratio": 0.5, "fa3": True}


def test_malformed_lines_name_their_line():
    report = mg.parse_checks(
        '{"check":"a","status":"pass"}\n'
        "not json\n"
        '{"check":"b","status":"maybe"}\n'
        '{"doors":{"x":[1]}}\n'
        "[1,2]\n"
        "\n"
        '{"doors":3}\n'
        '{"doors":{"y":null}}\n'
        '{"status":"pass"}\n'
        '{"check":"c","status":"pass","value":NaN}\n'
        '{"check":"d","status":"pass","metrics":null}\n'
        '{"check":7,"status":"pass"}\n'
        '{"check":"e","status":"pass","message":3}\n'
        '{"check":"f","status":"pass","big":1e999}'
    )
    assert len(report.checks) == 1
    expected = ' expected {"check":NAME,"status":"pass|fail|warn|skip",…} or {"doors":{…}}'
    assert report.problems[0].startswith("checks.jsonl line 2: not JSON (")
    assert report.problems[1:] == [
        "checks.jsonl line 3: not a check row (unknown variant `maybe`, expected one of "
        "`pass`, `fail`, `warn`, `skip`);" + expected,
        "checks.jsonl line 4: doors.x is [1]; door values must be strings, numbers or "
        "booleans (a flat object)",
        "checks.jsonl line 5: not a JSON object",
        'checks.jsonl line 7: "doors" must be an object of strings, numbers and booleans',
        "checks.jsonl line 8: doors.y is null; door values must be strings, numbers or "
        "booleans (a flat object)",
        "checks.jsonl line 9: not a check row (missing field `check`);" + expected,
        report.problems[7],
        "checks.jsonl line 11: not a check row (invalid type: null, expected a map);" + expected,
        "checks.jsonl line 12: not a check row (invalid type: integer `7`, expected a string);"
        + expected,
        "checks.jsonl line 13: not a check row (invalid type: integer `3`, expected a string);"
        + expected,
        report.problems[11],
    ]
    assert report.problems[7].startswith("checks.jsonl line 10: not JSON (NaN is not JSON")
    assert report.problems[11].startswith("checks.jsonl line 14: not JSON (number out of range")
    assert report.doors is None
    assert report.speaks_protocol()


def test_rows_of_other_writers_keep_their_unknown_keys_and_shapes():
    report = mg.parse_checks(
        '{"check":"x","status":"warn","elapsed_s":1.5,"first_mismatch":{"tensor":"logits","row":0}}'
    )
    assert report.problems == []
    row = report.checks[0]
    assert "message" not in row
    assert row["elapsed_s"] == 1.5
    assert row["first_mismatch"] == {"tensor": "logits", "row": 0}
    assert mg.mismatch(row) is None
    assert report.first_failed() is None


def test_crlf_blank_lines_and_surrounding_space_are_fine():
    report = mg.parse_checks('\r\n  {"check":"a","status":"pass"}  \r\n\n\t\n{"doors":{"k":1}}\r\n')
    assert report.problems == []
    assert [c["check"] for c in report.checks] == ["a"]
    assert report.doors == {"k": 1}


def test_a_missing_file_is_an_empty_report_and_an_unreadable_one_a_problem(tmp_path):
    report = mg.read_checks(tmp_path / "never-written.jsonl")
    assert report == mg.Report()
    assert not report.speaks_protocol()
    report = mg.read_checks(tmp_path)
    assert len(report.problems) == 1
    assert report.problems[0].startswith(f"{tmp_path}: cannot read: Is a directory (os error 21)")


def test_bytes_that_are_not_utf8_are_read_lossily(tmp_path):
    path = tmp_path / "checks.jsonl"
    path.write_bytes(b'{"check":"a\xff","status":"pass"}\n')
    assert mg.read_checks(path).checks[0]["check"] == "a\ufffd"
