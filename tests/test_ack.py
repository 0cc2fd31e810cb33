"""ack: fenced, true exactly once, stale and gone are answers."""

from __future__ import annotations

from collections.abc import Callable

import redis

from pyqueue import NewJob, Outcome, Queue

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True
#: And on the async driver too (conftest.Blocking).
ASYNC_TOO = True

T0 = 1_000_000


def test_ack_is_ok_once_then_gone(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.ack(job) is Outcome.OK
    assert q.ack(job) is Outcome.GONE
    assert r.hlen(q.spec.keys.jobs) == 0 and r.zcard(q.spec.keys.leased) == 0 and r.zcard(q.spec.keys.owners) == 0
    assert r.zrange(q.spec.keys.done, 0, -1) == [job.id.encode()]  # only its tombstone is left


def test_ack_with_a_stale_fence_changes_nothing(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", now_ms=T0)
    (old,) = q.lease(lease_ms=10, now_ms=T0)
    (new,) = q.lease(now_ms=T0 + 100)
    before = {k: r.dump(k) for k in r.keys("*")}
    assert q.ack(old) is Outcome.STALE
    assert {k: r.dump(k) for k in r.keys("*")} == before
    assert q.ack(new) is Outcome.OK


def test_ack_of_a_lease_past_its_deadline_that_was_not_reclaimed_is_ok(q: Queue) -> None:
    q.enqueue(b"x", now_ms=T0)
    (job,) = q.lease(lease_ms=10, now_ms=T0)
    assert q.ack(job) is Outcome.OK


def test_ack_many_answers_each_receipt_and_a_repeated_one_is_gone(q: Queue) -> None:
    q.enqueue_many([NewJob(b"1"), NewJob(b"2")], now_ms=T0)
    a, b = q.lease(count=2, now_ms=T0)
    assert q.ack_many([a, b, a]) == [Outcome.OK, Outcome.OK, Outcome.GONE]
    assert q.stats(now_ms=T0).acked == 2


def test_ack_of_a_job_that_went_back_to_scheduled_is_stale(q: Queue) -> None:
    q.enqueue(b"x", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    q.nack(job, "e", now_ms=T0)
    assert q.ack(job) is Outcome.STALE


def test_expired_tombstones_are_trimmed_in_batches_by_later_acks(make_queue: Callable[..., Queue], r: redis.Redis) -> None:
    """ack and ack_and_lease trim once at least 10 tombstones have expired, up to 10 more
    than they ack, oldest first; tombstones in force are never trimmed."""
    q = make_queue(keep_done_ms=1000)
    q.enqueue_many([NewJob(b"", job_id=f"j{i:02}") for i in range(30)], now_ms=T0)
    jobs = q.lease(count=30, now_ms=T0)
    for i, job in enumerate(jobs[:12]):
        assert q.ack(job, now_ms=T0 + i) is Outcome.OK  # tombstones until T0 + 1000 + i
    # At T0 + 1009 ten have expired (j00..j09): the next ack trims them all.
    assert q.ack(jobs[12], now_ms=T0 + 1009) is Outcome.OK
    assert r.zrange(q.spec.keys.done, 0, -1) == [b"j10", b"j11", b"j12"]
    # Fewer than ten expired: nothing is trimmed (enqueue ignores expired tombstones).
    outcomes, _ = q.ack_and_lease(jobs[13], count=0, now_ms=T0 + 5000)
    assert outcomes is Outcome.OK and r.zcard(q.spec.keys.done) == 4
    # Many expired, one ack: it trims 1 + 10 of them, oldest first.
    q.ack_many(jobs[14:29], now_ms=T0 + 5000)  # 15 more, all in force until T0 + 6000
    assert r.zcard(q.spec.keys.done) == 19
    assert q.ack(jobs[29], now_ms=T0 + 10_000) is Outcome.OK
    assert r.zcard(q.spec.keys.done) == 19 - 11 + 1
    assert q.stats(now_ms=T0 + 10_000).done == 1
