"""nack: fenced; backoff with jitter computed in the script; DEAD at max attempts."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import dump_all

from pyqueue import InvalidArgument, Outcome, Queue
from pyqueue.drivers.queue import transport_of

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


def test_a_final_nack_sends_the_job_to_dead_at_once_whatever_its_attempt(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"payload", job_id="j", max_attempts=5, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert job.attempt == 1
    nacked = q.nack(job, "cannot succeed ☠", final=True, now_ms=T0 + 5)
    assert (nacked.outcome, nacked.state, nacked.at_ms) == (Outcome.OK, "dead", T0 + 5)
    info = q.get("j", now_ms=T0 + 5)
    assert (info.state, info.attempts, info.max_attempts, info.error, info.due_ms) == (
        "dead", 1, 5, "cannot succeed ☠", T0 + 5
    )
    (dead,) = q.dead_list().jobs
    assert (dead.id, dead.attempts, dead.error, dead.payload) == ("j", 1, "cannot succeed ☠", b"payload")
    # Counted as any death by nack: one attempt, `nacked` and `dead`, and a finished
    # entry so result waiters wake.
    stats = q.stats(now_ms=T0 + 5)
    assert (stats.dead, stats.dead_total, stats.nacked, stats.scheduled) == (1, 1, 1, 0)
    assert [e[b"id"] for _, e in r.xrange(q.spec.keys.role("finished"))] == [b"j"]
    assert q.result("j", now_ms=T0 + 5).state == "dead"
    # A delay given with final is ignored: there is no retry.
    q.enqueue(b"", job_id="k", max_attempts=3, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.nack(job, "no", delay_ms=10, final=True, now_ms=T0).state == "dead"


def test_final_false_is_todays_nack(q: Queue) -> None:
    q.enqueue(b"x", job_id="j", max_attempts=2, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.nack(job, "e", delay_ms=0, final=False, now_ms=T0).state == "scheduled"
    (job,) = q.lease(now_ms=T0)
    assert q.nack(job, "e", final=False, now_ms=T0).state == "dead"  # at max attempts, as always


def test_a_final_nack_sent_twice_changes_nothing_the_second_time(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="j", max_attempts=5, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.nack(job, "fatal", final=True, now_ms=T0).state == "dead"
    before = dump_all(r)
    again = q.nack(job, "fatal", final=True, now_ms=T0 + 1)
    assert (again.outcome, again.state, again.at_ms) == (Outcome.STALE, None, 0)
    assert dump_all(r) == before


def test_the_old_six_argument_nack_still_works(q: Queue) -> None:
    # Clients written before ARGV 7 (the Node example among them) send 6 values.
    q.enqueue(b"x", job_id="j", max_attempts=2, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert transport_of(q).run("nack", q.spec.keys, [T0, job.receipt, "e", 0, 100, 1000]) == [b"ok", b"scheduled", T0]
    (job,) = q.lease(now_ms=T0)
    assert transport_of(q).run("nack", q.spec.keys, [T0, job.receipt, "e", "", 100, 1000]) == [b"ok", b"dead", T0]
    # ARGV 7 '' and '0' are the same as leaving it out.
    for final in ("", "0"):
        q.enqueue(b"x", job_id=f"k{final}", max_attempts=2, now_ms=T0)
        (job,) = q.lease(now_ms=T0)
        assert transport_of(q).run("nack", q.spec.keys, [T0, job.receipt, "e", 0, 100, 1000, final])[:2] == [b"ok", b"scheduled"]


def test_a_partitioned_queue_nacks_final_in_the_jobs_partition(make_queue: Any) -> None:
    q = make_queue("parted", partitions=3)
    q.enqueue(b"x", job_id="j", max_attempts=5, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.nack(job, "fatal", final=True, now_ms=T0).state == "dead"
    info = q.get("j")
    assert (info.state, info.attempts, info.error) == ("dead", 1, "fatal")


@pytest.mark.parametrize("final", [1, 0, "1", None])
def test_final_must_be_a_bool(q: Queue, r: redis.Redis, final: Any) -> None:
    q.enqueue(b"x", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    before = dump_all(r)
    with pytest.raises(InvalidArgument):
        q.nack(job, "e", final=final)
    assert dump_all(r) == before
