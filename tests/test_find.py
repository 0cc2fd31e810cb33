"""Finding dead letters by error class, time and any test, and replaying or purging them
in bulk (pyqueue.ops.find): the scripts re-check each id, so a job moved meanwhile is
never moved twice, and a dry run changes nothing. On fakeredis, a real redis-server
and a Redis Cluster."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import dump_all

from pyqueue import InvalidArgument, NewJob, Queue
from pyqueue.ops.find import DeadFilter, dead_matching, purge_matching, replay_matching

ON_CLUSTER = True
T0 = 1_000_000


def kill(q: Queue, job_id: str, error: str, at: int, payload: bytes = b"") -> None:
    q.enqueue(payload, job_id=job_id, max_attempts=1, now_ms=at)
    (job,) = [j for j in q.lease(count=1, now_ms=at) if j.id == job_id]
    q.nack(job, error, now_ms=at)


def dead_world(q: Queue) -> None:
    kill(q, "t1", "TimeoutError: the API took 30 s", T0)
    kill(q, "t2", "asyncio.exceptions.TimeoutError: slow", T0 + 1000)
    kill(q, "v1", "ValueError: bad row", T0 + 2000)
    kill(q, "t3", "TimeoutError: again", T0 + 3000, payload=b"invoice")
    kill(q, "m1", "MyTimeoutErrorX: not this one", T0 + 4000)


def test_a_filter_finds_by_error_class_and_time(q: Queue) -> None:
    dead_world(q)
    assert [j.id for j in dead_matching(q, DeadFilter(error="TimeoutError"))] == ["t1", "t2", "t3"]
    assert [j.id for j in dead_matching(q, DeadFilter(error="TimeoutError", since_ms=T0 + 1000,
                                                       until_ms=T0 + 3000))] == ["t2"]
    assert [j.id for j in dead_matching(q, DeadFilter(match=lambda j: j.payload == b"invoice"))] == ["t3"]
    assert len(list(dead_matching(q, DeadFilter()))) == 5


def test_a_bulk_replay_moves_each_found_job_once_and_a_dry_run_nothing(q: Queue, r: redis.Redis) -> None:
    dead_world(q)
    before = dump_all(r)
    dry = replay_matching(q, DeadFilter(error="TimeoutError"), dry_run=True)
    assert (dry.found, dry.done, dry.sample) == (3, 0, ["t1", "t2", "t3"])
    assert dump_all(r) == before
    # Another replays t2 between the read and the action: it is found, not moved twice.
    real_replay = q.dead_replay
    raced: list[str] = []

    def replay_racing(ids: Any = None, **kwargs: Any) -> int:
        if not raced:
            raced.append("t2")
            assert real_replay(["t2"]) == 1
        return real_replay(ids, **kwargs)

    q.dead_replay = replay_racing  # type: ignore[method-assign]
    result = replay_matching(q, DeadFilter(error="TimeoutError"))
    assert (result.found, result.done) == (3, 2)
    st = q.stats()
    assert (st.dead, st.ready, st.replayed) == (2, 3, 3)


def test_a_bulk_purge_deletes_what_it_finds(q: Queue) -> None:
    dead_world(q)
    result = purge_matching(q, DeadFilter(until_ms=T0 + 2000))
    assert (result.found, result.done) == (2, 2)
    assert sorted(j.id for j in dead_matching(q, DeadFilter())) == ["m1", "t3", "v1"]


def test_many_pages_of_dead_letters_are_all_read(q: Queue) -> None:
    for start in range(0, 2100, 1000):
        q.enqueue_many([NewJob(b"", job_id=f"j{i}", max_attempts=1) for i in range(start, min(start + 1000, 2100))],
                       now_ms=T0)
    while True:
        jobs = q.lease(count=1000, now_ms=T0)
        if not jobs:
            break
        for job in jobs:
            q.nack(job, "ValueError: x" if int(job.id[1:]) % 2 else "KeyError: y", now_ms=T0)
    assert len(list(dead_matching(q, DeadFilter(error="KeyError")))) == 1050
    assert replay_matching(q, DeadFilter(error="ValueError")).done == 1050


@pytest.mark.parametrize("bad", [{"error": ""}, {"error": "TimeoutError: x"}, {"since_ms": -1}, {"until_ms": "10:00"}])
def test_a_bad_filter_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        DeadFilter(**bad)
