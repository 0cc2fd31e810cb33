"""limit (lua/limit.lua, enforced in lua/lease.lua): at most N leases per period across
all workers, on the server clock; workers wait for the next permit. Both drivers, and a
cluster."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from pyqueue import InvalidArgument, NewJob, Queue
from pyqueue.worker import Worker

ON_CLUSTER = True
ASYNC_TOO = True

T0 = 1_000_000


def fill(q: Queue, n: int) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(n)], now_ms=T0)


def test_leases_are_spaced_by_the_limit_and_the_answer_says_when_the_next_permit_is_due(q: Queue) -> None:
    fill(q, 20)
    assert q.limit(10, 1000) is True  # one lease every 100 ms
    first = q.lease_call(count=5, now_ms=T0)
    assert len(first.jobs) == 1 and first.next_due_ms == T0 + 100
    assert q.lease_call(count=5, now_ms=T0 + 99).jobs == []
    assert len(q.lease_call(count=5, now_ms=T0 + 100).jobs) == 1
    # After a quiet spell with burst 1, still one at a time: no permits are banked.
    later = q.lease_call(count=5, now_ms=T0 + 10_000)
    assert len(later.jobs) == 1 and later.next_due_ms == T0 + 10_100
    s = q.stats(now_ms=T0 + 10_000)
    assert (s.rate_limit, s.rate_period_ms, s.rate_burst, s.leased) == (10, 1000, 1, 3)


def test_a_burst_banks_permits_after_a_quiet_spell(q: Queue) -> None:
    fill(q, 50)
    q.limit(10, 1000, burst=4)
    assert len(q.lease(count=10, now_ms=T0)) == 4
    assert len(q.lease(count=10, now_ms=T0 + 100)) == 1  # one permit per 100 ms after that
    assert len(q.lease(count=10, now_ms=T0 + 5_000)) == 4  # banked again, at most 4


def test_in_any_window_of_one_period_at_most_count_leases_start(q: Queue) -> None:
    fill(q, 200)
    q.limit(7, 1000)
    starts: list[int] = []
    for now in range(T0, T0 + 5_000, 37):  # workers asking at an unrelated cadence
        starts += [now] * len(q.lease(count=3, now_ms=now))
    assert len(starts) >= 5 * 7 - 1
    assert max(sum(1 for t in starts if w <= t < w + 1000) for w in starts) <= 7


def test_lifting_or_changing_the_limit(q: Queue) -> None:
    fill(q, 20)
    q.limit(1, 60_000)
    assert len(q.lease(count=5, now_ms=T0)) == 1 and q.lease(count=5, now_ms=T0 + 1) == []
    assert q.limit(1, 60_000) is False  # the same cap: nothing changes
    assert q.limit(0) is True and q.limit(0) is False
    assert len(q.lease(count=5, now_ms=T0 + 2)) == 5
    assert q.stats(now_ms=T0 + 2).rate_limit == 0


def test_acks_and_maintenance_go_on_without_permits(q: Queue) -> None:
    fill(q, 3)
    q.limit(1, 60_000)
    (job,) = q.lease(lease_ms=10, now_ms=T0)
    leased = q.lease_call(ack=[job], count=2, now_ms=T0 + 1)
    assert leased.acks[0].value == "ok" and leased.jobs == [] and leased.next_due_ms == T0 + 60_000


def test_a_partitioned_queue_refuses_a_limit(make_queue: object) -> None:
    q = make_queue("p", partitions=2)  # type: ignore[operator]
    with pytest.raises(InvalidArgument, match="partitions"):
        q.limit(10)


def test_bad_limits_are_refused_before_anything_is_sent(q: Queue) -> None:
    for args, kwargs in (((-1,), {}), ((1_000_001,), {}), ((5, 0), {}), ((5, 86_400_001), {}), ((5,), {"burst": 0})):
        with pytest.raises(InvalidArgument):
            q.limit(*args, **kwargs)  # type: ignore[arg-type]
    assert q.stats().rate_limit == 0


def test_workers_wait_for_the_next_permit_instead_of_polling(r: redis.Redis) -> None:
    q = Queue("w", r)
    q.enqueue_many([NewJob(b"") for _ in range(100)])
    q.limit(20, 1000)  # one lease every 50 ms
    started: list[float] = []
    workers = [Worker(["w"], lambda job: started.append(time.monotonic()), redis=r, concurrency=4, block_ms=5_000)
               for _ in range(2)]
    threads = [threading.Thread(target=w.run, kwargs={"install_signal_handlers": False}, daemon=True) for w in workers]
    for t in threads:
        t.start()
    # The window starts at the first lease, not at the threads' start: registering two
    # workers on a loaded machine (or cluster) takes a while of its own.
    deadline = time.monotonic() + 20
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started, "no job started within 20 s"
    time.sleep(1.5 - (time.monotonic() - started[0]))
    for w in workers:
        w.stop("test finished")
    for t in threads:
        t.join(10)
    in_window = [t for t in started if t <= started[0] + 1.5]
    # 1.5 s at one per 50 ms: about 30 leases, never more than the limit allows; and far
    # more than workers polling every block_ms (5 s) would get.
    assert 10 <= len(in_window) <= 32, len(in_window)
