"""nack: fenced; backoff with jitter computed in the script; DEAD at max attempts."""

from __future__ import annotations

import redis

from pyqueue import Outcome, Queue

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True
#: And on the async driver too (conftest.Blocking).
ASYNC_TOO = True

T0 = 1_000_000


def test_nack_schedules_a_retry_with_exponential_backoff_and_jitter(q: Queue) -> None:
    q.enqueue(b"x", job_id="j", max_attempts=10, now_ms=T0)
    now = T0
    delays = []
    for attempt in range(1, 5):
        (job,) = q.lease(now_ms=now)
        assert job.attempt == attempt
        nacked = q.nack(job, "boom", backoff_base_ms=1_000, backoff_cap_ms=1_000_000, now_ms=now)
        assert nacked.outcome is Outcome.OK and nacked.state == "scheduled"
        delay = nacked.at_ms - now
        full = 1_000 * 2 ** (attempt - 1)
        assert full // 2 <= delay < full  # half fixed, half jitter
        delays.append(delay)
        assert q.lease(now_ms=nacked.at_ms - 1) == []
        now = nacked.at_ms
    assert delays == sorted(delays)


def test_backoff_is_capped(q: Queue) -> None:
    q.enqueue(b"x", max_attempts=50, now_ms=T0)
    now = T0
    for _ in range(20):
        (job,) = q.lease(now_ms=now)
        nacked = q.nack(job, backoff_base_ms=1_000, backoff_cap_ms=5_000, now_ms=now)
        assert nacked.at_ms - now <= 5_000
        now = nacked.at_ms


def test_jitter_differs_between_jobs(q: Queue) -> None:
    q.enqueue_many([b"x"] * 20, now_ms=T0)
    jobs = q.lease(count=20, now_ms=T0)
    due = {q.nack(j, now_ms=T0).at_ms for j in jobs}
    assert len(due) > 10


def test_nack_with_explicit_delay_uses_it(q: Queue) -> None:
    q.enqueue(b"x", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.nack(job, delay_ms=0, now_ms=T0).at_ms == T0
    (job,) = q.lease(now_ms=T0)
    assert job.attempt == 2


def test_nack_at_max_attempts_goes_to_dead_with_the_error(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"payload", job_id="j", max_attempts=2, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    q.nack(job, "first", delay_ms=0, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    nacked = q.nack(job, "second ☠", now_ms=T0 + 5)
    assert (nacked.state, nacked.at_ms) == ("dead", T0 + 5)
    (dead,) = q.dead_list().jobs
    assert (dead.id, dead.attempts, dead.max_attempts, dead.error, dead.payload, dead.dead_ms) == (
        "j", 2, 2, "second ☠", b"payload", T0 + 5
    )
    stats = q.stats(now_ms=T0 + 5)
    assert (stats.dead, stats.dead_total, stats.nacked) == (1, 1, 2)


def test_nack_with_a_stale_receipt_changes_nothing(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    q.ack(job)
    before = {k: r.dump(k) for k in r.keys("*")}
    nacked = q.nack(job, "late", now_ms=T0)
    assert (nacked.outcome, nacked.state) == (Outcome.GONE, None)
    assert {k: r.dump(k) for k in r.keys("*")} == before
