"""ack: fenced, true exactly once, stale and gone are answers."""

from __future__ import annotations

import redis

from pyqueue import NewJob, Outcome, Queue

T0 = 1_000_000


def test_ack_is_ok_once_then_gone(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.ack(job) is Outcome.OK
    assert q.ack(job) is Outcome.GONE
    assert r.hlen(q.keys.jobs) == 0 and r.zcard(q.keys.leased) == 0 and r.zcard(q.keys.owners) == 0


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
