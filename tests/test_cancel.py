"""cancel (lua/cancel.lua): a job ends now in every state, a leased one's lease with it,
and nothing brings it back; on both drivers and a cluster."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from pyqueue import Cancelled, InvalidArgument, Job, NewJob, Outcome, Queue
from pyqueue.worker.aio import AsyncWorker
from pyqueue.worker import Worker

ON_CLUSTER = True
ASYNC_TOO = True

T0 = 1_000_000


def test_each_state_is_cancelled_and_leaves_nothing_behind(q: Queue) -> None:
    q.enqueue_many(
        [NewJob(b"", job_id="r"), NewJob(b"", job_id="s", delay_ms=500), NewJob(b"", job_id="l"),
         NewJob(b"", job_id="d", max_attempts=1), NewJob(b"", job_id="keep")],
        now_ms=T0,
    )
    leased = q.lease(count=3, lease_ms=1000, now_ms=T0)  # r, l, d
    q.nack(leased[2], "broke", now_ms=T0)
    q.release([leased[0]])  # r is ready again, at the head
    assert [q.cancel(i, now_ms=T0 + 1) for i in ("r", "s", "l", "d")] == [
        Cancelled(i, q.name, state) for i, state in (("r", "ready"), ("s", "scheduled"), ("l", "leased"), ("d", "dead"))
    ]
    for i in ("r", "s", "l", "d"):
        info = q.get(i, now_ms=T0 + 2)
        assert (info.state, info.done_until_ms) == ("done", T0 + 1 + q.spec.keep_done_ms)
    s = q.stats(now_ms=T0 + 2)
    assert (s.ready, s.scheduled, s.leased, s.dead, s.cancelled) == (1, 0, 0, 0, 4)
    # The cancelled lease is no ack: acked is derived from how leases ended.
    assert (s.leased_total, s.acked, s.released, s.nacked) == (3, 0, 1, 1)
    assert [j.id for j in q.lease(count=10, now_ms=T0 + 3)] == ["keep"]


def test_a_cancelled_lease_cannot_be_acked_nacked_extended_or_reclaimed(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="a"), NewJob(b"", job_id="b"), NewJob(b"", job_id="c")], now_ms=T0)
    a, b, c = q.lease(count=3, lease_ms=100, now_ms=T0)
    for job in (a, b, c):
        assert q.cancel(job.id, now_ms=T0 + 1).state == "leased"
    assert q.extend([a], lease_ms=100, now_ms=T0 + 2)[0].outcome is Outcome.GONE
    assert q.ack(a, now_ms=T0 + 2) is Outcome.GONE
    assert q.nack(b, "failed after the cancel", now_ms=T0 + 2).outcome is Outcome.GONE
    # Past the deadlines: maintenance finds no lease to reclaim, and nothing is leased.
    assert q.lease(count=3, now_ms=T0 + 10_000) == []
    s = q.stats(now_ms=T0 + 10_000)
    assert (s.reclaimed, s.dead, s.scheduled, s.acked, s.nacked, s.cancelled) == (0, 0, 0, 0, 0, 3)


def test_a_cancelled_id_stays_a_duplicate_for_keep_done_ms(q: Queue) -> None:
    q.enqueue(b"", job_id="x", now_ms=T0)
    assert q.cancel("x", now_ms=T0).cancelled
    assert not q.enqueue(b"", job_id="x", now_ms=T0 + q.spec.keep_done_ms - 1).added
    assert q.enqueue(b"", job_id="x", now_ms=T0 + q.spec.keep_done_ms + 1).added


def test_a_second_cancel_and_an_unknown_id_change_nothing(q: Queue) -> None:
    q.enqueue(b"", job_id="x", now_ms=T0)
    assert q.cancel("x", now_ms=T0).state == "ready"
    again = q.cancel("x", now_ms=T0 + 1)  # a re-sent call: one cancel
    assert (again.state, again.cancelled) == ("done", False)
    assert q.cancel("never", now_ms=T0).state == "unknown"
    assert q.stats(now_ms=T0 + 1).cancelled == 1


def test_ready_jobs_around_the_cancelled_one_keep_their_order(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(6)], now_ms=T0)
    q.cancel("j3", now_ms=T0)
    assert [j.id for j in q.lease(count=10, now_ms=T0)] == ["j0", "j1", "j2", "j4", "j5"]


def test_without_tombstones_the_id_is_free_at_once(make_queue: object) -> None:
    q = make_queue("nokeep", keep_done_ms=0)  # type: ignore[operator]
    q.enqueue(b"", job_id="x", now_ms=T0)
    assert q.cancel("x", now_ms=T0).state == "ready"
    assert q.cancel("x", now_ms=T0).state == "unknown"
    assert q.enqueue(b"", job_id="x", now_ms=T0).added


def test_a_lease_of_another_id_that_ends_with_this_one_is_not_cancelled(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="a|b"), NewJob(b"", job_id="b"), NewJob(b"", job_id="*")], now_ms=T0)
    (ab,) = q.lease(now_ms=T0)  # its receipt ends in '|b'
    assert q.cancel("b", now_ms=T0).state == "ready"
    assert q.cancel("*", now_ms=T0).state == "ready"  # a glob character matches itself only
    assert q.get("a|b", now_ms=T0).state == "leased" and q.ack(ab, now_ms=T0) is Outcome.OK


def test_a_partitioned_queue_cancels_in_the_ids_partition(make_queue: object) -> None:
    q = make_queue("p", partitions=4)  # type: ignore[operator]
    q.enqueue_many([NewJob(b"x", job_id=f"j{i}") for i in range(8)], now_ms=T0)
    results = [q.cancel(f"j{i}", now_ms=T0) for i in range(8)]
    assert {c.state for c in results} == {"ready"} and len({c.queue for c in results}) > 1
    assert q.stats(now_ms=T0).cancelled == 8 and q.stats(now_ms=T0).ready == 0


def test_a_bad_id_is_refused_before_anything_is_sent(q: Queue) -> None:
    for bad in ("", "x" * 257, "a\nb", 7):
        with pytest.raises(InvalidArgument):
            q.cancel(bad)  # type: ignore[arg-type]


def test_past_ten_thousand_leases_ready_and_leased_jobs_are_still_found(q: Queue, r: redis.Redis) -> None:
    # The first 10 pages of LEASED are scanned, then READY, then the rest of LEASED.
    q.enqueue_many([NewJob(b"", job_id=f"l{i}") for i in range(1000)], now_ms=T0)
    for chunk in range(11):
        q.enqueue_many([NewJob(b"", job_id=f"l{chunk}-{i}") for i in range(1000)], now_ms=T0)
    leased = []
    for _ in range(12):
        leased += q.lease(count=1000, lease_ms=60_000, now_ms=T0)
    q.enqueue_many([NewJob(b"", job_id="ready-1"), NewJob(b"", job_id="ready-2")], now_ms=T0)
    assert len(leased) == 12_000
    assert q.cancel("ready-2", now_ms=T0).state == "ready"
    assert all(q.cancel(job.id, now_ms=T0).state == "leased" for job in leased[::997])
    assert q.stats(now_ms=T0).leased == 12_000 - len(leased[::997])


# -- a running job: its worker learns the cancel at the next extension ------------------

LEASE_MS = 600  # extended every 200 ms


def cancel_when_running(q: Queue, job_id: str, running: threading.Event) -> float:
    assert running.wait(10), "the handler never started"
    assert q.cancel(job_id).state == "leased"
    return time.monotonic()


def test_a_sync_handler_sees_the_cancel_and_its_job_ends_as_cancelled(r: redis.Redis) -> None:
    q = Queue("w", r)
    q.enqueue(b"", job_id="long")
    running, seen = threading.Event(), []

    def handle(job: Job) -> None:
        running.set()
        seen.append(job.cancelled.wait(10))
        raise RuntimeError("stopped half-way")  # whatever it does now, the job stays cancelled

    worker = Worker(["w"], handle, redis=r, lease_ms=LEASE_MS, block_ms=100)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        cancelled_at = cancel_when_running(q, "long", running)
        deadline = cancelled_at + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [True]
        assert time.monotonic() - cancelled_at < LEASE_MS / 1000 + 1  # the next extension, not the deadline
        time.sleep(LEASE_MS / 1000)
        s = q.stats()
        assert (s.cancelled, s.nacked, s.dead, s.scheduled, s.ready, s.leased, s.acked) == (1, 0, 0, 0, 0, 0, 0)
        assert q.get("long").state == "done"
    finally:
        worker.stop("test finished")
        thread.join(10)


def test_an_async_handlers_task_is_cancelled(r: redis.Redis) -> None:
    q = Queue("w", r)
    q.enqueue(b"", job_id="long")
    running, seen = threading.Event(), []

    async def handle(job: Job) -> None:
        running.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append(job.cancelled.is_set())
            raise

    worker = AsyncWorker(["w"], handle, redis=r, lease_ms=LEASE_MS, block_ms=100)
    thread = threading.Thread(
        target=lambda: asyncio.run(worker.run(install_signal_handlers=False)), daemon=True
    )
    thread.start()
    try:
        cancelled_at = cancel_when_running(q, "long", running)
        while not seen and time.monotonic() < cancelled_at + 5:
            time.sleep(0.01)
        assert seen == [True]
        time.sleep(LEASE_MS / 1000)
        s = q.stats()
        assert (s.cancelled, s.nacked, s.scheduled, s.ready, s.leased) == (1, 0, 0, 0, 0)
    finally:
        worker.stop("test finished")
        thread.join(10)


def test_a_jobs_cancelled_flag_acts_as_an_event_between_threads() -> None:
    """``Job.cancelled`` is a flag that makes its Event only when a handler waits (one
    per leased job otherwise costs a lock and a condition): set before a wait, during
    one, from another thread, by many waiters at once: every waiter wakes."""
    from pyqueue.protocol.models import CancelFlag

    flag = CancelFlag()
    assert not flag.is_set() and flag.wait(0.01) is False
    flag.set()
    assert flag.is_set() and flag.wait(0) is True
    flag.clear()
    assert not flag.is_set() and flag.wait(0.01) is False

    for _ in range(200):  # set while waiters are making the Event
        flag = CancelFlag()
        woke: list[bool] = []
        waiters = [threading.Thread(target=lambda f=flag: woke.append(f.wait(5))) for _ in range(3)]
        for t in waiters:
            t.start()
        flag.set()
        for t in waiters:
            t.join(10)
        assert woke == [True, True, True]
