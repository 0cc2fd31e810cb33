"""Task middleware (pyqueue.tasks.middleware) on both backends: the order of the hooks
on both sides, what they see, meta added by a send hook reaching the run, a send
refused by a hook (nothing enqueued, through every send verb), a run hook's error
failing the job by its policy (retried, dead at max_attempts, never acked; the error
and the log name the middleware), Retry and Fail raised by a hook, the endings a hook
sees, async and batch tasks, the testing helper, worker hooks, and no chain at all
when no middleware is registered."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Generator
from typing import Any

import pytest
import redis
from tasks_support import burst, job_state

from pyqueue import InvalidArgument
from pyqueue.tasks import (
    Fail,
    HookOutcome,
    Middleware,
    MiddlewareError,
    Retry,
    Sending,
    TaskRun,
    Tasks,
    current_batch,
    current_job,
)
from pyqueue.tasks.middleware import Chain

FAST = {"backoff_base_ms": 1, "backoff_cap_ms": 5}


@pytest.fixture
def tasks(r: redis.Redis) -> Tasks:
    return Tasks(client=r)


class Recorder(Middleware):
    """Logs what each of its hooks sees, in one list shared by several recorders."""

    def __init__(self, name: str, log: list[Any]) -> None:
        self.name, self.log = name, log

    def around_send(self, message: Sending) -> Generator[None, HookOutcome[Any], None]:
        self.log.append((self.name, "send", message.task_name, message.args, message.kwargs, message.queue))
        message.meta[self.name] = f"{self.name}-was-here"
        outcome = yield
        self.log.append((self.name, "sent", outcome.value.id if outcome.value else None, outcome.error, outcome.ending))

    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        self.log.append((self.name, "run", run.task, run.attempt, run.meta.get(self.name)))
        outcome = yield
        self.log.append((self.name, "ran", outcome.value, type(outcome.error).__name__, outcome.ending))


def dead_error(tasks: Tasks, job_id: str, queue: str = "default") -> str:
    info = job_state(tasks, queue, job_id)
    assert info.state == "dead", f"job {job_id} is {info.state}, not dead"
    return info.error


# -- order and what the hooks see ------------------------------------------------------


def test_first_registered_is_outermost_on_both_sides_and_meta_reaches_the_run(tasks: Tasks) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("outer", log))
    tasks.middleware(Recorder("inner", log))
    seen_meta: list[Any] = []

    @tasks.task(name="add", keep_result=60)
    def add(a: int, *, b: int) -> int:
        seen_meta.append(dict(current_job().meta))
        log.append("function")
        return a + b

    sent = add.send(1, b=2)
    assert log == [
        ("outer", "send", "add", [1], {"b": 2}, "default"),
        ("inner", "send", "add", [1], {"b": 2}, "default"),
        ("inner", "sent", sent.id, None, "sent"),
        ("outer", "sent", sent.id, None, "sent"),
    ]
    log.clear()
    assert burst(tasks, **FAST) == 0
    assert sent.result(timeout=5) == 3
    assert log == [
        ("outer", "run", "add", 1, "outer-was-here"),
        ("inner", "run", "add", 1, "inner-was-here"),
        "function",
        ("inner", "ran", 3, "NoneType", "ok"),
        ("outer", "ran", 3, "NoneType", "ok"),
    ]
    # The keys the hooks added travel in the envelope's meta, beside the layer's own.
    assert seen_meta[0]["outer"] == "outer-was-here" and seen_meta[0]["inner"] == "inner-was-here"
    assert isinstance(seen_meta[0]["enqueued_ms"], int)


def test_every_send_verb_passes_the_send_hooks(tasks: Tasks) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("m", log))

    @tasks.task(name="echo")
    def echo(x: int) -> None:
        pass

    echo.send(1)
    echo.send_in(5, 2)
    echo.options(queue="other").send(3)
    sent_many = echo.send_many([(4,), echo.s(5)])

    async def asends() -> tuple[Any, Any]:
        sent = await echo.asend(6), await echo.options(priority=2).asend_in(1, 7)
        await tasks.aclose()
        return sent

    asent, asent_in = asyncio.run(asends())
    sends = [entry for entry in log if entry[1] == "send"]
    assert [(s[3], s[5]) for s in sends] == [([1], "default"), ([2], "default"), ([3], "other"), ([4], "default"),
                                             ([5], "default"), ([6], "default"), ([7], "default")]
    sent_ids = [entry[2] for entry in log if entry[1] == "sent"]
    assert {s.id for s in sent_many} | {asent.id, asent_in.id} <= set(sent_ids)
    assert len(sent_ids) == 7
    # Each job carries the hook's meta key.
    for sent in [*sent_many, asent]:
        payload = tasks.queue("default").get(sent.id, with_payload=True).payload
        assert payload is not None and b'"m":"m-was-here"' in payload


# -- refusing a send -------------------------------------------------------------------


class Refuse(Middleware):
    def __init__(self, when: Any = lambda message: True) -> None:
        self.when = when

    def around_send(self, message: Sending) -> None:
        if self.when(message):
            raise PermissionError(f"no tenant for {message.task_name}")


def test_a_send_hook_that_raises_refuses_the_send_and_nothing_is_enqueued(tasks: Tasks) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("outer", log))
    tasks.middleware(Refuse(lambda message: message.args == [2]))

    @tasks.task(name="job")
    def job(x: int) -> None:
        pass

    refusals = [
        lambda: job.send(2),
        lambda: job.send_in(1, 2),
        lambda: job.options(queue="other").send(2),
        lambda: job.send_many([(1,), (2,), (3,)]),  # one refused: none of them is sent
        lambda: asyncio.run(job.asend(2)),  # refused before the asyncio client is used
    ]
    for refuse in refusals:
        with pytest.raises(MiddlewareError, match=r"middleware test_tasks_middleware\.Refuse failed in around_send: "
                                                  r"PermissionError: no tenant for job") as caught:
            refuse()
        assert isinstance(caught.value.__cause__, PermissionError)
    assert tasks.queue("default").stats().enqueued == 0 and tasks.queue("other").stats().enqueued == 0
    # The hook outside the refusing one saw each refusal as its outcome.
    refused = [entry for entry in log if entry[1] == "sent"]
    assert refused and all(entry[2] is None and isinstance(entry[3], MiddlewareError) and entry[4] == "refused"
                           for entry in refused)
    job.send(1)  # another call goes through
    assert tasks.queue("default").stats().enqueued == 1


def test_a_send_hook_may_not_write_the_layers_meta_keys_or_values_that_do_not_travel(tasks: Tasks) -> None:
    class Writes(Middleware):
        def __init__(self, key: str, value: Any) -> None:
            self.key, self.value = key, value

        def around_send(self, message: Sending) -> None:
            message.meta[self.key] = self.value

    @tasks.task(name="job")
    def job() -> None:
        pass

    bad = Writes("enqueued_ms", 1)
    tasks.middleware(bad)
    with pytest.raises(InvalidArgument, match=r"middleware set the envelope's meta \['enqueued_ms'\]"):
        job.send()
    bad.key, bad.value = "trace", object()
    with pytest.raises(InvalidArgument, match="meta set by middleware"):
        job.send()
    assert tasks.queue("default").stats().enqueued == 0


def test_a_send_hook_that_raises_after_the_send_says_the_job_was_enqueued(tasks: Tasks) -> None:
    class After(Middleware):
        def around_send(self, message: Sending) -> Generator[None, HookOutcome[Any], None]:
            yield
            raise RuntimeError("audit log down")

    tasks.middleware(After())

    @tasks.task(name="job")
    def job() -> None:
        pass

    with pytest.raises(MiddlewareError, match=r"After failed in around_send: RuntimeError: audit log down "
                                              r"\(after the send: job \w+ was enqueued all the same\)"):
        job.send()
    assert tasks.queue("default").stats().enqueued == 1


# -- a run hook's error: the job follows its policy, never acked -------------------------


class Broken(Middleware):
    """A run hook that raises before or after ``yield``."""

    def __init__(self, where: str) -> None:
        self.where = where

    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        if self.where == "before":
            raise ConnectionError("tracing backend down")
        yield
        raise ConnectionError("tracing backend down")


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_run_hooks_error_retries_the_job_then_kills_it_naming_the_middleware(
    tasks: Tasks, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("outer", log))
    tasks.middleware(Broken(where))
    runs: list[int] = []

    @tasks.task(name="work", max_attempts=3, retry_on=ValueError)  # retry_on is the task's: not the hook's
    def work() -> str:
        runs.append(current_job().attempt)
        return "done"

    sent = work.send()
    with caplog.at_level(logging.WARNING, logger="pyqueue.tasks"):
        burst(tasks, **FAST)
    error = dead_error(tasks, sent.id)
    assert error.startswith("pyqueue.tasks.middleware.MiddlewareError: middleware test_tasks_middleware.Broken "
                            "failed in around_run: ConnectionError: tracing backend down"), error
    stats = tasks.queue("default").stats()
    assert (stats.acked, stats.nacked, stats.dead) == (0, 3, 1)  # never acked, though the task returned
    # Before yield the function is not called; after, it ran each attempt.
    assert runs == ([] if where == "before" else [1, 2, 3])
    assert [r.getMessage() for r in caplog.records if "test_tasks_middleware.Broken failed in around_run" in
            r.getMessage()] != []
    # The hook outside saw the failure, and how it ends the job: retried twice, then dead.
    ran = [entry for entry in log if entry[1] == "ran"]
    assert [(entry[3], entry[4]) for entry in ran] == [("MiddlewareError", "retry")] * 2 + [("MiddlewareError", "dead")]


def test_a_run_hook_may_end_the_job_with_retry_or_fail(tasks: Tasks) -> None:
    class Gate(Middleware):
        def around_run(self, run: TaskRun) -> None:
            if run.attempt == 1:
                raise Retry(delay=0, reason="tenant over quota")
            raise Fail("tenant closed")

    tasks.middleware(Gate())
    runs: list[int] = []

    @tasks.task(name="work", max_attempts=5)
    def work() -> None:
        runs.append(1)

    sent = work.send()
    burst(tasks, **FAST)
    assert runs == []
    error = dead_error(tasks, sent.id)
    assert error.startswith("middleware test_tasks_middleware.") and error.endswith(
        ".Gate ended the job in around_run: tenant closed"), error
    assert tasks.queue("default").stats().nacked == 2  # the Retry, then the Fail: dead at attempt 2 of 5


def test_the_ending_a_run_hook_sees(tasks: Tasks) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("m", log))

    @tasks.task(name="flaky", max_attempts=2)
    def flaky() -> None:
        raise ValueError("nope")

    @tasks.task(name="fails", fail_on=KeyError)
    def fails() -> None:
        raise KeyError("gone")

    @tasks.task(name="unstorable", keep_result=60)
    def unstorable() -> object:
        return object()

    flaky.send()
    fails.send()
    unstorable.send()
    burst(tasks, **FAST)
    ran = sorted((entry[3], entry[4]) for entry in log if entry[1] == "ran")
    assert ran == sorted([("ValueError", "retry"), ("ValueError", "dead"), ("KeyError", "dead"), ("Fail", "dead")])


# -- async, batch, testing, worker hooks -------------------------------------------------

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


class SetsContext(Middleware):
    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        token = request_id.set(f"req-{run.id}")
        try:
            yield
        finally:
            request_id.reset(token)


def test_an_async_task_runs_inside_the_hooks_with_their_context(tasks: Tasks) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("m", log))
    tasks.middleware(SetsContext())

    @tasks.task(name="aio", keep_result=60)
    async def aio() -> str:
        await asyncio.sleep(0)
        return request_id.get()

    sent = aio.send()
    burst(tasks, **FAST)
    assert sent.result(timeout=5) == f"req-{sent.id}"
    assert [entry[1:] for entry in log if entry[1] in ("run", "ran")] == [
        ("run", "aio", 1, "m-was-here"), ("ran", f"req-{sent.id}", "NoneType", "ok")]


def test_each_job_of_a_batch_passes_the_hooks_and_a_hooks_error_fails_that_job_alone(tasks: Tasks) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("m", log))

    class RefuseOdd(Middleware):
        def around_run(self, run: TaskRun) -> None:
            if current_job_item(run) % 2:
                raise LookupError("odd item")

    def current_job_item(run: TaskRun) -> int:
        return int(run.meta["item"])

    class Tag(Middleware):
        def around_send(self, message: Sending) -> None:
            message.meta["item"] = message.args[0]

    tasks.middleware(Tag())
    tasks.middleware(RefuseOdd())
    batches: list[list[int]] = []

    @tasks.task(name="double", batch=10, keep_result=60, max_attempts=1)
    def double(items: list[int]) -> list[int | BaseException]:
        batches.append(items)
        assert len(current_batch()) == len(items)
        return [ValueError("two") if x == 2 else x * 2 for x in items]

    sent = double.send_many([1, 2, 3, 4])
    burst(tasks, **FAST)
    assert batches == [[2, 4]]  # the odd ones never reached the function
    assert sent[3].result(timeout=5) == 8
    assert "odd item" in dead_error(tasks, sent[0].id, "default") and "RefuseOdd" in dead_error(tasks, sent[0].id)
    assert dead_error(tasks, sent[1].id).startswith("ValueError: two")
    ran = sorted(((entry[2], entry[3], entry[4]) for entry in log if entry[1] == "ran"), key=repr)
    assert ran == sorted([(None, "MiddlewareError", "dead"), (None, "MiddlewareError", "dead"),
                          (None, "ValueError", "dead"), (8, "NoneType", "ok")], key=repr)


def test_the_testing_helper_runs_the_hooks(tasks: Tasks) -> None:
    log: list[Any] = []
    tasks.middleware(Recorder("m", log))

    @tasks.task(name="job", keep_result=60)
    def job(x: int) -> int:
        return x + 1

    with tasks.testing() as t:
        sent = job.send(1)
        assert t.drain() == 1
        assert sent.result() == 2
    assert [entry[1] for entry in log] == ["send", "sent", "run", "ran"]


def test_a_middlewares_worker_hooks_run_with_the_tasks_own(tasks: Tasks) -> None:
    log: list[str] = []

    class Lifecycle(Middleware):
        def on_worker_start(self) -> None:
            log.append("mw start")

        def on_worker_stop(self) -> None:
            log.append("mw stop")

    tasks.on_worker_start(lambda: log.append("own start"))
    tasks.middleware(Lifecycle())
    tasks.on_worker_stop(lambda: log.append("own stop"))

    @tasks.task(name="job")
    def job() -> None:
        log.append("job")

    job.send()
    burst(tasks, **FAST)
    assert log == ["own start", "mw start", "job", "mw stop", "own stop"]


def test_registering_checks_the_object(tasks: Tasks) -> None:
    with pytest.raises(InvalidArgument, match="defines none of around_send, around_run"):
        tasks.middleware(object())
    with pytest.raises(InvalidArgument, match="defines none of"):
        tasks.middleware(Middleware())  # only the base class's hooks
    m = Recorder("m", [])
    assert tasks.middleware(m) is m
    with pytest.raises(InvalidArgument, match="registered already"):
        tasks.middleware(m)


def test_no_middleware_no_chain(tasks: Tasks, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path enters no chain when there is nothing to enter: a Chain made would
    fail the run here. A middleware with a send hook only adds no run hook."""

    @tasks.task(name="job", keep_result=60)
    def job(x: int) -> int:
        return x

    def no_chain(*args: Any) -> None:
        raise AssertionError("a chain was made")

    monkeypatch.setattr(Chain, "__init__", no_chain)
    sent = job.send(1)
    assert tasks.send_hooks == () and tasks.dispatcher().run_hooks == ()
    burst(tasks, **FAST)
    assert sent.result(timeout=5) == 1
    tasks.middleware(Refuse(lambda message: False))
    assert tasks.dispatcher().run_hooks == ()
    with pytest.raises(AssertionError, match="a chain was made"):
        job.send(2)
