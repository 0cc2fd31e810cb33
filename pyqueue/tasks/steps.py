"""Durable steps of a task run: ``current_job().step``, ``.sleep`` and ``.wait_signal``
(and their ``async`` forms), over the engine's step, park, signal and steps scripts
(:mod:`pyqueue.protocol.verbs.steps`, lua/README.md section 2.6).

A task's function runs again from the top on every run of its job: after a crash, a
retry, a sleep or a wait. What a run committed is read once, at its first durable call
(one round trip), and returned at once by the same calls of later runs, without calling
their functions again. Values travel as results do: JSON with pyqueue's tagged types,
returned as they decode (so a run gets the same value whether it committed it or read
it back).

Delivery: a step's function runs at least once, and more only when a run ends between
the function's return and its commit (a crash, a lost lease): then the next run calls
it again. A step committed is never run again, by any later run or any zombie: its
commit is fenced by the lease.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from pyqueue.protocol.core import DEFAULT_LEASE_MS
from pyqueue.protocol.errors import InvalidArgument, LeaseLost, SignalTimeout
from pyqueue.protocol.models import Job
from pyqueue.protocol.verbs.steps import TIMED_OUT, Committed, JobSteps, ParkAnswer, check_step_name
from pyqueue.tasks.codec import dumps, loads, to_json
from pyqueue.worker.endings import seconds_to_ms
from pyqueue.worker.slots import Parked, current_slot
from pyqueue.tasks.run_queue import ClientUnavailable, run_queue


class StepRun(Protocol):
    """What this module uses of a run (a :class:`~pyqueue.tasks.run.TaskRun`, which
    calls it: named by this protocol, not imported, so the two import nothing of each
    other in a circle)."""

    job: Job
    task: str
    app: Any
    in_batch: bool

    def book(self) -> StepBook: ...


def encode(value: Any, where: str) -> bytes:
    """A step's value or a signal's data as the engine keeps it: ``j`` + JSON."""
    return b"j" + dumps(to_json(value, where)).encode("utf-8")


def decode(data: bytes) -> Any:
    """A kept value: JSON data (``j``), else the bytes another client sent as they are."""
    return loads(data[1:]) if data[:1] == b"j" else data


@dataclass(frozen=True)
class TaskSteps:
    """What a task job has kept of its runs (``SentTask.steps()``), decoded."""

    #: The committed steps, name -> value, in commit order; a wait's is its signal's
    #: data, or :data:`SIGNAL_TIMED_OUT` when it timed out.
    results: dict[str, Any]
    #: The sleeps, name -> when it ends (ended or not).
    sleeps: dict[str, datetime]
    #: The waits not decided yet, name -> its timeout.
    waits: dict[str, datetime]
    #: The signals sent to it, name -> data (taken by a wait or not yet).
    signals: dict[str, Any]


class _TimedOut:
    """The value of a wait that timed out, in :attr:`TaskSteps.results`."""

    def __repr__(self) -> str:
        return "SIGNAL_TIMED_OUT"


#: A wait that timed out, in :attr:`TaskSteps.results` (one object: test with ``is``).
SIGNAL_TIMED_OUT = _TimedOut()


def task_steps(found: JobSteps) -> TaskSteps:
    """:class:`JobSteps` decoded as a task's."""
    def when(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, timezone.utc)

    return TaskSteps(
        results={name: SIGNAL_TIMED_OUT if data == TIMED_OUT else decode(data) for name, data in found.results.items()},
        sleeps={name: when(p.until_ms) for name, p in found.parks.items() if p.kind == "sleep"},
        waits={name: when(p.until_ms) for name, p in found.parks.items() if p.kind == "wait" and name not in found.results},
        signals={name: decode(data) for name, data in found.signals.items()},
    )


class StepBook:
    """What one run knows of its job's durable steps: what earlier runs committed (read
    at the run's first durable call), and the names this run has used (a name used
    twice in one run is a mistake in the task, refused)."""

    __slots__ = ("run", "known", "used")

    def __init__(self, run: StepRun) -> None:
        self.run = run
        self.known: JobSteps | None = None
        self.used: set[str] = set()

    def claim(self, name: str, verb: str) -> None:
        if self.run.in_batch:
            raise InvalidArgument(f"{self.run.task}: {verb}() in a batch task: durable steps, sleeps and waits "
                                  "are for tasks that run one job at a time")
        check_step_name(name)
        if name in self.used:
            raise InvalidArgument(f"{self.run.task}: {verb}({name!r}) is the second durable call named {name!r} "
                                  "in one run: each step, sleep and wait needs a name of its own")
        self.used.add(name)

    def lease_ms(self) -> int:
        """The worker's lease length: a commit extends the lease by it."""
        slot = current_slot()
        if slot is None or slot.job is not self.run.job:
            return DEFAULT_LEASE_MS
        return max(1, self.run.job.deadline_ms - slot.leased_at_ms)

    def committed(self, name: str, answer: Committed, data: bytes) -> Any:
        """The value a commit kept; a refused commit stops the run as a lost lease does."""
        if not answer.current:
            self.lost(f"step {name!r}", answer.status)
        assert self.known is not None
        self.known.results[name] = data
        return decode(data)

    def lost(self, what: str, status: str) -> None:
        self.run.job.cancelled.set()
        raise LeaseLost(f"job {self.run.job.id}: {what} was not committed: its lease has ended ({status}); "
                        "this run no longer counts")

    def parked(self, name: str, answer: ParkAnswer) -> Any:
        """What a sleep or a wait returns, by the park's answer."""
        if answer.status == "parked":
            # The lease ended in that call: tell the worker's heartbeat to leave it be.
            self.run.job.cancelled.set()
            raise Parked(self.run.job.id, name, answer.at_ms)
        if answer.status in ("stale", "gone"):
            self.lost(f"the park {name!r}", answer.status)
        if answer.status == "awake":
            return None
        if answer.status == "timeout" or answer.status == "done" and answer.value == TIMED_OUT:
            raise SignalTimeout(f"job {self.run.job.id}: no signal {name!r} came within its wait's timeout")
        return decode(answer.value)

    def sleeping_done(self, name: str) -> bool:
        """Whether an earlier run slept ``name`` to its end already (no call needed)."""
        assert self.known is not None
        park = self.known.parks.get(name)
        return park is not None and park.kind == "sleep" and park.until_ms <= self.known.now_ms

    def waited(self, name: str) -> tuple[bool, Any]:
        """Whether an earlier run's wait ``name`` has its outcome committed, and it
        (raises SignalTimeout for a wait that timed out)."""
        assert self.known is not None
        data = self.known.results.get(name)
        if data is None:
            return False, None
        if data == TIMED_OUT:
            raise SignalTimeout(f"job {self.run.job.id}: no signal {name!r} came within its wait's timeout")
        return True, decode(data)


def step(run: StepRun, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """:meth:`TaskRun.step`."""
    book = run.book()
    book.claim(name, "step")
    queue = run_queue(run.app, run.job.queue)
    if book.known is None:
        book.known = queue.steps(run.job.id)
    if name in book.known.results:
        return decode(book.known.results[name])
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if callable(close):
            close()
        raise InvalidArgument(f"{run.task}: step {name!r} got an awaitable: in an async def task, "
                              "await current_job().astep(...)")
    data = encode(value, f"{run.task} step {name!r}")
    return book.committed(name, queue.step(run.job, name, data, lease_ms=book.lease_ms()), data)


async def astep(run: StepRun, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """:meth:`TaskRun.astep`."""
    book = run.book()
    book.claim(name, "astep")
    if book.known is None:
        book.known = await _acall(run, "steps", run.job.id)
    if name in book.known.results:
        return decode(book.known.results[name])
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    data = encode(value, f"{run.task} step {name!r}")
    return book.committed(name, await _acall(run, "step", run.job, name, data, lease_ms=book.lease_ms()), data)


def sleep(run: StepRun, name: str, seconds: float | timedelta) -> None:
    """:meth:`TaskRun.sleep`."""
    book = run.book()
    book.claim(name, "sleep")
    for_ms = seconds_to_ms(seconds, "seconds")
    queue = run_queue(run.app, run.job.queue)
    if book.known is None:
        book.known = queue.steps(run.job.id)
    if book.sleeping_done(name):
        return
    book.parked(name, queue.park(run.job, "sleep", name, for_ms, lease_ms=book.lease_ms()))


async def asleep(run: StepRun, name: str, seconds: float | timedelta) -> None:
    """:meth:`TaskRun.asleep`."""
    book = run.book()
    book.claim(name, "asleep")
    for_ms = seconds_to_ms(seconds, "seconds")
    if book.known is None:
        book.known = await _acall(run, "steps", run.job.id)
    if book.sleeping_done(name):
        return
    book.parked(name, await _acall(run, "park", run.job, "sleep", name, for_ms, lease_ms=book.lease_ms()))


def wait_signal(run: StepRun, name: str, timeout: float | timedelta) -> Any:
    """:meth:`TaskRun.wait_signal`."""
    book = run.book()
    book.claim(name, "wait_signal")
    for_ms = seconds_to_ms(timeout, "timeout")
    queue = run_queue(run.app, run.job.queue)
    if book.known is None:
        book.known = queue.steps(run.job.id)
    found, value = book.waited(name)
    if found:
        return value
    return book.parked(name, queue.park(run.job, "wait", name, for_ms, lease_ms=book.lease_ms()))


async def await_signal(run: StepRun, name: str, timeout: float | timedelta) -> Any:
    """:meth:`TaskRun.await_signal`."""
    book = run.book()
    book.claim(name, "await_signal")
    for_ms = seconds_to_ms(timeout, "timeout")
    if book.known is None:
        book.known = await _acall(run, "steps", run.job.id)
    found, value = book.waited(name)
    if found:
        return value
    return book.parked(name, await _acall(run, "park", run.job, "wait", name, for_ms, lease_ms=book.lease_ms()))


async def _acall(run: StepRun, verb: str, *args: Any, **kwargs: Any) -> Any:
    """``verb`` of the run's queue on the asyncio client; in a thread on the blocking
    client where the Tasks object has no asyncio one (it was given a cluster client)."""
    try:
        queue = run_queue(run.app, run.job.queue, use_asyncio=True)
    except ClientUnavailable:
        blocking = run_queue(run.app, run.job.queue)
        return await asyncio.to_thread(getattr(blocking, verb), *args, **kwargs)
    return await getattr(queue, verb)(*args, **kwargs)
