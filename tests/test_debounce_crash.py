"""The debounce crash harness (tests/debounce_crash.py) at CI size on a real
redis-server: producers and workers SIGKILLed 20 times while bursts of debounced sends
for 12 keys run; at most one job per key ever waits, every key's last answered send
runs to its end, and nothing is left. The deep size is in its docstring (and in the
closing notes)."""

from __future__ import annotations

import shutil

import pytest
from conftest import IN_CI

import debounce_crash


def test_debounce_keeps_one_waiting_job_per_key_and_runs_the_last_send_under_kills() -> None:
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("redis-server not installed, and CI=true forbids skipping")
        pytest.skip("redis-server not installed")
    report = debounce_crash.run(debounce_crash.Config(keys=12, kills=20, seconds=8.0))
    print(report.line())
    assert not report.problems, report.problems[:10]
    assert report.kills == 20 and report.snapshots > 50
    assert report.most_waiting == 1  # the checker saw keys waiting, one job each
