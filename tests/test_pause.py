"""pause and resume (lua/pause.lua, lua/resume.lua): a paused queue leases nothing while
everything else goes on; resume wakes the workers."""

from __future__ import annotations

import threading
import time

import redis

from pyqueue import NewJob, Outcome, Queue
from pyqueue.worker import Worker

ON_CLUSTER = True
ASYNC_TOO = True

T0 = 1_000_000


def test_a_paused_queue_leases_nothing_but_takes_enqueues_and_acks(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)], now_ms=T0)
    (running,) = q.lease(lease_ms=10_000, now_ms=T0)
    assert q.pause(now_ms=T0 + 1) is True
    assert q.pause(now_ms=T0 + 2) is False  # paused already: the first time stands
    assert q.stats(now_ms=T0 + 3).paused_ms == T0 + 1
    q.enqueue(b"", job_id="late", now_ms=T0 + 3)
    assert q.lease(count=10, now_ms=T0 + 4) == []
    leased = q.lease_call(ack=[running], count=5, now_ms=T0 + 5)  # the ack goes through
    assert leased.acks == [Outcome.OK] and leased.jobs == [] and leased.next_due_ms == -1
    assert q.peek(now_ms=T0 + 6).ready == 0 and not q.peek(now_ms=T0 + 6).has_work
    assert q.resume(now_ms=T0 + 7) is True and q.resume(now_ms=T0 + 8) is False
    assert not q.stats(now_ms=T0 + 9).paused
    assert sorted(j.id for j in q.lease(count=10, now_ms=T0 + 9)) == ["j1", "j2", "late"]


def test_a_paused_queue_still_reclaims_expired_leases(q: Queue) -> None:
    q.enqueue(b"", job_id="j", now_ms=T0)
    q.lease(lease_ms=10, now_ms=T0)
    q.pause(now_ms=T0)
    assert q.lease(now_ms=T0 + 100) == []
    stats = q.stats(now_ms=T0 + 100)
    assert (stats.reclaimed, stats.ready, stats.leased) == (1, 1, 0)


def test_pausing_a_partitioned_queue_pauses_every_partition(make_queue: object) -> None:
    q = make_queue("p", partitions=3)  # type: ignore[operator]
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(9)], now_ms=T0)
    assert q.pause(now_ms=T0) is True
    assert q.lease(count=9, now_ms=T0) == [] and all(s.paused for s in q.partition_stats(now_ms=T0))
    assert q.resume(now_ms=T0) is True
    leased = [job for _ in range(3) for job in q.lease(count=9, now_ms=T0)]  # a partition per call
    assert sorted(j.id for j in leased) == sorted(f"j{i}" for i in range(9))


def test_a_worker_stops_leasing_while_paused_and_resumes_at_the_wake_up(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.pause()
    started: list[str] = []
    worker = Worker(["q"], lambda job: started.append(job.id), redis=r, block_ms=5_000)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        q.enqueue(b"", job_id="while-paused")
        time.sleep(0.5)
        assert started == [] and q.stats().ready == 1
        resumed = time.monotonic()
        q.resume()
        deadline = resumed + 3  # far below the 5 s block: the resume's wake-up, not a timeout
        while not started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started == ["while-paused"]
    finally:
        worker.stop("test finished")
        thread.join(10)

