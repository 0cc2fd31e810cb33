"""Executors: where a job's handler runs.

Every executor has one interface (:class:`Executor`): **run this job** (:meth:`submit`,
for a job the fetch loop leased into a free slot), **report how it ended** (to the
:class:`~pyqueue.worker.endings.Endings`, which sends the ack or nack), and **stop it**
(:meth:`interrupt` at its time limit, :meth:`lease_ended` when its lease ended without
this worker, :meth:`shutdown` when the worker ends). What each can interrupt differs,
and is said honestly per executor (:mod:`pyqueue.worker.slots`): the lease is the backstop.

:class:`ThreadExecutor` (the sync :class:`~pyqueue.worker.Worker`'s): ``concurrency``
**handler threads** take work from one queue (a ``queue.SimpleQueue``, the cheapest
hand-off between threads CPython has). A thread runs a job, posts its ack to the
commit loop (:mod:`pyqueue.worker.commit`), and takes the next job at once; the commit loop puts
the jobs it leased in their place on the same queue, in the slots of the jobs they
replace. So a thread waits only when there is no job to run, never on an ack's round
trip. A time limit raises :class:`~pyqueue.worker.slots.TimeLimitExceeded` in the thread; a job
whose lease ended gets ``job.cancelled`` set.

:class:`~pyqueue.worker.aio_executor.AsyncioExecutor` (the
:class:`~pyqueue.worker.aio.AsyncWorker`'s) is a ThreadExecutor whose handler threads
hand each ``async def`` handler's coroutine to the event loop and wait for it.
"""

from __future__ import annotations

import inspect
import logging
import queue as queue_lib
import threading
from collections.abc import Callable
from typing import Any, Protocol

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job, Outcome
from pyqueue.worker.endings import Endings
from pyqueue.worker.handler import spec_of
from pyqueue.worker.settings import Served, WorkerSettings
from pyqueue.worker.slots import Parked, Slot, TimeLimitExceeded, enter_slot

log = logging.getLogger("pyqueue.worker")

Handler = Callable[[Job], object]

#: A handler thread acks and leases in the same partition of a partitioned first queue
#: at most this many times in a row (then a lease round moves on to the next partition).
PARTITION_STREAK = 16


class Executor(Protocol):
    """Runs handlers (see the module docstring)."""

    #: The lease length: a slot dates its job's lease start from it.
    lease_ms: int

    def start(self) -> None:
        """Get ready to run jobs (the worker is registered)."""

    def submit(self, job: Job) -> None:
        """Run ``job`` in the slot the fetch loop took for it; report its end to the
        endings, then give the slot back."""

    def interrupt(self, slot: Slot) -> None:
        """Stop the work of ``slot``: it reached its time limit (its lease is ended)."""

    def lease_ended(self, job: Job, outcome: Outcome) -> None:
        """``job``'s lease ended without this worker (cancelled, or lost): tell its handler."""

    def run_awaitable(self, slot: Slot, awaitable: Any) -> Any:
        """Run a coroutine for the job of ``slot``, or refuse."""

    def describe(self, slot: Slot) -> str:
        """How logs name a running job."""

    def shutdown(self) -> None:
        """Run no more jobs; running handlers are not waited for (the worker's shutdown
        has waited out the grace period, or the process was killed)."""


class ThreadExecutor:
    """Runs handlers in ``concurrency`` threads (see the module docstring).

    Args:
        handler: called with each job in a handler thread (:meth:`call_handler`).
        settings: the worker's; read: ``concurrency``, ``lease_ms``.
        served: the worker's queues. If the first is partitioned, a slot leases in the
            same partition at most :data:`PARTITION_STREAK` times in a row.
        endings: how each run ends (and its commit loop, which this executor runs).
    """

    def __init__(
        self, handler: Handler, settings: WorkerSettings, served: Served, endings: Endings,
    ) -> None:
        self.handler = handler
        self.concurrency = settings.concurrency
        self.lease_ms = settings.lease_ms
        self.running = endings.running
        self.endings = endings
        self.crash = endings.crash
        self.partitioned_first = served.partitioned_first
        #: Sends the acks the handler threads post; it hands the jobs it leases in their
        #: place back to this executor (:meth:`resume`), and runs while the executor does.
        self.commit_loop = endings.commit_loop
        self.commit_loop.hand_out = self.resume
        #: The handler threads' work: (function, *arguments) to call; None ends a thread.
        self._work: queue_lib.SimpleQueue[tuple[Any, ...] | None] = queue_lib.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @staticmethod
    def check_handler(handler: object) -> None:
        """Refuse a handler this executor cannot run (:func:`check_sync_handler`)."""
        check_sync_handler(handler)

    def start(self) -> None:
        # Daemon threads: one stuck past its time limit in C code must not hold the
        # process at exit (its job was ended by the heartbeat, its slot written off).
        self._threads = [
            threading.Thread(target=self._serve_forever, name=f"pyqueue-handler-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in self._threads:
            thread.start()
        self.commit_loop.start()

    def _serve_forever(self) -> None:
        get = self._work.get
        while (work := get()) is not None:
            try:
                work[0](*work[1:])
            except BaseException:  # the slot was given back; the thread must live on for the next one
                log.exception("a handler thread's work failed (the worker's own error, not a handler's)")

    #: Whether jobs run in the thread that hands them over (:meth:`run_here`).
    inline = False

    def run_here(self) -> None:
        """Run each job (or batch) in the thread that hands it over, at once, and end it
        without leasing its successor: no handler thread and no commit loop. How
        ``tasks.testing().drain()`` drives the real lease round
        (:meth:`~pyqueue.worker.fetch.FetchLoop.lease_round`) one job at a time, its
        errors raised where it can see them. Call it instead of :meth:`start`."""
        self.inline = True

    def _hand(self, work: tuple[Any, ...]) -> None:
        if self.inline:
            work[0](*work[1:])
        else:
            self._work.put(work)

    def submit(self, job: Job) -> None:
        self._hand((self.serve, job, 1))

    def resume(self, job: Job, streak: int) -> None:
        """Run ``job``, which the commit loop leased in the slot of the job it replaces,
        the ``streak``-th job in a row that slot leased for itself."""
        self._hand((self.serve, job, streak))

    def spawn(self, serve: Callable[..., None], *args: Any) -> None:
        """Run ``serve(*args)`` in a handler thread, in the slot the caller took for it
        (a batch of jobs: :mod:`pyqueue.worker.batch`)."""
        self._hand((serve, *args))

    def shutdown(self) -> None:
        for _ in self._threads:
            self._work.put(None)  # a thread ends once it is done with what it runs
        self.commit_loop.close()  # once it has sent what was posted

    def serve(self, job: Job, streak: int) -> None:
        """Run ``job`` in its slot; the slot passes on to the commit loop with its ack
        (which leases a job in its place, in a partitioned queue at most
        PARTITION_STREAK in a row: then the slot goes back to a lease round, which moves
        on to the next partition), or is given back here."""
        handed_on = False
        try:
            if job.cancelled.is_set() or not self.running.is_tracked(job):
                # Its lease ended while it waited for a thread (a prefetched job that was
                # cancelled, or released at the end of a stop's grace period): not run.
                self.running.untrack(job)
                log.info("job %s: its lease ended before it started; not run", job.id)
            else:
                may_lease = not self.inline and (not self.partitioned_first or streak < PARTITION_STREAK)
                handed_on = self.run_one(job, may_lease=may_lease, streak=streak)
        finally:
            if not handed_on:
                self.running.give_back()

    def run_one(self, job: Job, *, may_lease: bool = True, streak: int = 1) -> bool:
        """Run ``job``'s handler in this thread, then end it (:meth:`Endings.end`);
        whether its slot passed on to the commit loop."""
        error: BaseException | None = None
        result: object = None
        slot = Slot(job, self.lease_ms, self)
        self.running.enter(slot)
        enter_slot(slot)
        try:
            try:
                self.crash.at("in_handler")
                result = slot.call(self.call_handler, job)
            # The handler's failure is the job's outcome. SystemExit too (sys.exit() in a
            # handler thread ends only that call): let through, it would leave the job
            # leased, extended and never ended. Parked: the handler parked its job.
            except (Exception, SystemExit, TimeLimitExceeded, Parked) as exc:
                error = exc
        finally:
            enter_slot(None)
            self.running.leave(slot)
        return self.endings.end(job, slot, result, error, may_lease=may_lease, streak=streak)

    def call_handler(self, job: Job) -> object:
        """Run the handler on ``job`` in this handler thread; what it returns."""
        return self.handler(job)

    def describe(self, slot: Slot) -> str:
        """How logs name a running job: its id, and its task when the handler named one."""
        return str(slot)

    def run_awaitable(self, slot: Slot, awaitable: Any) -> Any:
        """Run a coroutine for the job in ``slot`` (see :meth:`Slot.run_awaitable`): this
        sync worker has no event loop, so it refuses, loudly."""
        close = getattr(awaitable, "close", None)
        if callable(close):
            close()
        raise InvalidArgument(
            f"{self.describe(slot)} needs an event loop (an async def task) and this sync Worker has none: "
            "run it with pyqueue.worker.aio.AsyncWorker (pyqueue worker picks that one by itself)"
        )

    def interrupt(self, slot: Slot) -> None:
        """Stop the work of ``slot`` at its time limit (threads: an asynchronous
        :class:`TimeLimitExceeded`)."""
        slot.interrupt()

    def lease_ended(self, job: Job, outcome: Outcome) -> None:
        """A running job's lease ended without this worker (extend answered ``outcome``):
        GONE, the job was cancelled (or removed); STALE, the lease was lost and another
        worker may hold the job. Tell the handler (``job.cancelled``); its result will be
        neither acked nor nacked."""
        if outcome is Outcome.GONE:
            log.info("job %s was cancelled while running: telling its handler", job.id)
        else:
            log.warning("job %s lost its lease (%s) while running: telling its handler", job.id, outcome.value)
        job.cancelled.set()


def check_sync_handler(handler: object) -> None:
    """Refuse a handler this thread-pool worker cannot run: an ``async def`` function
    (or a callable whose ``__call__`` is one, or a partial of one) would return a
    coroutine that nobody awaits, and the job would be acked without having run.

    Raises:
        InvalidArgument: not callable, a coroutine or async generator function, or a
            handler that declares it runs coroutines (its HandlerSpec's
            ``needs_event_loop``: the task layer's dispatcher of ``async def`` tasks).
    """
    if spec_of(handler).needs_event_loop:
        raise InvalidArgument(
            f"handler {handler!r} runs async def tasks: this sync Worker has no event loop to run them on. Run it "
            "with pyqueue.worker.aio.AsyncWorker (Tasks.worker() and pyqueue worker pick that one by themselves)."
        )
    if is_async_handler(handler):
        raise InvalidArgument(
            f"handler {getattr(handler, '__qualname__', handler)!r} is an async function: this sync Worker "
            "would never await it, so its jobs would be acked without running. Give it a plain function, or "
            "run it with pyqueue.worker.aio.AsyncWorker (pyqueue worker picks that one by itself)."
        )


def is_async_handler(handler: object) -> bool:
    """Whether ``handler`` is an ``async def`` function (or a callable whose ``__call__``
    is one, or a partial of one), or an async generator function.

    Raises:
        InvalidArgument: not callable.
    """
    return any(inspect.iscoroutinefunction(c) or inspect.isasyncgenfunction(c) for c in handler_functions(handler))


def handler_functions(handler: object) -> tuple[object, object]:
    """``handler`` and its class's ``__call__`` (what an instance handler runs): the two
    places an ``async def`` may hide.

    Raises:
        InvalidArgument: not callable.
    """
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, got {type(handler).__name__}")
    return handler, getattr(type(handler), "__call__", None)


class ExecutorHooks:
    """What a :class:`~pyqueue.worker.slots.Slot` asks of its owner (a worker), passed to the
    worker's executor: the worker is each slot's owner, the executor does the work."""

    executor: ThreadExecutor
    executor_class: type[ThreadExecutor]

    @property
    def handler(self) -> Handler:
        """The handler the executor runs (settable: a test harness wraps it)."""
        return self.executor.handler

    @handler.setter
    def handler(self, handler: Handler) -> None:
        self.executor.handler = handler

    def check_handler(self, handler: object) -> None:
        """Refuse a handler this worker cannot run (:func:`check_sync_handler`)."""
        self.executor_class.check_handler(handler)

    def call_handler(self, job: Job) -> object:
        """Run the handler on ``job`` in this handler thread; what it returns."""
        return self.executor.call_handler(job)

    def describe(self, slot: Slot) -> str:
        """How logs name a running job: its id, and its task when the handler named one."""
        return self.executor.describe(slot)

    def run_awaitable(self, slot: Slot, awaitable: Any) -> Any:
        """Run a coroutine for the job in ``slot``: a sync worker refuses (InvalidArgument)."""
        return self.executor.run_awaitable(slot, awaitable)

    def interrupt(self, slot: Slot) -> None:
        """Stop the work of ``slot`` at its time limit (see the executor's ``interrupt``)."""
        self.executor.interrupt(slot)

    def lease_ended(self, job: Job, outcome: Outcome) -> None:
        """Tell the handler of ``job`` that its lease ended without this worker (cancelled,
        or lost: ``job.cancelled``); its result will be neither acked nor nacked."""
        self.executor.lease_ended(job, outcome)
