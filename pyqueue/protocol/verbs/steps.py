"""Durable steps: what a running job commits of its run, so that a later run of it
(after a crash, a retry, a sleep or a wait) does not do it again (lua/README.md
section 2.6).

* :func:`step` (lua/step.lua) commits one named step's value under the job's current
  lease (fenced: a zombie commits nothing) and extends the lease.
* :func:`park` (lua/park.lua) ends the lease without using an attempt and schedules the
  job: a sleep until a time, or a wait for a signal until a timeout. A wait whose signal
  is there already commits it as a step instead, and the run goes on.
* :func:`signal` (lua/signal.lua) sends a job a named signal; a job parked waiting for
  it is due at once.
* :func:`steps` (lua/steps.lua) reads what a job has committed, parked and received.

The engine keeps opaque bytes; the task layer writes ``j`` + JSON
(``current_job().step``, ``.sleep``, ``.wait_signal``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pyqueue.protocol.core import (
    CONTROL_CHARACTERS,
    MAX_LEASE_MS,
    MAX_RESULT_BYTES,
    Plan,
    check_int,
    check_job_id,
    check_now,
    park_call,
    signal_call,
    step_call,
    steps_call,
    text,
)
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job
from pyqueue.protocol.spec import QueueMemory, QueueSpec
from pyqueue.protocol.verbs.base import run

#: The most entries (steps, parks and signals together) one job keeps (lua/steps).
MAX_STEP_ENTRIES = 1000
#: The largest step value or signal payload, as a result's.
MAX_STEP_BYTES = MAX_RESULT_BYTES
#: The value lua/park.lua commits for a wait that timed out.
TIMED_OUT = b"t"

ParkKind = Literal["sleep", "wait"]


def check_step_name(name: object) -> str:
    """A step's or signal's name: 1..200 bytes of UTF-8 without control characters."""
    if isinstance(name, str):
        try:
            if 1 <= len(name.encode("utf-8")) <= 200 and CONTROL_CHARACTERS.search(name) is None:
                return name
        except UnicodeEncodeError:
            pass
    raise InvalidArgument(f"a step or signal name is 1..200 bytes of UTF-8 without control characters, got {name!r}")


def check_step_value(value: object, what: str) -> bytes:
    """A step value or a signal payload: bytes of at most :data:`MAX_STEP_BYTES`."""
    if not isinstance(value, bytes) or len(value) > MAX_STEP_BYTES:
        raise InvalidArgument(f"{what} is bytes of at most {MAX_STEP_BYTES}, got "
                              f"{len(value) if isinstance(value, bytes) else type(value).__name__}")
    return value


def check_leased(job: object, verb: str) -> Job:
    """The Job from lease that ``verb`` takes, else InvalidArgument."""
    if not isinstance(job, Job):
        raise InvalidArgument(f"{verb} takes the Job from lease, got {type(job).__name__}")
    return job


@dataclass(frozen=True)
class Committed:
    """What :func:`step` did. ``status``: ``ok`` (committed now), ``exists`` (a step of
    that name was committed already: nothing written), or ``stale`` / ``gone`` (this
    lease has ended: nothing written; the run's outcome no longer counts)."""

    status: Literal["ok", "exists", "stale", "gone"]
    #: The lease's new deadline (server clock); -1 when the lease has ended.
    deadline_ms: int

    @property
    def current(self) -> bool:
        """Whether the lease is still this run's (``ok`` or ``exists``)."""
        return self.status in ("ok", "exists")


@dataclass(frozen=True)
class ParkAnswer:
    """What :func:`park` did. ``status``:

    * ``parked``: the lease ended, the job is SCHEDULED until ``at_ms`` (a sleep's end, a
      wait's timeout): the run must stop now, with neither ack nor nack;
    * ``awake``: the sleep's time has come (a run after it): go on;
    * ``signalled``: the wait took its signal: ``value`` is the payload, committed as
      the step of the wait's name; go on;
    * ``timeout``: the wait timed out (committed so); go on;
    * ``done``: a step of that name was committed before: ``value`` is its value
      (:data:`TIMED_OUT` for a wait that timed out); go on;
    * ``stale`` / ``gone``: this lease has ended: nothing was written.

    ``at_ms``: ``parked``: until when; going on: the lease's new deadline; else -1."""

    status: Literal["parked", "awake", "signalled", "timeout", "done", "stale", "gone"]
    value: bytes
    at_ms: int


@dataclass(frozen=True)
class Signalled:
    """What :func:`signal` did. ``status``: ``woke`` (kept, and the job, parked waiting
    for it, is due now), ``kept`` (kept for the wait to come); refused, nothing written:
    ``unknown`` (no such job: it ended, or never was), ``dead``, ``duplicate`` (a signal
    of that name was sent before: the first is kept), ``closed`` (the job's wait for it
    has ended: it timed out)."""

    status: Literal["woke", "kept", "unknown", "dead", "duplicate", "closed"]

    @property
    def accepted(self) -> bool:
        """Whether the signal is kept for the job (``woke`` or ``kept``)."""
        return self.status in ("woke", "kept")


@dataclass(frozen=True)
class Park:
    """A job's sleep or wait (lua/park.lua): its kind, and until when."""

    kind: ParkKind
    until_ms: int


@dataclass(frozen=True)
class JobSteps:
    """What a job has committed of its runs (:func:`steps`), read atomically."""

    #: The server's clock when read.
    now_ms: int
    #: The committed steps, name -> value, in commit order (a wait's: its signal's
    #: payload, or :data:`TIMED_OUT`).
    results: dict[str, bytes] = field(default_factory=dict)
    #: Its sleeps and waits, name -> :class:`Park`.
    parks: dict[str, Park] = field(default_factory=dict)
    #: The signals sent to it, name -> payload (taken by a wait or not yet).
    signals: dict[str, bytes] = field(default_factory=dict)


def step(
    spec: QueueSpec, memory: QueueMemory, job: Job, name: str, value: bytes, *, lease_ms: int,
    now_ms: int | None = None,
) -> Plan[Committed]:
    """Commit ``value`` as the step ``name`` of ``job``, a job this worker holds, and
    extend its lease to now + ``lease_ms``. Fenced: once the lease has ended nothing is
    written (``stale`` / ``gone``). A step is committed once: a second commit of the name
    (or a re-sent call) answers ``exists`` and writes nothing. Kept until the job ends
    (acked, cancelled or purged), then deleted with its record.

    Raises:
        InvalidArgument: not a leased Job, a bad name or value, or the job keeps
            :data:`MAX_STEP_ENTRIES` entries already (nothing written).
    """
    check_leased(job, "step")
    check_step_name(name)
    check_step_value(value, "a step value")
    check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
    check_now(now_ms)
    status, deadline = yield from run(memory, step_call(spec.keys, now_ms, job.receipt, lease_ms, name, value))
    return Committed(text(status), int(deadline))  # type: ignore[arg-type]


def park(
    spec: QueueSpec, memory: QueueMemory, job: Job, kind: ParkKind, name: str, for_ms: int, *, lease_ms: int,
    now_ms: int | None = None,
) -> Plan[ParkAnswer]:
    """Sleep (``kind="sleep"``, ``for_ms``) or wait for the signal ``name`` (``"wait"``,
    at most ``for_ms``), by the name ``name``: see :class:`ParkAnswer` for what it did.
    A park ends the lease without using an attempt, as one script: the job's next lease
    has the same attempt number. A run that goes on has its lease extended to now +
    ``lease_ms``. The sleep's or the wait's end is kept under its name from the first
    call: a later run that parks by the same name waits only for what is left.

    Raises:
        InvalidArgument: a bad argument, a name parked as the other kind, or the job
            keeps :data:`MAX_STEP_ENTRIES` entries already (nothing written).
    """
    check_leased(job, "park")
    if kind not in ("sleep", "wait"):
        raise InvalidArgument(f"kind must be 'sleep' or 'wait', got {kind!r}")
    check_step_name(name)
    check_int(for_ms, "for_ms", 0, 2**40)
    check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
    check_now(now_ms)
    status, value, at = yield from run(memory, park_call(spec.keys, now_ms, job.receipt, kind, name, for_ms, lease_ms))
    return ParkAnswer(text(status), bytes(value), int(at))  # type: ignore[arg-type]


def signal(
    spec: QueueSpec, memory: QueueMemory, job_id: str, name: str, payload: bytes = b"", *, now_ms: int | None = None
) -> Plan[Signalled]:
    """Send job ``job_id`` the signal ``name`` with ``payload`` (bytes, at most
    :data:`MAX_STEP_BYTES`, but not :data:`TIMED_OUT`): kept for the job's wait of that name, before or after it
    began; a job parked waiting for it is due at once. Refused, writing nothing, for a
    job that has ended or never was, a dead one, a second signal of one name and a wait
    that has ended (see :class:`Signalled`). Replay-safe: a re-sent call answers
    ``duplicate``.

    Raises:
        InvalidArgument: a bad id, name or payload (nothing written).
    """
    check_job_id(job_id)
    check_step_name(name)
    check_step_value(payload, "a signal payload")
    if payload == TIMED_OUT:
        raise InvalidArgument(f"a signal payload may not be {TIMED_OUT!r}: it is the value a wait that timed out keeps")
    check_now(now_ms)
    (status,) = yield from run(memory, signal_call(spec.keys, now_ms, job_id, name, payload))
    return Signalled(text(status))  # type: ignore[arg-type]


def steps(spec: QueueSpec, memory: QueueMemory, job_id: str, *, now_ms: int | None = None) -> Plan[JobSteps]:
    """What job ``job_id`` has committed of its runs, its sleeps and waits, and the
    signals sent to it, read atomically (lua/steps.lua); all empty for a job without
    any, or gone."""
    check_job_id(job_id)
    check_now(now_ms)
    reply = yield from run(memory, steps_call(spec.keys, now_ms, job_id))
    return parse_steps(reply)


def parse_steps(reply: list[Any]) -> JobSteps:
    """lua/steps.lua's reply as :class:`JobSteps`."""
    found = JobSteps(int(reply[0]))
    for i in range(1, len(reply), 2):
        entry, value = text(reply[i]), bytes(reply[i + 1])
        kind, name = entry[0], entry[2:]
        if kind == "s":
            found.results[name] = value
        elif kind == "g":
            found.signals[name] = value
        else:
            until, _, how = value.decode().partition("|")
            found.parks[name] = Park(how, int(until))  # type: ignore[arg-type]
    return found
