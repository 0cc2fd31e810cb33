"""What a send returns: the job's id, and its result when it ends."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pyqueue.aio import AsyncQueue
from pyqueue.drivers.queue import Queue
from pyqueue.protocol.errors import PyQueueError
from pyqueue.protocol.models import JobResult
from pyqueue.tasks.codec import from_json, loads
from pyqueue.protocol.verbs.steps import Signalled
from pyqueue.tasks.policy import Duration
from pyqueue.tasks.steps import TaskSteps, encode, task_steps
from pyqueue.worker.endings import seconds_to_ms

R = TypeVar("R")

#: The longest one wait_result call waits; a longer timeout waits in several.
_WAIT_CHUNK_MS = 3_600_000

log = logging.getLogger("pyqueue.tasks")
#: The tasks whose result() was told it keeps no result (said once per task and process).
_told_no_result: set[str] = set()


class QueueSource(Protocol):
    """What a handle reads its job through: the :class:`~pyqueue.tasks.Tasks` object
    that sent it (declared above this module)."""

    def queue(self, name: str) -> Queue: ...

    def aqueue(self, name: str) -> AsyncQueue: ...


class TaskError(PyQueueError):
    """A task job's ending that is not a result."""


class TaskDead(TaskError):
    """The job went to the dead letters (its last attempt failed, a ``fail_on`` error,
    ``max_age``, a time limit on its last attempt, or an unknown task name)."""

    def __init__(self, job_id: str, task: str, error: str) -> None:
        super().__init__(f"task {task} job {job_id} is dead: {error}")
        self.job_id, self.task, self.error = job_id, task, error


class TaskResultMissing(TaskError):
    """The job ended without a result to read: it was cancelled or expired (``expires``:
    never run), or its result expired or was trimmed (``keep_result`` too short, or
    ``max_results`` reached)."""


class ResultTimeout(TaskError, TimeoutError):
    """The job had not ended when the timeout ran out (it may still run)."""


@dataclass(frozen=True)
class SentTask(Generic[R]):
    """A sent task run. ``added`` is false when its id (``unique``'s, or the send's
    ``job_id``) found the job there already (or acked less than ``keep_done_ms`` ago),
    or when its key gave the send to another job (``by_key``): then this handle names
    that job."""

    id: str
    queue: str
    task: str
    added: bool
    #: Whether the run keeps its return value (``keep_result``): else ``result()``
    #: answers None once the job is done.
    keeps_result: bool
    app: QueueSource
    #: None, or how the task's key decided this send (``debounce``/``throttle``):
    #: "debounced" (``id`` is the key's pending job, which now runs with this send's
    #: arguments) or "throttled" (dropped: ``id`` is the job of the key's window).
    by_key: str | None = None

    def state(self) -> str:
        """Where the job is now: ready, scheduled, waiting, leased, dead, expired, done
        or unknown (``Queue.get``)."""
        return self.app.queue(self.queue).get(self.id).state

    def progress(self) -> Any:
        """The latest progress the running job reported (``current_job().progress``),
        decoded; None while it is not running or has reported none in this run. One
        read (``Queue.progress_of``)."""
        found = self.app.queue(self.queue).progress_of([self.id]).get(self.id)
        return None if found is None else loads(found.value)

    def signal(self, name: str, data: Any = None) -> Signalled:
        """Send this run the signal ``name`` with ``data``: as :meth:`Task.signal
        <pyqueue.tasks.task.Task.signal>`."""
        return self.app.queue(self.queue).signal(self.id, name, encode(data, f"{self.task} signal {name!r}"))

    async def asignal(self, name: str, data: Any = None) -> Signalled:
        """:meth:`signal` from asyncio code."""
        return await self.app.aqueue(self.queue).signal(self.id, name, encode(data, f"{self.task} signal {name!r}"))

    def steps(self) -> TaskSteps:
        """What this run's job has kept of its durable steps, sleeps, waits and signals
        so far, decoded (one read, ``Queue.steps``); all empty once the job has ended."""
        return task_steps(self.app.queue(self.queue).steps(self.id))

    def result(self, timeout: Duration | None = None) -> R:
        """Wait for the job to end, up to ``timeout`` seconds (None: no limit), and
        return what the task returned (decoded as it was encoded).

        Raises:
            TaskDead: it went to the dead letters; the error names its last error.
            TaskResultMissing: it was cancelled, or its result is gone.
            ResultTimeout: still not ended after ``timeout``.
        """
        queue = self.app.queue(self.queue)
        end = None if timeout is None else time.monotonic() + seconds_to_ms(timeout, "timeout") / 1000
        self._check_known(queue.result(self.id))
        while True:
            left_ms = _WAIT_CHUNK_MS if end is None else max(0, round((end - time.monotonic()) * 1000))
            info = queue.wait_result(self.id, min(left_ms, _WAIT_CHUNK_MS))
            if info.finished and info.state != "unknown":
                return self._outcome(info)  # type: ignore[no-any-return]
            if end is not None and time.monotonic() >= end:
                raise ResultTimeout(f"task {self.task} job {self.id} has not ended after {timeout}s (state {info.state})")

    async def aresult(self, timeout: Duration | None = None) -> R:
        """:meth:`result` from asyncio code, on the Tasks' asyncio client."""
        queue = self.app.aqueue(self.queue)
        end = None if timeout is None else time.monotonic() + seconds_to_ms(timeout, "timeout") / 1000
        self._check_known(await queue.result(self.id))
        while True:
            left_ms = _WAIT_CHUNK_MS if end is None else max(0, round((end - time.monotonic()) * 1000))
            info = await queue.wait_result(self.id, min(left_ms, _WAIT_CHUNK_MS))
            if info.finished and info.state != "unknown":
                return self._outcome(info)  # type: ignore[no-any-return]
            if end is not None and time.monotonic() >= end:
                raise ResultTimeout(f"task {self.task} job {self.id} has not ended after {timeout}s (state {info.state})")

    def _check_known(self, info: JobResult) -> None:
        """This handle's job was enqueued before the handle existed: no trace of it
        means it ended long ago (its result and its id's tombstone both expired), not
        that it is still to come, so waiting would wait for nothing."""
        if info.state == "unknown":
            raise TaskResultMissing(
                f"task {self.task} job {self.id} left no trace: it ended, and its result (if one was kept) and its "
                "id's tombstone have expired"
            )

    def _outcome(self, info: JobResult) -> Any:
        if info.state == "ok":
            return from_json(info.value)
        if info.state == "dead":
            raise TaskDead(self.id, self.task, info.error)
        if not self.keeps_result:
            # Done: acked, and no result was asked for (or cancelled). Said once per task,
            # so that a caller who expected the return value learns why it is None.
            if self.task not in _told_no_result:
                _told_no_result.add(self.task)
                log.warning("task %s keeps no result (give it keep_result=...): result() waited for job %s to end "
                            "and returns None", self.task, self.id)
            return None
        raise TaskResultMissing(
            f"task {self.task} job {self.id} ended without a result to read: cancelled, or its result expired or "
            "was trimmed"
        )
