"""The task job that runs now: :class:`TaskRun` (what :func:`current_job` returns and
a middleware's ``around_run`` sees), :func:`current_batch` in a batch task, and
:class:`Undeliverable`, how a job that cannot run as a task ends.
:mod:`pyqueue.tasks.dispatch` runs the jobs, :mod:`pyqueue.tasks.batch` the batches.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn, TypeVar

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import CancelFlag, Job
from pyqueue.tasks import steps as durable
from pyqueue.tasks.codec import to_json
from pyqueue.tasks.run_queue import ClientUnavailable, run_queue
from pyqueue.worker import Retry
from pyqueue.worker.endings import seconds_to_ms

T = TypeVar("T")


class TaskRun:
    """The running task job, as :func:`current_job` returns it. (A plain class with
    slots, not a dataclass: one is made per job, on the worker's hot path.)"""

    __slots__ = ("job", "task", "enqueued_ms", "deadline_ms", "meta", "children", "app", "_book")

    #: Whether it runs in a batch task's batch, with other jobs (``current_batch()``).
    in_batch = False

    def __init__(
        self, job: Job, task: str, enqueued_ms: int | None, deadline_ms: int | None, meta: Mapping[str, Any],
        app: Any = None,
    ) -> None:
        self.job = job
        #: The Tasks object running it (its connection reports progress).
        self.app = app
        self.task = task
        #: When it was sent, on the server clock (ms); None if the producer did not say.
        self.enqueued_ms = enqueued_ms
        #: The time limit's deadline on the server clock (ms); None without a limit.
        self.deadline_ms = deadline_ms
        self.meta = meta
        #: What :meth:`spawn` and :meth:`then` asked for: (steps, callback, policy).
        self.children: tuple[list[Any], Any, str] | None = None
        self._book: durable.StepBook | None = None

    def __repr__(self) -> str:
        return f"TaskRun(id={self.job.id!r}, task={self.task!r}, attempt={self.job.attempt})"

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def attempt(self) -> int:
        """1 on the first run, counting every failed or expired lease before."""
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def fence(self) -> int:
        """The lease's fence: pass it to stores that must reject a zombie's writes."""
        return self.job.fence

    @property
    def enqueued_at(self) -> datetime | None:
        return None if self.enqueued_ms is None else datetime.fromtimestamp(self.enqueued_ms / 1000, timezone.utc)

    @property
    def deadline(self) -> datetime | None:
        return None if self.deadline_ms is None else datetime.fromtimestamp(self.deadline_ms / 1000, timezone.utc)

    @property
    def cancelled(self) -> CancelFlag:
        """Set once its end is decided without it: cancelled, lease lost, or time limit.
        The job's own flag, as a job handler gets it (``job.cancelled``): test it
        (``if current_job().cancelled:``, or ``.is_set()``), or ``.wait(timeout)`` on it."""
        return self.job.cancelled

    def progress(self, value: Any) -> bool:
        """Report how far this run is: ``value`` (JSON data, at most 4096 bytes encoded,
        e.g. ``{"done": 40, "of": 100}``) replaces the run's previous one, and shows
        (``SentTask.progress()``, ``Queue.progress_of``, ``pyqueue job QUEUE ID``) while
        this lease runs. Fenced (lua/progress.lua): returns False, and stores nothing, once
        this run's lease has ended (cancelled, expired, time limit): a sign to stop. One
        round trip; from an ``async def`` task, ``await`` :meth:`aprogress` instead.

        Raises:
            InvalidArgument: not JSON data, or more than 4096 bytes encoded.
        """
        return bool(run_queue(self.app, self.job.queue).progress(self.job, self._progress_bytes(value)))

    async def aprogress(self, value: Any) -> bool:
        """:meth:`progress` on the asyncio client, for ``async def`` tasks (in a thread
        on the blocking client where the Tasks object has no asyncio one: it was given
        a cluster client, from which it makes no other)."""
        data = self._progress_bytes(value)
        try:
            queue = run_queue(self.app, self.job.queue, use_asyncio=True)
        except ClientUnavailable:
            blocking = run_queue(self.app, self.job.queue)
            return bool(await asyncio.to_thread(blocking.progress, self.job, data))
        return bool(await queue.progress(self.job, data))

    def defer_key(self, seconds: float | timedelta, reason: str | None = None) -> NoReturn:
        """Hold this job's rate key for ``seconds`` (a downstream answered 429 with a
        ``Retry-After``): no job of the key is leased before then (lua/defer_key.lua; its
        jobs waiting for earlier slots wait on), and this run ends by raising
        :class:`Retry`, so the job runs again then. The retry counts as an attempt, as any retry does. From
        an ``async def`` task, ``await`` :meth:`adefer_key`.

        Raises:
            Retry: always (let it propagate).
            InvalidArgument: a bad duration, or the task has no rate limit.
        """
        delay_ms = seconds_to_ms(seconds, "seconds")
        run_queue(self.app, self.job.queue).defer_key(self.job, delay_ms)
        raise Retry(delay_ms=delay_ms, reason=reason or f"rate key deferred for {delay_ms} ms by the task")

    async def adefer_key(self, seconds: float | timedelta, reason: str | None = None) -> NoReturn:
        """:meth:`defer_key` for ``async def`` tasks."""
        delay_ms = seconds_to_ms(seconds, "seconds")
        try:
            queue = run_queue(self.app, self.job.queue, use_asyncio=True)
        except ClientUnavailable:
            blocking = run_queue(self.app, self.job.queue)
            await asyncio.to_thread(blocking.defer_key, self.job, delay_ms)
        else:
            await queue.defer_key(self.job, delay_ms)
        raise Retry(delay_ms=delay_ms, reason=reason or f"rate key deferred for {delay_ms} ms by the task")

    def _progress_bytes(self, value: Any) -> bytes:
        from pyqueue.tasks.codec import dumps
        from pyqueue.protocol.verbs.progress import MAX_PROGRESS_BYTES

        data = dumps(to_json(value, f"{self.task} progress")).encode("utf-8")
        if len(data) > MAX_PROGRESS_BYTES:
            raise InvalidArgument(f"{self.task}: progress is at most {MAX_PROGRESS_BYTES} bytes as JSON, got {len(data)}")
        return data

    # -- durable steps (pyqueue.tasks.steps) ------------------------------------------

    def book(self) -> durable.StepBook:
        """What this run knows of its job's durable steps (made at its first)."""
        if self._book is None:
            self._book = durable.StepBook(self)
        return self._book

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once for this job, across all its runs: the first
        run that gets here calls it and commits its result under ``name``; every later
        run (after a crash, a retry, a sleep or a wait) gets that result back at once,
        without calling ``fn``. The result must travel as JSON (as a task's result), and
        is returned as it decodes, the same on every run.

        Delivery: ``fn`` runs at least once; again only if a run ends between its return
        and the commit (a crash, a lost lease). An exception from ``fn`` commits nothing
        and follows the task's retry policy; steps committed before it stay.

        Raises:
            InvalidArgument: a bad or reused name (in this run), a result that does not
                travel, or the job keeps 1000 steps, sleeps, waits and signals already.
            LeaseLost: this run's lease has ended: nothing was committed, and the run no
                longer counts (its worker neither acks nor nacks it).
        """
        return durable.step(self, name, fn, args, kwargs)  # type: ignore[no-any-return]

    async def astep(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`step` for ``async def`` tasks: ``fn`` may be a coroutine function."""
        return await durable.astep(self, name, fn, args, kwargs)

    def sleep(self, name: str, seconds: float | timedelta) -> None:
        """Sleep ``seconds`` (or a ``timedelta``) without holding a worker: one script
        ends the lease and schedules the job at now + ``seconds`` on the server's clock,
        using no attempt. The run stops here (the worker neither acks nor nacks); the
        task's function runs again from the top when the time has come, and this call,
        reached again, returns at once. ``name`` keeps the sleep's end: a run made due
        early sleeps only what is left.

        Raises:
            InvalidArgument: a bad or reused name, a bad duration.
            LeaseLost: this run's lease has ended.
        """
        durable.sleep(self, name, seconds)

    async def asleep(self, name: str, seconds: float | timedelta) -> None:
        """:meth:`sleep` for ``async def`` tasks."""
        await durable.asleep(self, name, seconds)

    def wait_signal(self, name: str, timeout: float | timedelta) -> Any:
        """The data of the signal ``name`` sent to this job (``fn.signal(job_id, name,
        data)``, ``SentTask.signal``, ``pyqueue signal``), sent before this call or while
        it waits. Without one yet, the job is parked (state ``waiting``: no lease, no
        worker, no attempt used) until the signal comes or ``timeout`` seconds have
        passed, and the task's function runs again from the top then. Its outcome is
        committed as the step ``name``: every later run gets the same.

        Raises:
            SignalTimeout: no signal came within ``timeout`` (catch it to go on).
            InvalidArgument: a bad or reused name, a bad timeout.
            LeaseLost: this run's lease has ended.
        """
        return durable.wait_signal(self, name, timeout)

    async def await_signal(self, name: str, timeout: float | timedelta) -> Any:
        """:meth:`wait_signal` for ``async def`` tasks."""
        return await durable.await_signal(self, name, timeout)

    def spawn(self, *steps: Any) -> None:
        """Add children to this run: task calls (``fn.s(...)``), chains or groups. They
        are sent together, as one flow of their own, when the task's function returns
        (before its ack); a run that raises sends none. Their ids are derived from this
        job's, so a run that is retried (its worker died after the send) sends them
        again as duplicates: each child runs once. See :meth:`then`."""
        if not steps:
            raise InvalidArgument("spawn() takes at least one task call, chain or group")
        kids, callback, policy = self.children or ([], None, "fail")
        self.children = ([*kids, *steps], callback, policy)

    def then(self, callback: Any, *, on_failure: str = "fail") -> None:
        """Run ``callback`` (a task call) once every child spawned by this run has ended,
        with the list of their results as its first argument (as a chord's callback:
        :mod:`pyqueue.tasks.flows`, whose ``on_failure`` rules apply)."""
        kids, _, _ = self.children or ([], None, "fail")
        self.children = (kids, callback, on_failure)


#: The running job: set by :mod:`pyqueue.tasks.dispatch` around a task's call.
job_var: contextvars.ContextVar[TaskRun] = contextvars.ContextVar("pyqueue_current_job")
#: The jobs of the running batch: set by :mod:`pyqueue.tasks.batch` around a batch task's call.
batch_var: contextvars.ContextVar[list[TaskRun]] = contextvars.ContextVar("pyqueue_current_batch")


def current_job() -> TaskRun:
    """The task job this code runs in (its id, task name, attempt, enqueue time and
    deadline), from a task function or anything it calls, sync or async.

    Raises:
        LookupError: called outside a running task.
    """
    try:
        return job_var.get()
    except LookupError:
        if batch_var.get(None) is not None:
            raise LookupError("current_job() is called in a batch task: current_batch() has its jobs") from None
        raise LookupError("current_job() is called outside a running task") from None


class Undeliverable(Retry):
    """A job this worker cannot run as a task: an unknown task name, an envelope it cannot
    read, options that do not resolve. Retried with the worker's backoff (another worker
    may run it), dead at max_attempts with the reason as its error; never acked."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason=reason)


def current_batch() -> list[TaskRun]:
    """The jobs of the batch this code runs in, in the order of the items the batch task
    was called with (each with its id, attempt, fence, enqueue time, deadline and
    ``cancelled``), from the task's function or anything it calls, sync or async.

    Raises:
        LookupError: called outside a running batch task.
    """
    try:
        return list(batch_var.get())
    except LookupError:
        raise LookupError("current_batch() is called outside a running batch task") from None
