"""Jobs that wait for other jobs (a flow's continuation: the next step of a chain, a
chord's callback): lua/flow_wait.lua and lua/flow_done.lua, and the read a sweep makes;
and a flow's record, kept so it can be shown by its id: lua/flow_record.lua and
lua/flow_show.lua.

How a wait ends, exactly once: a waiting job is a SCHEDULED job that is never due by
time, with one member per job it waits for in ``fpending``. Whoever sees one of those
jobs end (the worker that acked it, at once; a sweep that reads the waiting jobs due for
a check, if that worker died first) reports it with ``flow_done``, which removes the
member (a set removal, never a counter, so a report sent twice counts once); the call
that removes the last member makes the job due now, and it runs as any job. Under the
policy ``'fail'``, a failed job releases the waiting one at once (it runs only to fail:
the task layer reads the ending it waited for). Nothing here decides what a failure is:
the caller reports ``'ok'`` or ``'failed'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyqueue.protocol.core import (
    Commands,
    Plan,
    check_int,
    check_job_id,
    check_now,
    flow_done_call,
    flow_record_call,
    flow_show_call,
    flow_wait_call,
    new_job,
    text,
)
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.keys import check_name
from pyqueue.protocol.models import NewJob
from pyqueue.protocol.spec import QueueSpec, QueueMemory
from pyqueue.protocol.verbs.base import run

#: How long after it was armed, then after each check, a waiting job's check is due.
DEFAULT_FLOW_CHECK_MS = 10_000
#: The due time of a waiting job (2^50 ms: never due by time); lua/flow_wait.lua.
WAIT_DUE_MS = 2**50
#: Policies of a waiting job when a job it waits for failed.
POLICIES = ("fail", "continue")

#: The most bytes of a flow's record (lua/flow_record.lua).
MAX_FLOW_RECORD_BYTES = 8 * 1024 * 1024

#: (queue, job id): a job another waits for.
Ref = tuple[str, str]


@dataclass(frozen=True)
class FlowRecord:
    """A flow's record as ``flow_record`` kept it, and when it goes (ms, server clock)."""

    record: bytes
    expires_ms: int


@dataclass(frozen=True)
class FlowDone:
    """The answer of ``flow_done``: ``state`` 'released' (by this call), 'waiting' or
    'gone' (not waiting, or no longer existing); ``counted``: the reported jobs removed
    from its wait (0 for a report made before)."""

    state: str
    counted: int


@dataclass(frozen=True)
class Waiting:
    """A waiting job whose check is due, and the jobs it still waits for."""

    id: str
    waits_for: list[Ref]


def check_refs(refs: Sequence[Ref], what: str, least: int) -> list[Ref]:
    """``least``..1000 (queue, job id) pairs, each checked."""
    checked = [(check_name(queue, "queue name"), check_job_id(ref)) for queue, ref in refs]
    if not least <= len(checked) <= 1000:
        raise InvalidArgument(f"{least}..1000 {what} per call, got {len(checked)}")
    return checked


"""flow_wait, flow_done and flow_due (see :class:`pyqueue.drivers.facade.QueueFacade`)."""

def flow_wait(
    spec: QueueSpec, memory: QueueMemory, job: NewJob, waits_for: Sequence[Ref], *, check_ms: int = DEFAULT_FLOW_CHECK_MS, now_ms: int | None = None
) -> Plan[str]:
    """Add ``job`` (with an id: a flow's step ids are deterministic) as waiting for
    the jobs ``waits_for`` (1..1000 (queue, job id) pairs) to end; its first check
    is due ``check_ms`` from now. ``job.delay_ms`` must be 0: it is due when its
    wait is over (lua/flow_wait.lua).

    As :meth:`enqueue`, the job is sized under a byte budget and listed under its
    ``task`` and group in a queue that keeps indexes.

    Returns 'ok' (added and armed), 'armed' (it waits already: a re-sent call) or
    'duplicate' (a job of that id exists or was acked recently; nothing written).

    Raises:
        QueueFull: the queue has a byte budget and the job's payload would take it past
            (nothing written: a definite answer, not an unknown outcome).
    """
    if job.job_id is None:
        raise InvalidArgument("a waiting job needs its id (a flow's ids are deterministic)")
    if job.delay_ms:
        raise InvalidArgument("a waiting job has no delay: it is due when what it waits for has ended")
    checked = new_job(job, spec.max_payload_bytes, spec.partitions)
    refs = check_refs(waits_for, "jobs waited for", 1)
    check_int(check_ms, "check_ms", 1, 2**40)
    check_now(now_ms)
    return text((yield from run(memory, flow_wait_call(spec.keys, now_ms, checked, check_ms, refs))))


def flow_done(
    spec: QueueSpec, memory: QueueMemory, job_id: str, ended: Sequence[tuple[str, str, str]], *, policy: str = "fail",
    check_ms: int = DEFAULT_FLOW_CHECK_MS, now_ms: int | None = None,
) -> Plan[FlowDone]:
    """Report that jobs the waiting job ``job_id`` waits for have ended: ``ended``
    holds 0..1000 (queue, job id, 'ok' or 'failed'). Replay-safe: a job reported
    before counts 0 (lua/flow_done.lua). With none, it is a check that found nothing
    ended: the next check is due ``check_ms`` from now."""
    check_job_id(job_id)
    if policy not in POLICIES:
        raise InvalidArgument(f"policy must be one of {POLICIES}, got {policy!r}")
    refs = check_refs([(queue, ref) for queue, ref, _ in ended], "ended jobs", 0)
    hows = [how for _, _, how in ended]
    if any(how not in ("ok", "failed") for how in hows):
        raise InvalidArgument(f"an ending is 'ok' or 'failed', got {hows!r}")
    check_int(check_ms, "check_ms", 1, 2**40)
    check_now(now_ms)
    call = flow_done_call(spec.keys, now_ms, job_id, policy, check_ms, [(q, r, h) for (q, r), h in zip(refs, hows)])
    state, counted = yield from run(memory, call)
    return FlowDone(text(state), int(counted))


def flow_due(spec: QueueSpec, memory: QueueMemory, limit: int = 100) -> Plan[list[Waiting]]:
    """Up to ``limit`` waiting jobs whose check is due on the server clock, earliest
    first, each with the jobs it still waits for. Read only (two round trips)."""
    check_int(limit, "limit", 1, 1000)
    time, due = yield Commands(
        spec.keys.fwait, [("TIME",), ("ZRANGEBYSCORE", spec.keys.fwait, "-inf", "+inf", "WITHSCORES", "LIMIT", 0, limit)]
    )
    now_ms = int(time[0]) * 1000 + int(time[1]) // 1000
    ids = [text(member) for member, score in pairs(due) if float(score) <= now_ms]
    if not ids:
        return []
    reads = [("ZRANGEBYLEX", spec.keys.fpending, f"[{i}\t", f"({i}\t\x7f") for i in ids]
    members = yield Commands(spec.keys.fpending, reads)
    out = []
    for job_id, found in zip(ids, members):
        refs = []
        for member in found:
            _, queue, ref = text(member).split("\t", 2)
            refs.append((queue, ref))
        out.append(Waiting(job_id, refs))
    return out


def flow_record(
    spec: QueueSpec, memory: QueueMemory, flow_id: str, record: bytes | str, keep_ms: int, *, now_ms: int | None = None
) -> Plan[str]:
    """Keep ``record`` (1 byte..8 MiB, opaque to the engine) as the record of flow
    ``flow_id`` for ``keep_ms`` from now; each call also deletes a few records whose
    time has passed (lua/flow_record.lua).

    Returns 'ok', or 'duplicate' (a record of this id is in force: a re-sent call, or
    an id used twice; nothing written). Replay-safe.
    """
    check_job_id(flow_id)
    data = record.encode() if isinstance(record, str) else record
    if not isinstance(data, bytes) or not 1 <= len(data) <= MAX_FLOW_RECORD_BYTES:
        raise InvalidArgument(f"a flow's record is 1..{MAX_FLOW_RECORD_BYTES} bytes")
    check_int(keep_ms, "keep_ms", 1, 2**40)
    check_now(now_ms)
    return text((yield from run(memory, flow_record_call(spec.keys, now_ms, flow_id, data, keep_ms))))


def flow_show(spec: QueueSpec, memory: QueueMemory, flow_id: str, *, now_ms: int | None = None) -> Plan[FlowRecord | None]:
    """The record of flow ``flow_id``, or None when none is in force (never kept, or
    its time has passed). Read only (lua/flow_show.lua)."""
    check_job_id(flow_id)
    check_now(now_ms)
    found = yield from run(memory, flow_show_call(spec.keys, now_ms, flow_id))
    if not found:
        return None
    record, expires_ms = found
    return FlowRecord(bytes(record), int(expires_ms))



def pairs(reply: Any) -> list[tuple[Any, Any]]:
    """A WITHSCORES reply as (member, score) pairs: redis-py gives pairs already, or a
    flat list (RESP2 without its callback)."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(pair[0], pair[1]) for pair in reply]
    flat = list(reply)
    return list(zip(flat[::2], flat[1::2]))
