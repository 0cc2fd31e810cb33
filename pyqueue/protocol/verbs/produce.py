"""Enqueue: the plans that add jobs (lua/enqueue.lua)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from json import dumps
from typing import Any

from pyqueue.protocol.core import JobTuple, Plan, check_now, enqueue_call, new_batch, text
from pyqueue.protocol.models import Enqueued, NewJob, RateLimit
from pyqueue.protocol.spec import QueueSpec, QueueMemory
from pyqueue.protocol.verbs.base import run


def enqueue(
    spec: QueueSpec,
    memory: QueueMemory,
    payload: bytes | str,
    *,
    job_id: str | None = None,
    delay_ms: int = 0,
    max_attempts: int | None = None,
    priority: int = 0,
    group: str | None = None,
    expires_ms: int | None = None,
    debounce_ms: int | None = None,
    throttle_ms: int | None = None,
    key: str | None = None,
    sequence: str | None = None,
    on_failure: str = "block",
    rate_key: str | None = None,
    rate_limit: RateLimit | str | None = None,
    cost: int = 1,
    task: str | None = None,
    now_ms: int | None = None,
) -> Plan[Enqueued]:
    """Add one job (lua/enqueue.lua).

    Args:
        payload: bytes, or str (stored as UTF-8). Never pickled.
        job_id: a caller-chosen id makes enqueue idempotent: if a job with this id
            exists in any state, or was acked less than ``keep_done_ms`` ago (the
            acking queue object's setting), nothing changes and ``added`` is false.
            Default: 128 random bits in hex.
        delay_ms: run no earlier than this long after now (server clock).
        max_attempts: leases that may fail (nack, expiry, scrub) before the job goes
            to DEAD; default 5.
        priority: -5..5, default 0. Lease takes ready jobs of a higher level first,
            first in first out within a level (within a group, with ``group``).
        group: a key (1..128 bytes, no ``|`` or control characters: a tenant, an
            account) for fair scheduling: lease serves the groups with ready jobs
            round-robin, and never more of one group at once than its cap
            (:meth:`set_group_limit`). Jobs without a group share one turn of
            the round, as if they were one group without a cap.
        expires_ms: the job must be leased within this long of the send, or it ends
            as ``expired`` (state, counter, event), never run and never retried; its
            id stays a duplicate for ``keep_done_ms`` (lua/README.md section 2.7).
        debounce_ms: with ``key``: the job is due this long after the send. A later
            send with the same key while it is still waiting replaces its arguments
            and pushes it back: the key runs once, after a quiet ``debounce_ms``, with
            the last arguments. A send once it is due (ready, running, retrying) adds
            one new job for the key. At most one job per key waits at any time.
        throttle_ms: with ``key``: the first send adds a job and opens the key's
            window for this long; sends inside it add nothing.
        key: 1..256 bytes without control characters; on a partitioned queue it picks
            the job's partition.
        sequence: a key (as ``key``): the jobs sent with one sequence key run one at a
            time, in send order. A job sent while the key has a job waits, in no other
            state (``get`` answers ``sequenced``), until every job sent before it has
            ended (acked, cancelled, expired, or purged from the dead letters); a dead
            one blocks the key until it is replayed and acked, purged, or skipped
            (``sequence_skip``). Its delay counts from its send.
        on_failure: with ``sequence``: what its dead head does: "block" (the key
            waits, as above) or "skip" (the next job runs at once; the dead one stays in
            the dead letters, out of the sequence).
        rate_key: a key (as ``key``; on a partitioned queue it picks the partition
            when there is no other key): the jobs sent with one rate key are leased no
            faster than ``rate_limit``, across all workers. Decided by lease.lua at
            every lease: a job whose permits are not due is not leased but scheduled
            at its slot, when they will be (counted as ``deferred``; the key's waiting
            jobs spread over its permits, in order); other keys' jobs are leased
            meanwhile. A retry takes a permit again; the
            job's expiry still counts while it is deferred.
        rate_limit: with ``rate_key``: a :class:`RateLimit`, or its text ``COUNT/PERIOD``
            ("100/m", "5/s", "20/500ms"; burst 1: evenly spaced). Each job is checked
            against the limit it carries, unless the key has one set with
            :meth:`set_rate_limit`, which wins.
        cost: with ``rate_key``: the permits this job takes, 1..the limit's burst.
        task: the task the job runs (1..256 bytes without control characters; the
            task layer sets its own): a queue that keeps indexes (:meth:`set_indexes`)
            lists the job under it, for :meth:`search`.
        now_ms: tests only: override the server clock.

    Returns:
        The job id and whether it was added. For a send its key gave to another job
        (``by_key`` "debounced" or "throttled"), that job's id, and ``added`` false.
        A call re-sent after a lost reply
        reports ``added=False`` for the job it added the first time, and adds
        nothing even if that job has run and been acked since (within
        ``keep_done_ms``).

    Raises:
        InvalidArgument, WrongTypeError, OutcomeUnknown.
    """
    new = NewJob(payload, job_id, delay_ms, max_attempts, priority, group, expires_ms, debounce_ms, throttle_ms, key,
                 sequence, on_failure, rate_key, rate_limit, cost, task)
    (added,) = yield from enqueue_many(spec, memory, [new], now_ms=now_ms)
    return added


def json_payload(obj: Any) -> str:
    """What ``enqueue_json`` enqueues: the compact JSON of ``obj`` (UTF-8, not ASCII-escaped)."""
    return dumps(obj, separators=(",", ":"), ensure_ascii=False)


def enqueue_json(
    spec: QueueSpec,
    memory: QueueMemory,
    obj: Any,
    *,
    job_id: str | None = None,
    delay_ms: int = 0,
    max_attempts: int | None = None,
    priority: int = 0,
    group: str | None = None,
    expires_ms: int | None = None,
    debounce_ms: int | None = None,
    throttle_ms: int | None = None,
    key: str | None = None,
    sequence: str | None = None,
    on_failure: str = "block",
    rate_key: str | None = None,
    rate_limit: RateLimit | str | None = None,
    cost: int = 1,
    task: str | None = None,
    now_ms: int | None = None,
) -> Plan[Enqueued]:
    """``enqueue`` the JSON encoding of ``obj`` (compact, UTF-8); read it with ``Job.json()``."""
    plan = enqueue(spec, memory, json_payload(obj), job_id=job_id, delay_ms=delay_ms, max_attempts=max_attempts,
                   priority=priority, group=group, expires_ms=expires_ms, debounce_ms=debounce_ms,
                   throttle_ms=throttle_ms, key=key, sequence=sequence, on_failure=on_failure,
                   rate_key=rate_key, rate_limit=rate_limit, cost=cost, task=task, now_ms=now_ms)
    return (yield from plan)


def enqueue_many(
    spec: QueueSpec, memory: QueueMemory, jobs: Iterable[NewJob | bytes | str], *, now_ms: int | None = None
) -> Plan[list[Enqueued]]:
    """Add up to 1000 jobs in one atomic call (lua/enqueue.lua).

    Duplicates (of existing jobs, or repeated ids within ``jobs``) are skipped and
    reported with ``added=False``; everything else is added.

    Raises:
        InvalidArgument (nothing sent), WrongTypeError, OutcomeUnknown.
    """
    return (yield from enqueue_batch(spec, memory, checked_batch(spec, jobs, now_ms), now_ms))


def checked_batch(spec: QueueSpec, jobs: Iterable[NewJob | bytes | str], now_ms: int | None) -> list[JobTuple]:
    """``enqueue_many``'s jobs validated (ids drawn), before anything is sent."""
    batch = new_batch(jobs, spec.max_payload_bytes, spec.partitions)
    check_now(now_ms)
    return batch


def enqueue_batch(spec: QueueSpec, memory: QueueMemory, batch: Sequence[JobTuple], now_ms: int | None) -> Plan[list[Enqueued]]:
    """``enqueue_many`` of jobs already validated (:func:`checked_batch`)."""
    reply = yield from run(memory, enqueue_call(spec.keys, now_ms, batch))
    return [enqueued(job, flag) for job, flag in zip(batch, reply[2:])]


def enqueued(job: JobTuple, flag: Any) -> Enqueued:
    """One job's answer from its flag: 1 (added), 0 (a duplicate), or the id of the job
    its key gave the send to (the key's mode says how)."""
    if flag == 1 or flag == 0:
        return Enqueued(job[0], flag == 1)
    return Enqueued(text(flag), False, job[7].split("|", 1)[0] + "d")
