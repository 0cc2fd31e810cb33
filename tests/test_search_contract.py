"""The contract of indexes, search and promote_now (lua/README.md section 2.8), checked at
the level of the keys: which members `index` holds and when they go, which state each
search answers, what promote_now moves. tests/test_mutations.py plants bugs in these
scripts and in the endings that unlist a job, and runs the plain tests of this module
(those that take only ``q`` and ``r``) against them: each bug must fail one. On
fakeredis and a real redis-server, sync and async."""

from __future__ import annotations

import pytest
import redis

from pyqueue import InvalidArgument, NewJob, Queue

ASYNC_TOO = True
T0 = 1_000_000


def members(r: redis.Redis, q: Queue) -> list[bytes]:
    return sorted(r.zrange(q.spec.keys.index, 0, -1))


def entries(r: redis.Redis, q: Queue) -> dict[bytes, bytes]:
    return {f: v for f, v in r.hgetall(q.spec.keys.keyed).items() if f.startswith(b"x:")}


def member(kind: str, value: str, at: int, job_id: str) -> bytes:
    return f"{kind}\n{value}\n{at:015d}\n{job_id}".encode()


def test_set_indexes_keeps_since_when_and_enqueue_lists_from_then_on(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="before", task="t", now_ms=T0)
    assert q.set_indexes(True, now_ms=T0 + 1) == T0 + 1
    assert q.set_indexes(True, now_ms=T0 + 2) == T0 + 1  # on already: since when it was turned on
    assert r.hget(q.spec.keys.counters, "indexes") == str(T0 + 1).encode()
    q.enqueue(b"x", job_id="after", task="t", group="g", now_ms=T0 + 3)
    assert members(r, q) == [member("g", "g", T0 + 3, "after"), member("t", "t", T0 + 3, "after")]
    assert entries(r, q) == {b"x:after": f"{T0 + 3}\ng\nt".encode()}
    page = q.search(task="t", now_ms=T0 + 4)
    assert [j.id for j in page.jobs] == ["after"] and page.indexed_since_ms == T0 + 1
    assert q.set_indexes(False, now_ms=T0 + 5) is None
    q.enqueue(b"x", job_id="off", task="t", now_ms=T0 + 6)
    assert members(r, q) == [member("g", "g", T0 + 3, "after"), member("t", "t", T0 + 3, "after")]
    with pytest.raises(InvalidArgument, match="keeps no indexes"):
        q.search(task="t", now_ms=T0 + 7)


def test_an_ack_unlists_its_job_and_a_job_without_task_or_group_is_never_listed(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue_many([NewJob(b"a", job_id="a", task="t"), NewJob(b"b", job_id="b")], now_ms=T0)
    assert members(r, q) == [member("t", "t", T0, "a")] and list(entries(r, q)) == [b"x:a"]
    a, b = q.lease(count=2, now_ms=T0)
    q.ack(a, now_ms=T0)
    assert members(r, q) == [] and entries(r, q) == {}
    q.ack(b, now_ms=T0)
    q.enqueue(b"c", job_id="c", task="t", now_ms=T0)
    (c,) = q.lease(now_ms=T0)
    assert q.ack_and_lease(c, now_ms=T0)[1] == [] and members(r, q) == []


def test_ack_result_cancel_and_purge_unlist_and_a_dead_job_stays_listed(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue_many([NewJob(b"x", job_id=i, task="t", group="g", max_attempts=1) for i in ("r", "c", "d")],
                   now_ms=T0)
    jobs = {j.id: j for j in q.lease(count=3, now_ms=T0)}
    q.ack_result(jobs["r"], b"done", now_ms=T0)
    assert not any(m.endswith(b"\nr") for m in members(r, q)) and b"x:r" not in entries(r, q)
    q.nack(jobs["d"], "boom", now_ms=T0)
    assert member("t", "t", T0, "d") in members(r, q), "a dead job is still a job: it stays listed"
    assert [j.state for j in q.search(task="t", state="dead", now_ms=T0).jobs] == ["dead"]
    q.dead_replay(["d"], now_ms=T0)
    assert member("t", "t", T0, "d") in members(r, q), "a replay keeps its members"
    (again,) = q.lease(now_ms=T0)
    q.nack(again, "boom again", now_ms=T0)
    assert q.dead_purge(["d"]) == 1
    assert members(r, q) == [member("g", "g", T0, "c"), member("t", "t", T0, "c")]
    q.cancel("c", now_ms=T0)
    assert members(r, q) == [] and entries(r, q) == {}


def test_a_job_expired_at_its_first_lease_is_unlisted(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue(b"x", job_id="e", task="t", expires_ms=10, now_ms=T0)
    assert q.lease(now_ms=T0 + 10) == []
    assert q.get("e", now_ms=T0 + 10).state == "expired"
    assert members(r, q) == [] and entries(r, q) == {}


def test_a_merge_lists_the_job_under_its_last_send_only(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue(b"1", job_id="d", task="old", group="g1", debounce_ms=100, key="k", now_ms=T0)
    assert q.enqueue(b"2", job_id="d2", task="new", debounce_ms=100, key="k", now_ms=T0 + 5).by_key == "debounced"
    assert members(r, q) == [member("t", "new", T0 + 5, "d")]
    assert entries(r, q) == {b"x:d": f"{T0 + 5}\n\nnew".encode()}
    assert q.search(task="old", now_ms=T0 + 6).jobs == []


def test_search_answers_each_job_in_the_state_it_has_now(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue_many([NewJob(b"x", job_id=f"j{i}", task="t", max_attempts=1, delay_ms=60_000 if i == 3 else 0)
                    for i in range(4)], now_ms=T0)
    held, dying, _ = q.lease(count=3, now_ms=T0)
    q.nack(dying, "boom", now_ms=T0)
    states = {j.id: j.state for j in q.search(task="t", now_ms=T0).jobs}
    assert states == {"j0": "leased", "j1": "dead", "j2": "leased", "j3": "scheduled"}
    for state in ("leased", "dead", "scheduled", "ready"):
        page = q.search(task="t", state=state, now_ms=T0)
        assert sorted(j.id for j in page.jobs) == sorted(i for i, s in states.items() if s == state), state
        assert {j.state for j in page.jobs} <= {state}
    # The same filters on the other sources (by state alone, and every job).
    assert [j.id for j in q.search(state="dead", now_ms=T0).jobs] == ["j1"]
    assert [j.id for j in q.search(state="scheduled", now_ms=T0).jobs] == ["j3"]
    assert sorted(j.id for j in q.search(state="leased", now_ms=T0).jobs) == ["j0", "j2"]
    assert q.search(state="ready", now_ms=T0).jobs == []
    assert sorted(j.id for j in q.search(now_ms=T0).jobs) == ["j0", "j1", "j2", "j3"]
    assert held.id == "j0"


def test_search_by_time_and_error(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    for i, error in enumerate(["TimeoutError: slow", "asyncio.exceptions.TimeoutError: slower", "ValueError: no"]):
        q.enqueue(b"x", job_id=f"d{i}", task="t", max_attempts=1, now_ms=T0 + i)
        (job,) = q.lease(now_ms=T0 + 10 * i)
        q.nack(job, error, now_ms=T0 + 10 * i)
    assert [j.id for j in q.search(error="TimeoutError", now_ms=T0 + 100).jobs] == ["d0", "d1"]
    assert [j.id for j in q.search(task="t", error="ValueError", now_ms=T0 + 100).jobs] == ["d2"]
    assert [j.id for j in q.search(state="dead", since_ms=T0 + 10, now_ms=T0 + 100).jobs] == ["d1", "d2"]
    assert [j.id for j in q.search(task="t", state="dead", until_ms=T0 + 10, now_ms=T0 + 100).jobs] == ["d0"]
    assert [j.id for j in q.search(since_ms=T0 + 1, until_ms=T0 + 2, now_ms=T0 + 100).jobs] == []  # dead: time of death
    q.enqueue(b"x", job_id="late", task="t", now_ms=T0 + 50)
    assert [j.id for j in q.search(task="t", state="ready", since_ms=T0 + 50, now_ms=T0 + 100).jobs] == ["late"]
    assert [j.id for j in q.search(state="ready", until_ms=T0 + 50, now_ms=T0 + 100).jobs] == []


def test_a_job_whose_record_has_no_send_time_is_found_unless_a_time_bounds_the_search(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="new", now_ms=T0)
    r.hset(q.spec.keys.jobs, "old", "0|3|1000|payload")  # a record written by v4 scripts (lua/README.md section 2)
    r.rpush(q.spec.keys.ready, "old")
    for where in ({"state": "ready"}, {}):
        page = q.search(now_ms=T0, **where)  # type: ignore[arg-type]
        assert sorted(j.id for j in page.jobs) == ["new", "old"], where
        assert {j.id: j.enqueued_ms for j in page.jobs}["old"] == -1
    assert [j.id for j in q.search(state="ready", since_ms=0, now_ms=T0).jobs] == ["new"]
    assert [j.id for j in q.search(until_ms=T0 + 1, now_ms=T0).jobs] == ["new"]


def test_promote_now_moves_only_jobs_scheduled_for_later(q: Queue, r: redis.Redis) -> None:
    q.enqueue_many([NewJob(b"x", job_id="held"), NewJob(b"x", job_id="later", delay_ms=60_000),
                    NewJob(b"x", job_id="soon", delay_ms=10)], now_ms=T0)
    assert [j.id for j in q.lease(now_ms=T0)] == ["held"]
    q.enqueue(b"x", job_id="ready", now_ms=T0)
    records = {i: r.hget(q.spec.keys.jobs, i) for i in ("ready", "held", "soon")}
    answer = q.promote_now(["later", "ready", "held", "soon", "nothing", "later"], now_ms=T0 + 20)
    assert answer == ["later"]
    assert r.zscore(q.spec.keys.scheduled, "later") == T0 + 20
    assert r.hget(q.spec.keys.jobs, "later").startswith(f"0|5|{T0 + 20}:{T0}|".encode())  # type: ignore[union-attr]
    assert {i: r.hget(q.spec.keys.jobs, i) for i in records} == records, "a job not scheduled for later was touched"
    assert r.zrange(q.spec.keys.wake, 0, -1) == [b"wake"]
    assert q.promote_now(["later"], now_ms=T0 + 20) == []  # due now: nothing more
    assert q.get("held", now_ms=T0 + 20).state == "leased" and q.get("ready", now_ms=T0 + 20).state == "ready"


def test_promote_now_skips_a_job_parked_for_a_signal(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="p", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    q.park(job, "wait", "approved", 60_000, lease_ms=60_000, now_ms=T0)
    before = r.hget(q.spec.keys.jobs, "p")
    assert q.promote_now(["p"], now_ms=T0 + 1) == []
    assert r.hget(q.spec.keys.jobs, "p") == before and r.zscore(q.spec.keys.scheduled, "p") == T0 + 60_000


def test_a_merge_by_a_send_without_task_or_group_unlists_the_job_whole(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue(b"1", job_id="d", task="old", group="g", debounce_ms=100, key="k", now_ms=T0)
    q.enqueue(b"2", job_id="d2", debounce_ms=100, key="k", now_ms=T0 + 5)
    assert members(r, q) == []
    assert entries(r, q) == {}, "the entry of members no longer in the index"
