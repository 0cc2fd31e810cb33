"""NOSCRIPT storms are weather (issue #19): redis-py reloads a script once after
NOSCRIPT; a second NOSCRIPT in a row (the script cache flushed again, as by two SCRIPT
FLUSHes close together) used to surface as a ScriptError, which a worker's fetch loop
took as fatal (exit 2, its leases left to expire). Now every driver pauses, reloads and
sends again within scripts.NOSCRIPT_BUDGET_S, and a worker drains through a storm of
SCRIPT FLUSH with 0 lost and no exit."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest
import redis

from pyqueue import Queue
from pyqueue import scripts as scripts_module
from pyqueue.aio import AsyncQueue
from pyqueue.worker import EXIT_OK, Worker
from conftest import async_client



def flaky_evalsha(client: Any, refusals: int) -> list[int]:
    """Make ``client`` answer NOSCRIPT to its next ``refusals`` EVALSHA calls (as a server
    whose cache is flushed again after every load would); the count of refusals sent."""
    sent = [0]
    real = client.evalsha

    def evalsha(*args: Any, **kwargs: Any) -> Any:
        if sent[0] < refusals:
            sent[0] += 1
            raise redis.exceptions.NoScriptError("No matching script. Please use EVAL.")
        return real(*args, **kwargs)

    client.evalsha = evalsha
    return sent


def test_a_call_answered_noscript_many_times_in_a_row_is_reloaded_and_sent_again(backend: str, r: Any) -> None:
    q = Queue("q", r)
    q.enqueue(b"first")
    sent = flaky_evalsha(r, 5)
    (job,) = q.lease()
    assert sent == [5] and job.payload == b"first"
    assert q.ack(job).name == "OK"


def test_the_async_driver_rides_out_noscript_too(backend: str, r: Any) -> None:

    async def scenario() -> None:
        client = async_client(r)
        try:
            q = AsyncQueue("q", client)
            await q.enqueue(b"first")
            sent = flaky_evalsha(client, 4)
            (job,) = await q.lease()
            assert sent == [4] and job.payload == b"first"
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_noscript_past_the_budget_is_raised(backend: str, r: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scripts_module, "NOSCRIPT_BUDGET_S", 0.2)
    q = Queue("q", r)
    flaky_evalsha(r, 10_000)
    started = time.monotonic()
    with pytest.raises(Exception, match="No matching script"):
        q.stats()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("where", ["real", "cluster"])
def test_a_worker_drains_through_a_storm_of_script_flush_with_nothing_lost(where: str, request: pytest.FixtureRequest) -> None:
    """SCRIPT FLUSH every 0-4 ms (at random) from another client while a worker drains."""
    if where == "cluster":
        r: Any = request.getfixturevalue("cluster")
    else:
        r = request.getfixturevalue("redis_server").client()
        r.flushall()
    jobs = 300
    q = Queue("q", r)
    for start in range(0, jobs, 100):
        q.enqueue_many([f"{i}".encode() for i in range(start, start + 100)])
    ran: set[bytes] = set()
    lock = threading.Lock()

    def handler(job: Any) -> None:
        with lock:
            ran.add(job.payload)

    worker = Worker(["q"], handler, redis=r, concurrency=4, block_ms=100)
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(worker.run(install_signal_handlers=False)))
    flushes = [0]
    halt = threading.Event()
    flusher_client = r  # SCRIPT FLUSH goes to every primary on a cluster client

    def flusher() -> None:
        rng = random.Random(19)
        while not halt.is_set():
            flusher_client.script_flush()
            flushes[0] += 1
            time.sleep(rng.uniform(0, 0.004))

    storm = threading.Thread(target=flusher)
    runner.start()
    storm.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and runner.is_alive():
        if q.stats().acked >= jobs:
            if flushes[0] > 100:
                break
            # A loaded machine drained faster than the storm flushed: more jobs, so the
            # drain meets at least 100 flushes (the storm is what this test is about).
            q.enqueue_many([f"{i}".encode() for i in range(jobs, jobs + 100)])
            jobs += 100
        time.sleep(0.05)
    halt.set()
    storm.join(10)
    worker.stop()
    runner.join(30)
    stats = q.stats()
    assert codes == [EXIT_OK], worker.exit_reason
    assert (stats.acked, stats.ready, stats.leased, stats.dead) == (jobs, 0, 0, 0)
    assert len(ran) == jobs and flushes[0] > 100
