"""Handler slots: the job a worker's handler thread runs now, its time limit, and how
to stop it.

A worker runs each job in a *slot* (one of its ``concurrency`` handler threads). While
the handler runs, :func:`current_slot` returns that slot, so code above the engine (the
task layer) can ask for a time limit (:meth:`Slot.limit`) or run a coroutine on the
worker's event loop (:meth:`Slot.run_awaitable`) without knowing which worker it is in.

Time limits have a soft and a hard end, and never let two attempts of one job run at
once. The worker's heartbeat checks the limits of running jobs every tick (50 ms):

* At ``time_limit`` (the *soft* limit) it interrupts the work, as well as its executor
  can: a thread gets :class:`TimeLimitExceeded` raised asynchronously
  (``PyThreadState_SetAsyncExc``) at its next Python bytecode; an asyncio task is
  cancelled (:class:`asyncio.CancelledError` at its next ``await``, which the worker
  reports as :class:`TimeLimitExceeded`). The lease stays this worker's, renewed, for
  at most ``grace_s`` more (a task's ``time_limit_grace``, default 5 s). A handler that
  catches it and returns is acked with what it returned, as in dramatiq; one that lets
  it propagate is nacked under the policy the slot was given with its limit
  (:class:`LimitEnding`: a retry, or the dead letters).
* At ``time_limit + grace_s`` (the *hard* limit), work still running is stopped for
  good: the job will end as :class:`TimeLimitExceeded` under that policy, whatever its
  handler does after. A thread inside a long C call (``time.sleep``, a blocking read)
  cannot be stopped, so its job stays leased by this worker, renewed, until the thread
  returns: **no second attempt starts while the first still runs**. The work is
  interrupted again at the hard limit; still running :data:`WRITE_OFF_S` later, its slot
  is *written off* (logged, counted, not leased into until the thread returns), and it
  is interrupted again every WRITE_OFF_S. A worker whose every slot is written off
  stops leasing, drains and exits 75 (``EXIT_STUCK``), for its supervisor to replace it;
  in a child of ``pyqueue worker --processes N`` the first written-off slot asks the
  supervisor for a replacement, which starts first, and the child then drains and
  exits, ending the stuck thread with it. A job still held so at a worker's end is
  nacked under its policy with its retry no sooner than a lease length later, the time
  a dead worker's lease would take to expire: by then this process has exited.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pyqueue.protocol.models import Job

log = logging.getLogger("pyqueue.worker")

#: How long the work may go on after its time limit (a task's ``time_limit_grace``) before
#: the hard limit: time to catch TimeLimitExceeded, clean up and return.
DEFAULT_TIME_LIMIT_GRACE_S = 5.0
#: How often the work past its hard limit is interrupted again (it may have caught the
#: exception and gone on, or been in C code when the last one was raised).
WRITE_OFF_S = 1.0
#: The same in a child of ``pyqueue worker --processes N``, where a slot written off ends
#: the process (its replacement starts first).
SUPERVISED_WRITE_OFF_S = 0.25


class TimeLimitExceeded(BaseException):
    """Raised inside a handler when its job reached its time limit; also the job's error.

    A :class:`BaseException` (like :class:`KeyboardInterrupt`), so an ``except
    Exception`` in the handler does not swallow it. Catch it to clean up and return
    within the grace period (``time_limit_grace``): the job is then acked with what the
    handler returned. Let it propagate, and the job follows its retry policy with this
    as its error. Past the grace period the job ends so whatever the handler does."""


class Parked(BaseException):
    """Raised by a handler whose job it parked (lua/park.lua: a durable sleep, or a wait
    for a signal): the job's lease has ended already, and it is scheduled to run again
    (``until_ms``, the server's clock). The worker sends neither ack nor nack, and uses
    no attempt. A :class:`BaseException`, so that an ``except Exception`` in the task
    does not stop it; nothing should catch it."""

    def __init__(self, job_id: str, name: str, until_ms: int) -> None:
        super().__init__(f"job {job_id} parked by {name!r} until {until_ms}")
        self.job_id, self.name, self.until_ms = job_id, name, until_ms


@dataclass(frozen=True)
class LimitEnding:
    """How a job ends at its time limit: the nack the heartbeat sends."""

    #: The job's error text (kept if it goes to the dead letters).
    error: str
    #: Retry after this long; None: the worker's default backoff.
    delay_ms: int | None = None
    #: Dead letters at once, whatever the attempt count.
    final: bool = False


class AwaitableRunner(Protocol):
    """Who runs a coroutine for a slot's job: its executor (an AsyncWorker's runs it on
    the event loop; a thread executor refuses)."""

    def run_awaitable(self, slot: Slot, awaitable: Awaitable[Any]) -> Any: ...


class Slot:
    """One running job in one handler thread (see the module docstring).

    Args:
        job: the job.
        lease_ms: its lease length (the lease began ``lease_ms`` before its deadline).
        runner: its executor, which runs a coroutine for it (:meth:`run_awaitable`).
    """

    __slots__ = (
        "runner", "job", "thread_id", "leased_at_ms", "started", "name", "limit_at", "limit_s", "grace_s", "ending",
        "reached", "limited", "interrupted_at", "written_off", "_lock", "_in_user_code", "_injected",
    )

    def __init__(self, job: Job, lease_ms: int, runner: AwaitableRunner) -> None:
        self.runner = runner
        self.job = job
        self.thread_id = threading.get_ident()
        #: The server clock when the job was leased (its deadline minus the lease length).
        self.leased_at_ms = job.deadline_ms - lease_ms
        self.started = time.monotonic()
        #: What logs call the job besides its id (the task layer sets its task name).
        self.name = ""
        #: Monotonic time of the time limit; None: no limit.
        self.limit_at: float | None = None
        self.limit_s: float = 0.0
        self.grace_s = DEFAULT_TIME_LIMIT_GRACE_S
        self.ending: LimitEnding | None = None
        #: Set by the heartbeat at the time limit, as it interrupts the work.
        self.reached = False
        #: Set by the heartbeat at the hard limit (``grace_s`` after the time limit) while
        #: the work still ran: its job ends as TimeLimitExceeded, whatever it does after.
        self.limited = False
        self.interrupted_at: float | None = None
        self.written_off = False
        # Guards `in_user_code` against the heartbeat's interruption: an asynchronous
        # exception must reach the handler, never the worker's own code after it.
        self._lock = threading.Lock()
        self._in_user_code = False
        self._injected = False

    def __str__(self) -> str:
        """How logs name the job: its id, and its task when the handler named one."""
        return f"job {self.job.id} [{self.name}]" if self.name else f"job {self.job.id}"

    # What a batch slot (pyqueue.worker.batch.BatchSlot) answers for its N jobs; one
    # job's slot answers them for that job, so the heartbeat and the executors treat
    # both alike.

    @property
    def jobs(self) -> tuple[Job, ...]:
        """The jobs this slot runs: its job."""
        return (self.job,)

    @property
    def key(self) -> str:
        """What the worker's maps of running slots (and an asyncio executor's tasks)
        know this slot by: its job's receipt."""
        return self.job.receipt

    def ending_for(self, job: Job) -> LimitEnding | None:
        """How ``job`` ends at the time limit (the nack the heartbeat sends)."""
        return self.ending

    @property
    def abandoned(self) -> bool:
        """Whether the outcome of the work no longer matters to any of its jobs
        (cancelled, lease lost, or ended at the time limit)."""
        return self.job.cancelled.is_set()

    def server_now_ms(self) -> int:
        """The server clock now, as this slot knows it: the lease's time plus the time
        elapsed since (measured on this process's monotonic clock)."""
        return self.leased_at_ms + int((time.monotonic() - self.started) * 1000)

    def limit(self, seconds: float, ending: LimitEnding, grace_s: float = DEFAULT_TIME_LIMIT_GRACE_S) -> None:
        """Interrupt the work ``seconds`` after it started, and stop it for good
        ``grace_s`` later (see the module docstring); a job that ends by the limit ends
        as ``ending`` says. Call it from the handler before the work starts."""
        self.limit_s, self.grace_s = seconds, grace_s
        elapsed = (self.server_now_ms() - self.leased_at_ms) / 1000
        self.limit_at = time.monotonic() + max(0.0, seconds - elapsed)
        self.ending = ending

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run user code where the heartbeat may interrupt it at the time limit. An
        interruption that arrives after ``fn`` returned is withdrawn, or surfaces here as
        :class:`TimeLimitExceeded` — never later, inside the worker."""
        with self._lock:
            self._in_user_code = True
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self._in_user_code = False
                injected = self._injected
            if injected:
                # Withdraw an exception not yet raised (no-op if it was).
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)

    def run_awaitable(self, awaitable: Awaitable[Any]) -> Any:
        """Run a coroutine on the worker's event loop and wait for it (an AsyncWorker);
        a sync worker refuses (InvalidArgument), since it has no loop to run it on."""
        return self.runner.run_awaitable(self, awaitable)

    def interrupt(self) -> None:
        """Stop the work at its time limit: raise :class:`TimeLimitExceeded` in the
        thread if it is in user code (an AsyncWorker cancels the task instead). Called
        again while the thread still runs (it caught the exception and went on), it
        raises it again."""
        with self._lock:
            self.interrupted_at = time.monotonic()
            if self._in_user_code:
                self._injected = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.thread_id), ctypes.py_object(TimeLimitExceeded)
                )

    def write_off(self, count: Callable[[], int]) -> int | None:
        """Mark this slot written off if its thread still runs the handler and it is not
        already; ``count()`` (the worker's count of written-off slots) is called then,
        and its answer returned; None if the slot was not written off.

        Under the lock the thread takes as it leaves the handler (:meth:`call`): so either
        the mark comes first, and the job's ending sees it and gives the slot back
        (``written_back``), or the thread has left, and the slot is not written off. A
        mark that came after the ending looked would count a slot off for ever."""
        with self._lock:
            if not self._in_user_code or self.written_off:
                return None
            self.written_off = True
            return count()

    @property
    def in_user_code(self) -> bool:
        return self._in_user_code


_local = threading.local()


def current_slot() -> Slot | None:
    """The slot of the job this handler thread runs; None outside a worker's handler."""
    return getattr(_local, "slot", None)


def enter_slot(slot: Slot | None) -> None:
    """Make ``slot`` this thread's current slot (None: leave it)."""
    _local.slot = slot
