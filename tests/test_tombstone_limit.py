"""Tombstones kept by count (lua/set_tombstone_limit.lua): past the limit, the scripts
that write tombstones (ack, ack_result, lease's acks and expiries, cancel) delete the
earliest-expiring, at most n + 10 a call; an id whose tombstone went is no longer a
duplicate; a queue without a limit pays nothing. On fakeredis, a real redis-server and
a Redis Cluster, sync and async."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import dump_all

from pyqueue import InvalidArgument, NewJob, Queue

ON_CLUSTER = True
ASYNC_TOO = True
T0 = 1_000_000


def tombstones(r: Any, q: Queue) -> list[bytes]:
    return r.zrange(f"pq:{{{q.name}}}:done", 0, -1)


def ack_all(q: Queue, ids: list[str], at: int) -> None:
    q.enqueue_many([NewJob(b"", job_id=i) for i in ids], now_ms=at)
    for job in q.lease(count=len(ids), now_ms=at):
        q.ack(job, now_ms=at)


def test_acks_keep_at_most_the_limit_and_the_earliest_expiring_go(q: Queue, r: redis.Redis) -> None:
    assert q.set_tombstone_limit(5) is True
    assert q.set_tombstone_limit(5) is False  # a re-sent call changes nothing
    assert q.stats().tombstone_limit == 5
    for n in range(8):
        ack_all(q, [f"j{n}"], T0 + n)  # later acks expire later
    assert tombstones(r, q) == [f"j{n}".encode() for n in range(3, 8)]
    # An id whose tombstone went for room is no longer a duplicate; one kept still is.
    assert q.enqueue(b"", job_id="j0", now_ms=T0 + 10).added is True
    assert q.enqueue(b"", job_id="j7", now_ms=T0 + 10).added is False


def test_every_writer_of_tombstones_keeps_the_limit(q: Queue, r: redis.Redis) -> None:
    q.set_tombstone_limit(2)
    ack_all(q, ["a0", "a1"], T0)  # ack
    assert tombstones(r, q) == [b"a0", b"a1"]
    q.enqueue(b"", job_id="r0", now_ms=T0 + 1)
    (job,) = q.lease(count=1, now_ms=T0 + 1)
    q.ack_result(job, b"v", now_ms=T0 + 1)  # ack_result
    assert tombstones(r, q) == [b"a1", b"r0"]
    q.enqueue(b"", job_id="c0", now_ms=T0 + 2)
    assert q.cancel("c0", now_ms=T0 + 2).state == "ready"  # cancel
    assert tombstones(r, q) == [b"r0", b"c0"]
    q.enqueue(b"", job_id="e0", expires_ms=1, now_ms=T0 + 3)
    q.enqueue(b"", job_id="l0", now_ms=T0 + 3)
    assert q.lease(count=1, now_ms=T0 + 10) == []  # lease's expiry of e0; asked again:
    assert tombstones(r, q) == [b"c0", b"e0"]
    (job,) = q.lease(count=1, now_ms=T0 + 10)
    assert job.id == "l0"
    q.ack_and_lease(job, count=0, now_ms=T0 + 11)  # lease's acks
    assert tombstones(r, q) == [b"e0", b"l0"]


def test_a_lowered_limit_is_reached_a_bounded_step_per_call(q: Queue, r: redis.Redis) -> None:
    ack_all(q, [f"j{n:03d}" for n in range(100)], T0)
    q.set_tombstone_limit(10)
    ack_all(q, ["x"], T0 + 1)
    assert len(tombstones(r, q)) == 101 - 11  # one ack: at most 1 + 10 go
    for n in range(8):
        ack_all(q, [f"y{n}"], T0 + 2 + n)
    assert len(tombstones(r, q)) == 10


def test_without_a_limit_nothing_is_trimmed_in_force_and_lifting_it_stops_the_trim(q: Queue, r: redis.Redis) -> None:
    ack_all(q, [f"j{n}" for n in range(20)], T0)
    assert len(tombstones(r, q)) == 20
    q.set_tombstone_limit(5)
    assert q.set_tombstone_limit(None) is True
    ack_all(q, ["k"], T0 + 1)
    assert len(tombstones(r, q)) == 21


def test_a_bad_limit_is_refused_with_nothing_written(q: Queue, r: redis.Redis) -> None:
    before = dump_all(r)
    for bad in (-1, 2**41, "5", 2.5):
        with pytest.raises(InvalidArgument):
            q.set_tombstone_limit(bad)  # type: ignore[arg-type]
    assert dump_all(r) == before


def test_a_partitioned_queue_splits_the_limit(make_queue: Any, r: redis.Redis) -> None:
    q = make_queue("tomb", partitions=3)
    assert q.set_tombstone_limit(10) is True
    assert [int(r.hget(f"pq:{{tomb#{p}}}:counters", "done_max")) for p in range(3)] == [4, 4, 4]
