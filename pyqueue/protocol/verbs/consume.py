"""The lease and its endings: the verbs of the worker's path (lua/lease.lua, ack.lua,
ack_result.lua, nack.lua, extend.lua, release.lua)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from pyqueue.protocol.core import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    DEFAULT_MAX_RESULTS,
    DEFAULT_RESULT_TTL_MS,
    MAX_BATCH,
    MAX_CALL_PAYLOAD_BYTES,
    MAX_ERROR_BYTES,
    MAX_LEASE_MS,
    Plan,
    Step,
    ack_call,
    ack_outcomes,
    ack_result_call,
    check_int,
    check_now,
    defer_key_call,
    encode_result,
    extend_call,
    lease_call as lease_script,
    nack_call,
    receipts_of,
    release_call,
    text,
)
from pyqueue.protocol.errors import InvalidArgument, NotReplicated
from pyqueue.protocol.models import Extended, Job, Leased, Nacked, Outcome
from pyqueue.protocol.spec import QueueSpec, QueueMemory
from pyqueue.protocol.verbs.base import run


"""Lease, ack, nack, extend and release (see :class:`pyqueue.drivers.facade.QueueFacade`)."""

def _run_acks(memory: QueueMemory, step: Step, receipts: Sequence[str], acks_of: Callable[[Any], list[Outcome]]) -> Plan[Any]:
    """Run ``step``, a call that acks ``receipts`` (their outcomes are
    ``acks_of(reply)``), and return its reply. If it raises NotReplicated, the
    receipts it acked are remembered, so that the ack sent again answers OK for them
    where it finds the job gone (see :mod:`pyqueue.protocol.unconfirmed`)."""
    try:
        return (yield from run(memory, step))
    except NotReplicated as exc:
        if exc.reply is not None and not isinstance(exc.reply, Exception):
            memory.unconfirmed.note(receipts, acks_of(exc.reply))
        raise

def _resolved(memory: QueueMemory, receipts: Sequence[str], outcomes: list[Outcome]) -> list[Outcome]:
    """``outcomes`` of an ack of ``receipts``, GONE read as OK where an unconfirmed
    send of this object acked the receipt (costs one test while there is none)."""
    return memory.unconfirmed.resolve(receipts, outcomes) if memory.unconfirmed else outcomes

# -- lease / ack -----------------------------------------------------------------

def lease(spec: QueueSpec, memory: QueueMemory, lease_ms: int = DEFAULT_LEASE_MS, count: int = 1, *, now_ms: int | None = None) -> Plan[list[Job]]:
    """Lease up to ``count`` ready jobs (lua/lease.lua). Returns [] if none is ready.

    Before leasing, the same call promotes due scheduled jobs and reclaims expired
    leases (bounded). Each job gets a new fence and the deadline now + ``lease_ms``
    (server clock); ``extend`` pushes it back. A lease past its deadline stays
    valid until it is reclaimed; then the job runs again (at least once).
    """
    return (yield from lease_call(spec, memory, count=count, lease_ms=lease_ms, now_ms=now_ms)).jobs


def ack(spec: QueueSpec, memory: QueueMemory, job: Job, *, now_ms: int | None = None) -> Plan[Outcome]:
    """Complete a leased job (lua/ack.lua).

    Returns :attr:`Outcome.OK` if this lease was current: the job is deleted, and no
    call will ever get OK for it again; its id stays a duplicate for enqueue for
    ``keep_done_ms``. :attr:`Outcome.STALE` if the job was
    reclaimed from this lease (it will run, or ran, again elsewhere);
    :attr:`Outcome.GONE` if it no longer exists. Only OK changes anything.

    Raises:
        NotReplicated: with ``wait_replicas``, the ack ran but too few replicas
            confirmed it. Send it again on this object: it answers OK if the job
            is gone because this send completed it (see :mod:`pyqueue.protocol.unconfirmed`).
    """
    return (yield from ack_many(spec, memory, [job], now_ms=now_ms))[0]


def ack_many(spec: QueueSpec, memory: QueueMemory, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]:
    """``ack`` up to 1000 jobs in one atomic call (lua/ack.lua); one outcome each.
    ``now_ms``: tests only (it dates the tombstones)."""
    receipts = receipts_of(jobs)
    check_now(now_ms)
    reply = yield from _run_acks(memory, ack_call(spec.keys, now_ms, spec.keep_done_ms, receipts), receipts, ack_outcomes)
    return _resolved(memory, receipts, ack_outcomes(reply))


def ack_result(
    spec: QueueSpec, memory: QueueMemory, job: Job, value: object, *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
    max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None,
) -> Plan[Outcome]:
    """``ack`` the job and keep ``value`` (bytes, str or JSON-able) as its result
    for ``result_ttl_ms``, in one atomic call (lua/ack_result.lua): a result is
    stored exactly when the ack answers OK. :meth:`result` and :meth:`wait_result`
    read it. The queue keeps at most ``max_results`` results (the oldest-expiring
    go first), each at most 512 KiB encoded: memory stays bounded.

    Raises:
        InvalidArgument: a value that is not bytes, str or JSON-able, or too large.
    """
    receipt = receipts_of([job])[0]
    encoded = encode_result(value)
    check_int(result_ttl_ms, "result_ttl_ms", 1, 2**40)
    check_int(max_results, "max_results", 1, 10_000_000)
    check_now(now_ms)
    step = ack_result_call(
        spec.keys, now_ms, spec.keep_done_ms, result_ttl_ms, max_results, [(receipt, encoded)]
    )
    reply = yield from _run_acks(memory, step, [receipt], ack_outcomes)
    return _resolved(memory, [receipt], ack_outcomes(reply))[0]


def ack_result_many(
    spec: QueueSpec, memory: QueueMemory, jobs: Sequence[Job], values: Sequence[object], *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
    max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None,
) -> Plan[list[Outcome]]:
    """:meth:`ack_result` of up to 1000 jobs in one atomic call (lua/ack_result.lua),
    ``values[i]`` the result of ``jobs[i]``, all kept for ``result_ttl_ms``; one
    outcome each, as :meth:`ack_many` answers (a result is stored exactly for the
    jobs answered OK).

    Raises:
        InvalidArgument: ``jobs`` and ``values`` of different lengths, a value that
            cannot be stored, or values over 256 MiB in all (nothing was sent).
    """
    receipts = receipts_of(jobs)
    if len(values) != len(receipts):
        raise InvalidArgument(f"{len(receipts)} jobs and {len(values)} values: one value per job")
    encoded = [encode_result(value) for value in values]
    if sum(map(len, encoded)) > MAX_CALL_PAYLOAD_BYTES:
        raise InvalidArgument(f"the results of one call must total at most {MAX_CALL_PAYLOAD_BYTES} bytes")
    check_int(result_ttl_ms, "result_ttl_ms", 1, 2**40)
    check_int(max_results, "max_results", 1, 10_000_000)
    check_now(now_ms)
    step = ack_result_call(
        spec.keys, now_ms, spec.keep_done_ms, result_ttl_ms, max_results, list(zip(receipts, encoded))
    )
    return _resolved(memory, receipts, ack_outcomes((yield from _run_acks(memory, step, receipts, ack_outcomes))))


def ack_and_lease(
    spec: QueueSpec,
    memory: QueueMemory,
    job: Job,
    *,
    lease_ms: int = DEFAULT_LEASE_MS,
    count: int = 1,
    call: str | None = None,
    now_ms: int | None = None,
) -> Plan[tuple[Outcome, list[Job]]]:
    """Ack ``job`` and lease up to ``count`` more in one round trip (lua/lease.lua).

    The ack has exactly the semantics of ``ack``; the lease those of ``lease``.
    ``call``: see :meth:`lease_call`.
    """
    leased = yield from lease_call(spec, memory, ack=[job], count=count, lease_ms=lease_ms, call=call, now_ms=now_ms)
    return leased.acks[0], leased.jobs


def lease_call(
    spec: QueueSpec,
    memory: QueueMemory,
    *,
    ack: Sequence[Job] = (),
    count: int = 1,
    lease_ms: int = DEFAULT_LEASE_MS,
    limit: int = DEFAULT_MAINTENANCE_LIMIT,
    call: str | None = None,
    now_ms: int | None = None,
) -> Plan[Leased]:
    """The whole lease call (lua/lease.lua): ack ``ack``, maintain, lease ``count``.

    Returns the jobs, the ack outcomes and when to look again (``next_due_ms``).
    The call token makes the call replay-safe: if the same call (same token) is sent
    again after a lost reply, by redis-py or by the caller, the script returns the
    jobs the first run leased. Default: a fresh random token; pass your own to
    retry a call yourself.
    """
    check_int(count, "count", 0, MAX_BATCH)
    check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
    check_int(limit, "limit", 1, MAX_BATCH)
    check_now(now_ms)
    receipts = receipts_of(ack) if ack else []
    call = secrets.token_hex(8) if call is None else call
    step = lease_script(spec.keys, now_ms, spec.owner, call, count, lease_ms, limit, spec.keep_done_ms, receipts)
    if not receipts:
        return parse_lease(spec.name, (yield from run(memory, step)))
    leased = parse_lease(spec.name, (yield from _run_acks(memory, step, receipts, lambda r: parse_lease(spec.name, r).acks)))
    return replace(leased, acks=_resolved(memory, receipts, leased.acks)) if memory.unconfirmed else leased


def parse_lease(queue: str, reply: list[Any]) -> Leased:
    """Turn lua/lease.lua's flat reply into a :class:`Leased`."""
    now, next_due, n_acks = int(reply[0]), int(reply[1]), int(reply[2])
    acks = [Outcome(text(s)) for s in reply[3 : 3 + n_acks]]
    at = 3 + n_acks
    count = int(reply[at])
    jobs = []
    for i in range(count):
        receipt, job_id, payload, fence, attempt, max_attempts, deadline, sent = reply[at + 1 + 8 * i : at + 9 + 8 * i]
        jobs.append(
            Job(
                id=text(job_id),
                queue=queue,
                payload=bytes(payload),
                fence=int(fence),
                attempt=int(attempt),
                max_attempts=int(max_attempts),
                deadline_ms=int(deadline),
                receipt=text(receipt),
                enqueued_ms=None if int(sent) < 0 else int(sent),
            )
        )
    return Leased(jobs=jobs, acks=acks, now_ms=now, next_due_ms=next_due)

# -- failure paths ---------------------------------------------------------------

def nack(
    spec: QueueSpec,
    memory: QueueMemory,
    job: Job,
    error: str = "",
    *,
    delay_ms: int | None = None,
    backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS,
    backoff_cap_ms: int = DEFAULT_BACKOFF_CAP_MS,
    now_ms: int | None = None,
    final: bool = False,
) -> Plan[Nacked]:
    """Fail this lease of ``job`` (lua/nack.lua); the attempt counts.

    If attempts reached max_attempts, or ``final`` is true (a retry cannot succeed),
    the job goes to DEAD with ``error`` (state ``dead``, counted in ``nacked`` and
    ``dead``, and its waiters woken, as any death by nack); otherwise it is
    scheduled again after ``delay_ms``, or after exponential backoff
    ``min(cap, base * 2^(attempt-1))`` with jitter (half of it random) when
    ``delay_ms`` is None. A stale receipt changes nothing.
    """
    (receipt,) = receipts_of([job])
    if not isinstance(error, str) or len(error.encode("utf-8", "replace")) > MAX_ERROR_BYTES:
        raise InvalidArgument(f"error must be a str of at most {MAX_ERROR_BYTES} bytes")
    if delay_ms is not None:
        check_int(delay_ms, "delay_ms", 0, 2**40)
    check_int(backoff_base_ms, "backoff_base_ms", 1, 2**40)
    check_int(backoff_cap_ms, "backoff_cap_ms", 1, 2**40)
    check_now(now_ms)
    if not isinstance(final, bool):
        raise InvalidArgument(f"final must be a bool, got {final!r}")
    step = nack_call(
        spec.keys, now_ms, receipt, error.encode("utf-8", "replace"), delay_ms, backoff_base_ms, backoff_cap_ms,
        final,
    )
    status, state, at_ms = yield from run(memory, step)
    outcome = Outcome(text(status))
    return Nacked(outcome, text(state) if outcome else None, int(at_ms))


def extend(
    spec: QueueSpec, memory: QueueMemory, jobs: Iterable[Job], lease_ms: int = DEFAULT_LEASE_MS, *, now_ms: int | None = None
) -> Plan[list[Extended]]:
    """Move the deadlines of current leases to now + ``lease_ms`` (lua/extend.lua).

    Never moves a deadline earlier. Stale receipts change nothing.
    """
    receipts = receipts_of(jobs)
    check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
    check_now(now_ms)
    reply = yield from run(memory, extend_call(spec.keys, now_ms, lease_ms, receipts))
    return [Extended(Outcome(text(reply[i])), int(reply[i + 1])) for i in range(0, len(reply), 2)]


def defer_key(spec: QueueSpec, memory: QueueMemory, job: Job, delay_ms: int, *, now_ms: int | None = None) -> Plan[int | None]:
    """Let the rate key of ``job``, a job this worker holds, take no job until now +
    ``delay_ms`` (lua/defer_key.lua): for a downstream's 429 with its Retry-After. The
    key's next permit is due then (or later, if it was already): its jobs deferred to
    earlier slots are checked again when they come due, and wait on.
    The job itself is not touched: end its run as you choose (the task layer's
    ``current_job().defer_key`` retries it then). Fenced: a lease that has ended
    defers nothing.

    Returns:
        When the key's next permit is due (server ms), the server's now if the key's
        limit was lifted with ``set_rate_limit`` (nothing written), or None if the
        lease has ended.

    Raises:
        InvalidArgument: not a leased Job, a bad delay, or the job has no rate key.
    """
    receipt = receipts_of([job])[0]
    check_int(delay_ms, "delay_ms", 0, 2**40)
    check_now(now_ms)
    status, until_ms = yield from run(memory, defer_key_call(spec.keys, now_ms, receipt, delay_ms))
    return None if text(status) == "lost" else int(until_ms)


def release(spec: QueueSpec, memory: QueueMemory, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]:
    """Give leases back to the head of READY without counting the attempt
    (lua/release.lua), e.g. at shutdown. Stale receipts change nothing."""
    receipts = receipts_of(jobs)
    check_now(now_ms)
    reply = yield from run(memory, release_call(spec.keys, now_ms, receipts))
    return [Outcome(text(s)) for s in reply]

