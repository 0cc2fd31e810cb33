"""Shared by the task layer's tests (tests/test_tasks*.py): a worker of a Tasks object
running in a thread (a sync Worker, or an AsyncWorker in its own event loop), and
polling helpers whose timeouts bound behaviour, never measure speed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pyqueue.worker.aio import AsyncWorker
from pyqueue.protocol.models import JobInfo
from pyqueue.tasks import Tasks


def server_ms(r: Any) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "the condition") -> None:
    """Poll ``condition`` every 10 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout}s")
        time.sleep(0.01)


def job_state(tasks: Tasks, queue: str, job_id: str) -> JobInfo:
    return tasks.queue(queue).get(job_id)


class Serving:
    """``tasks.worker(**options)`` running in a thread until :meth:`stop` (an
    AsyncWorker runs in ``asyncio.run`` in that thread), with the start and stop hooks."""

    def __init__(self, tasks: Tasks, **options: Any) -> None:
        options.setdefault("block_ms", 200)
        options.setdefault("grace_ms", 5_000)
        self.tasks = tasks
        self.worker = tasks.worker(**options)
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while self.worker.service is None:
            assert self.thread.is_alive(), f"the worker ended before it registered: {self.error!r}"
            assert time.monotonic() < deadline, "the worker did not register"
            time.sleep(0.01)

    @property
    def is_async(self) -> bool:
        return isinstance(self.worker, AsyncWorker)

    def _run(self) -> None:
        try:
            worker = self.worker
            if isinstance(worker, AsyncWorker):
                self.exit_code = asyncio.run(self.tasks.arun_worker(worker, install_signal_handlers=False))
            else:
                self.exit_code = self.tasks.run_worker(worker, install_signal_handlers=False)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> int:
        self.worker.stop("test finished")
        self.thread.join(15)
        assert not self.thread.is_alive(), "the worker did not stop"
        assert self.error is None, f"the worker raised {self.error!r}"
        assert self.exit_code is not None
        return self.exit_code


@pytest.fixture
def serve() -> Iterator[Callable[..., Serving]]:
    """Factory: ``serve(tasks, **worker_options)`` -> a running :class:`Serving`,
    stopped at the end of the test if it still runs."""
    started: list[Serving] = []

    def start(tasks: Tasks, **options: Any) -> Serving:
        serving = Serving(tasks, **options)
        started.append(serving)
        return serving

    yield start
    for serving in started:
        if serving.thread.is_alive():
            serving.worker.stop("test finished")
            serving.thread.join(15)


def burst(tasks: Tasks, **options: Any) -> int:
    """Run a worker of ``tasks`` until every queue is drained (its own retries too)."""
    options.setdefault("block_ms", 100)
    options.setdefault("backoff_base_ms", 1)
    options.setdefault("backoff_cap_ms", 5)
    worker = tasks.worker(**options)
    if isinstance(worker, AsyncWorker):
        return asyncio.run(tasks.arun_worker(worker, burst=True, install_signal_handlers=False))
    return tasks.run_worker(worker, burst=True, install_signal_handlers=False)
