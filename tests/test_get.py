"""get: where is job X (lua/get.lua), in every state, on both drivers."""

from __future__ import annotations

import pytest
import redis

from pyqueue import InvalidArgument, JobInfo, NewJob, Queue

ON_CLUSTER = True
ASYNC_TOO = True

T0 = 1_000_000


def test_each_state_is_answered_with_what_it_knows(q: Queue) -> None:
    q.enqueue_many(
        [NewJob(b"ready!", job_id="r"), NewJob(b"s", job_id="s", delay_ms=500, max_attempts=3),
         NewJob(b"l", job_id="l"), NewJob(b"d", job_id="d", max_attempts=1)],
        now_ms=T0,
    )
    r = q.get("r", with_payload=True, now_ms=T0)
    assert (r.state, r.attempts, r.max_attempts, r.payload_bytes, r.payload, r.deadline_ms) == (
        "ready", 0, 5, 6, b"ready!", -1
    )
    assert q.get("r", now_ms=T0).payload is None  # the payload only when asked for
    s = q.get("s", now_ms=T0)
    assert (s.state, s.due_ms, s.max_attempts) == ("scheduled", T0 + 500, 3)
    leased = q.lease(count=3, lease_ms=1000, now_ms=T0)
    assert [j.id for j in leased] == ["r", "l", "d"]
    info = q.get("l", now_ms=T0)
    assert (info.state, info.deadline_ms, info.owner, info.fence) == ("leased", T0 + 1000, q.spec.owner, leased[1].fence)
    q.nack(leased[2], "it broke", now_ms=T0 + 1)
    d = q.get("d", now_ms=T0 + 2)
    assert (d.state, d.due_ms, d.error, d.attempts) == ("dead", T0 + 1, "it broke", 1)
    q.ack(leased[0], now_ms=T0 + 3)
    done = q.get("r", with_payload=True, now_ms=T0 + 4)
    assert (done.state, done.done_until_ms, done.payload, done.exists) == ("done", T0 + 3 + q.spec.keep_done_ms, None, False)
    assert q.get("r", now_ms=T0 + 3 + q.spec.keep_done_ms + 1).state == "unknown"
    assert q.get("never", now_ms=T0) == JobInfo(
        "never", q.name, "unknown", T0, -1, -1, -1, -1, None, "", -1, "", -1, -1
    )


def test_a_lease_of_another_id_that_ends_with_this_one_is_not_its_lease(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="a|b"), NewJob(b"", job_id="b"), NewJob(b"", job_id="*")], now_ms=T0)
    q.lease(now_ms=T0)  # leases 'a|b', whose receipt ends in '|b'
    assert q.get("a|b", now_ms=T0).state == "leased"
    assert q.get("b", now_ms=T0).state == "ready"
    assert q.get("*", now_ms=T0).state == "ready"  # a glob character in the id matches itself only


def test_a_partitioned_queue_answers_from_the_ids_partition(make_queue: object) -> None:
    q = make_queue("p", partitions=4)  # type: ignore[operator]
    q.enqueue_many([NewJob(b"x", job_id=f"j{i}") for i in range(8)], now_ms=T0)
    infos = [q.get(f"j{i}", now_ms=T0) for i in range(8)]
    assert {i.state for i in infos} == {"ready"}
    assert {i.queue for i in infos} <= {f"p#{p}" for p in range(4)} and len({i.queue for i in infos}) > 1


def test_a_bad_id_is_refused_before_anything_is_sent(q: Queue, r: redis.Redis) -> None:
    for bad in ("", "x" * 257, "a\nb", 7):
        with pytest.raises(InvalidArgument):
            q.get(bad)  # type: ignore[arg-type]
