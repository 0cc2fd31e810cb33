"""Batch handlers (issue #21 item 4), on both backends: ``Worker(..., batch=N,
batch_wait_ms=...)`` and ``@tasks.task(batch=N, batch_wait=...)``.

What is proved: a batch is what one lease call returned (and its successes are acked,
with the next batch leased, in one call); a short batch waits to fill; each job's
outcome is its own (a failure at one position retries that job only, by its task's
policy); a raise or an answer of the wrong shape fails every job; the time limit, a
cancel and the shutdown act per job; a batch takes one slot and its jobs are tracked as
jobs. Timing bounds are generous: they prove a mechanism, not a speed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from tasks_support import burst, job_state, wait_for

from pyqueue import InvalidArgument, Job, NewJob, Queue, Result, Retry, TimeLimitExceeded
from pyqueue.worker.aio import AsyncWorker
from pyqueue.protocol.plans import Bound, SingleQueue
from pyqueue.protocol.verbs import consume
from pyqueue.tasks import Fail, Tasks, current_batch
from pyqueue.worker import Worker

FAST = {"backoff_base_ms": 1, "backoff_cap_ms": 5, "block_ms": 100}


class Serving:
    """An engine worker running in a thread until :meth:`stop`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_for(lambda: worker.service is not None, what="the worker's registration")

    def _run(self) -> None:
        self.exit_code = self.worker.run(install_signal_handlers=False)

    def stop(self) -> int:
        self.worker.stop("test finished")
        self.thread.join(15)
        assert not self.thread.is_alive() and self.exit_code is not None
        return self.exit_code


@pytest.fixture
def serving() -> Iterator[Callable[[Worker], Serving]]:
    started: list[Serving] = []

    def start(worker: Worker) -> Serving:
        started.append(Serving(worker))
        return started[-1]

    yield start
    for s in started:
        if s.thread.is_alive():
            s.stop()


@pytest.fixture
def lease_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[str]]]:
    """Every lease call (lua/lease.lua) made from here on: (receipts it acked, ids of
    the jobs it leased)."""
    calls: list[tuple[int, list[str]]] = []
    original = consume.lease_call

    def lease_call(spec: Any, memory: Any, **kwargs: Any) -> Any:
        leased = yield from original(spec, memory, **kwargs)
        calls.append((len(kwargs.get("ack", ())), [job.id for job in leased.jobs]))
        return leased

    monkeypatch.setattr(consume, "lease_call", lease_call)
    monkeypatch.setattr(SingleQueue, "lease_call", Bound(lease_call))
    return calls


def run_burst(worker: Worker) -> int:
    return worker.run(burst=True, install_signal_handlers=False)


# -- how a batch is made ----------------------------------------------------------------


def test_ten_ready_jobs_with_batch_five_run_as_two_calls_of_five_each_from_one_lease_call(
    r: redis.Redis, lease_calls: list[tuple[int, list[str]]]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(10)])
    batches: list[list[str]] = []

    def handler(jobs: list[Job]) -> list[object]:
        batches.append([job.id for job in jobs])
        return [Result(job.id.upper()) for job in jobs]

    assert run_burst(Worker(["q"], handler, redis=r, batch=5, **FAST)) == 0
    assert batches == [[f"j{i}" for i in range(5)], [f"j{i}" for i in range(5, 10)]]
    # Each batch is the jobs of one lease call: the fetch loop's, then the call after
    # the first batch's results were stored (an ack_result call: the lease acks none).
    leases = [ids for _acked, ids in lease_calls if ids]
    assert leases == batches
    assert q.stats().acked == 10 and q.stats().leased_total == 10
    assert q.result("j7").value == "J7"


def test_the_successes_of_a_batch_are_acked_in_the_call_that_leases_the_next_batch(
    r: redis.Redis, lease_calls: list[tuple[int, list[str]]]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(9)])
    sizes: list[int] = []

    def handler(jobs: list[Job]) -> list[None]:
        sizes.append(len(jobs))
        return [None] * len(jobs)

    run_burst(Worker(["q"], handler, redis=r, batch=4, **FAST))
    assert sizes == [4, 4, 1]
    # (acked, leased): the fetch loop leases 4; each ack of a batch leases the next.
    assert [(acked, len(ids)) for acked, ids in lease_calls if acked or ids] == [(0, 4), (4, 4), (4, 1), (1, 0)]
    assert q.stats().acked == 9


def test_a_short_batch_waits_batch_wait_ms_for_more_jobs_then_runs_what_it_has(
    r: redis.Redis, serving: Callable[[Worker], Serving]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([b"a", b"b"])
    batches: list[tuple[float, list[bytes]]] = []

    def handler(jobs: list[Job]) -> list[None]:
        batches.append((time.monotonic(), [job.payload for job in jobs]))
        return [None] * len(jobs)

    serving(Worker(["q"], handler, redis=r, batch=5, batch_wait_ms=1500, **FAST))
    wait_for(lambda: q.stats().leased == 2, what="the first two jobs leased")
    time.sleep(0.2)
    assert batches == []  # waiting for the batch to fill
    q.enqueue_many([b"c", b"d", b"e", b"f"])
    wait_for(lambda: len(batches) == 2, what="two batches")
    assert batches[0][1] == [b"a", b"b", b"c", b"d", b"e"]  # filled up, then ran at once
    assert batches[1][1] == [b"f"]  # waited its batch_wait_ms, then ran alone
    assert batches[1][0] - batches[0][0] >= 1.4
    wait_for(lambda: q.stats().acked == 6, what="every ack")


def test_a_batch_takes_one_slot_and_its_jobs_are_tracked_as_jobs(
    r: redis.Redis, serving: Callable[[Worker], Serving]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([b""] * 12)
    release = threading.Event()
    sizes: list[int] = []

    def handler(jobs: list[Job]) -> list[None]:
        sizes.append(len(jobs))
        release.wait(10)
        return [None] * len(jobs)

    worker = Worker(["q"], handler, redis=r, batch=5, concurrency=2, **FAST)
    serving(worker)
    wait_for(lambda: len(sizes) == 2, what="two batches running")
    time.sleep(0.1)
    assert sorted(sizes) == [5, 5]  # two slots: two batches; the other 2 jobs wait
    assert worker.running.free == 0 and len(worker.running.snapshot()) == 10
    assert q.stats().leased == 10 and q.stats().ready == 2
    release.set()
    wait_for(lambda: q.stats().acked == 12, what="every ack")
    assert worker.running.ended == 12  # what --max-jobs-per-child counts


# -- how a batch ends --------------------------------------------------------------------


def test_an_exception_at_one_position_fails_that_job_alone_by_its_tasks_policy(r: redis.Redis) -> None:
    tasks = Tasks(client=r)
    calls: list[list[tuple[int, int]]] = []

    @tasks.task(name="square", batch=5, keep_result=60, max_attempts=3, fail_on=KeyError)
    def square(items: list[int]) -> list[int | Exception]:
        runs = current_batch()
        calls.append([(item, run.attempt) for item, run in zip(items, runs)])
        out: list[int | Exception] = []
        for item, run in zip(items, runs):
            if item == 2 and run.attempt == 1:
                out.append(ValueError("not yet"))  # retried, then succeeds
            elif item == 4:
                out.append(KeyError("never"))  # fail_on: dead at once
            else:
                out.append(item * item)
        return out

    sent = square.send_many(range(5))
    burst(tasks)
    assert calls[0] == [(i, 1) for i in range(5)]
    assert calls[1:] == [[(2, 2)]]  # only the failed job ran again
    assert [s.result(timeout=0) for s in sent[:4]] == [0, 1, 4, 9]
    assert job_state(tasks, "default", sent[2].id).state == "done"
    dead = job_state(tasks, "default", sent[4].id)
    assert dead.state == "dead" and dead.attempts == 1 and "KeyError: 'never'" in dead.error
    stats = tasks.queue("default").stats()
    assert (stats.acked, stats.nacked, stats.dead_total) == (4, 2, 1)


def test_retry_and_fail_instances_at_positions_of_an_engine_handler(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=i) for i in ("ok", "retry", "fail")])
    seen: list[tuple[str, int]] = []

    def handler(jobs: list[Job]) -> list[object]:
        seen.extend((job.id, job.attempt) for job in jobs)
        answers = {"ok": None, "retry": Retry(delay_ms=50, reason="later"), "fail": Fail("hopeless")}
        return [None if job.attempt > 1 else answers[job.id] for job in jobs]

    run_burst(Worker(["q"], handler, redis=r, batch=10, **FAST))
    assert sorted(seen) == [("fail", 1), ("ok", 1), ("retry", 1), ("retry", 2)]
    assert q.get("fail").state == "dead" and q.get("fail").error == "hopeless"
    assert q.stats().acked == 2


def test_a_batch_that_raises_fails_every_job_by_its_policy(r: redis.Redis) -> None:
    tasks = Tasks(client=r)
    attempts: list[list[int]] = []

    @tasks.task(name="flaky", batch=3, max_attempts=3, keep_result=60)
    def flaky(items: list[str]) -> list[str]:
        attempts.append([run.attempt for run in current_batch()])
        if len(attempts) == 1:
            raise ConnectionError("the store is down")
        return [item + "!" for item in items]

    sent = flaky.send_many(["a", "b", "c"])
    burst(tasks)
    assert attempts == [[1, 1, 1], [2, 2, 2]]
    assert [s.result(timeout=0) for s in sent] == ["a!", "b!", "c!"]
    assert tasks.queue("default").stats().nacked == 3

    @tasks.task(name="broken", batch=3, queue="other", max_attempts=2)
    def broken(items: list[int]) -> list[int]:
        raise RuntimeError("always")

    for job in broken.send_many([1, 2]):
        burst(tasks)
        info = job_state(tasks, "other", job.id)
        assert info.state == "dead" and info.attempts == 2 and "RuntimeError: always" in info.error


@pytest.mark.parametrize("answer", [lambda jobs: [None] * (len(jobs) - 1), lambda jobs: None, lambda jobs: "ok"])
def test_an_answer_that_is_not_one_result_per_job_fails_the_whole_batch_clearly(
    r: redis.Redis, answer: Callable[[list[Job]], object]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}", max_attempts=1) for i in range(3)])
    run_burst(Worker(["q"], answer, redis=r, batch=3, **FAST))  # type: ignore[arg-type]
    dead = q.dead_list().jobs
    assert sorted(d.id for d in dead) == ["j0", "j1", "j2"]
    assert all("BatchError" in d.error and "3 jobs" in d.error for d in dead), dead[0].error
    assert q.stats().acked == 0


# -- time limits, cancels, shutdown -----------------------------------------------------


def test_a_batch_interrupted_at_its_time_limit_ends_by_what_it_does_then(r: redis.Redis) -> None:
    """Caught and returned from, the batch's jobs are acked with what it returned (as a
    single task's); let through, each job is dead (max_attempts 1) with the limit's error."""
    tasks = Tasks(client=r)
    stopped: list[str] = []

    @tasks.task(name="slow", batch=5, time_limit=0.3, max_attempts=1, keep_result=60)
    def slow(items: list[int]) -> list[int]:
        if items[0] < 10:
            try:
                while True:
                    time.sleep(0.005)
            except TimeLimitExceeded:
                stopped.append("stopped")
                if items[0] < 5:
                    return items  # caught and returned: acked
                raise
        return items

    sent = slow.send_many(range(15))
    started = time.monotonic()
    burst(tasks)
    assert time.monotonic() - started < 10
    assert stopped == ["stopped", "stopped"]
    assert [s.result(timeout=1) for s in sent[:5]] == [0, 1, 2, 3, 4]
    for s in sent[5:10]:
        info = job_state(tasks, "default", s.id)
        assert info.state == "dead" and "TimeLimitExceeded" in info.error and "0.3s" in info.error
    assert [s.result(timeout=1) for s in sent[10:]] == [10, 11, 12, 13, 14]
    stats = tasks.queue("default").stats()
    assert (stats.acked, stats.dead_total) == (10, 5)


def test_a_job_cancelled_while_its_batch_runs_is_not_acked_the_others_are(
    r: redis.Redis, serving: Callable[[Worker], Serving]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(4)])
    told: list[str] = []

    def handler(jobs: list[Job]) -> list[None]:
        # lease_ms=300: the heartbeat extends every 100 ms and learns of the cancel.
        wait_for(lambda: any(job.cancelled.is_set() for job in jobs), what="the cancel reaching the handler")
        told.extend(job.id for job in jobs if job.cancelled.is_set())
        return [None] * len(jobs)

    serving(Worker(["q"], handler, redis=r, batch=4, lease_ms=300, **FAST))
    wait_for(lambda: q.stats().leased == 4, what="the batch leased")
    assert q.cancel("j2").state == "leased"
    wait_for(lambda: q.stats().acked == 3, what="the acks")
    assert told == ["j2"]
    time.sleep(0.2)
    stats = q.stats()
    assert (stats.acked, stats.cancelled, stats.nacked, stats.leased) == (3, 1, 0, 0)
    assert stats.reclaimed == 0  # the other leases were extended while the batch ran


def test_a_stop_releases_the_jobs_of_a_batch_still_running_after_the_grace_period(
    r: redis.Redis, serving: Callable[[Worker], Serving]
) -> None:
    q = Queue("q", r)
    q.enqueue_many([b""] * 3)
    release = threading.Event()

    def handler(jobs: list[Job]) -> list[None]:
        release.wait(10)
        return [None] * len(jobs)

    run = serving(Worker(["q"], handler, redis=r, batch=5, grace_ms=200, **FAST))
    wait_for(lambda: q.stats().leased == 3, what="the batch leased")
    assert run.stop() == 0
    stats = q.stats()
    assert (stats.ready, stats.leased, stats.released) == (3, 0, 3)
    release.set()
    time.sleep(0.2)
    assert q.stats().acked == 0  # its answer came after the release: nothing acked


# -- asyncio, mixing, the testing helper, refusals --------------------------------------


def test_an_async_batch_task_runs_in_an_async_worker_and_is_refused_by_a_sync_one(r: redis.Redis) -> None:
    tasks = Tasks(client=r)
    batches: list[list[int]] = []

    @tasks.task(name="double", batch=4, keep_result=60)
    async def double(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        batches.append([run.attempt for run in current_batch()])
        return [2 * i for i in items]

    assert isinstance(tasks.worker(), AsyncWorker)
    with pytest.raises(InvalidArgument, match="AsyncWorker"):
        Worker(["default"], tasks.dispatcher(), redis=r, block_ms=100)
    sent = double.send_many(range(6))
    burst(tasks)
    assert batches == [[1, 1, 1, 1], [1, 1]]
    assert [s.result(timeout=0) for s in sent] == [0, 2, 4, 6, 8, 10]

    async def handler(jobs: list[Job]) -> list[object]:
        return [Result(len(jobs))] * len(jobs)

    q = Queue("raw", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)])
    worker = AsyncWorker(["raw"], handler, redis=r, batch=3, **FAST)
    assert asyncio.run(worker.run(burst=True, install_signal_handlers=False)) == 0
    assert q.result("j1").value == 3


def test_a_worker_serves_batch_and_single_tasks_and_a_foreign_job_in_a_batch_queue_fails_alone(
    r: redis.Redis,
) -> None:
    tasks = Tasks(client=r)
    seen: list[list[int]] = []

    @tasks.task(name="bulk", batch=10, queue="bulk")
    def bulk(items: list[int]) -> list[None]:
        seen.append(items)
        return [None] * len(items)

    @tasks.task(name="one", max_attempts=2)
    def one(x: int) -> int:
        return x

    one.send(1)
    bulk.send_many([1, 2])
    stray = one.options(queue="bulk").send(3)  # a job of another task in the batch queue
    bulk.send(4)
    burst(tasks, queues=["bulk", "default"])
    assert seen == [[1, 2, 4]]
    info = job_state(tasks, "bulk", stray.id)
    assert info.state == "dead" and info.attempts == 2
    assert "task 'one' in the queue of batch task 'bulk'" in info.error
    assert tasks.queue("default").stats().acked == 1 and tasks.queue("bulk").stats().acked == 3


def test_the_testing_helper_runs_batch_tasks_in_batches() -> None:
    tasks = Tasks()
    seen: list[list[str]] = []

    @tasks.task(name="shout", batch=3, keep_result=60)
    def shout(items: list[str]) -> list[str | Exception]:
        seen.append(items)
        return [ValueError("no") if item == "x" else item.upper() for item in items]

    with tasks.testing() as t:
        sent = shout.send_many(["a", "b", "c", "d"])
        assert t.drain() == 4
        assert seen == [["a", "b", "c"], ["d"]]
        assert sent[3].result() == "D"
        shout.send("x")
        with pytest.raises(ValueError, match="no"):
            t.drain()


def test_bad_batch_options_are_refused_loudly(r: redis.Redis) -> None:
    def handler(jobs: list[Job]) -> list[None]:
        return [None] * len(jobs)

    for bad in (0, 1001, True, 2.0, "5"):
        with pytest.raises(InvalidArgument, match="batch"):
            Worker(["q"], handler, redis=r, batch=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="batch_wait_ms"):
        Worker(["q"], handler, redis=r, batch=5, batch_wait_ms=-1)
    with pytest.raises(InvalidArgument, match="give batch=N"):
        Worker(["q"], handler, redis=r, batch_wait_ms=10)

    async def async_handler(jobs: list[Job]) -> list[None]:
        return [None] * len(jobs)

    with pytest.raises(InvalidArgument, match="AsyncWorker"):
        Worker(["q"], async_handler, redis=r, batch=5)  # type: ignore[arg-type]

    tasks = Tasks(client=r)
    for options in ({"batch": 0}, {"batch": 1001}, {"batch": 5, "batch_wait": -1}, {"batch_wait": 1},
                    {"batch": 5, "batch_wait_ms": 10}, {"batch": 5, "batch_wait": 601}):
        with pytest.raises(InvalidArgument, match="batch"):
            tasks.task(name="t", **options)(lambda items: items)

    with pytest.raises(InvalidArgument, match="one argument"):
        tasks.task(name="none", batch=5)(lambda: [])
    with pytest.raises(InvalidArgument, match="unknown task option 'batch'"):
        tasks.task(name="opts", batch=5, queue="opts")(lambda items: items).options(batch=3)

    @tasks.task(name="ok", batch=5)
    def ok(items: list[int]) -> list[int]:
        return items

    with pytest.raises(InvalidArgument, match="share queue 'default'"):
        tasks.task(name="other")(lambda x: x)
    with pytest.raises(InvalidArgument, match="share queue 'default'"):
        tasks.task(name="other_batch", batch=2)(lambda items: items)
    with pytest.raises(InvalidArgument, match="give batch= to the task"):
        tasks.worker(batch=5)
    assert ok([1, 2]) == [1, 2]  # calling it runs it here, on a list of items


def test_ack_result_many_stores_each_result_with_its_ack_on_a_partitioned_queue_too(r: redis.Redis) -> None:
    for q in (Queue("one", r), Queue("parts", r, partitions=3)):
        q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(6)])
        jobs: list[Job] = []
        while len(jobs) < 6:  # a partitioned queue leases from one partition per call
            jobs += q.lease(count=6)
        q.ack(jobs[0])
        outcomes = q.ack_result_many(jobs, [{"n": i} for i in range(6)], result_ttl_ms=60_000)
        assert [o.value for o in outcomes] == ["gone"] + ["ok"] * 5
        assert q.result(jobs[4].id).value == {"n": 4} and q.result(jobs[0].id).state == "done"
        with pytest.raises(InvalidArgument):
            q.ack_result_many(jobs[:2], [1])
