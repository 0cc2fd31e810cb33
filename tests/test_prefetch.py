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
* a bad count is refused before anything runs;
* ``"auto"``, the default: the pace turns ``concurrency`` more slots on while the jobs
  average under 10 ms and takes them back once they average over 50 ms (the jobs held
  then end without leasing others in their place), and a worker of short jobs holds up
  to twice its threads, one of long jobs no more than its threads.
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
from pyqueue.worker.running import Pace, Running

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
    for bad in (-1, 1001, 1.5, True, "fast", "Auto"):
        with pytest.raises(InvalidArgument, match="prefetch"):
            Worker(["q"], lambda job: None, redis=r, prefetch=bad)  # type: ignore[arg-type]
    for text in ("-1", "fast"):
        with pytest.raises(SystemExit) as exited:
            main(["worker", "handlers:slow", "-q", "q", "--prefetch", text, "--burst"])
        assert exited.value.code == 2 and "--prefetch: prefetch must be" in capsys.readouterr().err


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


def test_the_pace_turns_its_slots_on_under_10_ms_and_takes_them_back_over_50_ms() -> None:
    running = Running(2, auto_prefetch=2)
    assert (running.capacity, running.free, running.pace.on) == (2, 2, False)
    running.pace.ran(0.040)  # between the two thresholds: stays off
    assert running.capacity == 2
    while not running.pace.on:
        running.pace.ran(0.001)
    assert (running.capacity, running.free) == (4, 4)
    running.take(4)  # every slot holds a job
    while running.pace.on:
        running.pace.ran(0.200)
    # The two slots go as their jobs end: until then an ending job leases none in its place.
    assert (running.capacity, running.free, running.shrinking()) == (2, -2, True)
    running.give_back(2)
    assert (running.free, running.shrinking()) == (0, False)
    running.give_back(2)
    assert running.free == 2
    assert running.pace.mean_s is not None and running.pace.mean_s > Pace.OFF_ABOVE_S
    fixed = Running(3)  # prefetch given as a number (or 0): no pace
    fixed.pace.ran(0.001)
    assert (fixed.capacity, fixed.pace.on) == (3, False)


@pytest.mark.parametrize("job_s, most", [(0.0, 4), (0.06, 2)], ids=["short", "long"])
def test_by_default_a_worker_prefetches_short_jobs_and_not_long_ones(r: redis.Redis, job_s: float, most: int) -> None:
    q = Queue("q", r)
    n = 300 if job_s == 0 else 12
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(n)])
    held: list[int] = []

    def handle(job: Job) -> None:
        held.append(q.stats().leased)
        time.sleep(job_s)

    worker = Worker(["q"], handle, redis=r, concurrency=2, block_ms=100)
    thread = start(worker)
    try:
        wait_until(lambda: q.stats().acked == n, "the jobs did not all run", 30)
    finally:
        worker.stop()
        thread.join(10)
    assert len(held) == n and max(held) == most
