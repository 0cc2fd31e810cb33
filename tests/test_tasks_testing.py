"""The testing helper (``tasks.testing()``, the ``pyqueue_testing`` fixture): drain runs
jobs through the real scripts and dispatch, jumps the clock through scheduled ones,
re-raises a task's error (or collects them), enforces time limits, and isolates the
test's jobs from the server the Tasks object talks to otherwise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from pyqueue import Queue
from pyqueue.tasks import Backoff, TaskDead, Tasks, TimeLimitExceeded, current_job
from pyqueue.tasks.testing import TaskTesting


def test_drain_runs_ready_jobs_and_jumps_the_clock_through_scheduled_ones() -> None:
    tasks = Tasks()  # never connects: the block gives it a server of its own
    ran: list[tuple[str, int]] = []

    @tasks.task(name="hello", keep_result=86_400)  # the clock moves hours
    def hello(who: str) -> str:
        ran.append((who, current_job().attempt))
        return f"hello {who}"

    @tasks.task(name="flaky", backoff=3600, max_attempts=3)
    def flaky() -> None:
        ran.append(("flaky", current_job().attempt))
        if current_job().attempt < 3:
            raise ConnectionError("later")

    began = time.monotonic()
    with tasks.testing(raise_errors=False) as t:
        start_ms = t.now_ms()
        now = hello.send("now")
        later = hello.send_in(3600, "in an hour")
        flaky.send()
        assert t.drain() == 5  # now, flaky x3 (an hour apart), in an hour
        assert t.now_ms() - start_ms >= 2 * 3_600_000  # the server clock moved, not the test's
        assert now.result(timeout=1) == "hello now" and later.result(timeout=1) == "hello in an hour"
        assert t.stats().acked == 3 and t.stats().scheduled == 0
        assert [type(e) for e in t.errors] == [ConnectionError, ConnectionError]
    assert sorted(ran) == [("flaky", 1), ("flaky", 2), ("flaky", 3), ("in an hour", 1), ("now", 1)]
    assert time.monotonic() - began < 30  # (it did not wait the hours)


def test_drain_without_advance_leaves_scheduled_jobs_for_later() -> None:
    tasks = Tasks()
    ran: list[int] = []

    @tasks.task(name="t")
    def t_(n: int) -> None:
        ran.append(n)

    with tasks.testing() as t:
        t_.send(1)
        t_.send_in(60, 2)
        assert t.drain(advance=False) == 1 and ran == [1]
        assert t.stats().scheduled == 1
        t.advance(59)
        assert t.drain(advance=False) == 0
        t.advance(1)
        assert t.drain(advance=False) == 1 and ran == [1, 2]
        with pytest.raises(ValueError):
            t.advance(-1)


def test_a_task_that_sends_another_task_both_run() -> None:
    tasks = Tasks()
    ran: list[str] = []

    @tasks.task(name="signup")
    def signup(email: str) -> None:
        ran.append(f"signup {email}")
        welcome.send(email)
        reminder.send_in(86_400, email)

    @tasks.task(name="welcome", queue="emails")
    def welcome(email: str) -> None:
        ran.append(f"welcome {email}")

    @tasks.task(name="reminder", queue="emails")
    async def reminder(email: str) -> None:
        await asyncio.sleep(0)
        ran.append(f"reminder {email}")

    with tasks.testing() as t:
        signup.send("a@example.com")
        assert t.drain() == 3
    assert ran == ["signup a@example.com", "welcome a@example.com", "reminder a@example.com"]


def test_drain_re_raises_the_first_error_of_a_planted_bug() -> None:
    tasks = Tasks()

    @tasks.task(name="price", max_attempts=3)
    def price(item: dict[str, Any]) -> int:
        return int(item["cents"])  # the bug: the producer sends "price_cents"

    with tasks.testing() as t:
        handle = price.send({"price_cents": 100})
        with pytest.raises(KeyError, match="cents"):
            t.drain()
        assert [type(e) for e in t.errors] == [KeyError]
        # As in a worker, the failure was nacked before drain raised: the job waits for its retry.
        info = tasks.queue("default").get(handle.id)
        assert info.state == "scheduled" and info.attempts == 1


def test_with_raise_errors_false_errors_are_collected_and_retries_go_on_until_dead() -> None:
    tasks = Tasks()
    calls: list[int] = []

    @tasks.task(name="broken", max_attempts=3, backoff=Backoff.exponential(base=60, cap=600))
    def broken() -> None:
        calls.append(current_job().attempt)
        raise KeyError("missing")

    with tasks.testing(raise_errors=False) as t:
        handle = broken.send()
        assert t.drain() == 3
        assert calls == [1, 2, 3]
        assert [type(e) for e in t.errors] == [KeyError, KeyError, KeyError]
        with pytest.raises(TaskDead, match="KeyError: 'missing'"):
            handle.result(timeout=1)
        assert t.stats().dead == 1
        # raise_errors per drain overrides the helper's
        broken.send()
        with pytest.raises(KeyError):
            t.drain(raise_errors=True)


def test_the_pytest_fixture(pyqueue_testing: Callable[..., TaskTesting]) -> None:
    tasks = Tasks()
    seen: list[int] = []

    @tasks.task(name="fx")
    def fx(n: int) -> None:
        seen.append(n)

    t = pyqueue_testing(tasks, raise_errors=False)
    assert isinstance(t, TaskTesting) and not t.raise_errors
    fx.send(1)
    assert t.drain() == 1 and seen == [1]


@pytest.fixture
def after_teardown() -> Iterator[list[Callable[[], None]]]:
    """Checks a test registers to run after every fixture it asked for later was torn
    down (this one is set up first, so torn down last)."""
    checks: list[Callable[[], None]] = []
    yield checks
    for check in checks:
        check()


def test_the_pytest_fixture_restores_the_connection_at_teardown(
    after_teardown: list[Callable[[], None]], r: redis.Redis, pyqueue_testing: Callable[..., TaskTesting]
) -> None:
    tasks = Tasks(client=r)

    @tasks.task(name="fx")
    def fx() -> None:
        pass

    t = pyqueue_testing(tasks)
    fx.send()
    assert t.stats().ready == 1

    def restored() -> None:
        assert tasks.redis is r
        assert Queue("default", r).stats().enqueued == 0  # the fixture's job never reached it

    after_teardown.append(restored)


def test_isolation_from_the_server_the_tasks_talk_to(r: redis.Redis) -> None:
    tasks = Tasks(client=r)
    ran: list[str] = []

    @tasks.task(name="iso")
    def iso(where: str) -> None:
        ran.append(where)

    outside = iso.send("outside")
    with tasks.testing() as t:
        assert tasks.redis is not r
        assert t.stats().enqueued == 0
        assert tasks.queue("default").get(outside.id).state == "unknown"
        inside = iso.send("inside")
        assert t.drain() == 1
    assert ran == ["inside"]
    assert tasks.redis is r  # talking to its own server again
    q = Queue("default", r)
    assert q.get(outside.id).state == "ready" and q.get(inside.id).state == "unknown"
    assert q.stats().enqueued == 1
    iso.send("after")
    assert q.stats().enqueued == 2
    # A Tasks object not yet connected is left unconnected (it connects on first use).
    lazy = Tasks()
    with lazy.testing():
        pass
    assert lazy.connection._client is None


def test_async_tasks_run_in_drain_with_current_job() -> None:
    tasks = Tasks()
    seen: list[tuple[str, int, bool]] = []

    @tasks.task(name="a", time_limit=60, keep_result=60)
    async def a(n: int) -> int:
        await asyncio.sleep(0.01)
        run = current_job()
        seen.append((run.task, run.attempt, run.deadline is not None))
        return n * 2

    with tasks.testing() as t:
        handles = [a.send(n) for n in range(3)]
        assert t.drain() == 3
        assert [h.result(timeout=1) for h in handles] == [0, 2, 4]
    assert seen == [("a", 1, True)] * 3


def test_time_limits_are_enforced_in_drain() -> None:
    tasks = Tasks()
    cleaned: list[str] = []

    @tasks.task(name="spin", time_limit=0.2, max_attempts=1)
    def spin() -> None:
        try:
            while True:
                pass
        except TimeLimitExceeded:
            cleaned.append("sync")
            raise

    @tasks.task(name="await_forever", time_limit=0.2, max_attempts=2, backoff=600)
    async def await_forever() -> None:
        try:
            while True:
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            cleaned.append("async")
            raise

    with tasks.testing() as t:
        stuck = spin.send()
        with pytest.raises(TimeLimitExceeded):
            t.drain()
        info = tasks.queue("default").get(stuck.id)
        assert info.state == "dead" and "TimeLimitExceeded" in info.error
        waiting = await_forever.send()
        assert t.drain(raise_errors=False) == 2  # the retry 10 minutes later is run too
        info = tasks.queue("default").get(waiting.id)
        assert info.state == "dead" and "TimeLimitExceeded" in info.error
    assert cleaned == ["sync", "async", "async"]


def test_max_age_with_the_moving_clock() -> None:
    tasks = Tasks()
    ran: list[int] = []

    @tasks.task(name="fresh_only", max_age=5)
    def fresh_only(n: int) -> None:
        ran.append(n)

    with tasks.testing() as t:
        old = fresh_only.send(1)
        t.advance(10)
        young = fresh_only.send(2)
        t.advance(1)
        with pytest.raises(Exception, match="max_age exceeded"):
            t.drain()
        assert t.drain() == 1
        assert ran == [2]
        error = tasks.queue("default").get(old.id).error
        assert error.startswith("max_age exceeded") and tasks.queue("default").get(young.id).state == "done"


def test_a_task_that_keeps_sending_itself_stops_at_max_jobs() -> None:
    tasks = Tasks()

    @tasks.task(name="forever")
    def forever(n: int) -> None:
        forever.send(n + 1)

    with tasks.testing(max_jobs=20) as t:
        forever.send(0)
        with pytest.raises(RuntimeError, match="20 jobs"):
            t.drain()


def test_drain_does_not_take_a_retry_the_task_asked_for_as_an_error_but_an_unknown_task_is_one() -> None:
    from pyqueue import Retry
    from pyqueue.tasks.run import Undeliverable

    tasks = Tasks()
    polls: list[int] = []

    @tasks.task(name="poll", max_attempts=5)
    def poll() -> str:
        polls.append(1)
        if len(polls) < 3:
            raise Retry(delay=30)  # not ready yet: asked for, not a failure
        return "ready"

    with tasks.testing() as t:
        poll.send()
        assert t.drain() == 3  # two asked-for retries, the clock moved through their delays
        assert t.errors == []
        other = Tasks()

        @other.task(name="not.here")
        def not_here() -> None: ...

        other.bind(t.client)
        not_here.send()
        with pytest.raises(Undeliverable, match="unknown task 'not.here'"):
            t.drain()
