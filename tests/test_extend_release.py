"""extend (batched, fenced, never earlier) and release (head of READY, no penalty)."""

from __future__ import annotations

from pyqueue import NewJob, Outcome, Queue

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True
#: And on the async driver too (conftest.Blocking).
ASYNC_TOO = True

T0 = 1_000_000


def test_extend_moves_deadlines_and_keeps_a_lease_from_reclaim(q: Queue) -> None:
    q.enqueue_many([b"a", b"b"], now_ms=T0)
    jobs = q.lease(lease_ms=100, count=2, now_ms=T0)
    extended = q.extend(jobs, 1_000, now_ms=T0 + 90)
    assert [(e.outcome, e.deadline_ms) for e in extended] == [(Outcome.OK, T0 + 1_090)] * 2
    assert q.lease(now_ms=T0 + 500) == []
    assert q.stats(now_ms=T0 + 500).leased == 2


def test_extend_never_moves_a_deadline_earlier(q: Queue) -> None:
    q.enqueue(b"a", now_ms=T0)
    jobs = q.lease(lease_ms=10_000, now_ms=T0)
    assert q.extend(jobs, 5, now_ms=T0)[0].deadline_ms == T0 + 10_000


def test_extend_of_stale_and_gone_receipts_changes_nothing(q: Queue) -> None:
    q.enqueue_many([b"a", b"b"], now_ms=T0)
    a, b = q.lease(lease_ms=10, count=2, now_ms=T0)
    q.ack(b)
    q.lease(now_ms=T0 + 100)  # reclaims and re-leases a
    assert [e.outcome for e in q.extend([a, b], 1_000, now_ms=T0 + 100)] == [Outcome.STALE, Outcome.GONE]


def test_release_returns_jobs_to_the_head_in_order_without_counting_the_attempt(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=i) for i in "abcd"], now_ms=T0)
    a, b = q.lease(count=2, now_ms=T0)
    assert q.release([a, b]) == [Outcome.OK, Outcome.OK]
    jobs = q.lease(count=4, now_ms=T0)
    assert [(j.id, j.attempt) for j in jobs] == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    assert q.release([a]) == [Outcome.STALE]
    assert q.stats(now_ms=T0).released == 2
