"""Durable steps of tasks (pyqueue.tasks.steps): ``current_job().step`` runs a function
once across every run of its job, ``.sleep`` and ``.wait_signal`` leave the worker and
use no attempt, a signal reaches its wait whenever it is sent, and a commit under a lost
lease stops the run. With a real worker in a thread, on fakeredis and a real
redis-server (both drivers through their worker kinds)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
from conftest import all_keys
from tasks_support import Serving, wait_for

from pyqueue import InvalidArgument, LeaseLost, SignalTimeout
from pyqueue.tasks import Middleware, Tasks, current_job
from pyqueue.tasks.steps import SIGNAL_TIMED_OUT

#: How long a test waits for a worker to get somewhere (a bound, not a measure).
WAIT_S = 20


def test_committed_steps_run_once_across_retries_and_the_result_is_right(r: Any) -> None:
    tasks = Tasks(client=r)
    calls: Counter[str] = Counter()
    attempts: list[int] = []

    def charge(cents: int) -> dict[str, Any]:
        calls["charge"] += 1
        return {"charge_id": f"ch_{cents}", "cents": cents}

    def ship(charge: dict[str, Any]) -> str:
        calls["ship"] += 1
        return "track-" + str(charge["charge_id"])

    @tasks.task(name="order", max_attempts=3, backoff=0, keep_result=60)
    def order(cents: int) -> list[Any]:
        job = current_job()
        attempts.append(job.attempt)
        paid = job.step("charge", charge, cents)
        if job.attempt == 1:
            raise RuntimeError("the warehouse is down")  # after the charge: retried, not charged twice
        tracking = job.step("ship", ship, paid)
        return [paid, tracking]

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = order.send(500)
        assert sent.result(timeout=WAIT_S) == [{"charge_id": "ch_500", "cents": 500}, "track-ch_500"]
    finally:
        serving.stop()
    assert attempts == [1, 2] and calls == {"charge": 1, "ship": 1}
    assert sent.steps().results == {}  # deleted with the job


def test_a_sleep_leaves_the_worker_uses_no_attempt_and_the_run_goes_on_after_it(r: Any) -> None:
    tasks = Tasks(client=r)
    runs: list[tuple[int, bool]] = []
    before = Counter[str]()

    @tasks.task(name="nap", max_attempts=1, keep_result=60)
    def nap() -> str:
        job = current_job()
        job.step("before", lambda: before.update(["x"]))
        runs.append((job.attempt, True))
        job.sleep("cool_down", 0.3)
        return "woke"

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = nap.send()
        wait_for(lambda: sent.steps().sleeps, what="the sleep")
        assert sent.state() in ("scheduled", "ready", "leased", "done")
        assert sent.result(timeout=WAIT_S) == "woke"
        stats = tasks.queue("default").stats()
        assert (stats.parked, stats.nacked, stats.dead_total) == (1, 0, 0)
    finally:
        serving.stop()
    # Two runs, both attempt 1 (max_attempts=1 yet not dead): the sleep used no attempt.
    assert runs == [(1, True), (1, True)] and before["x"] == 1


def test_a_wait_parks_the_job_until_its_signal_and_gets_its_data(r: Any) -> None:
    tasks = Tasks(client=r)

    @tasks.task(name="approval", keep_result=60)
    def approval(doc: str) -> list[Any]:
        answer = current_job().wait_signal("approved", timeout=3600)
        return [doc, answer]

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = approval.send("contract-7")
        wait_for(lambda: sent.state() == "waiting", timeout=WAIT_S, what="the wait")
        assert tasks.queue("default").stats().waiting == 1
        assert set(sent.steps().waits) == {"approved"}
        assert approval.signal(sent.id, "approved", {"by": "ops"}).status == "woke"
        assert sent.result(timeout=WAIT_S) == ["contract-7", {"by": "ops"}]
        assert approval.signal(sent.id, "approved", "again").status == "unknown"  # the job has ended
    finally:
        serving.stop()


def test_a_signal_sent_before_the_wait_is_kept_for_it(r: Any) -> None:
    tasks = Tasks(client=r)

    @tasks.task(name="early", keep_result=60)
    def early() -> Any:
        job = current_job()
        job.sleep("first", 0.3)
        return job.wait_signal("go", timeout=3600)

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = early.send()
        wait_for(lambda: sent.steps().sleeps, timeout=WAIT_S, what="the sleep")
        assert sent.signal("go", [1, 2]).status == "kept"
        assert sent.signal("go", [3]).status == "duplicate"  # the first is kept
        assert sent.result(timeout=WAIT_S) == [1, 2]
    finally:
        serving.stop()


def test_a_wait_that_times_out_raises_signal_timeout_the_task_may_catch(r: Any) -> None:
    tasks = Tasks(client=r)
    seen: list[str] = []

    @tasks.task(name="patient", keep_result=60)
    def patient() -> str:
        job = current_job()
        try:
            job.wait_signal("reply", timeout=0.2)
        except SignalTimeout:
            seen.append("timeout")
            job.sleep("after", 0.1)  # a later run meets the same outcome again
            return "gave up"
        return "answered"

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = patient.send()
        assert sent.result(timeout=WAIT_S) == "gave up"
    finally:
        serving.stop()
    assert seen == ["timeout", "timeout"]


def test_an_async_task_uses_astep_asleep_and_await_signal(r: Any) -> None:
    tasks = Tasks(client=r)
    calls: Counter[str] = Counter()

    async def fetch(n: int) -> int:
        calls["fetch"] += 1
        await asyncio.sleep(0)
        return n * 2

    @tasks.task(name="aflow", keep_result=60)
    async def aflow(n: int) -> list[Any]:
        job = current_job()
        doubled = await job.astep("fetch", fetch, n)
        await job.asleep("pause", 0.2)
        answer = await job.await_signal("ok", timeout=3600)
        return [doubled, answer]

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        assert serving.is_async
        sent = aflow.send(21)
        wait_for(lambda: sent.state() == "waiting", timeout=WAIT_S, what="the async wait")
        assert sent.signal("ok", "yes").status == "woke"
        result: Any = sent.result(timeout=WAIT_S)
        assert result == [42, "yes"]
    finally:
        serving.stop()
    assert calls["fetch"] == 1


def test_a_step_under_a_lost_lease_commits_nothing_and_the_run_is_not_acked(r: Any) -> None:
    tasks = Tasks(client=r)
    started, go_on = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    @tasks.task(name="slowpoke", keep_result=60)
    def slowpoke() -> str:
        job = current_job()
        started.set()
        go_on.wait(WAIT_S)
        try:
            job.step("late", lambda: "never kept")
        except LeaseLost as exc:
            errors.append(exc)
            raise
        return "done"

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = slowpoke.send()
        assert started.wait(WAIT_S)
        assert tasks.queue("default").cancel(sent.id).state == "leased"
        go_on.set()
        wait_for(lambda: errors, timeout=WAIT_S, what="the refused commit")
        assert sent.steps().results == {}
        stats = tasks.queue("default").stats()
        assert (stats.acked, stats.nacked, stats.cancelled) == (0, 0, 1)
    finally:
        go_on.set()
        serving.stop()


def test_a_name_used_twice_in_one_run_is_refused(r: Any) -> None:
    tasks = Tasks(client=r)

    @tasks.task(name="twice", max_attempts=1)
    def twice() -> None:
        job = current_job()
        job.step("same", lambda: 1)
        job.step("same", lambda: 2)

    with tasks.testing(raise_errors=True) as testing:
        twice.send()
        with pytest.raises(InvalidArgument, match="second durable call named 'same'"):
            testing.drain()


def test_task_testing_drains_sleeps_and_timeouts_by_moving_the_clock(r: Any) -> None:
    tasks = Tasks(client=r)
    middleware_endings: list[str] = []

    class Endings(Middleware):
        def around_run(self, run: Any) -> Any:
            outcome = yield
            middleware_endings.append(outcome.ending)

    tasks.middleware(Endings())

    @tasks.task(name="week", keep_result=86_400 * 30)
    def week() -> Any:
        job = current_job()
        job.sleep("a day", 86_400)
        try:
            return job.wait_signal("reply", timeout=7 * 86_400)
        except SignalTimeout:
            return "no reply"

    with tasks.testing() as testing:
        sent = week.send()
        assert testing.drain() == 3  # run, after the day, after the week's timeout
        assert sent.result(timeout=0) == "no reply"
        assert sent.steps().results == {}
    assert middleware_endings == ["parked", "parked", "ok"]


def test_steps_shows_what_a_job_kept_decoded(r: Any) -> None:
    tasks = Tasks(client=r)

    @tasks.task(name="shown", max_attempts=1)
    def shown() -> None:
        job = current_job()
        job.step("made", lambda: {"id": 7})
        try:
            job.wait_signal("never", timeout=0.05)
        except SignalTimeout:
            pass
        job.wait_signal("later", timeout=3600)

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = shown.send()
        wait_for(lambda: "later" in sent.steps().waits, timeout=WAIT_S, what="the second wait")
        steps = sent.steps()
        assert steps.results["made"] == {"id": 7} and steps.results["never"] is SIGNAL_TIMED_OUT
        assert list(steps.waits) == ["later"] and steps.signals == {}
        info = tasks.queue("default").get(sent.id)
        assert info.state == "waiting"
        assert tasks.queue("default").cancel(sent.id).state == "scheduled"
        assert sent.steps().results == {}
        assert not [k for k in all_keys(r) if k.endswith((b":steps", b":waiting"))]
    finally:
        serving.stop()


def test_a_flow_step_that_sleeps_and_waits_passes_its_result_on_when_it_ends(r: Any) -> None:
    from pyqueue import chain

    tasks = Tasks(client=r)

    @tasks.task(name="slow_first")
    def slow_first(n: int) -> int:
        job = current_job()
        n = job.step("grow", lambda: n + 1)
        job.sleep("breath", 0.2)
        return n + int(job.wait_signal("more", timeout=3600))

    @tasks.task(name="then_double")
    def then_double(n: int) -> int:
        return n * 2

    serving = Serving(tasks, concurrency=2, block_ms=50)
    try:
        flow = chain(slow_first.s(10), then_double.s()).send()  # type: ignore[call-arg]  # n: the first step's result
        first_id = flow.steps[0][1]
        wait_for(lambda: tasks.queue("default").get(first_id).state == "waiting", timeout=WAIT_S, what="the wait")
        assert slow_first.signal(first_id, "more", 5).status == "woke"
        assert flow.result(timeout=WAIT_S) == (10 + 1 + 5) * 2
    finally:
        serving.stop()
