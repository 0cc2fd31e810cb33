"""Coalesced enqueues: enqueues made while another is in flight share one script call,
and each caller keeps its own answer and its own error (sync threads and async tasks)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis
from conftest import async_client

from pyqueue import Enqueued, InvalidArgument, NewJob, Queue, WrongTypeError
from pyqueue.aio import AsyncQueue
from pyqueue.drivers.queue import transport_of

ON_CLUSTER = True


def enqueue_from_threads(q: Queue, payloads: list[Any], ids: list[str | None]) -> list[Any]:
    """Each (payload, id) enqueued by a thread of its own, all released at once; the
    answer or the exception of each."""
    barrier = threading.Barrier(len(payloads))
    out: list[Any] = [None] * len(payloads)

    def one(i: int) -> None:
        barrier.wait()
        try:
            out[i] = q.enqueue(payloads[i], job_id=ids[i])
        except Exception as exc:  # the caller's own error is part of the answer
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(payloads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_threads_enqueueing_at_once_share_calls_and_each_gets_its_own_answer(r: redis.Redis) -> None:
    q = Queue("q", r)
    ids = [f"j{i}" for i in range(40)] + ["same", "same"]
    answers = enqueue_from_threads(q, [b"x"] * len(ids), ids)  # type: ignore[arg-type]
    assert [a.job_id for a in answers] == ids
    assert sum(a.added for a in answers if a.job_id == "same") == 1  # one of the two, as if sent in turn
    assert all(a.added for a in answers if a.job_id != "same")
    batcher = transport_of(q)._enqueues[q.spec.keys]
    assert batcher.state.items == len(ids) and batcher.state.calls < len(ids)
    stats = q.stats()
    assert (stats.enqueued, stats.duplicates, stats.ready) == (41, 1, 41)


def test_a_callers_bad_input_is_its_own_error_and_the_others_go_through(r: redis.Redis) -> None:
    q = Queue("q", r)
    answers = enqueue_from_threads(q, [b"a", 42, b"c"], ["a", "b", "c"])
    assert isinstance(answers[1], InvalidArgument)
    assert isinstance(answers[0], Enqueued) and isinstance(answers[2], Enqueued)
    assert q.stats().ready == 2


def test_a_script_error_reaches_every_caller_of_the_call_and_writes_nothing(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue(b"first")  # records the partition count before the queue is broken
    r.delete(q.spec.keys.ready)
    r.set(q.spec.keys.ready, "not a list")
    answers = enqueue_from_threads(q, [b"x"] * 8, [f"k{i}" for i in range(8)])  # type: ignore[arg-type]
    assert all(isinstance(a, WrongTypeError) for a in answers)
    assert r.hlen(q.spec.keys.jobs) == 1


def test_without_coalescing_every_enqueue_is_its_own_call(r: redis.Redis) -> None:
    q = Queue("q", r, coalesce_enqueues=False)
    answers = enqueue_from_threads(q, [b"x"] * 10, [None] * 10)
    assert all(a.added for a in answers) and not transport_of(q)._enqueues
    with pytest.raises(InvalidArgument, match="coalesce_enqueues"):
        Queue("q", r, coalesce_enqueues=1)  # type: ignore[arg-type]


def test_tasks_enqueueing_at_once_share_calls_and_each_gets_its_own_answer(r: redis.Redis) -> None:
    async def main() -> tuple[list[Enqueued], int, int]:
        client = async_client(r)
        q = AsyncQueue("q", client)
        ids = [f"t{i}" for i in range(100)] + ["t0"]
        answers = await asyncio.gather(*(q.enqueue(b"x", job_id=i) for i in ids))
        batcher = transport_of(q)._enqueues[q.spec.keys]
        await client.aclose()
        return answers, batcher.state.calls, len(ids)

    answers, calls, sent = asyncio.run(main())
    assert [a.added for a in answers] == [True] * 100 + [False]  # the repeated id: a duplicate
    assert calls < sent // 2  # the first call alone, the rest together
    assert Queue("q", r).stats().ready == 100


def test_a_partitioned_queue_coalesces_per_partition(r: redis.Redis) -> None:
    q = Queue("p", r, partitions=3)
    answers = enqueue_from_threads(q, [b"x"] * 30, [f"p{i}" for i in range(30)])  # type: ignore[arg-type]
    assert all(a.added for a in answers)
    assert q.stats().ready == 30 and sum(s.ready for s in q.partition_stats()) == 30


def test_jobs_enqueued_many_at_a_time_are_merged_within_the_batch_limit(r: redis.Redis) -> None:
    q = Queue("q", r)
    batches = [[NewJob(b"", job_id=f"b{b}-{i}") for i in range(400)] for b in range(4)]
    barrier = threading.Barrier(4)
    out: list[Any] = [None] * 4

    def one(b: int) -> None:
        barrier.wait()
        out[b] = q.enqueue_many(batches[b])

    threads = [threading.Thread(target=one, args=(b,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(len(o) == 400 and all(a.added for a in o) for o in out)
    assert q.stats().ready == 1600  # no merged call carried more than 1000 jobs (the script's limit)
