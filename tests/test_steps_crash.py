"""The durable-steps crash harness (tests/steps_crash.py) at CI size on a real
redis-server: 200 jobs of five committed steps, a sleep and a wait, through worker
processes SIGKILLed 20 times; every step's function runs again only after a kill of the
process that ran it, no sleep or wait uses an attempt, every result is right, and
nothing is left behind. The deep size is in its docstring (and in the closing notes)."""

from __future__ import annotations

import shutil

import pytest
from conftest import IN_CI

import steps_crash


def test_durable_steps_survive_kills_and_run_each_committed_step_once() -> None:
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("redis-server not installed, and CI=true forbids skipping")
        pytest.skip("redis-server not installed")
    report = steps_crash.run(steps_crash.Config(jobs=200, kills=20))
    print(report.line())
    assert not report.problems, report.problems[:10]
    assert report.jobs == 200 and report.kills == 20
    # Every job ran at least twice (first, after its sleep); the odd ones three times
    # (after their wait's timeout), and the even ones signalled after they parked too.
    assert report.runs >= 2 * 200 + 100
