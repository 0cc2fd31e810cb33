"""The flow crash harness (tests/flow_crash.py) at CI size on a real redis-server:
chords and chains through worker processes SIGKILLed at random, paused past their
leases, and dying between an ack and its report; every continuation runs for one job,
when all it waits for has ended, and nothing is left behind. The deep size is in its
docstring (and in the closing notes)."""

from __future__ import annotations

import shutil

import pytest
from conftest import IN_CI

import flow_crash


def test_flows_survive_kills_zombies_and_lost_reports() -> None:
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("redis-server not installed, and CI=true forbids skipping")
        pytest.skip("redis-server not installed")
    report = flow_crash.run(flow_crash.Config(chords=40, members=5, chains=40, length=3, kills=6))
    print(report.line())
    assert not report.problems, report.problems[:10]
    assert report.flows == 80 and report.kills == 6
