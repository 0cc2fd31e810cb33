"""Serving a :class:`~pyqueue.tasks.Tasks` object's tasks: its dispatcher, a worker
for them, and running that worker between the start and stop hooks. (A part of
``Tasks``: it holds the registry; this holds what runs it.)"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyqueue.worker.aio import AsyncWorker
from pyqueue.drivers.clients import Client
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job
from pyqueue.tasks.connection import Connection, check_partition_counts
from pyqueue.tasks.dispatch import Dispatcher
from pyqueue.worker import Worker

log = logging.getLogger("pyqueue.tasks")


class TaskServing:
    """The running half of :class:`~pyqueue.tasks.Tasks`."""

    connection: Connection
    _tasks: dict[str, Any]
    _raw: Callable[[Job], object] | None
    _middleware: list[object]
    on_start: list[Callable[[], object]]
    on_stop: list[Callable[[], object]]

    @property
    def redis(self) -> Client:
        raise NotImplementedError

    @property
    def prefix(self) -> str:
        raise NotImplementedError

    def queue_names(self) -> list[str]:
        raise NotImplementedError


    def dispatcher(self) -> Dispatcher:
        """The worker handler that routes jobs to these tasks by name."""
        if not self._tasks:
            raise InvalidArgument("this Tasks object has no tasks to serve")
        return Dispatcher(dict(self._tasks), self._raw, list(self._middleware))

    def needs_event_loop(self) -> bool:
        """Whether a task or hook is ``async def`` (its worker must be an AsyncWorker)."""
        return self.dispatcher().needs_event_loop or any(
            inspect.iscoroutinefunction(h) for h in self.on_start + self.on_stop
        )

    def worker(self, queues: Sequence[str] | None = None, **options: Any) -> Worker:
        """A worker serving every task on the queues they name (or ``queues``): an
        :class:`~pyqueue.worker.aio.AsyncWorker` if any task or hook is ``async def``,
        else a :class:`~pyqueue.worker.Worker`. ``options`` are the worker's (concurrency,
        lease_ms, ...). Run it with :meth:`run_worker` (or ``pyqueue worker module:tasks``),
        which also runs the start and stop hooks."""
        names = list(queues) if queues else self.queue_names()
        unknown = sorted(set(names) - set(self.queue_names()))
        if unknown:
            log.warning("queues %s have no task of this Tasks object: their jobs will be retried, then dead", unknown)
        if "batch" in options or "batch_wait_ms" in options:
            raise InvalidArgument("a task worker runs in batches the tasks registered with @tasks.task(batch=...): "
                                  "give batch= to the task, not to the worker")
        options["partitions"] = self._worker_partitions(names, options.get("partitions"))
        if options.get("redis") is not None:
            self.connection.adopt(options["redis"])
        options.setdefault("redis", self.redis)
        options.setdefault("prefix", self.prefix)
        cls = AsyncWorker if self.needs_event_loop() else Worker
        return cls(names, self.dispatcher(), **options)

    def _worker_partitions(self, names: Sequence[str], given: Mapping[str, int] | None) -> dict[str, int]:
        """The partition counts of the served queues: this object's, and those the worker
        was given (``pyqueue worker --partitions``), which must agree with them."""
        given = check_partition_counts(given, "the worker's partitions")
        mine = {name: count for name, count in self.connection.partitions.items() if name in names}
        for name, count in given.items():
            if mine.get(name, count) != count:
                raise InvalidArgument(f"queue {name!r}: the Tasks object says {mine[name]} partitions, the worker "
                                      f"was given {count}: give both the count recorded for it")
        return {**mine, **given}

    def run_worker(self, worker: Worker, *, burst: bool = False, install_signal_handlers: bool = True) -> int:
        """Run the start hooks, ``worker`` until it stops, then the stop hooks; the
        worker's exit code. An AsyncWorker runs in a new event loop (``asyncio.run``)."""
        if isinstance(worker, AsyncWorker):
            return asyncio.run(self.arun_worker(worker, burst=burst, install_signal_handlers=install_signal_handlers))
        if self.needs_event_loop():
            raise InvalidArgument("a task or hook is async def: run these tasks with an AsyncWorker (Tasks.worker())")
        for hook in self.on_start:
            hook()
        try:
            return worker.run(burst=burst, install_signal_handlers=install_signal_handlers)
        finally:
            for hook in self.on_stop:
                hook()

    async def arun_worker(self, worker: AsyncWorker, *, burst: bool = False, install_signal_handlers: bool = True) -> int:
        """:meth:`run_worker` in the running event loop (hooks may be ``async def``)."""
        for hook in self.on_start:
            await _maybe_await(hook())
        try:
            return await worker.run(burst=burst, install_signal_handlers=install_signal_handlers)
        finally:
            for hook in self.on_stop:
                await _maybe_await(hook())


async def _maybe_await(value: object) -> None:
    if inspect.isawaitable(value):
        await value
