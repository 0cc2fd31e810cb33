"""Prefetch (``Worker(prefetch=P)``, ``pyqueue worker --prefetch P``): a worker holds up
to ``concurrency + P`` jobs leased, the P beyond its threads waiting for a free thread;
on fakeredis and a real server.

* it holds exactly that many, runs every job once, and a plain worker (P = 0) holds no
  more than its threads;
* a prefetched job cancelled while it waits is not run;
* a stop runs the prefetched jobs within its grace period, and those still waiting at
  its end are released, not run;
* an AsyncWorker prefetches as the sync one does, and still runs at most
  ``concurrency`` handlers at once;
* a bad count is refused before anything runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
import redis

from pyqueue import InvalidArgument, Job, NewJob, Queue
from pyqueue.worker.aio import AsyncWorker
from pyqueue.cli import main
from pyqueue.worker import Worker

#: Leases extended every 200 ms: a cancel reaches the worker within that.
LEASE_MS = 600


def start(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    return thread


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_a_worker_holds_concurrency_plus_prefetch_jobs_and_runs_each_once(r: redis.Redis, prefetch: int) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(12)])
    gate, ran, lock = threading.Event(), [], threading.Lock()

    def handle(job: Job) -> None:
        with lock:
            ran.append(job.id)
        assert gate.wait(10)

    worker = Worker(["q"], handle, redis=r, concurrency=2, prefetch=prefetch, block_ms=100)
    thread = start(worker)
    try:
        wait_until(lambda: q.stats().leased == 2 + prefetch and len(ran) == 2, "the worker did not fill up")
        time.sleep(0.2)  # and it takes no more
        assert q.stats().leased == 2 + prefetch and len(ran) == 2
        gate.set()
        wait_until(lambda: q.stats().acked == 12, "the jobs were not all acked")
    finally:
        gate.set()
        worker.stop("test finished")
        thread.join(10)
    assert sorted(ran) == sorted(f"j{i}" for i in range(12))  # each ran once


def test_a_prefetched_job_cancelled_while_it_waits_is_not_run(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id="first"), NewJob(b"", job_id="waiting")])
    gate, ran = threading.Event(), []

    def handle(job: Job) -> None:
        ran.append(job.id)
        assert gate.wait(10)

    worker = Worker(["q"], handle, redis=r, concurrency=1, prefetch=1, lease_ms=LEASE_MS, block_ms=100)
    thread = start(worker)
    try:
        wait_until(lambda: ran == ["first"] and q.stats().leased == 2, "the second job was not prefetched")
        assert q.cancel("waiting").state == "leased"
        time.sleep(3 * LEASE_MS / 1000)  # past the next extensions: the worker heard of it
        gate.set()
        wait_until(lambda: q.stats().acked == 1, "the first job was not acked")
        time.sleep(0.2)
    finally:
        gate.set()
        worker.stop("test finished")
        thread.join(10)
    s = q.stats()
    assert ran == ["first"]
    assert (s.acked, s.cancelled, s.leased, s.ready, s.nacked) == (1, 1, 0, 0, 0)


def test_a_stop_releases_the_prefetched_jobs_still_waiting_at_the_end_of_its_grace_period(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)])
    gate, ran = threading.Event(), []

    def handle(job: Job) -> None:
        ran.append(job.id)
        gate.wait(10)

    worker = Worker(["q"], handle, redis=r, concurrency=1, prefetch=2, grace_ms=300, block_ms=100)
    thread = start(worker)
    try:
        wait_until(lambda: len(ran) == 1 and q.stats().leased == 3, "the worker did not prefetch")
        worker.stop("test finished")
        thread.join(10)
        assert not thread.is_alive()
        s = q.stats()
        assert (s.released, s.ready, s.leased, s.acked) == (3, 3, 0, 0)
        gate.set()  # the running handler returns after its job was released ...
        time.sleep(0.3)
    finally:
        gate.set()
    assert len(ran) == 1 and q.stats().acked == 0  # ... and the prefetched ones never ran


def test_a_stop_runs_the_prefetched_jobs_within_its_grace_period(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)])
    gate, ran = threading.Event(), []

    def handle(job: Job) -> None:
        ran.append(job.id)
        assert gate.wait(10)

    worker = Worker(["q"], handle, redis=r, concurrency=1, prefetch=2, grace_ms=10_000, block_ms=100)
    thread = start(worker)
    wait_until(lambda: len(ran) == 1 and q.stats().leased == 3, "the worker did not prefetch")
    worker.stop("test finished")
    gate.set()
    thread.join(10)
    assert not thread.is_alive()
    s = q.stats()
    assert sorted(ran) == ["j0", "j1", "j2"] and (s.acked, s.leased, s.released) == (3, 0, 0)


def test_a_bad_prefetch_is_refused(r: redis.Redis, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (-1, 1001, 1.5, True):
        with pytest.raises(InvalidArgument, match="prefetch"):
            Worker(["q"], lambda job: None, redis=r, prefetch=bad)  # type: ignore[arg-type]
    assert main(["worker", "handlers:slow", "-q", "q", "--prefetch", "-1", "--burst"]) != 0
    assert "prefetch" in capsys.readouterr().err


def test_an_async_worker_prefetches_and_still_runs_at_most_concurrency_handlers_at_once(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(30)])
    now, most, seen = [0], [0], []

    async def handle(job: Job) -> None:
        now[0] += 1  # the handlers' tasks all run on the one event loop: no lock needed
        most[0] = max(most[0], now[0])
        seen.append(q.stats().leased)
        await asyncio.sleep(0.005)
        now[0] -= 1

    worker = AsyncWorker(["q"], handle, redis=r, concurrency=2, prefetch=4, block_ms=100)
    assert asyncio.run(worker.run(burst=True, install_signal_handlers=False)) == 0
    assert q.stats().acked == 30 and most[0] == 2
    assert max(seen) == 6  # 2 running + 4 prefetched, never more
