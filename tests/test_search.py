"""Indexes and search (lua/set_indexes.lua, lua/search.lua) and the bulk actions on what
is found (pyqueue.ops.find: replay, purge, cancel, promote_now): jobs are found by task
and group in every state, by state, error class and time; pages go on by cursor; every
ending unlists its job; the actions check each job's state again, so a job moved
meanwhile is never moved twice. On fakeredis, a real redis-server and a Redis Cluster,
sync and async."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import all_keys, dump_all

from pyqueue import InvalidArgument, NewJob, Queue
from pyqueue.ops.find import JobFilter, act_matching, matching

ON_CLUSTER = True
ASYNC_TOO = True
T0 = 1_000_000


def found(q: Queue, **where: Any) -> list[str]:
    return sorted(j.id for j in matching(q, JobFilter(**where)))


def index_of(r: Any, q: Queue) -> list[bytes]:
    return sorted(r.zrange(f"pq:{{{q.name}}}:index", 0, -1))


def x_fields(r: Any, q: Queue) -> list[bytes]:
    return sorted(f for f in r.hkeys(f"pq:{{{q.name}}}:keyed") if f.startswith(b"x:"))


def world(q: Queue) -> Any:
    """Jobs of two tasks and two groups in every state; answers r1's lease."""
    q.enqueue_many([
        NewJob(b"r1", job_id="r1", task="send_invoice", group="acme"),
        NewJob(b"r2", job_id="r2", task="send_invoice"),
        NewJob(b"r3", job_id="r3", task="resize", group="globex"),
        NewJob(b"s1", job_id="s1", task="send_invoice", group="acme", delay_ms=60_000),
        NewJob(b"d1", job_id="d1", task="send_invoice", max_attempts=1),
        NewJob(b"d2", job_id="d2", task="resize", max_attempts=1),
    ], now_ms=T0)
    # d1 and d2 die (the lease takes the head of READY first: r1, r2, r3, then d1, d2).
    leased = {j.id: j for j in q.lease(count=5, now_ms=T0 + 10)}
    q.nack(leased["d1"], "TimeoutError: the API took 30 s", now_ms=T0 + 20)
    q.nack(leased["d2"], "ValueError: bad row", now_ms=T0 + 30)
    q.release([leased["r2"], leased["r3"]], now_ms=T0 + 40)
    return leased["r1"]  # r1 stays leased


def test_without_indexes_a_search_by_task_is_refused_and_one_by_state_works(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match="no indexes"):
        q.search(task="send_invoice")
    with pytest.raises(InvalidArgument, match="no indexes"):
        q.search(group="acme")
    assert dump_all(r) == before
    page = q.search(state="ready")
    assert ([j.id for j in page.jobs], page.cursor, page.indexed_since_ms) == (["a"], "", None)


def test_set_indexes_turns_them_on_once_and_off(q: Queue) -> None:
    assert q.set_indexes(True, now_ms=T0) == T0
    assert q.set_indexes(True, now_ms=T0 + 5) == T0  # a re-sent call changes nothing
    assert q.search(state="ready").indexed_since_ms == T0
    assert q.set_indexes(False) is None
    with pytest.raises(InvalidArgument, match="no indexes"):
        q.search(task="t")
    with pytest.raises(InvalidArgument):
        q.set_indexes("yes")  # type: ignore[arg-type]


def test_jobs_are_found_by_task_and_group_in_every_state(q: Queue) -> None:
    q.set_indexes(True, now_ms=T0)
    world(q)
    states = {j.id: j.state for j in q.search(task="send_invoice").jobs}
    assert states == {"r1": "leased", "r2": "ready", "s1": "scheduled", "d1": "dead"}
    assert found(q, group="acme") == ["r1", "s1"]
    assert found(q, task="send_invoice", group="acme") == ["r1", "s1"]
    assert found(q, task="send_invoice", state="ready") == ["r2"]
    assert found(q, task="resize", state="dead") == ["d2"]
    assert found(q, task="nothing") == []
    dead = q.search(task="send_invoice", state="dead").jobs[0]
    assert (dead.task, dead.dead_ms, dead.error, dead.attempts, dead.payload_bytes) == (
        "send_invoice", T0 + 20, "TimeoutError: the API took 30 s", 1, 2)
    running = q.search(state="leased").jobs[0]
    assert (running.id, running.task, running.group, running.enqueued_ms) == ("r1", "send_invoice", "acme", T0)
    assert running.owner and running.deadline_ms > T0
    # Without a task or group, the state's own structure is read.
    assert found(q, state="ready") == ["r2", "r3"]
    assert found(q, state="scheduled") == ["s1"]
    assert found(q) == ["d1", "d2", "r1", "r2", "r3", "s1"]


def test_error_class_and_time_filters(q: Queue) -> None:
    q.set_indexes(True, now_ms=T0)
    world(q)
    assert found(q, error="TimeoutError") == ["d1"]
    assert found(q, error="TimeoutError", task="send_invoice") == ["d1"]
    assert found(q, error="TimeoutError", task="resize") == []
    # A dead job's time is its death; any other's its send.
    assert found(q, state="dead", since_ms=T0 + 25) == ["d2"]
    assert found(q, state="dead", until_ms=T0 + 25) == ["d1"]
    assert found(q, task="send_invoice", since_ms=T0 + 25) == []  # sent at T0; d1 died at T0 + 20
    assert found(q, task="send_invoice", until_ms=T0 + 1) == ["r1", "r2", "s1"]
    with pytest.raises(InvalidArgument, match="only dead jobs"):
        q.search(state="ready", error="TimeoutError")
    for bad in ({"state": "running"}, {"error": "a:b"}, {"group": "a|b"}, {"count": 0}, {"since_ms": -1}):
        with pytest.raises(InvalidArgument):
            q.search(**bad)


def test_pages_go_on_by_cursor_and_find_each_job_once(q: Queue) -> None:
    q.set_indexes(True, now_ms=T0)
    for start in range(0, 4500, 1000):
        q.enqueue_many([NewJob(b"", job_id=f"j{i:05d}", task="t" if i % 1000 == 7 or i < 300 else "u")
                        for i in range(start, min(start + 1000, 4500))], now_ms=T0 + start)
    # 300 + 4 jobs of task t among 4500, read in pages of 100.
    seen, cursor, pages = [], "", 0
    while True:
        page = q.search(task="t", count=100, cursor=cursor)
        assert len(page.jobs) <= 100
        seen += [j.id for j in page.jobs]
        pages += 1
        cursor = page.cursor
        if not cursor:
            break
    assert len(seen) == len(set(seen)) == 304 and pages >= 4
    assert seen == sorted(seen)  # in send order
    # Without an index: 4500 jobs by state, sparse matches, several script calls.
    assert len(found(q, state="ready")) == 4500
    sparse = q.search(state="ready", since_ms=T0 + 4000, count=500)
    assert len(sparse.jobs) == 500 and sparse.examined >= 4500 - 500
    # A cursor of another search is refused.
    page = q.search(task="t", count=1)
    with pytest.raises(InvalidArgument, match="cursor"):
        q.search(state="ready", cursor=page.cursor)


def test_every_ending_unlists_its_job(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    r1 = world(q)
    q.enqueue(b"e", job_id="e1", task="t", expires_ms=5, now_ms=T0)
    assert len(index_of(r, q)) == 7 + 3  # a task member per job, a group member for r1, s1, r3
    leased = {j.id: j for j in q.lease(count=10, now_ms=T0 + 100)}
    assert "e1" not in leased  # expired at the lease: unlisted
    for job in [r1, *leased.values()]:
        q.ack(job)
    q.cancel("s1")
    assert q.dead_purge(["d1", "d2"]) == 2
    assert index_of(r, q) == [] and x_fields(r, q) == []
    assert found(q, task="send_invoice") == []


def test_a_dead_job_stays_listed_and_a_replay_keeps_it(q: Queue) -> None:
    q.set_indexes(True, now_ms=T0)
    world(q)
    assert q.dead_replay(["d1"]) == 1
    assert {j.id: j.state for j in q.search(task="send_invoice").jobs}["d1"] == "ready"


def test_a_debounce_merge_lists_the_job_under_its_last_send(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue_many([NewJob(b"1", job_id="a", task="first", group="g1", key="k", debounce_ms=1000)], now_ms=T0)
    q.enqueue_many([NewJob(b"2", job_id="b", task="second", group="g2", key="k", debounce_ms=1000)], now_ms=T0 + 10)
    assert found(q, task="first") == [] and found(q, group="g1") == []
    assert found(q, task="second") == ["a"] and found(q, group="g2") == ["a"]
    assert len(index_of(r, q)) == 2


def test_a_job_that_waits_for_others_is_listed_and_each_ending_unlists_it(q: Queue, r: redis.Redis) -> None:
    """flow_wait.lua lists a flow's continuation as enqueue lists a job."""
    q.set_indexes(True, now_ms=T0)
    for name in ("then", "cancelled"):
        assert q.flow_wait(NewJob(b"", job_id=name, task="report", group="acme"), [(q.name, "first")],
                           now_ms=T0) == "ok"
    assert q.flow_wait(NewJob(b"", job_id="plain"), [(q.name, "first")], now_ms=T0) == "ok"
    assert found(q, task="report") == ["cancelled", "then"] and found(q, group="acme") == ["cancelled", "then"]
    assert {j.id: j.task for j in q.search(task="report").jobs} == {"then": "report", "cancelled": "report"}
    assert len(index_of(r, q)) == 4 and x_fields(r, q) == [b"x:cancelled", b"x:then"]
    assert q.cancel("cancelled", now_ms=T0).state == "scheduled"
    assert found(q, task="report") == ["then"]
    assert q.flow_done("then", [(q.name, "first", "ok")], now_ms=T0).state == "released"
    assert found(q, task="report", state="scheduled") == ["then"]
    (job,) = [j for j in q.lease(count=2, now_ms=T0) if j.id == "then"]
    q.ack(job, now_ms=T0)
    assert index_of(r, q) == [] and x_fields(r, q) == []


def test_a_flows_steps_are_listed_under_their_tasks(r: redis.Redis) -> None:
    from pyqueue.tasks import Tasks

    q = Queue("jobs", r)
    q.set_indexes(True)
    tasks = Tasks(client=r, default_queue="jobs")

    @tasks.task(name="fetch")
    def fetch(n: int) -> int: ...

    @tasks.task(name="render")
    def render(n: int) -> None: ...

    (fetch.s(1) | render.s()).send()
    assert [j.task for j in q.search(task="render").jobs] == ["render"]
    assert [j.task for j in q.search(task="fetch").jobs] == ["fetch"]


def test_jobs_sent_before_indexes_are_not_listed(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="old", task="t")], now_ms=T0)
    q.set_indexes(True, now_ms=T0 + 1)
    q.enqueue_many([NewJob(b"", job_id="new", task="t")], now_ms=T0 + 2)
    page = q.search(task="t")
    assert [j.id for j in page.jobs] == ["new"] and page.indexed_since_ms == T0 + 1
    assert found(q, state="ready") == ["new", "old"]


def test_a_bad_task_name_is_refused_before_anything_is_sent(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True)
    before = dump_all(r)
    for bad in ("", "a\nb", "x" * 257):
        with pytest.raises(InvalidArgument):
            q.enqueue_many([NewJob(b"", task=bad)])
    assert dump_all(r) == before


def test_bulk_cancel_of_a_group_in_every_state_and_a_dry_run_changes_nothing(q: Queue, r: redis.Redis) -> None:
    q.set_indexes(True, now_ms=T0)
    world(q)
    before = dump_all(r)
    dry = act_matching(q, "cancel", JobFilter(group="acme"), dry_run=True)
    assert (dry.found, dry.done, sorted(dry.sample)) == (2, 0, ["r1", "s1"])
    assert dump_all(r) == before
    result = act_matching(q, "cancel", JobFilter(group="acme"))
    assert (result.found, result.done) == (2, 2)
    assert found(q, group="acme") == [] and q.get("r1").state == "done" and q.get("s1").state == "done"


def test_bulk_replay_and_purge_by_task_and_error(q: Queue) -> None:
    q.set_indexes(True, now_ms=T0)
    world(q)
    with pytest.raises(InvalidArgument, match="acts on dead"):
        act_matching(q, "replay", JobFilter(state="ready"))
    assert (act_matching(q, "replay", JobFilter(task="send_invoice", error="TimeoutError")).done) == 1
    assert q.get("d1").state == "ready"
    assert act_matching(q, "purge", JobFilter(task="resize")).done == 1
    assert q.get("d2").state == "unknown"


def test_bulk_promote_makes_scheduled_jobs_due_now(q: Queue) -> None:
    q.set_indexes(True)
    q.enqueue_many([NewJob(b"", job_id=f"s{i}", task="later", delay_ms=3_600_000) for i in range(3)]
                   + [NewJob(b"", job_id="other", task="other", delay_ms=3_600_000)])
    result = act_matching(q, "promote", JobFilter(task="later"))
    assert (result.found, result.done) == (3, 3)
    assert sorted(j.id for j in q.lease(count=10)) == ["s0", "s1", "s2"]
    # A job no longer scheduled is skipped: the state is checked again.
    assert q.promote_now(["s0", "other", "nope"]) == ["other"]
    assert q.promote_now(["other"]) == []


def test_a_job_acked_between_the_find_and_the_action_is_not_touched(q: Queue) -> None:
    q.set_indexes(True, now_ms=T0)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}", task="t") for i in range(5)], now_ms=T0)
    real = q.cancel_many
    acked: list[str] = []

    def cancel_racing(ids: Any, **kwargs: Any) -> Any:
        # A worker leases and acks j0 after the search found it, before the cancel.
        (job,) = q.lease(count=1)
        assert q.ack(job).name == "OK"
        acked.append(job.id)
        return real(ids, **kwargs)

    q.cancel_many = cancel_racing  # type: ignore[method-assign]
    result = act_matching(q, "cancel", JobFilter(task="t"))
    assert acked == ["j0"] and (result.found, result.done) == (5, 4)
    assert q.stats().cancelled == 4


def test_a_partitioned_queue_is_searched_in_every_partition(make_queue: Any) -> None:
    q = make_queue("orders", partitions=3)
    q.set_indexes(True, now_ms=T0)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}", task="t" if i % 2 else "u") for i in range(60)], now_ms=T0)
    ids, cursor = [], ""
    while True:
        page = q.search(task="t", count=7, cursor=cursor)
        ids += [j.id for j in page.jobs]
        cursor = page.cursor
        if not cursor:
            break
    assert sorted(ids) == sorted(f"j{i}" for i in range(1, 60, 2))
    assert {j.queue for j in q.search(task="t", count=100).jobs} == {f"orders#{p}" for p in range(3)}
    assert act_matching(q, "cancel", JobFilter(task="u")).done == 30
    assert q.stats().ready == 30


def test_the_task_layer_lists_its_jobs_under_their_task(r: redis.Redis, backend: str) -> None:
    from pyqueue.tasks import Tasks

    q = Queue("jobs", r)
    q.set_indexes(True)
    tasks = Tasks(client=r, default_queue="jobs")

    @tasks.task(name="billing.send_invoice")
    def send_invoice(number: int) -> None: ...

    send_invoice.send(1)
    send_invoice.send(2)
    page = q.search(task="billing.send_invoice")
    assert len(page.jobs) == 2 and {j.task for j in page.jobs} == {"billing.send_invoice"}
    assert b"pq:{jobs}:index" in all_keys(r)


def test_a_page_goes_on_after_its_cursor_when_that_job_left_meanwhile(q: Queue) -> None:
    # 30 dead letters that died at the same ms (equal scores: ordered by id).
    q.enqueue_many([NewJob(b"", job_id=f"d{i:02d}", max_attempts=1) for i in range(30)], now_ms=T0)
    for job in q.lease(count=30, now_ms=T0):
        q.nack(job, "ValueError: x", now_ms=T0 + 5)
    first = q.search(state="dead", count=10)
    assert [j.id for j in first.jobs] == [f"d{i:02d}" for i in range(10)] and first.cursor
    assert q.dead_purge(["d09", "d10"]) == 2  # the cursor's job, and the next one
    rest, cursor = [], first.cursor
    while cursor:
        page = q.search(state="dead", count=10, cursor=cursor)
        rest += [j.id for j in page.jobs]
        cursor = page.cursor
    assert rest == [f"d{i:02d}" for i in range(11, 30)]


def test_a_str_of_ids_is_refused_not_taken_as_its_characters(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"", job_id="j", delay_ms=3_600_000)
    before = dump_all(r)
    for call in (lambda: q.promote_now("j"), lambda: q.cancel_many("j"), lambda: q.dead_replay("j"),
                 lambda: q.dead_purge("j")):
        with pytest.raises(InvalidArgument, match="list of job ids"):
            call()
    assert dump_all(r) == before
