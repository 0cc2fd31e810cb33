"""promote, stats (counts, lag, derived acked) and dead-letter list/replay/purge."""

from __future__ import annotations

from typing import Any

from pyqueue import NewJob, Queue
from pyqueue.drivers.queue import stats_many

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True
#: And on the async driver too (conftest.Blocking).
ASYNC_TOO = True

T0 = 1_000_000


def test_promote_moves_due_jobs_and_reclaims_expired_leases(q: Queue) -> None:
    q.enqueue(b"s", job_id="s", delay_ms=100, now_ms=T0)
    q.enqueue(b"l", job_id="l", now_ms=T0)
    q.lease(lease_ms=50, now_ms=T0)
    promoted = q.promote(now_ms=T0 + 100)
    assert (promoted.promoted, promoted.reclaimed, promoted.dead, promoted.more) == (1, 1, 0, False)
    assert [j.id for j in q.lease(count=2, now_ms=T0 + 100)] == ["l", "s"]


def test_promote_reports_more_when_the_limit_is_reached(q: Queue) -> None:
    q.enqueue_many([NewJob(b"x", delay_ms=1) for _ in range(3)], now_ms=T0)
    first = q.promote(limit=2, now_ms=T0 + 1)
    assert (first.promoted, first.more) == (2, True)
    second = q.promote(limit=2, now_ms=T0 + 1)
    assert (second.promoted, second.more, second.next_due_ms) == (1, False, -1)


def test_promote_sends_an_expired_lease_at_max_attempts_to_dead(q: Queue) -> None:
    q.enqueue(b"x", job_id="p", max_attempts=1, now_ms=T0)
    q.lease(lease_ms=10, now_ms=T0)
    assert q.promote(now_ms=T0 + 10).dead == 1
    assert [d.id for d in q.dead_list().jobs] == ["p"]


def test_stats_counts_every_state_and_derives_acked(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", delay_ms=d) for d in (0, 0, 0, 0, 500)], now_ms=T0)
    a, b, c = q.lease(count=3, now_ms=T0)
    q.ack(a)
    q.nack(b, "e", delay_ms=1_000, now_ms=T0)
    q.release([c])
    s = q.stats(now_ms=T0 + 600)
    assert (s.ready, s.scheduled, s.due, s.leased, s.dead) == (2, 2, 1, 0, 0)
    assert (s.enqueued, s.leased_total, s.acked, s.nacked, s.released) == (5, 3, 1, 1, 1)


def test_stats_lag_is_how_long_the_oldest_due_job_has_waited(q: Queue) -> None:
    assert q.stats(now_ms=T0).lag_ms == 0
    q.enqueue(b"", now_ms=T0)
    q.enqueue(b"", delay_ms=100, now_ms=T0)
    assert q.stats(now_ms=T0 + 250).lag_ms == 250
    q.lease(now_ms=T0 + 10)  # takes the ready job; the scheduled one (due T0 + 100) is left
    assert q.stats(now_ms=T0 + 250).lag_ms == 150


def test_dead_list_pages_oldest_first(q: Queue) -> None:
    q.enqueue_many([NewJob(str(i), job_id=f"d{i}", max_attempts=1) for i in range(5)], now_ms=T0)
    for i, job in enumerate(q.lease(count=5, now_ms=T0)):
        q.nack(job, f"e{i}", now_ms=T0 + i)
    page = q.dead_list(offset=1, limit=2)
    assert page.total == 5 and [(d.id, d.error) for d in page.jobs] == [("d1", "e1"), ("d2", "e2")]
    assert q.dead_list(offset=5).jobs == []


def test_dead_replay_moves_jobs_to_ready_with_attempts_reset(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"d{i}", max_attempts=1) for i in range(3)], now_ms=T0)
    for job in q.lease(count=3, now_ms=T0):
        q.nack(job, now_ms=T0)
    assert q.dead_replay(["d1", "nope"], now_ms=T0) == 1
    assert q.dead_replay(["d1"], now_ms=T0) == 0  # replay safe
    assert q.dead_replay(limit=5, now_ms=T0) == 2
    jobs = q.lease(count=3, now_ms=T0)
    assert [(j.id, j.attempt) for j in jobs] == [("d1", 1), ("d0", 1), ("d2", 1)]
    assert q.stats(now_ms=T0).replayed == 3


def test_dead_purge_deletes_jobs_for_good(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"d{i}", max_attempts=1) for i in range(3)], now_ms=T0)
    for job in q.lease(count=3, now_ms=T0):
        q.nack(job, now_ms=T0)
    assert q.dead_purge(["d0"]) == 1
    assert q.dead_purge(["d0"]) == 0
    assert q.dead_purge(limit=10) == 2
    s = q.stats(now_ms=T0)
    assert (s.dead, s.purged) == (0, 3)
    assert q.enqueue(b"", job_id="d0", now_ms=T0).added


def test_stats_many_reads_every_queue_in_one_pipeline_as_stats_does(make_queue: Any) -> None:
    plain, parted = make_queue("plain"), make_queue("parted", partitions=3)
    plain.enqueue_many([b"a", b"b"], now_ms=T0)
    parted.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(7)], now_ms=T0)
    parted.pause(now_ms=T0)
    both = stats_many([plain, parted])
    assert [s.ready for s in both] == [2, 7] and both[1].paused_ms == T0
    assert both[0] == plain.stats(now_ms=both[0].now_ms) and stats_many([]) == []
