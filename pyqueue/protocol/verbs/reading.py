"""Reading a queue: counts, the next due time, one job, a page of jobs by state, results
(lua/stats.lua, peek.lua, get.lua, browse.lua, result.lua). Read-only: never followed by WAIT."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from pyqueue.protocol.core import (
    Commands,
    Pipelined,
    Plan,
    browse_call,
    check_ids,
    check_int,
    check_job_id,
    check_now,
    decode_result,
    get_call,
    now_arg,
    peek_call,
    result_call,
    stats_call,
    text,
)
from pyqueue.protocol.errors import InvalidArgument, map_redis_error
from pyqueue.protocol.models import JobEntry, JobInfo, JobPage, JobResult, Peeked, Stats
from pyqueue.protocol.spec import QueueSpec, QueueMemory
from pyqueue.protocol.verbs.base import run


#: wait_result reads the job's state again this long after its first read, then after
#: twice as long each time, up to WAIT_SLICE_MS apart: the endings that add no entry to
#: the finished stream (an ack without a result, a cancel, a death by lease expiry or
#: scrub) are seen within about the time already waited, and at most WAIT_SLICE_MS late.
WAIT_REREAD_FIRST_MS = 50
#: The longest time between two reads of the job's state in wait_result.
WAIT_SLICE_MS = 2_000


def stream_entries(reply: Any) -> list[tuple[str, str]]:
    """(entry id, job id) of each entry of an XREAD reply on the finished stream, oldest
    first; [] when the read timed out. Takes redis-py's RESP2 and RESP3 shapes."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [stream[1] for stream in reply]
    out = []
    for entries in streams:
        for entry_id, fields in entries:
            if not isinstance(fields, dict):
                fields = dict(zip(fields[::2], fields[1::2]))
            job = fields.get(b"id", fields.get("id", b""))
            out.append((text(entry_id), text(job)))
    return out


#: The states ``browse`` pages through (dead jobs: ``dead_list``), and the values of one
#: job in lua/browse.lua's reply for each.
BROWSE_STATES = {"ready": 5, "scheduled": 4, "running": 6, "done": 4}
#: The most jobs one ``browse`` call answers.
MAX_BROWSE = 500


def check_browse(state: object, start: object, count: object) -> str:
    """``browse``'s arguments checked (InvalidArgument before anything is sent)."""
    if not isinstance(state, str) or state not in BROWSE_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(BROWSE_STATES)}, got {state!r}")
    check_int(start, "start", 0, 2**31)
    check_int(count, "count", 1, MAX_BROWSE)
    return str(state)


def parse_browse(queue: str, state: str, start: int, reply: Sequence[Any]) -> JobPage:
    """lua/browse.lua's reply as a :class:`JobPage` (``queue``: the queue read)."""
    width = BROWSE_STATES[state]
    jobs = []
    for i in range(2, len(reply), width):
        v = reply[i : i + width]
        job_id = text(v[0])
        if state == "ready":
            entry = JobEntry(job_id, queue, attempts=int(v[1]), max_attempts=int(v[2]), group=text(v[3]),
                             priority=int(v[4]))
        elif state == "scheduled":
            entry = JobEntry(job_id, queue, due_ms=int(v[1]), attempts=int(v[2]), max_attempts=int(v[3]))
        elif state == "running":
            entry = JobEntry(job_id, queue, owner=text(v[1]), attempts=int(v[2]), max_attempts=int(v[3]),
                             fence=int(v[4]), deadline_ms=int(v[5]))
        else:
            entry = JobEntry(job_id, queue, done_until_ms=int(v[1]), has_result=int(v[2]) == 1, finished_ms=int(v[3]))
        jobs.append(entry)
    return JobPage(state=state, total=int(reply[1]), start=start, now_ms=int(reply[0]), jobs=jobs)


def parse_stats(reply: Sequence[Any]) -> Stats:
    """lua/stats.lua's name/value pairs as :class:`Stats`."""
    return Stats(**{text(reply[i]): int(reply[i + 1]) for i in range(0, len(reply), 2)})


"""Stats, peek, get and results (see :class:`pyqueue.drivers.facade.QueueFacade`)."""

def stats(spec: QueueSpec, memory: QueueMemory, *, now_ms: int | None = None) -> Plan[Stats]:
    """Counts per state, lag and counters, read atomically (lua/stats.lua)."""
    check_now(now_ms)
    return parse_stats((yield from run(memory, stats_call(spec.keys, now_ms))))


def peek(spec: QueueSpec, memory: QueueMemory, *, now_ms: int | None = None) -> Plan[Peeked]:
    """Whether this queue has work for a lease call, and when it will next
    (lua/peek.lua). Read-only; see :func:`peek_many` for several queues at once."""
    check_now(now_ms)
    now, ready, next_due = yield from run(memory, peek_call(spec.keys, now_ms))
    return Peeked(int(now), int(ready), int(next_due))


def get(spec: QueueSpec, memory: QueueMemory, job_id: str, *, with_payload: bool = False, now_ms: int | None = None) -> Plan[JobInfo]:
    """Where job ``job_id`` is, and what is known of it, read atomically
    (lua/get.lua): its state, attempts, due time, payload size (the payload itself
    only ``with_payload``), a dead job's last error, a leased job's deadline, owner
    and fence, an acked job's tombstone. O(1), but O(current leases) for a ready or
    leased job (the lease is found by its receipt); never O(queue length)."""
    check_job_id(job_id)
    check_now(now_ms)
    reply = yield from run(memory, get_call(spec.keys, now_ms, job_id, bool(with_payload)))
    now, state, attempts, max_attempts, due, size, payload, error, deadline, owner, fence, until, sent = reply
    return JobInfo(
        id=job_id, queue=spec.name, state=text(state), now_ms=int(now), attempts=int(attempts),
        max_attempts=int(max_attempts), due_ms=int(due), payload_bytes=int(size),
        payload=bytes(payload) if with_payload and text(state) not in ("done", "unknown", "expired") else None,
        error=bytes(error).decode("utf-8", "replace"), deadline_ms=int(deadline), owner=text(owner),
        fence=int(fence), done_until_ms=int(until), enqueued_ms=int(sent),
    )


def browse(
    spec: QueueSpec, memory: QueueMemory, state: str, start: int = 0, count: int = 50, *, now_ms: int | None = None
) -> Plan[JobPage]:
    """One page of the jobs in ``state`` (``ready``, ``scheduled``, ``running`` or
    ``done``; the dead ones: :meth:`dead_list`): at most ``count`` (1..500) from
    rank ``start``, and how many there are in that state (lua/browse.lua).

    A snapshot of one moment, read atomically in one call, and bounded: each
    command reads at most ``count`` entries, by rank (O(log n + count); for the
    ready list, O(d + count), d the distance of ``start`` from its nearer end).
    Payloads are never returned (``get`` shows one job's). Pages read one after
    another may overlap or skip jobs that moved in between. Order: ready, the jobs
    without group or priority in the order lease takes them, then the grouped or
    prioritised ones by group (those without one last), priority and age (not the
    order lease serves those); scheduled by due time (jobs waiting for others last,
    ``JobEntry.waiting``); running by lease deadline; done, the tombstones in
    force, the earliest to expire first. Read only."""
    state = check_browse(state, start, count)
    check_now(now_ms)
    reply = yield from run(memory, browse_call(spec.keys, now_ms, state, start, count))
    return parse_browse(spec.name, state, start, reply)


def result(spec: QueueSpec, memory: QueueMemory, job_id: str, *, now_ms: int | None = None) -> Plan[JobResult]:
    """Job ``job_id``'s outcome now, without waiting (lua/result.lua): its kept
    result (``ok``), its last error (``dead``), ``pending``, ``done`` (ended with no
    result kept) or ``unknown``; see :class:`JobResult`."""
    info, _ = yield from _read_result(spec, memory, check_job_id(job_id), now_ms)
    return info


def results(spec: QueueSpec, memory: QueueMemory, job_ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[JobResult]]:
    """:meth:`result` of up to 1000 jobs, in one round trip (lua/result.lua once per
    id, pipelined); one answer each, in order. Read only."""
    ids = check_ids(job_ids)
    check_now(now_ms)
    replies = yield Pipelined("result", [(spec.keys, [now_arg(now_ms), job_id]) for job_id in ids])
    out = []
    for job_id, reply in zip(ids, replies):
        if isinstance(reply, Exception):
            raise map_redis_error(reply) from reply
        out.append(job_result(spec.name, job_id, reply)[0])
    return out


def wait_result(spec: QueueSpec, memory: QueueMemory, job_id: str, timeout_ms: int, *, now_ms: int | None = None) -> Plan[JobResult]:
    """Job ``job_id``'s outcome, waiting up to ``timeout_ms`` while it is pending or
    not there yet (the same on :class:`Queue` and :class:`~pyqueue.aio.AsyncQueue`).

    Returns at once when the outcome is final: ``ok``, ``dead``, or ``done`` (acked
    without a result, cancelled, or its result expired). An id that is ``unknown``
    (not enqueued yet: the producer may ask before its enqueue's reply, or for a job
    another process enqueues) is waited for like a pending one, until the timeout;
    it answers ``unknown`` only if nothing appeared by then. So an id with no trace
    at all (never enqueued, or finished so long ago that its result and tombstone
    expired) costs the whole timeout. A job seen pending that then vanishes without
    a trace (acked with ``keep_done_ms=0``, which leaves no tombstone) answers
    ``done``. Otherwise, when the time runs out: ``pending`` (or ``unknown``).

    How it waits: on the queue's ``finished`` stream (``XREAD BLOCK``, a key in the
    queue's hash tag), from the entry that lua/result.lua reported with the state, so
    an outcome written in between is not missed: it wakes when a result is stored,
    or when a nack sends the job to DEAD, not by polling. The other endings add no
    entry (an ack without a result, a cancel, a death by lease expiry or scrub), nor
    does an enqueue, so the waiter also reads the state again
    :data:`WAIT_REREAD_FIRST_MS` after its first read, then after twice as long each
    time, at most :data:`WAIT_SLICE_MS` apart, whatever other jobs finish meanwhile:
    such an ending is seen within about the time already waited (a short job's
    answer comes soon after it ends) and at most 2 s late, for about 6 reads in the
    first 2 s and one per 2 s after.
    """
    check_job_id(job_id)
    check_int(timeout_ms, "timeout_ms", 0, 86_400_000)
    end = time.monotonic() + timeout_ms / 1000
    info, last_id = yield from _read_result(spec, memory, job_id, now_ms)
    seen = False  # whether the job was seen pending
    pause = WAIT_REREAD_FIRST_MS / 1000
    read_at = time.monotonic() + pause  # the next read of the state
    while True:
        if info.state == "pending":
            seen = True
        elif info.state != "unknown":
            return info  # ok, dead, done: final
        elif seen:
            return replace(info, state="done")  # it ended and left no trace
        now = time.monotonic()
        if now >= end:
            return info
        block_ms = math.ceil((min(end, read_at) - now) * 1000)
        if block_ms > 0:  # (BLOCK 0 would block until an entry comes, maybe forever)
            block = ("XREAD", "BLOCK", block_ms, "STREAMS", spec.keys.finished, last_id)
            entries = stream_entries((yield Commands(spec.keys.finished, [block]))[0])
            if entries and job_id not in (job for _, job in entries):
                last_id = entries[-1][0]  # other jobs' outcomes: wait on until the next read
                continue
        info, last_id = yield from _read_result(spec, memory, job_id, now_ms)
        pause = min(pause * 2, WAIT_SLICE_MS / 1000)
        read_at = time.monotonic() + pause


def _read_result(spec: QueueSpec, memory: QueueMemory, job_id: str, now_ms: int | None) -> Plan[tuple[JobResult, str]]:
    """lua/result.lua: the outcome, and the newest entry of the finished stream."""
    check_now(now_ms)
    return job_result(spec.name, job_id, (yield from run(memory, result_call(spec.keys, now_ms, job_id))))


def job_result(queue: str, job_id: str, reply: Sequence[Any]) -> tuple[JobResult, str]:
    """lua/result.lua's reply as a :class:`JobResult`, and the newest entry of the
    finished stream."""
    _now, state, finished_ms, value, last_id = reply
    state = text(state)
    info = JobResult(
        id=job_id, queue=queue, state=state, value=decode_result(bytes(value)) if state == "ok" else None,
        error=bytes(value).decode("utf-8", "replace") if state == "dead" else "", finished_ms=int(finished_ms),
    )
    return info, text(last_id)


def peek_many(specs: Sequence[QueueSpec]) -> Plan[list[Peeked]]:
    """``peek`` every queue in one round trip per server (a pipeline of lua/peek.lua
    calls). A worker serving many queues finds the first with work this way instead of
    one lease call per empty queue. No partition-count guard: the caller's queues
    check theirs.

    Raises:
        the mapped error of the first call that failed (read-only: nothing was written).
    """
    if not specs:
        return []
    replies = yield Pipelined("peek", [(spec.keys, [""]) for spec in specs])
    out = []
    for reply in replies:
        if isinstance(reply, Exception):
            raise map_redis_error(reply) from reply
        now, ready, next_due = reply
        out.append(Peeked(int(now), int(ready), int(next_due)))
    return out


def sum_stats(each: Sequence[Stats]) -> Stats:
    """The figures of several partitions as one queue's: sums, but the largest
    ``lag_ms``, the latest ``now_ms`` and the latest ``paused_ms``."""
    summed = {f.name: sum(getattr(s, f.name) for s in each) for f in fields(Stats)}
    for latest in ("lag_ms", "now_ms", "paused_ms", "rate_limit", "rate_period_ms", "rate_burst"):
        summed[latest] = max(getattr(s, latest) for s in each)
    return Stats(**summed)


def stats_many(specs: Sequence[QueueSpec]) -> Plan[list[Stats]]:
    """``stats`` of every queue (a partitioned one summed over its partitions,
    :meth:`QueueSpec.partition_specs`) in one round trip per server: a pipeline of
    lua/stats.lua calls, one per physical queue. For exporters that read many queues
    at once.

    Raises:
        the mapped error of the first call that failed (read-only: nothing was written).
    """
    parts = [spec.partition_specs() for spec in specs]
    physical = [part for group in parts for part in group]
    if not physical:
        return []
    replies = iter((yield Pipelined("stats", [(p.keys, [""]) for p in physical])))
    out = []
    for group in parts:
        each = []
        for reply in (next(replies) for _ in group):
            if isinstance(reply, Exception):
                raise map_redis_error(reply) from reply
            each.append(parse_stats(reply))
        out.append(each[0] if len(each) == 1 else sum_stats(each))
    return out


def partition_stats(spec: QueueSpec, memory: QueueMemory, *, now_ms: int | None = None) -> Plan[list[Stats]]:
    """``stats`` of each partition, in partition order (of a queue of one partition, a
    list of its ``stats``)."""
    return [(yield from stats(spec, memory, now_ms=now_ms))]
