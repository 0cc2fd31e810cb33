"""browse: one page of a queue's jobs in one state (lua/browse.lua, Queue.browse), on
fakeredis and a real redis-server, both drivers; read only, bounded by its count."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import dump_all

from pyqueue import InvalidArgument, JobEntry, NewJob, Queue, WrongTypeError
from pyqueue.protocol.core import partition_of
from pyqueue.protocol.models import WAITING_DUE_MS
from pyqueue.drivers.facade import plans_of

ASYNC_TOO = True

T0 = 1_000_000


def ids(page: Any) -> list[str]:
    return [job.id for job in page.jobs]


def test_ready_jobs_page_through_the_list_first_then_the_grouped_and_prioritised(q: Queue, r: redis.Redis) -> None:
    q.enqueue_many([NewJob(b"p", job_id=f"r{i}", max_attempts=3) for i in range(3)], now_ms=T0)
    q.enqueue_many(
        [NewJob(b"p", job_id="b1", group="b"), NewJob(b"p", job_id="a1", group="a", priority=2),
         NewJob(b"p", job_id="a2", group="a"), NewJob(b"p", job_id="hi", priority=5),
         NewJob(b"p", job_id="lo", priority=-5)],
        now_ms=T0,
    )
    before = dump_all(r)
    page = q.browse("ready", now_ms=T0)
    assert (page.state, page.total, page.start, page.now_ms) == ("ready", 8, 0, T0)
    # the list (lease order), then gready by member: group (the ungrouped, "|...", after
    # every group), priority (higher first), age
    assert ids(page) == ["r0", "r1", "r2", "a1", "a2", "b1", "hi", "lo"]
    assert page.jobs[0] == JobEntry("r0", "q", attempts=0, max_attempts=3)
    by_id = {job.id: job for job in page.jobs}
    assert (by_id["a1"].group, by_id["a1"].priority) == ("a", 2)
    assert (by_id["hi"].group, by_id["hi"].priority, by_id["lo"].priority) == ("", 5, -5)
    assert (by_id["b1"].group, by_id["b1"].priority, by_id["b1"].max_attempts) == ("b", 0, 5)
    # pages across the list's end, and past everything
    assert ids(q.browse("ready", 2, 3, now_ms=T0)) == ["r2", "a1", "a2"]
    assert ids(q.browse("ready", 4, 2, now_ms=T0)) == ["a2", "b1"]
    assert ids(q.browse("ready", 7, 50, now_ms=T0)) == ["lo"]
    empty = q.browse("ready", 8, 50, now_ms=T0)
    assert (empty.total, empty.jobs) == (8, [])
    assert dump_all(r) == before  # read only


def test_scheduled_jobs_by_due_time_and_a_waiting_flow_job_last(q: Queue) -> None:
    q.enqueue(b"x", job_id="late", delay_ms=900, now_ms=T0)
    q.enqueue(b"x", job_id="soon", delay_ms=100, max_attempts=2, now_ms=T0)
    q.enqueue(b"x", job_id="r0", now_ms=T0)
    assert q.flow_wait(NewJob(b"w", job_id="w0"), [("q", "r0")], now_ms=T0) == "ok"
    page = q.browse("scheduled", now_ms=T0)
    assert page.total == 3 and ids(page) == ["soon", "late", "w0"]
    assert page.jobs[0] == JobEntry("soon", "q", due_ms=T0 + 100, attempts=0, max_attempts=2)
    assert not page.jobs[0].waiting
    assert page.jobs[2].due_ms == WAITING_DUE_MS and page.jobs[2].waiting
    assert ids(q.browse("scheduled", 1, 1, now_ms=T0)) == ["late"]


def test_running_jobs_show_owner_attempt_fence_and_deadline_earliest_first(make_queue: Any) -> None:
    q = make_queue(owner="w1")
    other = make_queue(owner="w2")
    q.enqueue_many([NewJob(b"x", job_id=f"j{i}", max_attempts=4) for i in range(3)], now_ms=T0)
    first = q.lease(count=2, lease_ms=5000, now_ms=T0)
    (late,) = other.lease(count=1, lease_ms=1000, now_ms=T0 + 10)
    page = q.browse("running", now_ms=T0 + 20)
    assert page.total == 3
    assert ids(page) == ["j2", "j0", "j1"]  # by deadline: T0 + 1010, then T0 + 5000 (by receipt)
    assert page.jobs[0] == JobEntry("j2", "q", owner="w2", attempts=1, max_attempts=4, fence=late.fence,
                                    deadline_ms=T0 + 1010)
    assert {(j.id, j.owner, j.fence, j.deadline_ms) for j in page.jobs[1:]} == {
        (job.id, "w1", job.fence, T0 + 5000) for job in first
    }
    # an expired lease not yet reclaimed is still listed, its deadline in the past
    later = q.browse("running", 0, 1, now_ms=T0 + 2000)
    assert later.total == 3 and later.jobs[0].deadline_ms < later.now_ms
    # a second attempt says so
    q.nack(first[0], "again", delay_ms=0, now_ms=T0 + 30)
    q.promote(now_ms=T0 + 31)
    (again,) = q.lease(count=1, lease_ms=9000, now_ms=T0 + 40)
    entry = q.browse("running", 2, 1, now_ms=T0 + 41).jobs[0]
    assert (entry.id, entry.attempts, entry.fence) == (again.id, 2, again.fence)


def test_done_jobs_say_whether_a_result_is_kept(q: Queue) -> None:
    q.enqueue_many([NewJob(b"x", job_id=i) for i in ("plain", "with", "short")], now_ms=T0)
    plain, with_result, short = q.lease(count=3, now_ms=T0)
    q.ack(plain, now_ms=T0 + 1)
    q.ack_result(with_result, {"n": 1}, result_ttl_ms=60_000, now_ms=T0 + 2)
    q.ack_result(short, "brief", result_ttl_ms=10, now_ms=T0 + 3)
    page = q.browse("done", now_ms=T0 + 5)
    assert page.total == 3 and ids(page) == ["plain", "with", "short"]  # earliest expiry first
    plain_e, with_e, short_e = page.jobs
    assert plain_e == JobEntry("plain", "q", done_until_ms=T0 + 1 + q.spec.keep_done_ms)
    assert (with_e.has_result, with_e.finished_ms, with_e.done_until_ms) == (True, T0 + 2, T0 + 2 + q.spec.keep_done_ms)
    assert (short_e.has_result, short_e.finished_ms) == (True, T0 + 3)
    assert q.result("with", now_ms=T0 + 5).value == {"n": 1}
    # a result past its time is no longer kept; a tombstone past its time is not listed
    assert [j.has_result for j in q.browse("done", now_ms=T0 + 20).jobs] == [False, True, False]
    gone = q.browse("done", now_ms=T0 + 1 + q.spec.keep_done_ms)
    assert gone.total == 2 and ids(gone) == ["with", "short"]
    assert ids(q.browse("done", 1, 5, now_ms=T0 + 1 + q.spec.keep_done_ms)) == ["short"]


def test_an_empty_queue_has_nothing_in_any_state(q: Queue) -> None:
    for state in ("ready", "scheduled", "running", "done"):
        page = q.browse(state, now_ms=T0)
        assert (page.state, page.total, page.jobs) == (state, 0, [])
    assert q.browse("ready").now_ms > 0  # the server clock without now_ms


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("dead",), "state must be one of"),
        (("READY",), "state must be one of"),
        ((None,), "state must be one of"),
        ((["ready"],), "state must be one of"),
        (("ready", -1), "start"),
        (("ready", 2**31 + 1), "start"),
        (("ready", 1.0), "start"),
        (("ready", 0, 0), "count"),
        (("ready", 0, 501), "count"),
        (("ready", 0, True), "count"),
    ],
)
def test_bad_input_is_refused_in_python_before_anything_is_sent(q: Queue, args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        q.browse(*args)
    # the plan raises before it yields its first step: nothing reaches the server
    with pytest.raises(InvalidArgument, match=message):
        next(plans_of(q).browse(*args))
    with pytest.raises(InvalidArgument, match="now_ms"):
        q.browse("ready", now_ms=-1)


@pytest.mark.parametrize("role", ["jobs", "ready", "scheduled", "leased", "done", "results", "result_expiry", "gready"])
def test_a_key_of_the_wrong_type_is_reported_whatever_the_state(q: Queue, r: redis.Redis, role: str) -> None:
    r.set(q.spec.keys.role(role), "planted")
    before = dump_all(r)
    for state in ("ready", "scheduled", "running", "done"):
        with pytest.raises(WrongTypeError, match=role):
            q.browse(state, now_ms=T0)
    assert dump_all(r) == before


def test_a_corrupt_record_is_reported(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="j", now_ms=T0)
    r.hset(q.spec.keys.jobs, "j", "garbage")
    with pytest.raises(Exception, match="PQ_CORRUPT"):
        q.browse("ready", now_ms=T0)


def test_a_partitioned_queue_pages_over_its_partitions_in_order(r: redis.Redis) -> None:
    q = Queue("orders", r, partitions=3)
    job_ids = [f"j{i}" for i in range(12)]
    q.enqueue_many([NewJob(b"x", job_id=i) for i in job_ids], now_ms=T0)
    in_order = sorted(job_ids, key=lambda i: (partition_of(i, 3), job_ids.index(i)))
    whole = q.browse("ready", 0, 50, now_ms=T0)
    assert whole.total == 12 and ids(whole) == in_order
    assert {job.queue for job in whole.jobs} == {"orders#0", "orders#1", "orders#2"}
    assert all(job.queue == f"orders#{partition_of(job.id, 3)}" for job in whole.jobs)
    pages = [q.browse("ready", start, 5, now_ms=T0) for start in (0, 5, 10)]
    assert [p.total for p in pages] == [12, 12, 12]
    assert [i for p in pages for i in ids(p)] == in_order
    assert ids(q.browse("ready", 12, 5, now_ms=T0)) == []
    with pytest.raises(InvalidArgument):
        q.browse("dead")
