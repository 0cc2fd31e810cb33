"""Handlers for worker subprocesses in tests (``PYTHONPATH=tests``).

Each records its executions durably (RPUSH to a Redis list), so a test can count runs
across processes that may be killed.
"""

from __future__ import annotations

import os
import time

from pyqueue import Job, connect

_client = None


def runs_key() -> str:
    return "test:{runs}:" + os.environ.get("PQ_TEST_RUNS", "runs")


def slow(job: Job) -> None:
    """Record the start of the run, then sleep PQ_TEST_SLEEP_S seconds."""
    global _client
    if _client is None:
        _client = connect(os.environ["PQ_TEST_URL"])
    _client.rpush(runs_key(), job.id)
    time.sleep(float(os.environ.get("PQ_TEST_SLEEP_S", "0")))


_async_client = None


async def slow_async(job: Job) -> None:
    """``slow`` as an ``async def`` handler (pyqueue worker runs it on AsyncWorker):
    records its run, then awaits PQ_TEST_SLEEP_S seconds."""
    import asyncio

    from pyqueue import aio

    global _async_client
    if _async_client is None:
        _async_client = aio.connect(os.environ["PQ_TEST_URL"])
    await _async_client.rpush(runs_key(), job.id)
    await asyncio.sleep(float(os.environ.get("PQ_TEST_SLEEP_S", "0")))
