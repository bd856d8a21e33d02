"""Every test starts outside the orchestrator: its variables and the canary unset, so a
test run that is itself a gate's attempt never writes into that attempt's files."""

import pytest

import memra_gate as mg


@pytest.fixture(autouse=True)
def _run_by_hand(monkeypatch):
    for name in (mg.CHECKS, mg.ARTIFACTS, mg.NODE, mg.ATTEMPT, mg.REP, mg.CANARY):
        monkeypatch.delenv(name, raising=False)
