"""Testing tasks on the real engine: ``with tasks.testing() as t:``.

Inside the block the :class:`~pyqueue.tasks.Tasks` object talks to a new, empty
embedded server of its own (fakeredis with its Lua), so a test sees only its own jobs.
``fn.send(...)`` enqueues there, through the real ``enqueue.lua``. :meth:`TaskTesting.drain`
then runs the jobs in this thread through the real scripts (``lease``, ``ack``,
``ack_result``, ``nack``) and the real task dispatch a worker uses, time limits
included, until nothing is ready or due; a batch task's jobs in batches of what one
lease call returns (it does not wait for a batch to fill). When only scheduled jobs are left (a retry's
backoff, ``send_in``), it moves the server's clock forward to the next one and goes on,
so a test of a task that retries after an hour takes milliseconds. It re-raises the
first error a task raised, unless told not to; ``t.errors`` keeps them all.

There is no eager mode: a job that would fail to encode, route, retry or store its
result in production fails here the same way.

The clock: the scripts read the server's ``TIME``. :meth:`TaskTesting.advance` (and
drain's jumps) shift the ``TIME`` of this test's server only; every other server,
embedded or real, keeps the real clock.

The pytest fixture ``pyqueue_testing`` (this package's pytest plugin) does the same
for a test: ``t = pyqueue_testing(tasks)``.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol

from pyqueue.worker.aio import AsyncWorker
from pyqueue.drivers.facade import plans_of
from pyqueue.drivers.queue import Queue
from pyqueue.protocol.models import Job, Stats
from pyqueue.tasks.connection import Connection
from pyqueue.tasks.run import Undeliverable
from pyqueue.worker import Worker
from pyqueue.worker import Fail, Parked, Retry

_clock_lock = threading.Lock()
_clock_installed = False


def _install_clock() -> None:
    """Let one fakeredis server's ``TIME`` run ahead of the real clock: the server's
    ``pyqueue_offset_ms`` attribute (absent on every other server: unchanged)."""
    global _clock_installed
    with _clock_lock:
        if _clock_installed:
            return
        from fakeredis.commands_mixins.server_mixin import ServerCommandsMixin

        original = ServerCommandsMixin.time

        @functools.wraps(original)
        def time_command(self: Any) -> list[bytes]:
            offset_ms = getattr(self._server, "pyqueue_offset_ms", 0)
            if not offset_ms:
                return original(self)  # type: ignore[no-any-return]
            now_us = round(time.time() * 1_000_000) + offset_ms * 1000
            return [str(now_us // 1_000_000).encode(), str(now_us % 1_000_000).encode()]

        ServerCommandsMixin.time = time_command  # type: ignore[method-assign]
        _clock_installed = True


class Testable(Protocol):
    """What a test's server and drain use of the :class:`~pyqueue.tasks.Tasks` object
    under test (declared above this module): its connection to swap, its queues, and
    a worker of its tasks."""

    @property
    def connection(self) -> Connection: ...

    @property
    def default_queue(self) -> str: ...

    def queue(self, name: str) -> Queue: ...

    def worker(self, queues: Sequence[str] | None = None, **options: Any) -> Worker: ...


class TaskTesting:
    """An isolated embedded server for a :class:`~pyqueue.tasks.Tasks` object, and the
    means to run its jobs (see the module docstring).

    Args:
        raise_errors: :meth:`drain` re-raises the first exception a task raised (after
            the job's nack went through, as in a worker).
        lease_ms: the lease of each job drain runs.
        max_jobs: the most job runs one drain makes (a task that sends itself forever
            stops there, with an error).
    """

    def __init__(self, tasks: Testable, *, raise_errors: bool = True, lease_ms: int = 60_000, max_jobs: int = 10_000) -> None:
        self.tasks = tasks
        self.raise_errors, self.lease_ms, self.max_jobs = raise_errors, lease_ms, max_jobs
        #: Every exception a task raised during drains, in order.
        self.errors: list[BaseException] = []
        self._old: tuple[Any, ...] | None = None
        self.server: Any = None
        self.client: Any = None

    def __enter__(self) -> TaskTesting:
        import fakeredis

        _install_clock()
        self.server = fakeredis.FakeServer()
        self.server.pyqueue_offset_ms = 0
        self.client = fakeredis.FakeRedis(server=self.server)
        self._old = self.tasks.connection.swap(self.client, fakeredis.FakeAsyncRedis(server=self.server))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._old is not None
        self.tasks.connection.restore(self._old)

    # -- the clock -------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move this server's clock forward: scheduled jobs and retries become due,
        results and tombstones age."""
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        self.server.pyqueue_offset_ms += round(seconds * 1000)
        self.tasks.connection.forget_clock()  # the producer's estimate of the server clock

    def now_ms(self) -> int:
        """This server's clock."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # -- running ---------------------------------------------------------------------

    def stats(self, queue: str | None = None) -> Stats:
        """``stats`` of a task queue (default: the default queue)."""
        return self.tasks.queue(queue or self.tasks.default_queue).stats()

    def drain(self, *, raise_errors: bool | None = None, advance: bool = True) -> int:
        """Run every ready job, then every scheduled one as it becomes due (moving the
        clock to it unless ``advance=False``), until none is left; returns how many
        runs were made. Re-raises the first task error (see the class).

        Raises:
            RuntimeError: more than ``max_jobs`` runs (a task that keeps sending itself).
        """
        raise_errors = self.raise_errors if raise_errors is None else raise_errors
        worker = self.tasks.worker(redis=self.client, concurrency=1, lease_ms=self.lease_ms, grace_ms=0)
        dispatcher = worker.handler
        failures: list[BaseException] = []

        def record(exc: BaseException) -> None:
            if isinstance(exc, Parked):
                return  # a durable sleep or wait: not an error; drain runs it again when due
            if isinstance(exc, Undeliverable):
                failures.append(exc)
            elif isinstance(exc, Retry):
                # A task that asks for a retry (no exception behind it) is not an error;
                # a retry after an exception is that exception's.
                if exc.__cause__ is not None:
                    failures.append(exc.__cause__)
            else:
                failures.append(exc.__cause__ if isinstance(exc, Fail) and exc.__cause__ is not None else exc)

        runs = 0  # jobs handed to the tasks (a batch counts its jobs)

        def recording(job: Job) -> object:
            nonlocal runs
            runs += 1
            try:
                return dispatcher(job)
            except BaseException as exc:
                record(exc)
                raise

        worker.handler = recording
        batches = worker.batches
        if batches is not None:
            run_batch = batches.handler

            def recording_batch(jobs: list[Job]) -> object:
                nonlocal runs
                runs += len(jobs)
                try:
                    outcomes = run_batch(jobs)
                except BaseException as exc:
                    record(exc)
                    raise
                for outcome in outcomes if isinstance(outcomes, list) else ():
                    if isinstance(outcome, BaseException):
                        record(outcome)
                return outcomes

            batches.handler = recording_batch
        owner = "testing." + secrets.token_hex(4)
        for q in worker.served.logical + worker.served.queues:
            plans_of(q).set_owner(owner)
        loop: asyncio.AbstractEventLoop | None = None
        loop_thread: threading.Thread | None = None
        if isinstance(worker, AsyncWorker):
            loop = asyncio.new_event_loop()
            loop_thread = threading.Thread(target=loop.run_forever, name="pyqueue-testing-loop", daemon=True)
            loop_thread.start()
            worker._loop = loop
        # The worker's own lease round, its jobs run here one round at a time (no
        # handler threads, no commit loop): what runs, and in which order, is what a
        # worker does; waiting is replaced by moving this server's clock.
        worker.executor.run_here()
        ticking = threading.Event()
        heartbeat = threading.Thread(target=self._enforce_limits, args=(worker, ticking), daemon=True)
        heartbeat.start()
        try:
            while True:
                leased, next_due_ms, now_ms = worker.fetch.lease_round(1)
                if failures:
                    self.errors.extend(failures)
                    first, failures[:] = failures[0], []
                    if raise_errors:
                        raise first
                if runs > self.max_jobs:
                    raise RuntimeError(f"drain ran {self.max_jobs} jobs and jobs are still coming")
                if leased:
                    continue
                if advance and next_due_ms > now_ms:
                    self.advance((next_due_ms - now_ms) / 1000)
                    continue
                if 0 <= next_due_ms <= now_ms:
                    continue  # due now (maintenance left it for the next call)
                return runs
        finally:
            ticking.set()
            heartbeat.join(1)
            if loop is not None and loop_thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                loop_thread.join(5)
                if not loop_thread.is_alive():  # (a task blocking the loop keeps it: left to the daemon thread)
                    _close_loop(loop)

    @staticmethod
    def _enforce_limits(worker: Any, stop: threading.Event) -> None:
        while not stop.wait(0.02):
            worker.heartbeat.enforce_limits()


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on a stopped loop (a task cut off at its time limit that has
    not ended yet), let it finish, and close the loop."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
