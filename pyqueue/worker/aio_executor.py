"""The asyncio executor: ``async def`` handlers run as tasks of an event loop.

A :class:`~pyqueue.worker.executor.ThreadExecutor` whose handler threads hand each
coroutine to the loop (``run_coroutine_threadsafe``) and wait for it, so at most
``concurrency`` handler tasks run at once, and the job is acked (by group commit), or
nacked, exactly as with a sync handler once the task has finished. A plain function
runs in its handler thread, as in the sync worker. Stopping a job: at its time limit,
or when its lease ended without this worker, its task is cancelled
(:class:`asyncio.CancelledError` at its next ``await``; one cancelled at its time limit
ends as :class:`~pyqueue.worker.slots.TimeLimitExceeded`, unless it catches the
cancellation and returns); a plain handler's thread gets TimeLimitExceeded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Awaitable
from typing import Any

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job, Outcome
from pyqueue.worker.executor import ThreadExecutor, handler_functions, is_async_handler
from pyqueue.worker.slots import Slot, TimeLimitExceeded, current_slot


class _Awaiting:
    """A handler's coroutine handed to the event loop: the future its handler thread
    waits on, and (once it runs) its asyncio task."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: concurrent.futures.Future[Any] | None = None
        self.task: asyncio.Task[Any] | None = None

    async def run(self, awaitable: Awaitable[Any]) -> Any:
        """``run_coroutine_threadsafe`` takes a coroutine: this one, around any awaitable."""
        self.task = asyncio.current_task()
        return await awaitable

    def cancel(self) -> None:
        """Cancel the coroutine, from any thread, as often as needed. Its asyncio task
        is cancelled, not the future: the future (and the handler thread waiting on it)
        ends only when the coroutine has really ended, so one that swallows the
        cancellation keeps its slot taken (and is written off) rather than running on
        unaccounted. Before the task has started, the future is cancelled instead."""
        task = self.task
        if task is not None:
            self.loop.call_soon_threadsafe(task.cancel)
        elif self.future is not None:
            self.future.cancel()


class AsyncioExecutor(ThreadExecutor):
    """Runs ``async def`` handlers as tasks of :attr:`loop` (set before the worker
    starts: the loop that awaits ``AsyncWorker.run``), plain ones in handler threads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop: asyncio.AbstractEventLoop | None = None
        # receipt -> its task; None while the coroutine is being handed to the loop
        self._tasks: dict[str, _Awaiting | None] = {}
        self._tasks_lock = threading.Lock()

    @staticmethod
    def check_handler(handler: object) -> None:
        # Coroutine functions and plain functions run (handler_functions refuses what is
        # not callable). An async generator would yield, not run, its job: refused.
        if any(inspect.isasyncgenfunction(c) for c in handler_functions(handler)):
            raise InvalidArgument(
                f"handler {getattr(handler, '__qualname__', handler)!r} is an async generator function: "
                "give the worker an async def function that runs the job"
            )

    def call_handler(self, job: Job) -> object:
        if not is_async_handler(self.handler):
            return self.handler(job)
        slot = current_slot()
        assert slot is not None
        return self.run_awaitable(slot, self.handler(job))

    def run_awaitable(self, slot: Slot, awaitable: Any) -> Any:
        """Run ``awaitable`` as a task of the worker's event loop and wait for it in this
        handler thread; the task is cancelled if the job's lease ends without this
        worker (cancel, a lost lease) or at its time limit."""
        assert self.loop is not None
        key = slot.key  # a batch's slot: not any one job's receipt, which lease_ended looks up
        with self._tasks_lock:
            self._tasks[key] = None  # from here a limit or a cancel cancels, never interrupts the thread
        try:
            awaiting = _Awaiting(self.loop)
            awaiting.future = task = asyncio.run_coroutine_threadsafe(awaiting.run(awaitable), self.loop)
            with self._tasks_lock:
                self._tasks[key] = awaiting
                # The limit or the cancel came while the task was handed over: cancel it now.
                late = slot.interrupted_at is not None or slot.abandoned
            if late:
                awaiting.cancel()
            try:
                return task.result()
            except concurrent.futures.CancelledError:
                if slot.reached:  # cancelled at its time limit: that is how it ended
                    raise TimeLimitExceeded(f"cancelled at its time limit of {slot.limit_s:g}s") from None
                raise
        finally:
            with self._tasks_lock:
                self._tasks.pop(key, None)

    def interrupt(self, slot: Slot) -> None:
        """At the time limit, an ``async def`` handler's task is cancelled; a plain
        handler's thread gets :class:`~pyqueue.worker.slots.TimeLimitExceeded`."""
        with self._tasks_lock:
            awaiting = slot.key in self._tasks
            task = self._tasks.get(slot.key)
            if awaiting:
                slot.interrupted_at = slot.interrupted_at or time.monotonic()
        if task is not None:
            slot.interrupted_at = time.monotonic()  # again: a coroutine that swallowed it is cancelled again
            task.cancel()
        elif not awaiting:
            slot.interrupt()

    def lease_ended(self, job: Job, outcome: Outcome) -> None:
        """As :meth:`ThreadExecutor.lease_ended`, and an ``async def`` handler's task is
        cancelled (it sees :class:`asyncio.CancelledError` at its next ``await``). A job
        of a batch only gets ``job.cancelled`` set: the batch's task runs on for the
        others (its tasks are not known by any one job's receipt)."""
        super().lease_ended(job, outcome)
        with self._tasks_lock:
            task = self._tasks.get(job.receipt)
        if task is not None:
            task.cancel()

    def cancel_abandoned(self) -> None:
        """Cancel the tasks still running once the worker has ended: their jobs were
        released at the end of the grace period (or the worker was killed)."""
        with self._tasks_lock:
            abandoned = [task for task in self._tasks.values() if task is not None]
        for task in abandoned:
            task.cancel()
