"""Task time limits with real workers in threads, on both backends (pyqueue.worker.slots and
the worker's heartbeat), with dramatiq's semantics: at its limit the work is interrupted
(TimeLimitExceeded in a thread, the asyncio task cancelled) and the worker goes on
serving; a task that catches it and returns is acked with what it returned, one that
lets it through is retried or dead by its policy. ``time_limit_grace`` later (the hard
limit) the job ends as TimeLimitExceeded whatever the task does. A thread stuck in C
cannot be stopped: its job stays leased by the worker until the thread returns, so no
other attempt of it starts; its slot is written off meanwhile, and a worker whose every
slot is written off exits 75.

Bounds here are generous and prove behaviour (the issue's "within a second of the
limit"), not speed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis
from tasks_support import Serving, job_state, serve, wait_for  # noqa: F401 (serve: a fixture)

from pyqueue.worker import EXIT_STUCK
from pyqueue.tasks import HookOutcome, Middleware, TaskDead, TaskRun, Tasks, TimeLimitExceeded, current_job

LIMIT = 0.3


@pytest.fixture
def tasks(r: redis.Redis) -> Tasks:
    return Tasks(client=r)


class Log:
    """What the tasks of a test saw, with monotonic times, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: dict[str, float] = {}
        self.started = threading.Event()

    def mark(self, what: str) -> None:
        with self.lock:
            self.times.setdefault(what, time.monotonic())

    def __contains__(self, what: str) -> bool:
        return what in self.times


def test_a_sync_task_that_catches_its_time_limit_and_returns_is_acked_with_its_value(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    log = Log()
    endings: list[str] = []

    class Watch(Middleware):
        def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
            outcome = yield
            endings.append(f"{run.task}:{outcome.ending}")

    tasks.middleware(Watch())

    @tasks.task(name="spin", time_limit=LIMIT, max_attempts=1, keep_result=60)
    def spin() -> str:
        log.mark("started")
        n = 0
        try:
            while True:  # pure Python: the exception arrives at the next bytecode
                n += 1
        except TimeLimitExceeded:
            log.mark("cleanup")
            return "cleaned up"  # as in dramatiq: caught and returned, the job succeeded

    @tasks.task(name="next")
    def next_job() -> None:
        log.mark("next")

    spun = spin.send()
    following = next_job.send()  # sent right after: waits for the only slot
    worker = serve(tasks, concurrency=1, prefetch=0)
    wait_for(lambda: "next" in log, timeout=10, what="the next job")
    limit_at = log.times["started"] + LIMIT
    assert log.times["cleanup"] - limit_at < 1.0  # interrupted at its limit
    assert log.times["next"] - limit_at < 1.0  # the worker is alive and serving
    assert spun.result(timeout=5) == "cleaned up"
    assert job_state(tasks, "default", spun.id).state == "done"
    wait_for(lambda: job_state(tasks, "default", following.id).state == "done", what="the next job's ack")
    assert worker.stop() == 0
    stats = tasks.queue("default").stats()
    assert (stats.acked, stats.nacked, stats.dead) == (2, 0, 0)
    assert endings == ["spin:time_limit", "next:ok"]  # the middleware hears that it reached its limit
    assert worker.worker.slots_written_off == 0


def test_a_sync_task_that_lets_its_time_limit_through_is_dead_on_its_last_attempt(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    log = Log()

    @tasks.task(name="spin", time_limit=LIMIT, max_attempts=1, keep_result=60)
    def spin() -> str:
        log.mark("started")
        try:
            while True:
                pass
        finally:
            log.mark("cleanup")

    spun = spin.send()
    worker = serve(tasks, concurrency=1)
    with pytest.raises(TaskDead, match="TimeLimitExceeded"):
        spun.result(timeout=10)
    info = job_state(tasks, "default", spun.id)
    assert info.state == "dead" and "0.3s" in info.error and info.attempts == 1
    assert log.times["cleanup"] - (log.times["started"] + LIMIT) < 1.0
    assert worker.stop() == 0
    stats = tasks.queue("default").stats()
    assert (stats.acked, stats.nacked, stats.dead) == (0, 1, 1)


def test_a_job_stopped_at_its_limit_with_attempts_left_is_scheduled_for_its_retry(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    runs: list[int] = []

    @tasks.task(name="spin", time_limit=LIMIT, max_attempts=3, backoff=60)
    def spin() -> None:
        runs.append(current_job().attempt)
        while True:
            pass

    handle = spin.send()
    worker = serve(tasks)
    wait_for(lambda: job_state(tasks, "default", handle.id).state == "scheduled", what="the retry")
    info = job_state(tasks, "default", handle.id)
    assert info.attempts == 1 and 60_000 - 3_000 <= info.due_ms - info.now_ms <= 60_000
    wait_for(lambda: worker.worker.slots_written_off == 0 and not worker.worker.running.slots_running, what="the slot")
    assert worker.stop() == 0
    assert runs == [1]
    stats = tasks.queue("default").stats()
    assert (stats.acked, stats.nacked, stats.scheduled) == (0, 1, 1)


def test_a_task_that_exceeds_its_limit_cannot_escape_it_with_except_exception(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    log = Log()

    @tasks.task(name="stubborn", time_limit=LIMIT, max_attempts=1)
    def stubborn() -> None:
        log.mark("started")
        while True:
            try:
                while True:
                    pass
            except Exception:  # TimeLimitExceeded is a BaseException: not caught here
                log.mark("swallowed")

    handle = stubborn.send()
    serve(tasks)
    wait_for(lambda: job_state(tasks, "default", handle.id).state == "dead", what="the death at the limit")
    assert "swallowed" not in log


def test_an_async_task_is_cancelled_at_its_limit_and_the_worker_serves_the_next_job(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    log = Log()

    @tasks.task(name="await_forever", time_limit=LIMIT, max_attempts=1)
    async def await_forever() -> None:
        log.mark("started")
        try:
            while True:
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            log.mark("cleanup")
            raise

    @tasks.task(name="next")
    async def next_job() -> None:
        log.mark("next")

    waited = await_forever.send()
    following = next_job.send()
    worker = serve(tasks, concurrency=1)
    assert worker.is_async
    wait_for(lambda: "next" in log, timeout=10, what="the next job")
    limit_at = log.times["started"] + LIMIT
    assert "cleanup" in log and log.times["cleanup"] - limit_at < 1.0
    assert log.times["next"] - limit_at < 1.0
    info = job_state(tasks, "default", waited.id)
    assert info.state == "dead" and "TimeLimitExceeded" in info.error
    wait_for(lambda: job_state(tasks, "default", following.id).state == "done", what="the next job's ack")
    assert worker.stop() == 0
    assert tasks.queue("default").stats().acked == 1


def test_an_async_task_that_catches_its_cancellation_at_the_limit_and_returns_is_acked(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    log = Log()

    @tasks.task(name="swallow", time_limit=LIMIT, max_attempts=1, keep_result=60)
    async def swallow() -> str:
        try:
            while True:
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            log.mark("cancelled")
        await asyncio.sleep(0.05)  # cleaning up, within the grace period
        return "cleaned up"

    handle = swallow.send()
    worker = serve(tasks)
    assert handle.result(timeout=10) == "cleaned up"
    assert "cancelled" in log
    assert worker.stop() == 0
    stats = tasks.queue("default").stats()
    assert (stats.acked, stats.nacked) == (1, 0)


def test_a_sync_task_in_an_async_worker_is_stopped_at_its_limit(tasks: Tasks, serve: Callable[..., Serving]) -> None:
    log = Log()

    @tasks.task(name="spin", time_limit=LIMIT, max_attempts=1)
    def spin() -> None:
        try:
            while True:
                pass
        except TimeLimitExceeded:
            log.mark("cleanup")
            raise

    @tasks.task(name="other")
    async def other() -> None:
        log.mark("other")

    handle = spin.send()
    other.send()
    worker = serve(tasks, concurrency=1)
    assert worker.is_async
    wait_for(lambda: "other" in log, what="the next job")
    assert "cleanup" in log
    assert "TimeLimitExceeded" in job_state(tasks, "default", handle.id).error


def test_a_thread_stuck_in_c_keeps_its_job_leased_until_it_returns_while_its_slot_is_written_off(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    log = Log()
    served: list[float] = []
    states: list[str] = []

    @tasks.task(name="stuck", time_limit=LIMIT, time_limit_grace=0.2, max_attempts=2, backoff=0)
    def stuck() -> None:
        log.mark("started")
        try:
            time.sleep(3)  # in C: TimeLimitExceeded arrives only when it returns
        finally:
            log.mark("returned")

    @tasks.task(name="quick")
    def quick() -> None:
        served.append(time.monotonic())

    handle = stuck.send()
    serving = serve(tasks, concurrency=2)
    worker = serving.worker
    wait_for(lambda: "started" in log, what="the stuck task's start")
    wait_for(lambda: worker.slots_written_off == 1, timeout=5, what="the write-off")
    assert time.monotonic() < log.times["started"] + 3  # written off while stuck
    for _ in range(3):
        quick.send()
    while "returned" not in log:
        # Past its limits and written off, the job is still this worker's lease: no other
        # attempt can start while the thread runs.
        states.append(job_state(tasks, "default", handle.id).state)
        time.sleep(0.05)
    assert set(states) == {"leased"}, states
    assert len(served) == 3 and all(t < log.times["returned"] for t in served)  # the other slot served
    # Once it returned, it ended as TimeLimitExceeded: its retry (backoff 0) runs now.
    wait_for(lambda: job_state(tasks, "default", handle.id).state == "dead", timeout=10, what="the second attempt")
    info = job_state(tasks, "default", handle.id)
    assert info.attempts == 2 and "TimeLimitExceeded" in info.error
    wait_for(lambda: worker.slots_written_off == 0, timeout=5, what="the slots coming back")
    assert worker.slots_written_off_total == 2  # each attempt's slot, once
    assert serving.stop() == 0


def test_no_attempt_of_a_job_starts_while_an_earlier_one_still_runs_in_its_thread(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    """The overlap ledger: jobs whose every attempt sits in a C call well past its hard
    limit, retried at once (backoff 0). Each attempt's start and end go in the ledger;
    attempt n + 1 of a job never starts before attempt n ended."""
    lock = threading.Lock()
    ledger: dict[tuple[str, int], list[float]] = {}

    @tasks.task(name="stuck", time_limit=0.1, time_limit_grace=0.1, max_attempts=3, backoff=0)
    def stuck(n: int) -> None:
        run = current_job()
        with lock:
            ledger[(run.id, run.attempt)] = [time.monotonic()]
        try:
            time.sleep(0.8)  # in C: nothing interrupts it before it returns
        finally:
            with lock:
                ledger[(run.id, run.attempt)].append(time.monotonic())

    handles = [stuck.send(n) for n in range(3)]
    serving = serve(tasks, concurrency=4, prefetch=0)  # 3 stuck at once: 1 slot never written off
    for handle in handles:
        with pytest.raises(TaskDead, match="TimeLimitExceeded"):
            handle.result(timeout=30)
    assert serving.stop() == 0
    for handle in handles:
        spans = [ledger[(handle.id, attempt)] for attempt in (1, 2, 3)]
        assert all(len(span) == 2 for span in spans)
        for (_, ended), (started, _) in zip(spans, spans[1:]):
            assert started >= ended, spans  # the next attempt began after this one ended


def test_a_worker_whose_every_slot_is_written_off_exits_75_and_nacks_the_stuck_job_for_later(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    started = threading.Event()

    @tasks.task(name="stuck", time_limit=0.2, time_limit_grace=0.1, max_attempts=3, backoff=0)
    def stuck() -> None:
        started.set()
        time.sleep(2.5)

    handle = stuck.send()
    serving = serve(tasks, concurrency=1, lease_ms=2_000)
    assert started.wait(10)
    serving.thread.join(10)  # it stops by itself
    assert serving.exit_code == EXIT_STUCK and "written off" in serving.worker.exit_reason
    # Not released: its retry is due a lease length later, when this process would be
    # gone, not at once while the stuck thread still runs (backoff 0).
    info = job_state(tasks, "default", handle.id)
    assert info.state == "scheduled" and info.attempts == 1 and info.due_ms - info.now_ms >= 1_500, info


def test_the_limit_counts_from_the_lease_and_current_job_shows_the_deadline(
    tasks: Tasks, serve: Callable[..., Serving], r: Any
) -> None:
    seen: dict[str, Any] = {}

    @tasks.task(name="measure", time_limit=1.5, max_attempts=1)
    def measure() -> None:
        run = current_job()
        seen["deadline_ms"] = run.deadline_ms
        seconds, micros = r.time()
        seen["now_ms"] = int(seconds) * 1000 + int(micros) // 1000
        while True:
            time.sleep(0.01)

    handle = measure.send()
    serve(tasks)
    wait_for(lambda: job_state(tasks, "default", handle.id).state == "dead", timeout=10, what="the death at the limit")
    info = job_state(tasks, "default", handle.id)
    # Dead at about the deadline current_job() showed (on the server clock).
    assert seen["deadline_ms"] - seen["now_ms"] <= 1_500
    assert abs(info.due_ms - seen["deadline_ms"]) < 1_000


def test_a_limit_reached_while_the_coroutine_is_handed_to_the_loop_still_cancels_it(
    tasks: Tasks, serve: Callable[..., Serving], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log()
    real_handover = asyncio.run_coroutine_threadsafe

    def slow_handover(coroutine: Any, loop: asyncio.AbstractEventLoop) -> Any:
        future = real_handover(coroutine, loop)
        time.sleep(0.5)  # the limit passes here: the task runs, the worker does not know it yet
        return future

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", slow_handover)

    @tasks.task(name="late", time_limit=0.1, max_attempts=1)
    async def late() -> None:
        try:
            while True:
                log.mark("running")
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            log.mark("cancelled")
            raise

    handle = late.send()
    serve(tasks)
    wait_for(lambda: job_state(tasks, "default", handle.id).state == "dead", what="the death at the limit")
    wait_for(lambda: "cancelled" in log, timeout=3, what="the task's cancellation (else it runs on, unbounded)")


def test_a_task_is_stopped_at_its_limit_even_when_the_nack_fails(
    tasks: Tasks, serve: Callable[..., Serving], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log()

    @tasks.task(name="spin", time_limit=LIMIT, max_attempts=1)
    def spin() -> None:
        log.mark("started")
        try:
            while True:
                pass
        except TimeLimitExceeded:
            log.mark("cleanup")
            raise

    @tasks.task(name="next")
    def next_job() -> None:
        log.mark("next")

    handle = spin.send()
    next_job.send()
    serving = serve(tasks, concurrency=1, lease_ms=1_000)
    queue = serving.worker.served.by_name["default"]
    real_nack = queue.nack

    def failing_nack(*args: Any, **kwargs: Any) -> Any:
        if "final" in kwargs and "TimeLimitExceeded" in str(args[1:2]):
            raise redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
        return real_nack(*args, **kwargs)

    monkeypatch.setattr(queue, "nack", failing_nack)
    wait_for(lambda: "next" in log, timeout=10, what="the next job")
    assert "cleanup" in log and log.times["cleanup"] - (log.times["started"] + LIMIT) < 1.0
    # Not renewed, its lease expires and the job ends as an expired last attempt.
    wait_for(lambda: tasks.queue("default").stats().acked == 1, what="the next job's ack")
    assert tasks.queue("default").get(handle.id).state in ("leased", "dead")


def test_a_sync_task_that_catches_the_exception_and_goes_on_is_interrupted_at_the_hard_limit_and_after(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    caught: list[float] = []
    written_off_at_third: list[int] = []
    started: list[float] = []

    @tasks.task(name="stubborn", time_limit=LIMIT, time_limit_grace=0.2, max_attempts=1)
    def stubborn() -> str:
        started.append(time.monotonic())
        while True:
            try:
                while True:
                    time.sleep(0.001)
            except TimeLimitExceeded:
                caught.append(time.monotonic())
                if len(caught) == 3:
                    written_off_at_third.append(worker.worker.slots_written_off)
                    return "gave up"  # past the hard limit: it ends as TimeLimitExceeded all the same

    worker = serve(tasks, concurrency=2)
    handle = stubborn.send()
    with pytest.raises(TaskDead, match="TimeLimitExceeded"):
        handle.result(timeout=10)
    assert len(caught) == 3
    # Interrupted again at the hard limit, time_limit_grace after the limit (the run began
    # a moment before the task's first line: 0.05 s of slack) ...
    assert caught[1] - started[0] >= LIMIT + 0.2 - 0.05
    assert caught[2] - caught[1] >= 0.5  # then once that had not stopped it within WRITE_OFF_S (1 s) ...
    assert written_off_at_third == [1]  # ... its slot written off first
    wait_for(lambda: worker.worker.slots_written_off == 0, what="the slot back once the thread returned")
    assert worker.worker.slots_written_off_total == 1
    assert worker.stop() == 0
    assert tasks.queue("default").stats().acked == 0


def test_an_async_task_that_swallows_cancellation_keeps_its_job_until_it_ends_and_is_cancelled_again(
    tasks: Tasks, serve: Callable[..., Serving]
) -> None:
    # Conditions, not durations (a test that slept 0.5 s and read the write-off count as
    # soon as it saw the second cancellation failed on a slow machine): what is proved
    # is an order of events, each recorded where it happens.
    cancels: list[float] = []
    written_off_at_third_cancel: list[int] = []
    states: list[str] = []
    started: list[float] = []

    @tasks.task(name="deaf", time_limit=LIMIT, time_limit_grace=0.2, max_attempts=1)
    async def deaf() -> None:
        started.append(time.monotonic())
        while len(cancels) < 3:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancels.append(time.monotonic())
                states.append(job_state(tasks, "default", handle.id).state)
                if len(cancels) == 3:
                    written_off_at_third_cancel.append(worker.worker.slots_written_off)

    @tasks.task(name="quick", keep_result=60)
    async def quick() -> str:
        return "ran"

    worker = serve(tasks, concurrency=2)
    handle = deaf.send()
    wait_for(lambda: len(cancels) == 1, what="the first cancellation")
    assert quick.send().result(timeout=30) == "ran"  # the other slot serves meanwhile
    with pytest.raises(TaskDead, match="TimeLimitExceeded"):
        handle.result(timeout=30)
    # Cancelled at its limit, again at its hard limit, then once that had not stopped it
    # within WRITE_OFF_S (1 s), its slot written off by then; leased all along.
    assert cancels[1] - started[0] >= LIMIT + 0.2 - 0.05 and cancels[2] - cancels[1] >= 0.5
    assert written_off_at_third_cancel == [1] and states == ["leased"] * 3
    wait_for(lambda: worker.worker.slots_written_off == 0, what="the slot counted back once the coroutine ended")
    assert worker.worker.slots_written_off_total == 1
    assert worker.stop() == 0


def test_a_plain_handler_that_calls_sys_exit_fails_its_job_and_the_worker_goes_on(r: redis.Redis) -> None:
    import sys

    from pyqueue import Queue
    from pyqueue.worker import Worker

    q = Queue("exits", r)
    q.enqueue(b"x", job_id="bye", max_attempts=1)

    def handler(job: Any) -> None:
        sys.exit(3)

    worker = Worker(["exits"], handler, redis=r, block_ms=100)
    assert worker.run(burst=True, install_signal_handlers=False) == 0
    info = q.get("bye")
    assert info.state == "dead" and "SystemExit: 3" in info.error
