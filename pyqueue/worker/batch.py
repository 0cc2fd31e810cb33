"""Batch handlers: one handler call for up to N jobs of one queue (DESIGN §16, issue #21).

``Worker(queues, handler, batch=100, batch_wait_ms=50)`` calls ``handler(jobs)`` with a
``list[Job]`` of 1..100 jobs of one queue, and the handler returns one result per job,
in order. A task with ``@tasks.task(batch=...)`` is run the same way
(:meth:`pyqueue.tasks.dispatch.Dispatcher.run_batch`).

How a batch is made. The fetch loop, for a queue served in batches, asks one lease call
for ``batch`` jobs per free handler slot and cuts what it gets into batches of at most
``batch``, one slot each. A slot that finished a batch of the first queue acks it and
leases the next batch in the same ``lease`` call. A batch that came back short waits to
fill, at most ``batch_wait_ms`` from then: its slot asks for the rest every
:data:`FILL_POLL_S` (a lease call each) and runs what it has at the deadline, or at once
when the worker stops. With ``batch_wait_ms=0`` (the default) a batch is what one lease
call returned. The jobs waiting for their batch to fill are leased (extended by the
heartbeat like running ones).

How it ends, per job (:mod:`pyqueue.worker.batch_endings`): each job's result is its
outcome, as if a handler of that job alone had returned it (acked, with its result if
kept) or raised it (an exception instance: nacked by the same rules, :class:`Retry`,
:class:`Fail` and max attempts included). The handler raising, or returning anything
but a list (or tuple) of one result per job, fails every job of the batch with that
error. The successes are acked in one call, which also leases the next batch; the
failures are nacked in one pipelined round trip (``lua/nack.lua`` takes one receipt).

What applies per job as for single jobs: leases (the heartbeat extends every job of a
running batch), fences, retries, cancels (a job cancelled while its batch runs gets
``job.cancelled`` set at the next extension and is neither acked nor nacked; its ack
would answer GONE and change nothing), the release of running jobs at shutdown, and
``--max-jobs-per-child`` (which counts jobs). What applies per batch: a handler slot
(``concurrency`` counts batches), and a time limit (``BatchSlot.limit_each``): at the
limit every job still running is nacked, fenced, as a single job at its limit.

Delivery: at least once, per job, as every job.
"""

from __future__ import annotations

import inspect
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence

from pyqueue.protocol.core import MAX_BATCH
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job
from pyqueue.drivers.queue import Queue
from pyqueue.worker.batch_endings import BatchEndings, BatchError
from pyqueue.worker.executor import PARTITION_STREAK, ThreadExecutor
from pyqueue.worker.handler import BatchSpec, spec_of
from pyqueue.worker.settings import Served, WorkerSettings
from pyqueue.worker.retries import RETRY_ON
from pyqueue.worker.slots import AwaitableRunner, LimitEnding, Slot, TimeLimitExceeded, current_slot, enter_slot

__all__ = ["BatchError", "BatchHandler", "BatchRunner", "BatchSlot"]

log = logging.getLogger("pyqueue.worker")

#: The largest batch: what one lease call leases and one ack call acks.
#: While a short batch waits to fill, its slot asks for the rest this often.
FILL_POLL_S = 0.01

#: A batch handler: called with the jobs of one batch, returns one result per job, in
#: order (a value: the job is done; an exception instance: the job failed).
BatchHandler = Callable[[list[Job]], Sequence[object]]


class BatchSlot(Slot):
    """The handler slot of one batch: a :class:`Slot` whose work is N jobs. The time
    limit is the batch's, counted from the lease of its first job (``leased_at``, on
    this process's monotonic clock: a batch that waited to fill has used that wait),
    and at the limit each job ends as :attr:`endings` says (by receipt; else as
    :attr:`ending`)."""

    __slots__ = ("batch", "endings")

    def __init__(self, jobs: Sequence[Job], leased_at: float, lease_ms: int, runner: AwaitableRunner) -> None:
        super().__init__(jobs[0], lease_ms, runner)  # the first job is the earliest leased
        # The slot's clock (server_now_ms, the limit) runs from the first lease, not from now.
        self.started = leased_at
        self.batch = tuple(jobs)
        self.endings: dict[str, LimitEnding] = {}

    def __str__(self) -> str:
        jobs = f"job {self.job.id}" if len(self.batch) == 1 else f"jobs {self.job.id}..{self.batch[-1].id}"
        return f"batch of {len(self.batch)} ({jobs})" + (f" [{self.name}]" if self.name else "")

    @property
    def jobs(self) -> tuple[Job, ...]:
        return self.batch

    @property
    def key(self) -> str:
        return "batch:" + self.job.receipt

    def ending_for(self, job: Job) -> LimitEnding | None:
        return self.endings.get(job.receipt, self.ending)

    @property
    def abandoned(self) -> bool:
        return all(job.cancelled.is_set() for job in self.batch)

    def limit_each(self, seconds: float, endings: Mapping[str, LimitEnding], grace_s: float) -> None:
        """Interrupt the batch ``seconds`` after it started and stop it ``grace_s`` later
        (:meth:`Slot.limit`); a job ended by the limit ends as ``endings`` (by receipt,
        at least one) says."""
        self.endings = dict(endings)
        self.limit(seconds, next(iter(self.endings.values())), grace_s)


class BatchRunner:
    """Runs the batches of a worker's batch queues (see the module docstring).

    Args:
        specs: the batch spec of each (physical) queue served in batches.
        handler: the batch handler.
        endings: how each job of a batch ends (and the worker's shared state).
        executor: the worker's executor, whose threads run the batches.
        partitioned_first: the first queue is partitioned: a slot then leases in the
            same partition at most :data:`PARTITION_STREAK` times in a row.
    """

    def __init__(
        self, specs: Mapping[str, BatchSpec], handler: Callable[[list[Job]], object], endings: BatchEndings, *,
        executor: ThreadExecutor, partitioned_first: bool,
    ) -> None:
        self.specs = dict(specs)
        self.handler = handler
        self.executor = executor
        self.running = endings.running
        self.control = endings.control
        self.registration = endings.registration
        self.crash = endings.crash
        self.retrying = endings.retrying
        self.endings = endings
        self.lease_ms = endings.lease_ms
        self.partitioned_first = partitioned_first

    @staticmethod
    def of(handler: object, settings: WorkerSettings, served: Served, executor: ThreadExecutor) -> BatchRunner | None:
        """The batch runner of a worker, or None if it serves no queue in batches.

        With ``settings.batch``, every queue of the worker is served in batches of
        ``handler`` (a :data:`BatchHandler`). Else a handler that serves some queues in batches says
        so in its :class:`~pyqueue.worker.handler.HandlerSpec` (``batch_queues``, queue
        name -> :class:`BatchSpec`, and ``run_batch``: the task layer's dispatcher); its
        other queues are served one job per call.

        Raises:
            InvalidArgument: a bad ``batch`` or ``batch_wait_ms``, ``batch_wait_ms``
                without ``batch``, or ``batch`` for a handler that sets its own batches.
        """
        declared = spec_of(handler)
        batch, batch_wait_ms = settings.batch, settings.batch_wait_ms
        in_batches: Mapping[str, BatchSpec] | None = declared.batch_queues
        if batch is None:
            if batch_wait_ms is not None:
                raise InvalidArgument("batch_wait_ms is the wait of a batch handler: give batch=N with it")
            if not in_batches:
                return None
            if declared.run_batch is None:
                raise InvalidArgument("a handler that declares batch_queues must declare run_batch too")
            batch_handler: Callable[[list[Job]], object] = declared.run_batch
        else:
            if in_batches is not None:
                raise InvalidArgument(
                    "this handler sets its own batches (the tasks' @tasks.task(batch=...)): do not give the worker batch="
                )
            spec = BatchSpec.of(batch, 0 if batch_wait_ms is None else batch_wait_ms)
            in_batches = {name: spec for name in served.names}
            batch_handler = handler  # type: ignore[assignment]  # the worker's handler is a BatchHandler here
        specs = {
            part.name: in_batches[logical.name]
            for logical, group in zip(served.logical, served.groups) if logical.name in in_batches
            for part in group
        }
        if not specs:
            return None
        endings = BatchEndings(executor.endings, settings.lease_ms)
        return BatchRunner(specs, batch_handler, endings, executor=executor, partitioned_first=served.partitioned_first)

    def lease_count(self, queue: Queue, free: int) -> int | None:
        """How many jobs a lease round asks ``queue`` for with ``free`` slots: a batch
        per slot; None if the queue is not served in batches."""
        spec = self.specs.get(queue.name)
        return None if spec is None else min(MAX_BATCH, free * spec.size)

    def hand_out(self, queue: Queue, jobs: list[Job]) -> None:
        """Jobs a lease round leased from ``queue`` (at most a batch per free slot): cut
        into batches, each run in a slot of its own."""
        size = self.specs[queue.name].size
        batches = [jobs[i : i + size] for i in range(0, len(jobs), size)]
        self.running.take(len(batches))
        self.running.track_all(jobs)
        leased_at = time.monotonic()
        for batch in batches:
            self.executor.spawn(self.serve, queue, batch, leased_at)

    def serve(self, queue: Queue, first: list[Job], leased_at: float) -> None:
        """Run batches in this slot: ``first`` (leased at the monotonic ``leased_at``),
        then each batch leased with the acks of the one before (in a partitioned queue
        at most PARTITION_STREAK in a row)."""
        batch, streak, inline = first, 0, self.executor.inline
        try:
            while batch:
                streak += 1
                if not inline:  # (run here: a batch of what one lease call returned, no waiting)
                    batch = self.fill(queue, batch)
                may_lease = not inline and (not self.partitioned_first or streak < PARTITION_STREAK)
                batch = self.run(queue, batch, may_lease=may_lease, leased_at=leased_at)
                leased_at = time.monotonic()
        finally:
            self.running.give_back()

    def fill(self, queue: Queue, batch: list[Job]) -> list[Job]:
        """``batch``, topped up from ``queue`` for at most its ``wait_ms`` while it is
        short (and the worker leases)."""
        spec = self.specs[queue.name]
        if len(batch) >= spec.size or not spec.wait_ms:
            return batch
        deadline = time.monotonic() + spec.wait_ms / 1000
        stopping, paused = self.control.stopping, self.control.leasing_paused
        while len(batch) < spec.size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stopping.wait(min(FILL_POLL_S, remaining)) or paused.is_set():
                break
            if not self.registration.confirmed():
                break  # the fetch loop renews first (or stops): lease nothing meanwhile
            call, count = secrets.token_hex(8), spec.size - len(batch)  # one token: a re-sent call, one effect
            try:
                leased = self.retrying(lambda: queue.lease_call(count=count, lease_ms=self.lease_ms, call=call))
            except RETRY_ON as exc:
                log.warning("batch of %s: could not lease more (%s); running the %d jobs it has", queue.name, exc,
                            len(batch))
                break
            if leased.jobs:
                self.running.track_all(leased.jobs)
                batch = batch + leased.jobs
        return batch

    def run(self, queue: Queue, batch: list[Job], *, may_lease: bool, leased_at: float | None = None) -> list[Job]:
        """Run the handler on ``batch`` (its first jobs leased at the monotonic
        ``leased_at``, default now) in this thread, then end each job
        (:meth:`BatchEndings.end`); the next batch leased in its place, if any."""
        error: BaseException | None = None
        returned: object = None
        slot = BatchSlot(batch, time.monotonic() if leased_at is None else leased_at, self.lease_ms, self.executor)
        self.running.enter(slot)
        enter_slot(slot)
        try:
            try:
                self.crash.at("in_handler")
                returned = slot.call(self.call_handler, batch)
            # As for one job: the handler's failure (SystemExit and the time limit too) is
            # the batch's outcome.
            except (Exception, SystemExit, TimeLimitExceeded) as exc:
                error = exc
        finally:
            enter_slot(None)
            self.running.leave(slot)
        return self.endings.end(queue, slot, returned, error, size=self.specs[queue.name].size, may_lease=may_lease)

    def call_handler(self, batch: list[Job]) -> object:
        """The handler on a copy of ``batch`` (it may keep or change its list); an
        ``async def`` handler's coroutine runs on the worker's event loop (an
        AsyncWorker; a sync worker refuses it, failing the batch)."""
        returned = self.handler(list(batch))
        if inspect.isawaitable(returned):
            slot = current_slot()
            assert slot is not None
            return slot.run_awaitable(returned)
        return returned
