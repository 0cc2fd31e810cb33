"""AsyncWorker: async def handlers as tasks of the caller's event loop, with the sync
worker's lifecycle (the signal and remote-stop tests in test_worker.py run it too,
through ``pyqueue worker`` with an async handler)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from pyqueue import InvalidArgument, Job, NewJob, Queue
from pyqueue.worker.aio import AsyncWorker

#: Also on the Redis Cluster backend.
ON_CLUSTER = True


def test_async_handlers_run_as_tasks_of_the_callers_loop_at_most_concurrency_at_once(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(40)])
    seen: list[str] = []
    running, most = 0, 0

    async def handle(job: Job) -> None:
        nonlocal running, most
        assert asyncio.get_running_loop() is loop  # a task of the loop that awaits run()
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        seen.append(job.id)

    async def main() -> int:
        return await AsyncWorker(["q"], handle, redis=r, concurrency=5, block_ms=200).run(burst=True)

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == 0
    finally:
        loop.close()
    assert sorted(seen) == sorted(f"j{i}" for i in range(40))
    assert 1 < most <= 5
    stats = q.stats()
    assert (stats.acked, stats.ready, stats.leased) == (40, 0, 0)


def test_a_failing_async_handler_nacks_its_job_until_it_is_dead(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue(b"", job_id="bad", max_attempts=2)

    async def handle(job: Job) -> None:
        raise RuntimeError(f"boom {job.attempt}")

    worker = AsyncWorker(["q"], handle, redis=r, block_ms=100, backoff_base_ms=1, backoff_cap_ms=1)
    assert asyncio.run(worker.run(burst=True)) == 0
    page = q.dead_list()
    assert [j.id for j in page.jobs] == ["bad"] and "RuntimeError: boom 2" in page.jobs[0].error


def test_a_plain_handler_runs_in_a_handler_thread(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([b"a", b"b"])
    threads: set[str] = set()

    def handle(job: Job) -> None:
        threads.add(threading.current_thread().name)

    assert asyncio.run(AsyncWorker(["q"], handle, redis=r, block_ms=100).run(burst=True)) == 0
    assert q.stats().acked == 2 and all(name.startswith("pyqueue-handler") for name in threads)


def test_handlers_that_finish_together_are_acked_in_fewer_calls_than_jobs(r: redis.Redis) -> None:
    q = Queue("q", r)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(200)])

    async def handle(job: Job) -> None:
        await asyncio.sleep(0.002)

    worker = AsyncWorker(["q"], handle, redis=r, concurrency=20, block_ms=100)
    assert asyncio.run(worker.run(burst=True)) == 0
    commit = worker.commit_loop.commits["q"]
    assert commit.acked == 200 and commit.calls < 200  # group commit formed batches
    assert q.stats().acked == 200


def test_something_not_callable_or_an_async_generator_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="callable"):
        AsyncWorker(["q"], "not a function")  # type: ignore[arg-type]

    async def yields(job: Job) -> Any:
        yield job

    with pytest.raises(InvalidArgument, match="async generator"):
        AsyncWorker(["q"], yields)
