"""ack: fenced, true exactly once, stale and gone are answers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from pyqueue import NewJob, NotReplicated, Outcome, Queue

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
    assert r.hlen(q.keys.jobs) == 0 and r.zcard(q.keys.leased) == 0 and r.zcard(q.keys.owners) == 0
    assert r.zrange(q.keys.done, 0, -1) == [job.id.encode()]  # only its tombstone is left


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
    assert r.zrange(q.keys.done, 0, -1) == [b"j10", b"j11", b"j12"]
    # Fewer than ten expired: nothing is trimmed (enqueue ignores expired tombstones).
    outcomes, _ = q.ack_and_lease(jobs[13], count=0, now_ms=T0 + 5000)
    assert outcomes is Outcome.OK and r.zcard(q.keys.done) == 4
    # Many expired, one ack: it trims 1 + 10 of them, oldest first.
    q.ack_many(jobs[14:29], now_ms=T0 + 5000)  # 15 more, all in force until T0 + 6000
    assert r.zcard(q.keys.done) == 19
    assert q.ack(jobs[29], now_ms=T0 + 10_000) is Outcome.OK
    assert r.zcard(q.keys.done) == 19 - 11 + 1
    assert q.stats(now_ms=T0 + 10_000).done == 1


def no_async_wait_on_a_cluster(backend: str, driver: str) -> None:
    if backend == "cluster" and driver == "async":
        pytest.skip("the async driver refuses wait_replicas on a Redis Cluster (AsyncScripts)")


def test_an_ack_whose_wait_fell_short_answers_ok_when_sent_again_and_the_job_is_gone(
    make_queue: Callable[..., Queue], r: redis.Redis, backend: str, driver: str
) -> None:
    no_async_wait_on_a_cluster(backend, driver)
    # wait_replicas=100: no backend has that many replicas, so WAIT always falls short
    # and every write raises NotReplicated after it ran. Setting the transport's
    # wait_replicas to 0 afterwards stands for the replicas catching up (or the re-send
    # reaching a promoted replica that had the first send).
    q = make_queue(wait_replicas=100, wait_timeout_ms=1)
    plain = make_queue()
    plain.enqueue_many([NewJob(b"", job_id=i) for i in "abcde"])
    a, b, c, d, e = plain.lease(count=5)
    with pytest.raises(NotReplicated) as raised:
        q.ack_many([a, b])
    assert raised.value.reply is not None and r.hlen(q.keys.jobs) == 3  # it ran
    with pytest.raises(NotReplicated):
        q.lease_call(ack=[c], count=0)
    with pytest.raises(NotReplicated):
        q.ack_result(d, "kept")
    q.scripts.wait_replicas = 0
    # The re-sends find the jobs gone, because the first sends completed them: OK, once.
    assert q.ack_many([a, b, e]) == [Outcome.OK, Outcome.OK, Outcome.OK]
    assert q.lease_call(ack=[c], count=0).acks == [Outcome.OK]
    assert q.ack_result(d, "kept") is Outcome.OK and q.result(d.id).value == "kept"
    assert q.ack_many([a, b, c, d, e]) == [Outcome.GONE] * 5  # answered: forgotten
    # Another queue object never sent them: the script's own answer.
    assert plain.ack_many([a]) == [Outcome.GONE]


def test_an_ack_whose_wait_fell_short_and_was_lost_by_a_failover_is_ok_or_stale_when_sent_again(
    make_queue: Callable[..., Queue], r: redis.Redis, backend: str
) -> None:
    if backend == "cluster":
        pytest.skip("the failover is played by restoring one server's keys")
    q = make_queue(wait_replicas=100, wait_timeout_ms=1)
    plain = make_queue()
    plain.enqueue_many([NewJob(b"", job_id=i) for i in "ab"], now_ms=T0)
    (a,) = plain.lease(lease_ms=10, now_ms=T0)
    (b,) = plain.lease(lease_ms=60_000, now_ms=T0)
    before = {k: r.dump(k) for k in r.keys("*")}
    with pytest.raises(NotReplicated):
        q.ack_many([a, b], now_ms=T0 + 1)  # acked on the primary ...
    for key in r.keys("*"):  # ... then a failover to a replica that never had it
        r.delete(key)
    for key, value in before.items():
        r.restore(key, 0, value)
    (again,) = plain.lease(now_ms=T0 + 100)  # a's lease expired there: reclaimed
    assert again.id == "a"
    q.scripts.wait_replicas = 0
    # b's lease is still current there: the re-send acks it (OK). a is STALE, as the
    # script says: it runs again under the new lease.
    assert q.ack_many([a, b], now_ms=T0 + 100) == [Outcome.STALE, Outcome.OK]
    assert q.ack(again) is Outcome.OK
