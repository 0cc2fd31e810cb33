"""The asyncio worker: ``async def`` handlers run as tasks of your event loop, with the
sync worker's lifecycle and promises unchanged.

::

    from pyqueue.aio_worker import AsyncWorker

    async def send_email(job):
        await smtp.send(job.json())

    exit_code = await AsyncWorker(["emails"], send_email, redis=client, concurrency=50).run()

``pyqueue worker module:function`` runs this worker when the function is a coroutine
function.

How it is built, and why: the part of a worker that keeps the promises (registration,
the renewal that confirms it before every lease, lease extension, the scrub of dead
services, remote stop, group commit, graceful drain) is subtle, and it exists once, in
:class:`pyqueue.worker.Worker`. This class runs that machinery in threads beside the
event loop, and runs each job's handler on the loop: a handler thread hands the
coroutine to the loop (``run_coroutine_threadsafe``) and waits for it, so at most
``concurrency`` handler tasks run at once, and the job is acked (by group commit), or
nacked, exactly as with a sync handler once the task has finished. A plain function
given to this worker runs in its handler thread, as in the sync worker. The fetch
loop's blocking wait (``BZPOPMIN`` on the wake markers) stays on its own connection in
its thread: the event loop never blocks on Redis.

Signals: ``run`` installs SIGTERM and SIGINT handlers on the event loop (when it runs
in the main thread): the first drains gracefully, the second exits at once. When the
grace period ends with handlers still running, their jobs are released to other
workers and their tasks are cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pyqueue.errors import InvalidArgument
from pyqueue.models import Job, Outcome
from pyqueue.slots import Slot, current_slot
from pyqueue.worker import Worker, handler_functions, is_async_handler


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

#: A handler: an ``async def`` function of a Job, or a plain one.
AsyncHandler = Callable[[Job], Awaitable[object]] | Callable[[Job], object]


class AsyncWorker(Worker):
    """A :class:`~pyqueue.worker.Worker` (same arguments, same lifecycle, same exit
    codes) whose handler may be an ``async def`` function, run as a task of the event
    loop that awaits :meth:`run`, at most ``concurrency`` at once. Delivery is the sync
    worker's: at least once; a job is acked only after its task returned."""

    def __init__(self, queues: Any, handler: AsyncHandler, **options: Any) -> None:
        super().__init__(queues, handler, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        # receipt -> its task; None while the coroutine is being handed to the loop
        self._tasks: dict[str, _Awaiting | None] = {}
        self._tasks_lock = threading.Lock()

    def check_handler(self, handler: object) -> None:
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
        assert self._loop is not None
        receipt = slot.job.receipt
        with self._tasks_lock:
            self._tasks[receipt] = None  # from here a limit or a cancel cancels, never interrupts the thread
        try:
            awaiting = _Awaiting(self._loop)
            awaiting.future = task = asyncio.run_coroutine_threadsafe(awaiting.run(awaitable), self._loop)
            with self._tasks_lock:
                self._tasks[receipt] = awaiting
                # The limit or the cancel came while the task was handed over: cancel it now.
                late = slot.interrupted_at is not None or slot.job.cancelled.is_set()
            if late:
                awaiting.cancel()
            return task.result()
        finally:
            with self._tasks_lock:
                self._tasks.pop(receipt, None)

    def interrupt(self, slot: Slot) -> None:
        """At the time limit, an ``async def`` handler's task is cancelled; a plain
        handler's thread gets :class:`~pyqueue.slots.TimeLimitExceeded`."""
        with self._tasks_lock:
            awaiting = slot.job.receipt in self._tasks
            task = self._tasks.get(slot.job.receipt)
            if awaiting:
                slot.interrupted_at = slot.interrupted_at or time.monotonic()
        if task is not None:
            slot.interrupted_at = time.monotonic()  # again: a coroutine that swallowed it is cancelled again
            task.cancel()
        elif not awaiting:
            slot.interrupt()

    def lease_ended(self, job: Job, outcome: Outcome) -> None:
        """As :meth:`Worker.lease_ended`, and an ``async def`` handler's task is
        cancelled (it sees :class:`asyncio.CancelledError` at its next ``await``)."""
        super().lease_ended(job, outcome)
        with self._tasks_lock:
            task = self._tasks.get(job.receipt)
        if task is not None:
            task.cancel()

    async def run(self, *, burst: bool = False, install_signal_handlers: bool = True) -> int:  # type: ignore[override]
        """Register, serve until stopped, shut down cleanly; the exit code (see
        :meth:`pyqueue.worker.Worker.run`). Awaiting it keeps the event loop free: the
        worker's own I/O runs in its threads."""
        loop = self._loop = asyncio.get_running_loop()
        installed = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig, None)
                installed.append(sig)
        try:
            return await asyncio.to_thread(Worker.run, self, burst=burst, install_signal_handlers=False)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            with self._tasks_lock:
                abandoned = [task for task in self._tasks.values() if task is not None]
            for task in abandoned:  # released at the end of the grace period, or killed
                task.cancel()
