"""The asyncio worker: ``async def`` handlers run as tasks of your event loop, with the
sync worker's lifecycle and promises unchanged.

::

    from pyqueue.worker.aio import AsyncWorker

    async def send_email(job):
        await smtp.send(job.json())

    exit_code = await AsyncWorker(["emails"], send_email, redis=client, concurrency=50).run()

``pyqueue worker module:function`` runs this worker when the function is a coroutine
function.

How it is built, and why: the part of a worker that keeps the promises (registration,
the renewal that confirms it before every lease, lease extension, the scrub of dead
services, remote stop, group commit, graceful drain) is subtle, and it exists once, in
the parts of :mod:`pyqueue.worker` that :class:`pyqueue.worker.Worker` composes. This
class is that Worker with another executor
(:class:`~pyqueue.worker.aio_executor.AsyncioExecutor`): the machinery runs in threads
beside the event loop, and each job's handler runs on the loop: a handler thread hands
the coroutine to the loop (``run_coroutine_threadsafe``) and waits for it, so at most
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
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from pyqueue.protocol.models import Job
from pyqueue.worker.aio_executor import AsyncioExecutor
from pyqueue.worker.batch import BatchHandler
from pyqueue.worker.executor import Handler
from pyqueue.worker.worker import Worker

__all__ = ["AsyncBatchHandler", "AsyncHandler", "AsyncWorker"]

#: A handler: an ``async def`` function of a Job, or a plain one.
AsyncHandler = Callable[[Job], Awaitable[object]] | Callable[[Job], object]
#: A batch handler (``batch=N``): an ``async def`` function of a list of jobs returning
#: one result per job, or a plain one (:data:`~pyqueue.worker.batch.BatchHandler`).
AsyncBatchHandler = Callable[[list[Job]], Awaitable[Sequence[object]]] | BatchHandler


class AsyncWorker(Worker):
    """A :class:`~pyqueue.worker.Worker` (same arguments, same lifecycle, same exit
    codes) whose handler may be an ``async def`` function, run as a task of the event
    loop that awaits :meth:`run`, at most ``concurrency`` at once. Delivery is the sync
    worker's: at least once; a job is acked only after its task returned."""

    executor_class = AsyncioExecutor
    executor: AsyncioExecutor

    def __init__(self, queues: Any, handler: AsyncHandler | AsyncBatchHandler, **options: Any) -> None:
        # (The sync Worker's type of handler, which this executor widens to coroutines.)
        super().__init__(queues, cast("Handler | BatchHandler", handler), **options)

    @property
    def _loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the handlers' tasks run on (set by :meth:`run`; a test harness
        that drives the worker's parts itself sets it)."""
        return self.executor.loop

    @_loop.setter
    def _loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.executor.loop = loop

    async def run(self, *, burst: bool = False, install_signal_handlers: bool = True) -> int:  # type: ignore[override]
        """Register, serve until stopped, shut down cleanly; the exit code (see
        :meth:`pyqueue.worker.Worker.run`). Awaiting it keeps the event loop free: the
        worker's own I/O runs in its threads."""
        loop = self.executor.loop = asyncio.get_running_loop()
        installed = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.control.on_signal, sig, None)
                installed.append(sig)
        try:
            return await asyncio.to_thread(Worker.run, self, burst=burst, install_signal_handlers=False)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            self.executor.cancel_abandoned()  # released at the end of the grace period, or killed
