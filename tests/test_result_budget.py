"""Results kept by bytes (lua/set_result_budget.lua, lua/ack_result.lua): under a
results budget, ack_result keeps each result's size and their sum, and deletes the
oldest-expiring results before the sum would pass the budget; a queue without one pays
nothing and keeps no size. On fakeredis, a real redis-server and a Redis Cluster, sync
and async."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import dump_all

from pyqueue import InvalidArgument, Queue

ON_CLUSTER = True
ASYNC_TOO = True
T0 = 1_000_000
#: What ack_result stores of a result: "<finished_ms>|" then the encoded value (one kind byte).
STORED = len(f"{T0}|") + 1


def finish(q: Queue, job_id: str, value: bytes, at: int, ttl_ms: int = 60_000) -> None:
    q.enqueue(b"", job_id=job_id, now_ms=at)
    (job,) = [j for j in q.lease(count=10, now_ms=at) if j.id == job_id]
    assert q.ack_result(job, value, result_ttl_ms=ttl_ms, now_ms=at).name == "OK"


def counters(r: Any, q: Queue) -> dict[bytes, bytes]:
    return r.hgetall(f"pq:{{{q.name}}}:counters")


def sizes(r: Any, q: Queue) -> dict[bytes, int]:
    keyed = r.hgetall(f"pq:{{{q.name}}}:keyed")
    return {k[3:]: int(v) for k, v in keyed.items() if k.startswith(b"rb:")}


def kept(q: Queue, ids: list[str]) -> list[str]:
    return [i for i in ids if q.result(i, now_ms=T0 + 10).state == "ok"]


def test_a_budget_keeps_the_newest_results_within_it(q: Queue, r: redis.Redis) -> None:
    value = b"x" * 1000
    assert q.set_result_budget(3 * (STORED + 1000)) is True
    assert q.set_result_budget(3 * (STORED + 1000)) is False  # a re-sent call changes nothing
    ids = [f"j{i}" for i in range(6)]
    for i, job_id in enumerate(ids):
        finish(q, job_id, value, T0 + i)  # later ones expire later
    assert kept(q, ids) == ["j3", "j4", "j5"]
    assert int(counters(r, q)[b"result_bytes"]) == 3 * (STORED + 1000)
    assert sizes(r, q) == {i.encode(): STORED + 1000 for i in ("j3", "j4", "j5")}
    st = q.stats()
    assert (st.result_bytes, st.result_budget_bytes) == (3 * (STORED + 1000), 3 * (STORED + 1000))


def test_expired_and_counted_trims_give_their_bytes_back(q: Queue, r: redis.Redis) -> None:
    q.set_result_budget(10**6)
    for i in range(5):
        finish(q, f"j{i}", b"y" * 100, T0, ttl_ms=5)  # expired by the next call's time
    for i in range(5, 20):
        finish(q, f"j{i}", b"z" * 10, T0 + 100)
    assert kept(q, [f"j{i}" for i in range(5)]) == []
    assert int(counters(r, q)[b"result_bytes"]) == sum(sizes(r, q).values()) == 15 * (STORED + 10)


def test_a_result_stored_before_the_budget_counts_for_nothing_and_goes_in_its_turn(q: Queue, r: redis.Redis) -> None:
    finish(q, "old", b"o" * 5000, T0)
    q.set_result_budget(2 * (STORED + 100))
    for i in range(3):
        finish(q, f"n{i}", b"n" * 100, T0 + 1 + i)
    assert kept(q, ["old", "n0", "n1", "n2"]) == ["n1", "n2"]
    assert int(counters(r, q)[b"result_bytes"]) == 2 * (STORED + 100)


def test_lifting_the_budget_stops_sizing_and_the_sizes_go_with_their_results(q: Queue, r: redis.Redis) -> None:
    q.set_result_budget(10**6)
    finish(q, "a", b"a" * 10, T0, ttl_ms=5)
    assert q.set_result_budget(None) is True
    finish(q, "b", b"b" * 10, T0 + 100)  # trims a (expired): its size goes
    assert sizes(r, q) == {} and int(counters(r, q)[b"result_bytes"]) == 0
    assert b"result_budget" not in counters(r, q)


def test_a_queue_without_a_budget_keeps_no_size(q: Queue, r: redis.Redis) -> None:
    for i in range(3):
        finish(q, f"j{i}", b"v", T0)
    assert sizes(r, q) == {} and b"result_bytes" not in counters(r, q)


def test_a_bad_budget_is_refused_with_nothing_written(q: Queue, r: redis.Redis) -> None:
    before = dump_all(r)
    for bad in (-1, 2**51, "1MiB", 1.5):
        with pytest.raises(InvalidArgument):
            q.set_result_budget(bad)  # type: ignore[arg-type]
    assert dump_all(r) == before


def test_a_partitioned_queue_splits_the_budget(make_queue: Any, r: redis.Redis) -> None:
    q = make_queue("res", partitions=2)
    assert q.set_result_budget(1001) is True
    assert sorted(int(r.hget(f"pq:{{res#{p}}}:counters", "result_budget")) for p in range(2)) == [501, 501]
