"""Flows (DESIGN section 14, lua/README.md section 2.2): jobs that wait for others.

The engine's two transitions on both backends and drivers (flow_wait arms once,
flow_done counts a member once and releases exactly once, the 'fail' policy releases
early, a cancelled waiting job is forgotten, nothing is left behind), then the task
layer's chain, group and chord through real workers: results passed in order, `.si`,
both failure policies, the handle's status, result and cancel, and the flow check
that releases a step whose report was lost with its worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis
from conftest import all_keys
from tasks_support import Serving, wait_for

import pyqueue.tasks.flows as task_flows
from pyqueue import InvalidArgument, NewJob, Queue
from pyqueue.tasks import HookOutcome, Middleware, MiddlewareError, Sending, TaskDead, TaskRun, Tasks, chain, chord, current_job, group
from pyqueue.tasks.flows import children_flow_id
from pyqueue.protocol.verbs.flows import WAIT_DUE_MS, FlowDone

from pyqueue.protocol.core import partition_name, partition_of
from helpers import queue_parts

#: Also on the async driver (conftest.Blocking), for the engine's verbs.
ASYNC_TOO = True
#: And on the Redis Cluster backend (conftest.BACKENDS): a flow's steps in several slots.
ON_CLUSTER = True
T0 = 1_000_000


def flow_keys(r: Any) -> list[bytes]:
    return sorted(k for k in all_keys(r) if k.endswith((b":fwait", b":fpending")))


# -- the engine: flow_wait and flow_done ------------------------------------------------


def test_a_waiting_job_is_scheduled_never_due_and_armed_once(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("cb")
    assert q.flow_wait(NewJob(b"p", job_id="w"), [("a", "x"), ("a", "y")], now_ms=T0) == "ok"
    assert q.flow_wait(NewJob(b"p", job_id="w"), [("a", "x"), ("a", "y")], now_ms=T0) == "armed"
    info = q.get("w", now_ms=T0)
    assert (info.state, info.due_ms) == ("scheduled", WAIT_DUE_MS)
    assert q.stats(now_ms=T0).scheduled == 1 and q.lease(now_ms=T0 + 10**9) == []
    q.enqueue(b"", job_id="taken", now_ms=T0)
    before = sorted(all_keys(r))
    assert q.flow_wait(NewJob(b"p", job_id="taken"), [("a", "x")], now_ms=T0) == "duplicate"
    assert sorted(all_keys(r)) == before


def test_each_ended_job_counts_once_and_exactly_one_report_releases(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("cb")
    q.flow_wait(NewJob(b"p", job_id="w"), [("a", "x"), ("b", "y")], check_ms=500, now_ms=T0)
    assert q.flow_done("w", [("a", "x", "ok")], now_ms=T0 + 1) == FlowDone("waiting", 1)
    # A replay, a zombie's late report, a check's: nothing more is counted.
    assert q.flow_done("w", [("a", "x", "ok"), ("a", "x", "ok")], now_ms=T0 + 2).counted == 0
    assert q.flow_done("w", [("a", "nope", "ok")], now_ms=T0 + 2).counted == 0  # not waited for
    done = q.flow_done("w", [("b", "y", "ok"), ("a", "x", "ok")], now_ms=T0 + 3)
    assert (done.state, done.counted) == ("released", 1)
    assert q.flow_done("w", [("b", "y", "ok")], now_ms=T0 + 4).state == "gone"
    info = q.get("w", now_ms=T0 + 3)
    assert (info.state, info.due_ms) == ("scheduled", T0 + 3)
    (job,) = q.lease(now_ms=T0 + 3)
    assert (job.id, job.payload, job.attempt) == ("w", b"p", 1)
    assert flow_keys(r) == []


def test_a_check_that_finds_nothing_ended_pushes_the_next_check(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("cb")
    q.flow_wait(NewJob(b"p", job_id="w"), [("a", "x")], check_ms=500, now_ms=T0)
    assert r.zscore(q.spec.keys.fwait, "w") == T0 + 500
    assert q.flow_done("w", [], check_ms=700, now_ms=T0 + 600).state == "waiting"
    assert r.zscore(q.spec.keys.fwait, "w") == T0 + 1300


def test_under_fail_a_failed_job_releases_at_once_and_later_reports_find_nothing(
    make_queue: Callable[..., Queue], r: Any
) -> None:
    q = make_queue("cb")
    q.flow_wait(NewJob(b"p", job_id="w"), [("a", "x"), ("a", "y"), ("a", "z")], now_ms=T0)
    assert q.flow_done("w", [("a", "x", "ok")], policy="fail", now_ms=T0).state == "waiting"
    assert q.flow_done("w", [("a", "y", "failed")], policy="fail", now_ms=T0).state == "released"
    assert flow_keys(r) == []
    assert q.flow_done("w", [("a", "z", "ok")], policy="fail", now_ms=T0) == FlowDone("gone", 0)


def test_under_continue_a_failed_job_counts_as_ended(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("cb")
    q.flow_wait(NewJob(b"p", job_id="w"), [("a", "x"), ("a", "y")], now_ms=T0)
    assert q.flow_done("w", [("a", "x", "failed")], policy="continue", now_ms=T0).state == "waiting"
    assert q.flow_done("w", [("a", "y", "ok")], policy="continue", now_ms=T0).state == "released"


def test_a_waiting_job_cancelled_is_forgotten_by_the_next_report(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("cb")
    q.flow_wait(NewJob(b"p", job_id="w"), [("a", "x"), ("a", "y")], now_ms=T0)
    assert q.cancel("w", now_ms=T0).state == "scheduled"
    done = q.flow_done("w", [("a", "x", "ok")], now_ms=T0)
    assert (done.state, done.counted) == ("gone", 1)
    assert flow_keys(r) == [] and q.get("w", now_ms=T0).state in ("done", "unknown")


def test_flow_due_lists_the_checks_due_with_what_each_still_waits_for(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("cb")
    q.flow_wait(NewJob(b"p", job_id="soon"), [("a", "x"), ("b.b", "y")], check_ms=1)
    q.flow_wait(NewJob(b"p", job_id="later"), [("a", "z")], check_ms=3_600_000)
    q.flow_done("soon", [("a", "x", "ok")], check_ms=1)
    time.sleep(0.01)
    due = q.flow_due()
    assert [(w.id, w.waits_for) for w in due] == [("soon", [("b.b", "y")])]


def test_bad_flow_arguments_are_refused_before_anything_is_sent(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("cb")
    with pytest.raises(InvalidArgument):
        q.flow_wait(NewJob(b"p"), [("a", "x")])  # no id
    with pytest.raises(InvalidArgument):
        q.flow_wait(NewJob(b"p", job_id="w", delay_ms=5), [("a", "x")])
    with pytest.raises(InvalidArgument):
        q.flow_wait(NewJob(b"p", job_id="w"), [])
    with pytest.raises(InvalidArgument):
        q.flow_wait(NewJob(b"p", job_id="w"), [("a{b}", "x")])
    with pytest.raises(InvalidArgument):
        q.flow_done("w", [("a", "x", "maybe")])
    with pytest.raises(InvalidArgument):
        q.flow_done("w", [], policy="ignore")
    assert all(k.endswith(b":counters") for k in all_keys(r))  # at most the partition count


def test_a_partitioned_queue_keeps_a_waiting_job_in_the_partition_of_its_id(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("cb", partitions=4)
    for i in range(8):
        assert q.flow_wait(NewJob(b"p", job_id=f"w{i}"), [("a", "x")], check_ms=1) == "ok"
    time.sleep(0.01)
    assert sorted(w.id for w in q.flow_due()) == [f"w{i}" for i in range(8)]
    assert all(q.flow_done(f"w{i}", [("a", "x", "ok")]).state == "released" for i in range(8))
    leased: list[str] = []
    for _ in range(8):  # a partitioned lease serves one partition per call
        leased += [j.id for j in q.lease(count=10)]
    assert sorted(leased) == [f"w{i}" for i in range(8)]


def test_a_wait_for_jobs_spread_over_every_partition_is_released_once_by_their_reports(
    make_queue: Callable[..., Queue], r: Any
) -> None:
    # On the cluster backend the partitions live on several primaries, and the waiting
    # job in yet another slot: each report is its own call to the waiting job's slot.
    members = make_queue("m", partitions=4)
    cb = make_queue("cb")
    ids = [f"m{i}" for i in range(16)]
    members.enqueue_many([NewJob(b"", job_id=i) for i in ids])
    refs = [(partition_name("m", partition_of(i, 4), 4), i) for i in ids]
    assert len({queue for queue, _ in refs}) == 4
    assert cb.flow_wait(NewJob(b"cb", job_id="w"), refs) == "ok"
    states = []
    for part in queue_parts(members):
        for job in part.lease(count=10):
            assert part.ack(job).name == "OK"
            states.append(cb.flow_done("w", [(part.name, job.id, "ok")]).state)
            states.append(cb.flow_done("w", [(part.name, job.id, "ok")]).state)  # a replay
    assert states.count("released") == 1 and states[-2:] == ["released", "gone"]
    assert [j.id for j in cb.lease()] == ["w"] and flow_keys(r) == []


# -- the task layer: chain, group, chord --------------------------------------------------


@pytest.fixture
def app(r: redis.Redis) -> Tasks:
    tasks = Tasks(client=r)

    @tasks.task(name="add", queue="math")
    def add(x: int, y: int = 0) -> int:
        return x + y

    @tasks.task(name="total", queue="sums")
    def total(xs: list[Any]) -> int:
        return sum(x for x in xs if isinstance(x, int))

    @tasks.task(name="describe", queue="sums")
    def describe(xs: list[Any]) -> list[str]:
        return [type(x).__name__ for x in xs]

    @tasks.task(name="boom", queue="math", max_attempts=1)
    def boom(x: int) -> int:
        raise ValueError(f"boom {x}")

    @tasks.task(name="const", queue="math")
    def const() -> str:
        return "c"

    @tasks.task(name="fanout", queue="math", keep_result=60)
    def fanout(n: int) -> str:
        run = current_job()
        run.spawn(*[add.s(i, i) for i in range(n)])
        run.then(total.s())
        return run.id

    @tasks.task(name="hold", queue="math")
    def hold() -> int:
        HOLD.wait(20)
        return 1

    RAN.clear()

    @tasks.task(name="record", queue="sums")
    def record(xs: list[Any]) -> None:
        RAN.append(xs)

    return tasks


#: What the task "record" was called with.
RAN: list[Any] = []
#: What the task "hold" waits for.
HOLD = threading.Event()


def task(app: Tasks, name: str) -> Any:
    return app.tasks[name]


@pytest.fixture
def worker(app: Tasks) -> Any:
    serving = Serving(app, concurrency=4, block_ms=50, backoff_base_ms=1, backoff_cap_ms=5)
    yield serving
    serving.stop()


def test_a_chain_passes_each_result_as_the_next_steps_first_argument(app: Tasks, worker: Any) -> None:
    add = task(app, "add")
    flow = chain(add.s(1, 2), add.s(10), add.s(y=100)).send()
    assert flow.result(timeout=20) == 113
    assert flow.status() == {"done": 3}
    assert (add.s(1, 1) | add.s(1) | add.s(1)).send().result(timeout=20) == 4


def test_a_chord_calls_its_callback_with_the_groups_results_in_order(app: Tasks, worker: Any) -> None:
    add, describe = task(app, "add"), task(app, "describe")
    flow = chord([add.s(i, i) for i in range(10)], task(app, "total").s()).send()
    assert flow.result(timeout=20) == sum(2 * i for i in range(10))
    assert chord([add.s(1), task(app, "const").s()], describe.s()).send().result(timeout=20) == ["int", "str"]


def test_groups_and_chains_nest(app: Tasks, worker: Any) -> None:
    add, total = task(app, "add"), task(app, "total")
    assert group([add.s(1, 1), chain(add.s(2, 2), add.s(1))]).send().result(timeout=20) == [2, 5]
    nested = (add.s(1, 1) | group([add.s(1), add.s(2), chain(add.s(3), add.s(4))]) | total.s()).send()
    assert nested.result(timeout=20) == 3 + 4 + 9
    assert chain(group([add.s(1), add.s(2, 2)]), total.s()).send().result(timeout=20) == 5  # the group's list


def test_si_ignores_the_result_before_it(app: Tasks, worker: Any) -> None:
    add, const = task(app, "add"), task(app, "const")
    assert chain(add.s(1, 2), const.si()).send().result(timeout=20) == "c"
    assert chain(add.s(1, 2), add.si(5, 5)).send().result(timeout=20) == 10


def test_a_failed_step_fails_what_waits_for_it_and_the_callback_never_runs(app: Tasks, worker: Any) -> None:
    flow = chord([task(app, "add").s(1, 1), task(app, "boom").s(3)], task(app, "record").s()).send()
    with pytest.raises(TaskDead, match="boom 3"):
        flow.result(timeout=20)
    # The callback may die before add(1, 1) has ended: 'fail' does not wait for it.
    wait_for(lambda: flow.status() == {"done": 1, "dead": 2}, 10, "add(1, 1) ending")
    assert RAN == []


def test_the_failure_passed_on_is_the_steps_that_failed_while_another_still_runs(app: Tasks, worker: Any) -> None:
    # 'fail' releases the callback at the first failure: the input read then has one
    # step dead and one still running, and the dead one is the cause to report.
    HOLD.clear()
    try:
        flow = chord([task(app, "hold").s(), task(app, "boom").s(3)], task(app, "record").s()).send()
        with pytest.raises(TaskDead, match="boom 3"):
            flow.result(timeout=20)
        assert RAN == []
    finally:
        HOLD.set()


def test_under_continue_the_callback_gets_the_failures_in_place(app: Tasks, worker: Any) -> None:
    flow = chord([task(app, "add").s(1, 1), task(app, "boom").s(3)], task(app, "describe").s(), on_failure="continue").send()
    assert flow.result(timeout=20) == ["int", "TaskDead"]


def test_a_chain_refuses_a_step_that_cannot_take_the_result_before_it(app: Tasks) -> None:
    add, const = task(app, "add"), task(app, "const")
    with pytest.raises(TypeError, match="first step"):
        chain(add.s(), add.s(2)).send()  # add(x, y=0) needs x: nothing gives the first step one
    with pytest.raises(TypeError, match="cannot take the result"):
        chain(add.s(1, 2), const.s()).send()
    with pytest.raises(TypeError):
        add.send_many([add.s()])
    with pytest.raises(InvalidArgument):
        chain(add.s(1), on_failure="ignore")
    assert app.queue("math").stats().enqueued == 0


def test_cancel_removes_the_steps_not_started_and_a_flow_check_forgets_their_waits(
    app: Tasks, r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_flows, "FLOW_CHECK_MS", 100)
    add = task(app, "add")
    flow = chain(add.s(1, 1), add.s(1), add.s(1)).send()  # no worker: nothing runs
    assert flow.status() == {"ready": 1, "waiting": 2}
    assert flow.cancel() == 3
    # Cancelled, not "done": a flow step keeps its result, a cancelled one has none.
    assert flow.status() == {"cancelled": 3} and flow_keys(r) != []
    view = flow.show()
    assert view.counts() == {"cancelled": 3} and "3 cancelled" in view.render()
    assert {s["describe"] for s in view.as_json()["steps"]} == {"cancelled (ended without its result)"}
    serving = Serving(app, block_ms=50, renew_ms=100, expire_ms=1_000)
    try:
        wait_for(lambda: flow_keys(r) == [], 10, "the flow checks forgetting the cancelled waits")
    finally:
        serving.stop()
    assert app.queue("math").stats().leased_total == 0  # nothing ran


def test_status_counts_a_running_first_attempt_as_attempt_1_and_a_step_done_long_ago_as_done(app: Tasks) -> None:
    add = task(app, "add")
    flow = chain(add.s(1, 1), add.s(1)).send()
    (leased,) = app.queue("math").lease()  # the first step, running (by hand: no worker)
    assert leased.id == f"{flow.id}.0" and leased.attempt == 1
    assert flow.status() == {"leased": 1, "waiting": 1}
    step = flow.show().steps[0]
    assert step.info.attempts == 0 and step.info.attempts_made == 1  # 0 ended, the first one running
    assert flow.show().as_json()["steps"][0]["describe"].startswith(f"running (attempt 1/{step.info.max_attempts}, ")
    app.queue("math").release([leased])
    # Acked by a worker that keeps no tombstone (as when keep_done_ms has passed): get
    # says 'unknown', but each step's result is kept, so the flow says 'done'.
    serving = Serving(app, block_ms=50, keep_done_ms=0)
    try:
        assert flow.result(timeout=20) == 3
    finally:
        serving.stop()
    assert {app.queue(q).get(j).state for q, j in flow.steps} == {"unknown"}
    assert flow.status() == {"done": 2} and flow.show().counts() == {"done": 2}


def test_a_report_lost_with_its_worker_is_made_by_a_flow_check(
    app: Tasks, monkeypatch: pytest.MonkeyPatch, r: Any
) -> None:
    # The worker acks each step but never reports it (as if it died right after its
    # ack): the waiting step is released by a flow check of its queue instead.
    from pyqueue.tasks.dispatch import Dispatcher

    monkeypatch.setattr(Dispatcher, "job_ended", lambda self, job, how: None)
    monkeypatch.setattr(task_flows, "FLOW_CHECK_MS", 200)
    serving = Serving(app, concurrency=2, block_ms=50, renew_ms=200, expire_ms=2_000)
    try:
        serving.worker.heartbeat.flows.check_ms = 200
        add = task(app, "add")
        flow = chord([add.s(i, 1) for i in range(3)], task(app, "total").s()).send()
        assert flow.result(timeout=20) == 6
        assert (add.s(1, 1) | add.s(1)).send().result(timeout=20) == 3
    finally:
        serving.stop()
    assert flow_keys(r) == []


def test_a_thousand_flows_leave_no_key_per_flow_and_their_records_go_in_time(
    app: Tasks, worker: Any, r: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1000 on redis-server; 200 on fakeredis and the cluster, where each costs more.
    count = 1000 if backend == "real" else 200
    add, total = task(app, "add"), task(app, "total")
    chord([add.s(0, 1)], total.s()).send().result(timeout=30)  # the queues' own keys exist: the baseline

    def keys() -> set[bytes]:  # a queue's wake key comes and goes with the workers' waits
        return {key for key in all_keys(r) if not key.endswith(b":wake")}

    baseline = keys()
    monkeypatch.setattr(task_flows, "FLOW_RECORD_S", 1)  # records kept 1 s, so the test sees them go
    flows = [chord([add.s(i, 1), add.s(i, 2)], total.s()).send() for i in range(count)]
    assert [f.result(timeout=120) for f in flows] == [2 * i + 3 for i in range(count)]
    assert flow_keys(r) == []
    assert keys() == baseline  # no key per flow: every key is a queue's own
    time.sleep(1.1)
    # Each record kept trims up to 11 expired ones.
    assert [chord([add.s(0, 1)], total.s()).send().result(timeout=30) for _ in range(count // 11 + 1)] == [1] * (count // 11 + 1)
    math = app.queue("math")
    kept = sum(r.hlen(part.spec.keys.flows) for part in queue_parts(math))
    assert 1 <= kept <= count // 11 + 2  # these and the first: the records of the flows above are gone
    assert keys() == baseline


def test_send_middleware_sees_every_step_of_a_flow_and_a_refusal_sends_none_of_it(app: Tasks, r: Any) -> None:
    seen: list[tuple[str, str]] = []
    ran: list[tuple[str, Any]] = []

    class Tenant(Middleware):
        def around_send(self, message: Sending) -> Generator[None, HookOutcome[Any], None]:
            if message.args == [13]:
                raise PermissionError("13 is refused")
            message.meta["tenant"] = "acme"
            outcome = yield
            if outcome.value is not None:  # None: the flow was refused (by the hook of another step)
                seen.append((message.task_name, outcome.value.id))

        def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[Any], None]:
            ran.append((run.id, run.meta.get("tenant")))
            yield

    app.middleware(Tenant())
    add, total = task(app, "add"), task(app, "total")
    before = all_keys(r)
    with pytest.raises(MiddlewareError, match="13 is refused"):
        chord([add.s(1, 1), add.s(13)], total.s()).send()
    assert all_keys(r) == before and seen == []  # not even its record
    flow = chord([add.s(1, 1), add.s(2)], total.s()).send()
    assert seen == [("total", f"{flow.id}.2"), ("add", f"{flow.id}.1"), ("add", f"{flow.id}.0")]  # resumed last first
    serving = Serving(app, concurrency=2, block_ms=50)
    try:
        assert flow.result(timeout=20) == 2 + 2
    finally:
        serving.stop()
    assert sorted(ran) == [(f"{flow.id}.{n}", "acme") for n in range(3)]


def test_a_flow_is_shown_by_its_id_with_its_tree_and_each_steps_state(app: Tasks, r: Any) -> None:
    add, total = task(app, "add"), task(app, "total")
    flow = (add.s(1, 1) | group([add.s(1), chain(add.s(2), add.s(3))]) | total.s()).send()
    assert flow.queue == "math"
    view = flow.show()
    assert view.tree == {"chain": [0, {"group": [1, {"chain": [2, 3]}]}, 4]}
    assert [s.task for s in view.steps] == ["add", "add", "add", "add", "total"]
    assert [s.job_id for s in view.steps] == [f"{flow.id}.{n}" for n in range(5)]
    assert view.counts() == {"ready": 1, "waiting": 4}
    text = view.render()
    assert text.splitlines()[0].startswith(f"flow {flow.id} (record in math): 5 steps: 1 ready, 4 waiting")
    assert "├─ group" in text and "│  └─ chain" in text and "└─" in text.splitlines()[-1]
    serving = Serving(app, concurrency=2, block_ms=50)
    try:
        loaded = task_flows.FlowHandle.load(app, "math", flow.id)  # as another process would
        assert loaded.result(timeout=20) == (2 + 1) + (2 + 2 + 3)  # total([add(2, 1), add(add(2, 2), 3)])
    finally:
        serving.stop()
    assert flow.show().counts() == {"done": 5}
    with pytest.raises(LookupError, match="no record of flow"):
        task_flows.FlowHandle.load(app, "sums", flow.id)  # its record is in its first step's queue


def test_a_running_task_spawns_children_and_then_a_callback_gets_their_results(app: Tasks, worker: Any) -> None:
    parent = task(app, "fanout").send(4)
    assert parent.result(timeout=20) == parent.id
    callback = f"{children_flow_id('math', parent.id)}.4"  # after the 4 children
    found = app.queue("sums").wait_result(callback, 20_000)
    assert (found.state, found.value) == ("ok", 0 + 2 + 4 + 6)


def test_a_spawning_run_retried_sends_its_children_once(app: Tasks, r: Any) -> None:
    from pyqueue.protocol.models import Job
    from pyqueue.tasks.flows import send_children
    from pyqueue.tasks.run import TaskRun

    add, total = task(app, "add"), task(app, "total")
    job = Job("p1", "math", b"", 1, 1, 5, 0, "o|c|1|1|p1")
    for _ in range(2):  # the run, and its rerun after a kill before its ack
        run = TaskRun(job, "fanout", None, None, {})
        run.spawn(add.s(1, 1), add.s(2, 2))
        run.then(total.s())
        send_children(app, run)
    assert app.queue("math").stats().enqueued == 2 and app.queue("sums").stats().enqueued == 1
