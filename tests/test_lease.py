"""lease: fences, deadlines, maintenance (promote + reclaim), poison pills, replay."""

from __future__ import annotations

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
