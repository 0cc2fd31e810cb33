"""Results (lua/ack_result.lua, lua/result.lua): kept atomically with the ack for their
time to live, bounded in number, read and waited for without polling; on both drivers
and a cluster."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster

from pyqueue import InvalidArgument, Job, JobResult, NewJob, Outcome, Queue, Result
from pyqueue.protocol.core import MAX_RESULT_BYTES, decode_result, encode_result
from pyqueue.drivers.queue import transport_of
from pyqueue.protocol.verbs import reading

ON_CLUSTER = True
ASYNC_TOO = True

T0 = 1_000_000


def later(seconds: float, r: Any, act: Callable[[Queue], object]) -> threading.Thread:
    """Run ``act`` on the queue "q" after ``seconds``, in another thread, through a
    client of its own (as another process would)."""
    if isinstance(r, fakeredis.FakeRedis):
        client: Any = fakeredis.FakeRedis(server=r.connection_pool.connection_kwargs["server"])
    elif isinstance(r, RedisCluster):
        node = r.get_primaries()[0]
        client = RedisCluster(host=node.host, port=node.port)
    else:
        client = redis.Redis(unix_socket_path=r.connection_pool.connection_kwargs["path"])

    def run() -> None:
        time.sleep(seconds)
        act(Queue("q", client))
        client.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_result_is_kept_with_the_ack_and_read_back_as_it_was_returned(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=i) for i in ("b", "s", "j", "n")], now_ms=T0)
    jobs = {job.id: job for job in q.lease(count=4, now_ms=T0)}
    values = {"b": b"\x00raw", "s": "text ü", "j": {"total": 3, "items": [1, 2]}, "n": None}
    for job_id, value in values.items():
        assert q.ack_result(jobs[job_id], value, result_ttl_ms=1000, now_ms=T0 + 5) is Outcome.OK
    for job_id, value in values.items():
        assert q.result(job_id, now_ms=T0 + 6) == JobResult(job_id, q.name, "ok", value, "", T0 + 5)
    # The ack happened: the job is gone, its id a duplicate.
    assert q.stats(now_ms=T0 + 6).acked == 4 and not q.enqueue(b"", job_id="b", now_ms=T0 + 6).added
    # The result's time is up: what is left is the tombstone.
    assert q.result("b", now_ms=T0 + 1005).state == "done"


def test_a_stale_or_repeated_ack_keeps_no_result(q: Queue) -> None:
    q.enqueue(b"", job_id="x", now_ms=T0)
    (old,) = q.lease(lease_ms=10, now_ms=T0)
    (new,) = q.lease(now_ms=T0 + 100)  # reclaimed and leased again
    assert q.ack_result(old, "from the zombie", now_ms=T0 + 101) is Outcome.STALE
    assert q.result("x", now_ms=T0 + 101).state == "pending"
    assert q.ack_result(new, "real", now_ms=T0 + 102) is Outcome.OK
    assert q.ack_result(new, "again", now_ms=T0 + 103) is Outcome.GONE  # a re-sent call: one effect
    assert q.result("x", now_ms=T0 + 104).value == "real"


def test_each_state_of_the_outcome(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="d", max_attempts=1), NewJob(b"", job_id="p"), NewJob(b"", job_id="a")],
                   now_ms=T0)
    d, _p, a = q.lease(count=3, now_ms=T0)
    q.nack(d, "it broke", now_ms=T0 + 1)
    q.ack(a, now_ms=T0 + 2)
    assert q.result("d", now_ms=T0 + 3) == JobResult("d", q.name, "dead", None, "it broke", T0 + 1)
    assert q.result("p", now_ms=T0 + 3).state == "pending"
    assert q.result("a", now_ms=T0 + 3).state == "done"  # acked without a result
    assert q.result("never", now_ms=T0 + 3).state == "unknown"


def test_at_most_max_results_are_kept_the_oldest_expiring_go_first(q: Queue, r: redis.Redis) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(6)], now_ms=T0)
    for i, job in enumerate(q.lease(count=6, now_ms=T0)):
        q.ack_result(job, i, result_ttl_ms=10_000 + i, max_results=4, now_ms=T0 + i)
    kept = [i for i in range(6) if q.result(f"j{i}", now_ms=T0 + 10).state == "ok"]
    assert kept == [2, 3, 4, 5]
    assert r.hlen(q.spec.keys.results) == 4 and r.zcard(q.spec.keys.result_expiry) == 4


def test_expired_results_are_deleted_by_later_acks(q: Queue, r: redis.Redis) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)], now_ms=T0)
    a, b, c = q.lease(count=3, now_ms=T0)
    q.ack_result(a, "a", result_ttl_ms=10, now_ms=T0)
    q.ack_result(b, "b", result_ttl_ms=10, now_ms=T0)
    q.ack_result(c, "c", result_ttl_ms=10, now_ms=T0 + 100)  # a's and b's time is up
    assert r.hkeys(q.spec.keys.results) == [b"j2"]


def test_bad_results_are_refused_before_anything_is_sent(q: Queue) -> None:
    q.enqueue(b"", job_id="x", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    for bad in ({1, 2}, float("nan"), b"x" * MAX_RESULT_BYTES, object()):
        with pytest.raises(InvalidArgument):
            q.ack_result(job, bad, now_ms=T0)
    with pytest.raises(InvalidArgument):
        q.ack_result(job, "ok", result_ttl_ms=0, now_ms=T0)
    assert q.get("x", now_ms=T0).state == "leased"


def test_the_encoding_round_trips() -> None:
    for value in (b"", b"\xff", "", "é", 0, 1.5, [1, "a"], {"k": None}, None, True):
        assert decode_result(encode_result(value)) == value


def test_wait_result_returns_when_the_result_is_stored(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"", job_id="x")
    (job,) = q.lease()
    # Another client, in another thread, finishes the job while this one waits.
    finisher = later(0.3, r, lambda other: other.ack_result(job, {"done": True}))
    started = time.monotonic()
    got = q.wait_result("x", 10_000)
    finisher.join(10)
    assert got.state == "ok" and got.value == {"done": True}
    assert time.monotonic() - started < 2  # woken by the stream entry, not by a slice's end


def test_wait_result_times_out_pending_and_answers_at_once_when_finished(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=i) for i in ("x", "plain", "kept")])
    started = time.monotonic()
    assert q.wait_result("x", 200).state == "pending"
    assert 0.15 < time.monotonic() - started < 2
    plain, kept = q.lease(count=3)[1:]
    q.ack(plain)
    q.ack_result(kept, 7)
    started = time.monotonic()
    assert q.wait_result("plain", 10_000).state == "done"  # the tombstone: final
    assert q.wait_result("kept", 10_000).value == 7
    assert time.monotonic() - started < 1


def test_wait_result_answers_soon_after_an_ack_without_a_result(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"", job_id="x")
    (job,) = q.lease()
    acker = later(0.3, r, lambda other: other.ack(job))  # adds no stream entry
    started = time.monotonic()
    got = q.wait_result("x", 10_000)
    acker.join(10)
    assert got.state == "done"
    assert time.monotonic() - started < 1.5  # a re-read soon after, not the timeout nor a 2 s slice


def test_wait_result_sees_a_silent_ending_while_other_jobs_keep_finishing(q: Queue, r: redis.Redis) -> None:
    """Other jobs' results wake the waiter again and again: its re-reads still come."""
    q.enqueue_many([NewJob(b"", job_id="x")] + [NewJob(b"", job_id=f"o{i}") for i in range(40)])
    mine, *others = q.lease(count=41)

    def busy(other: Queue) -> None:
        for i, job in enumerate(others):
            if i == 3:
                other.ack(mine)
            other.ack_result(job, i)
            time.sleep(0.1)

    worker = later(0, r, busy)
    started = time.monotonic()
    got = q.wait_result("x", 10_000)
    waited = time.monotonic() - started
    worker.join(20)
    assert got.state == "done"
    assert waited < 2.5  # not the 10 s timeout


def test_wait_result_answers_done_for_a_job_that_ended_without_a_trace(
    q: Queue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    q.enqueue(b"", job_id="x")
    (job,) = q.lease()
    # Acked once the waiter has read the job pending (a slow machine could otherwise ack
    # before that first read, and the waiter would never have seen a trace of it).
    first_read = threading.Event()
    read = reading._read_result

    def spy(*args: Any, **kwargs: Any) -> Any:
        found = yield from read(*args, **kwargs)
        first_read.set()
        return found

    def ack(other: Queue) -> None:
        assert first_read.wait(10)
        # keep_done_ms=0: the ack leaves no tombstone, so the id reads "unknown" afterwards
        Queue(other.name, transport_of(other).client, keep_done_ms=0).ack(job)

    monkeypatch.setattr(reading, "_read_result", spy)
    acker = later(0.05, r, ack)
    got = q.wait_result("x", 10_000)
    acker.join(10)
    assert got.state == "done" and q.result("x").state == "unknown"


def test_wait_result_waits_for_an_id_that_is_not_enqueued_yet(q: Queue, r: redis.Redis) -> None:
    def produce_and_finish(other: Queue) -> None:
        other.enqueue(b"", job_id="late")
        (job,) = other.lease()
        other.ack_result(job, {"n": 1})

    producer = later(0.3, r, produce_and_finish)
    started = time.monotonic()
    got = q.wait_result("late", 10_000)
    producer.join(10)
    assert (got.state, got.value) == ("ok", {"n": 1})
    assert 0.25 < time.monotonic() - started < 2


def test_wait_result_on_an_id_that_never_comes_answers_unknown_at_the_timeout(q: Queue) -> None:
    started = time.monotonic()
    assert q.wait_result("nope", 300).state == "unknown"
    assert 0.25 < time.monotonic() - started < 2
    assert q.wait_result("nope", 0).state == "unknown"  # no wait: one read


def test_wait_result_wakes_when_a_nack_kills_the_job(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"", job_id="x", max_attempts=1)
    (job,) = q.lease()
    failer = later(0.2, r, lambda other: other.nack(job, "no luck"))
    started = time.monotonic()
    got = q.wait_result("x", 10_000)
    failer.join(10)
    assert (got.state, got.error) == ("dead", "no luck")
    assert time.monotonic() - started < 1.8  # the nack's stream entry, not the 2 s slice


def test_wait_result_sees_a_death_by_lease_expiry_within_a_slice(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"", job_id="x", max_attempts=1)
    q.lease(lease_ms=1)  # its worker "crashes": the lease expires on the last attempt
    reaper = later(0.2, r, lambda other: other.lease())  # maintenance sends it to DEAD, adding no entry
    got = q.wait_result("x", 10_000)
    reaper.join(10)
    assert got.state == "dead" and "lease expired" in got.error


def test_a_worker_keeps_results_when_asked(r: redis.Redis) -> None:
    from pyqueue.worker import Worker

    q = Queue("w", r)
    q.enqueue_many([NewJob(b"2", job_id="plain"), NewJob(b"3", job_id="wrapped")])

    def handle(job: Job) -> object:
        n = int(job.payload)
        return Result(n * n, ttl_ms=60_000) if job.id == "wrapped" else n * n

    worker = Worker(["w"], handle, redis=r, block_ms=100, keep_results_ms=30_000)
    thread = threading.Thread(target=worker.run, kwargs={"burst": True, "install_signal_handlers": False})
    thread.start()
    thread.join(30)
    assert q.result("plain").value == 4 and q.result("wrapped").value == 9


def test_a_worker_keeps_no_results_unless_asked_but_a_handler_may(r: redis.Redis) -> None:
    from pyqueue.worker import Worker

    q = Queue("w", r)
    q.enqueue_many([NewJob(b"", job_id="plain"), NewJob(b"", job_id="wrapped")])
    worker = Worker(["w"], lambda job: Result("kept") if job.id == "wrapped" else "dropped", redis=r, block_ms=100)
    thread = threading.Thread(target=worker.run, kwargs={"burst": True, "install_signal_handlers": False})
    thread.start()
    thread.join(30)
    assert q.result("plain").state == "done" and q.result("wrapped").value == "kept"


def test_a_result_that_cannot_be_stored_fails_the_job(r: redis.Redis) -> None:
    from pyqueue.worker import Worker

    q = Queue("w", r)
    q.enqueue(b"", job_id="odd", max_attempts=1)
    worker = Worker(["w"], lambda job: {1, 2}, redis=r, block_ms=100, keep_results_ms=1000)
    thread = threading.Thread(target=worker.run, kwargs={"burst": True, "install_signal_handlers": False})
    thread.start()
    thread.join(30)
    got = q.result("odd")
    assert got.state == "dead" and "JSON-able" in got.error
