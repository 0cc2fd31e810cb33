"""lease: fences, deadlines, maintenance (promote + reclaim), poison pills, replay."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import redis

from pyqueue.protocol.core import lease_call
from pyqueue import NewJob, Outcome, Queue
from pyqueue.drivers.queue import transport_of
from pyqueue.protocol.verbs.consume import parse_lease

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True
#: And on the async driver too (conftest.Blocking).
ASYNC_TOO = True

T0 = 1_000_000


def test_lease_of_an_empty_queue_returns_nothing_and_no_next_due(q: Queue) -> None:
    leased = q.lease_call(now_ms=T0)
    assert leased.jobs == [] and leased.next_due_ms == -1


def test_lease_sets_deadline_on_the_given_clock_and_increasing_fences(q: Queue) -> None:
    q.enqueue_many([b"a", b"b", b"c"], now_ms=T0)
    jobs = q.lease(lease_ms=1_000, count=3, now_ms=T0)
    assert [j.deadline_ms for j in jobs] == [T0 + 1_000] * 3
    assert [j.fence for j in jobs] == [1, 2, 3]
    more = q.enqueue(b"d", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert job.id == more.job_id and job.fence == 4


def test_lease_count_zero_leases_nothing(q: Queue) -> None:
    q.enqueue(b"a", now_ms=T0)
    assert q.lease(count=0, now_ms=T0) == []
    assert q.stats(now_ms=T0).ready == 1


def test_next_due_ms_is_the_earliest_scheduled_job_or_lease_deadline(q: Queue) -> None:
    q.enqueue(b"a", delay_ms=700, now_ms=T0)
    q.enqueue(b"b", now_ms=T0)
    q.lease(lease_ms=500, now_ms=T0)
    leased = q.lease_call(now_ms=T0)
    assert leased.jobs == [] and leased.next_due_ms == T0 + 500


def test_expired_lease_is_reclaimed_to_the_head_of_ready_with_the_attempt_counted(q: Queue) -> None:
    q.enqueue_many([NewJob(b"1", job_id="first"), NewJob(b"2", job_id="second")], now_ms=T0)
    (job,) = q.lease(lease_ms=100, now_ms=T0)
    assert job.id == "first"
    (again,) = q.lease(now_ms=T0 + 100)  # the deadline is inclusive: expired at T0 + 100
    assert again.id == "first" and again.attempt == 2 and again.fence > job.fence
    assert q.stats(now_ms=T0 + 100).reclaimed == 1


def test_lease_at_its_deadline_minus_one_is_not_reclaimed(q: Queue) -> None:
    q.enqueue(b"1", job_id="a", now_ms=T0)
    q.lease(lease_ms=100, now_ms=T0)
    assert q.lease(now_ms=T0 + 99) == []
    assert q.stats(now_ms=T0 + 99).leased == 1


def test_reclaimed_job_at_max_attempts_goes_to_dead_as_a_poison_pill(q: Queue) -> None:
    q.enqueue(b"poison", job_id="p", max_attempts=2, now_ms=T0)
    for attempt in (1, 2):
        (job,) = q.lease(lease_ms=10, now_ms=T0 + 100 * attempt)
        assert job.attempt == attempt
    assert q.lease(now_ms=T0 + 1_000) == []
    page = q.dead_list()
    assert [(d.id, d.attempts, d.error) for d in page.jobs] == [("p", 2, "lease expired on attempt 2 of 2")]
    assert q.ack(job) is Outcome.STALE


def test_lease_promotes_due_scheduled_jobs_in_due_order_behind_ready_ones(q: Queue) -> None:
    q.enqueue(b"late", job_id="late", delay_ms=200, now_ms=T0)
    q.enqueue(b"early", job_id="early", delay_ms=100, now_ms=T0)
    q.enqueue(b"now", job_id="now", now_ms=T0 + 150)
    jobs = q.lease(count=3, now_ms=T0 + 300)
    assert [j.id for j in jobs] == ["now", "early", "late"]


def test_busy_ready_list_still_gets_maintenance_every_50_ms(q: Queue) -> None:
    q.enqueue_many([NewJob(b"r", job_id=f"r{i}") for i in range(5)], now_ms=T0)
    (job,) = q.lease(lease_ms=10, now_ms=T0)  # maintenance ran: next at T0 + 50
    (other,) = q.lease(now_ms=T0 + 49)
    assert other.id == "r1"  # READY is not short and maintenance is not due: no reclaim
    (again,) = q.lease(now_ms=T0 + 50)
    assert again.id == job.id and again.attempt == 2


def test_maintenance_is_bounded_by_limit(q: Queue) -> None:
    q.enqueue_many([NewJob(b"x", delay_ms=10) for _ in range(5)], now_ms=T0)
    leased = q.lease_call(count=1, limit=2, now_ms=T0 + 10)
    assert len(leased.jobs) == 1
    stats = q.stats(now_ms=T0 + 10)
    assert (stats.ready, stats.scheduled) == (1, 3)


def test_lease_replay_returns_the_same_jobs_and_leases_no_more(q: Queue, r: redis.Redis) -> None:
    q.enqueue_many([b"a", b"b"], now_ms=T0)
    first = transport_of(q).call(lease_call(q.spec.keys, T0, "w1", "call1", 1, 1000, 100, 0))
    second = transport_of(q).call(lease_call(q.spec.keys, T0, "w1", "call1", 1, 1000, 100, 0))
    assert parse_lease(q.name, first).jobs == parse_lease(q.name, second).jobs
    assert q.stats(now_ms=T0).ready == 1 and q.stats(now_ms=T0).leased_total == 1


def test_lease_replay_of_an_ack_and_lease_call_returns_its_jobs(q: Queue) -> None:
    q.enqueue_many([b"a", b"b"], now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    args = (q.spec.keys, T0, "w1", "c2", 1, 1000, 100, 0, [job.receipt])
    first = parse_lease(q.name, transport_of(q).call(lease_call(*args)))
    second = parse_lease(q.name, transport_of(q).call(lease_call(*args)))
    assert first.acks == [Outcome.OK] and second.acks == [Outcome.GONE]
    assert first.jobs == second.jobs and len(first.jobs) == 1
    assert q.stats(now_ms=T0).ready == 0 and q.stats(now_ms=T0).leased == 1


def test_ack_and_lease_acks_then_leases_the_next_job(q: Queue) -> None:
    q.enqueue_many([NewJob(b"1", job_id="a"), NewJob(b"2", job_id="b")], now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    outcome, jobs = q.ack_and_lease(job, now_ms=T0)
    assert outcome is Outcome.OK and [j.id for j in jobs] == ["b"]
    outcome, jobs = q.ack_and_lease(jobs[0], now_ms=T0)
    assert outcome is Outcome.OK and jobs == []
    assert q.stats(now_ms=T0).acked == 2


def test_ack_and_lease_with_a_stale_receipt_still_leases(q: Queue) -> None:
    q.enqueue_many([b"1", b"2"], now_ms=T0)
    (job,) = q.lease(lease_ms=10, now_ms=T0)
    (again,) = q.lease(now_ms=T0 + 100)  # reclaims `job` to the head and leases it again
    assert again.id == job.id
    outcome, jobs = q.ack_and_lease(job, now_ms=T0 + 100)
    assert outcome is Outcome.STALE and len(jobs) == 1
    assert q.ack(again) is Outcome.OK


def test_expired_lease_acked_in_the_same_call_is_acked_not_reclaimed(q: Queue) -> None:
    q.enqueue(b"1", now_ms=T0)
    (job,) = q.lease(lease_ms=10, now_ms=T0)
    outcome, jobs = q.ack_and_lease(job, now_ms=T0 + 50)
    assert outcome is Outcome.OK and jobs == []
    assert q.stats(now_ms=T0 + 50).reclaimed == 0


def test_a_plain_lease_that_leaves_work_behind_raises_the_wake_marker(q: Queue, r: redis.Redis) -> None:
    q.enqueue_many([b"1", b"2"], now_ms=T0)
    r.delete(q.spec.keys.wake)
    q.lease(now_ms=T0)
    assert r.zrange(q.spec.keys.wake, 0, -1) == [b"wake"]
    r.delete(q.spec.keys.wake)
    q.lease(now_ms=T0)
    assert r.zcard(q.spec.keys.wake) == 0


def test_a_leased_job_knows_when_it_was_sent_through_retries_reclaims_and_replays(q: Queue) -> None:
    """Job.enqueued_ms (contract v5): the server's time at enqueue, never changed by a
    retry, a reclaim, a dead-letter replay or the fair pick; get answers it too."""
    q.enqueue(b"a", job_id="a", now_ms=T0)
    q.enqueue(b"b", job_id="b", delay_ms=1_000, now_ms=T0 + 5)
    q.enqueue(b"g", job_id="g", group="tenant-1", now_ms=T0 + 7)
    (a,) = q.lease(now_ms=T0 + 10)
    assert (a.id, a.enqueued_ms, a.enqueued_at) == ("a", T0, datetime.fromtimestamp(T0 / 1000, timezone.utc))
    q.nack(a, "retry me", delay_ms=0, now_ms=T0 + 20)
    (g,) = q.lease(now_ms=T0 + 20)  # the fair pick's path: the nacked one waits in SCHEDULED
    assert (g.id, g.enqueued_ms) == ("g", T0 + 7)
    (a2,) = q.lease(lease_ms=100, now_ms=T0 + 30)
    assert (a2.id, a2.attempt, a2.enqueued_ms) == ("a", 2, T0)
    (a3,) = q.lease(now_ms=T0 + 130)  # a2's lease expired: reclaimed, leased again
    assert (a3.id, a3.attempt, a3.enqueued_ms) == ("a", 3, T0)
    assert q.get("a", now_ms=T0 + 131).enqueued_ms == T0
    q.nack(a3, "give up", final=True, now_ms=T0 + 140)
    assert q.dead_replay(["a"], now_ms=T0 + 150) == 1
    a4, b = q.lease(count=2, now_ms=T0 + 1_005)  # the replayed job is READY before b is promoted
    assert (b.id, b.enqueued_ms, a4.id, a4.attempt, a4.enqueued_ms) == ("b", T0 + 5, "a", 1, T0)
    assert q.get("b", now_ms=T0 + 1_006).enqueued_ms == T0 + 5


def test_a_job_enqueued_before_contract_v5_still_runs_with_its_send_time_unknown(q: Queue, r: redis.Redis) -> None:
    """A v4 record ("<attempts>|<max>|<due_ms>|<payload>") is read and kept in its form:
    jobs sent before an upgrade are not lost, and no payload digit is read as a time."""
    r.hset(q.spec.keys.jobs, "old", f"0|3|{T0}|12|34 payload")
    r.rpush(q.spec.keys.ready, "old")
    (job,) = q.lease(now_ms=T0 + 10)
    assert (job.id, job.payload, job.enqueued_ms, job.enqueued_at) == ("old", b"12|34 payload", None, None)
    q.nack(job, "again", delay_ms=0, now_ms=T0 + 20)
    assert r.hget(q.spec.keys.jobs, "old") == f"1|3|{T0 + 20}|12|34 payload".encode()
    assert q.get("old", now_ms=T0 + 20).enqueued_ms == -1
    (again,) = q.lease(now_ms=T0 + 20)
    assert (again.attempt, again.payload, again.enqueued_ms) == (2, b"12|34 payload", None)
    assert q.ack(again) is Outcome.OK


def test_a_record_with_an_empty_send_time_is_corrupt_and_nothing_is_written(q: Queue, r: redis.Redis) -> None:
    r.hset(q.spec.keys.jobs, "j", f"0|3|{T0}:|payload")
    r.rpush(q.spec.keys.ready, "j")
    before = {k: r.dump(k) for k in r.keys("*")}
    with pytest.raises(Exception, match="PQ_CORRUPT"):
        q.lease(now_ms=T0)
    assert {k: r.dump(k) for k in r.keys("*")} == before
