"""Maintenance, job control and the dead letters: promote, scrub, cancel, rate limits,
group caps, pause/resume, dead_list/replay/purge (one script each)."""

from __future__ import annotations

from collections.abc import Sequence

from pyqueue.protocol.core import (
    DEFAULT_MAINTENANCE_LIMIT,
    MAX_BATCH,
    Pipelined,
    Plan,
    cancel_call,
    check_group,
    check_ids,
    check_int,
    check_job_id,
    check_now,
    dead_list_call,
    dead_purge_call,
    dead_replay_call,
    groups_call,
    limit_call,
    pause_call,
    promote_call,
    resume_call,
    scrub_call,
    check_key,
    check_rate,
    sequence_skip_call,
    set_budget_call,
    set_result_budget_call,
    set_tombstone_limit_call,
    set_group_limit_call,
    set_rate_limit_call,
    text,
)
from pyqueue.protocol.models import (
    Cancelled,
    DeadJob,
    DeadPage,
    GroupInfo,
    GroupsPage,
    Promoted,
    RateLimit,
    Scrubbed,
    SequenceSkipped,
)
from pyqueue.protocol.errors import map_redis_error
from pyqueue.protocol.spec import QueueSpec, QueueMemory
from pyqueue.protocol.verbs.base import run


"""Maintenance, job control and dead letters (see :class:`pyqueue.drivers.facade.QueueFacade`)."""

def promote(spec: QueueSpec, memory: QueueMemory, limit: int = DEFAULT_MAINTENANCE_LIMIT, *, now_ms: int | None = None) -> Plan[Promoted]:
    """Promote due scheduled jobs and reclaim expired leases, at most ``limit`` of
    each (lua/promote.lua). ``lease`` does this itself; call it to keep READY fresh
    without leasing."""
    check_int(limit, "limit", 1, MAX_BATCH)
    check_now(now_ms)
    p, r, d, more, next_due = yield from run(memory, promote_call(spec.keys, now_ms, limit))
    return Promoted(int(p), int(r), int(d), bool(more), int(next_due))


def scrub(spec: QueueSpec, memory: QueueMemory, owner: str, *, limit: int = DEFAULT_MAINTENANCE_LIMIT, now_ms: int | None = None) -> Plan[Scrubbed]:
    """End every lease ``owner`` (a dead service) holds in this queue (lua/scrub.lua):
    jobs go to the head of READY with the attempt counted, or to DEAD at their
    maximum. At most ``limit`` per call; ``more`` says to call again. Safe to run
    concurrently and twice. Never scrub a live owner: its jobs would run twice."""
    check_int(limit, "limit", 1, MAX_BATCH)
    check_now(now_ms)
    scrubbed, dead, more = yield from run(memory, scrub_call(spec.keys, now_ms, owner, limit))
    return Scrubbed(int(scrubbed), int(dead), bool(more))


def sequence_skip(spec: QueueSpec, memory: QueueMemory, key: str, *, now_ms: int | None = None) -> Plan[SequenceSkipped]:
    """Let the sequence ``key`` go on past its dead head (lua/sequence_skip.lua): the
    next job sent with the key becomes its head and runs (scheduled at its due time);
    the dead job stays in the dead letters, out of the sequence (a replay runs it alone).
    A head that is not dead is left alone (``running``). A re-sent call finds the new
    head running, or the key free: one skip."""
    check_key(key)
    check_now(now_ms)
    status, next_id = yield from run(memory, sequence_skip_call(spec.keys, now_ms, key))
    return SequenceSkipped(key=key, status=text(status), next_id=text(next_id))


def cancel(spec: QueueSpec, memory: QueueMemory, job_id: str, *, now_ms: int | None = None) -> Plan[Cancelled]:
    """End job ``job_id`` now, in whatever state it is, so that it never runs
    (again) (lua/cancel.lua).

    A ready, scheduled or dead job is removed. A leased job's lease ends at once:
    nothing can retry it, dead-letter it or reclaim it, whatever its handler then
    returns (its ack or nack answers ``gone``). The handler itself is told at its
    worker's next lease extension, within a third of ``lease_ms``: ``job.cancelled``
    is set for a sync handler, an ``async def`` handler's task is cancelled. Until
    it stops, the handler may still be working: cancelling running code is
    cooperative.

    Duplicates: the cancelled id stays a duplicate for ``keep_done_ms``, like an
    acked one, so a producer's retried enqueue does not bring the job back.

    Cost: O(1) for a scheduled or dead job; for a ready or leased one a scan of the
    queue's current leases (O(workers' concurrency)), and for a ready one an
    O(position) removal from READY.

    Returns:
        :class:`Cancelled`: ``state`` is where the job was cancelled from, or
        ``done`` / ``unknown`` with nothing changed (it already ended, or never
        existed). A re-sent call answers ``done`` (or ``unknown`` with
        ``keep_done_ms=0``): one cancel.
    """
    check_job_id(job_id)
    check_now(now_ms)
    (state,) = yield from run(memory, cancel_call(spec.keys, now_ms, job_id, spec.keep_done_ms))
    return Cancelled(id=job_id, queue=spec.name, state=text(state))


def cancel_many(spec: QueueSpec, memory: QueueMemory, job_ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[Cancelled]]:
    """:meth:`cancel` of up to 1000 jobs in one round trip (lua/cancel.lua once per id,
    pipelined): each call is atomic and checks its job's state, as one cancel does.
    One answer each, in order."""
    ids = check_ids(job_ids)
    check_now(now_ms)
    calls = [cancel_call(spec.keys, now_ms, job_id, spec.keep_done_ms) for job_id in ids]
    replies = yield Pipelined("cancel", [(call.keys, call.args) for call in calls])
    out = []
    for job_id, reply in zip(ids, replies):
        if isinstance(reply, Exception):
            raise map_redis_error(reply) from reply
        out.append(Cancelled(id=job_id, queue=spec.name, state=text(reply[0])))
    return out


def limit(spec: QueueSpec, memory: QueueMemory, count: int, period_ms: int = 1000, *, burst: int = 1) -> Plan[bool]:
    """Cap the rate at which this queue hands out jobs, across all workers
    (lua/limit.lua): at most ``count`` leases per ``period_ms``, spaced evenly on
    the Redis server's clock, with up to ``burst`` at once after a quiet spell; so
    in any window of ``period_ms`` at most ``count + burst - 1`` leases start (with
    the default burst 1, at most ``count``). Enforced inside lease.lua; workers wait
    for the next permit (the lease answer says when) instead of polling.
    ``count=0`` lifts the cap. Every lease counts, retries and reclaims included.
    Returns whether this call changed the cap.

    Raises:
        InvalidArgument: count not in 0..1,000,000, period_ms not in
            1..86,400,000, burst not in 1..1,000,000.
    """
    check_int(count, "count", 0, 1_000_000)
    check_int(period_ms, "period_ms", 1, 86_400_000)
    check_int(burst, "burst", 1, 1_000_000)
    *_, changed = yield from run(memory, limit_call(spec.keys, count, period_ms, burst))
    return bool(changed)


def set_rate_limit(spec: QueueSpec, memory: QueueMemory, key: str, rate: RateLimit | str | None) -> Plan[bool]:
    """Set the limit of the rate key ``key`` at run time (lua/set_rate_limit.lua): it wins
    over the limit its jobs were sent with (``enqueue(rate_limit=...)``), from the next
    lease on. ``rate``: a :class:`RateLimit` or its text ("100/m"); a count of 0 lets the
    key's jobs through unchecked; None goes back to the limit the jobs carry. Jobs
    already deferred are checked at the new limit when they come due (the permits
    still owed are counted at its spacing). Returns whether this call changed the
    key's limit (a re-sent call changes nothing).

    Raises:
        InvalidArgument: a malformed key or rate (nothing sent).
    """
    check_key(key, "key")
    limit = ""
    if rate is not None:
        checked = check_rate(RateLimit(0, 1000) if rate == "off" else rate, zero=True)
        limit = f"{checked.count}/{checked.period_ms}/{checked.burst}"
    (changed,) = yield from run(memory, set_rate_limit_call(spec.keys, key, limit))
    return bool(changed)


def set_budget(spec: QueueSpec, memory: QueueMemory, max_bytes: int | None) -> Plan[bool]:
    """Cap the payload bytes the queue holds (lua/set_budget.lua), or lift the cap (None
    or 0). With a budget, enqueue keeps each job's payload size and refuses, with
    :class:`~pyqueue.QueueFull` and nothing written, a call that would take the queue
    past it; a job's size is taken off when it ends (acked, cancelled, expired, purged
    from the dead letters: a dead job still counts). Jobs sent while the queue had no
    budget are not counted. ``Stats.bytes`` is the sum now, ``Stats.budget_bytes`` the
    cap. Returns whether this call changed the budget.

    Raises:
        InvalidArgument: max_bytes not None or in 0..2^50 (nothing sent).
    """
    check_int(0 if max_bytes is None else max_bytes, "max_bytes", 0, 2**50)
    changed, _bytes = yield from run(memory, set_budget_call(spec.keys, max_bytes or 0))
    return bool(changed)


def set_result_budget(spec: QueueSpec, memory: QueueMemory, max_bytes: int | None) -> Plan[bool]:
    """Cap the bytes of results the queue keeps (lua/set_result_budget.lua), or lift the
    cap (None or 0). With a budget, ``ack_result`` keeps each result's size and, before
    it stores results that would take the sum past the cap, deletes the oldest-expiring
    ones (as it deletes those past ``max_results`` or past their time): a result may be
    gone before its ``result_ttl_ms``. Results stored while the queue had no budget are
    not counted. Returns whether this call changed the budget.

    Raises:
        InvalidArgument: max_bytes not None or in 0..2^50 (nothing sent).
    """
    check_int(0 if max_bytes is None else max_bytes, "max_bytes", 0, 2**50)
    changed, _bytes = yield from run(memory, set_result_budget_call(spec.keys, max_bytes or 0))
    return bool(changed)


def set_tombstone_limit(spec: QueueSpec, memory: QueueMemory, max_count: int | None) -> Plan[bool]:
    """Cap how many tombstones the queue keeps (lua/set_tombstone_limit.lua), or lift
    the cap (None or 0). A tombstone is an ended job's id, kept ``keep_done_ms`` so that
    a re-sent enqueue of it is a duplicate; past the limit, the scripts that write them
    (ack, ack_result, lease, cancel) delete the earliest-expiring first, at most n + 10
    per call. An id whose tombstone went for room is no longer a duplicate: a re-sent
    enqueue of it adds the job again. Each tombstone is one id, so this bounds their
    bytes. Returns whether this call changed the limit.

    Raises:
        InvalidArgument: max_count not None or in 0..2^40 (nothing sent).
    """
    check_int(0 if max_count is None else max_count, "max_count", 0, 2**40)
    (changed,) = yield from run(memory, set_tombstone_limit_call(spec.keys, max_count or 0))
    return bool(changed)


def set_group_limit(spec: QueueSpec, memory: QueueMemory, cap: int | None, *, group: str | None = None) -> Plan[bool]:
    """Cap how many jobs of one group run at once (lua/set_group_limit.lua): the
    default cap of every group, or with ``group`` that group's own (which wins over
    the default). ``cap=None`` (or 0) lifts the default; for one group, ``None``
    deletes its own cap, so that the default applies to it again, and 0 exempts it.

    Decided in lease.lua: a group at its cap is skipped without moving its jobs or
    using their attempts, and other groups' jobs are leased past it. A slot is given
    back by every ending of a lease (ack, nack, cancel, release, expiry, scrub), at
    most once (the endings are fenced). A raised cap takes effect at once (waiting
    workers are woken), a lowered one at the next lease: leases running above it
    run to their end. Returns whether this call changed a cap.

    Raises:
        InvalidArgument: cap not None or in 0..1,000,000; a malformed group.
    """
    if cap is not None:
        check_int(cap, "cap", 0, 1_000_000)
    name = "" if group is None else check_group(group)
    arg: int | str = ("" if group is not None else 0) if cap is None else cap
    changed, _unparked = yield from run(memory, set_group_limit_call(spec.keys, name, arg))
    return bool(changed)


def groups(spec: QueueSpec, memory: QueueMemory, offset: int = 0, limit: int = 100) -> Plan[GroupsPage]:
    """One page of the groups that have READY jobs (lua/groups.lua): those parked at
    their cap first, then in the order lease serves them; each with its READY jobs,
    its running leases and its cap. A group with leases running but nothing READY is
    not listed. Read only."""
    check_int(offset, "offset", 0, 2**31)
    check_int(limit, "limit", 1, MAX_BATCH)
    reply = yield from run(memory, groups_call(spec.keys, offset, limit))
    rows = reply[2:]
    groups = [
        GroupInfo(name=text(rows[i]), ready=int(rows[i + 2]), running=int(rows[i + 3]), cap=int(rows[i + 4]),
                  parked=int(rows[i + 1]) < 0, turn=int(rows[i + 1]), queue=spec.name)
        for i in range(0, len(rows), 5)
    ]
    return GroupsPage(total=int(reply[0]), default_cap=int(reply[1]), groups=groups)


def pause(spec: QueueSpec, memory: QueueMemory, *, now_ms: int | None = None) -> Plan[bool]:
    """Stop the queue from handing out jobs (lua/pause.lua); returns whether this
    call paused it (False: it was paused already). Enqueue, ack, nack, extend and
    the reclaim of expired leases go on; running jobs run to their end; workers
    wait on the wake marker, without polling, until :meth:`resume`."""
    check_now(now_ms)
    _paused_ms, changed = yield from run(memory, pause_call(spec.keys, now_ms))
    return bool(changed)


def resume(spec: QueueSpec, memory: QueueMemory, *, now_ms: int | None = None) -> Plan[bool]:
    """Let a paused queue hand out jobs again and wake its workers
    (lua/resume.lua); returns whether this call resumed it (False: not paused)."""
    check_now(now_ms)
    _paused_ms, changed = yield from run(memory, resume_call(spec.keys, now_ms))
    return bool(changed)


def dead_list(spec: QueueSpec, memory: QueueMemory, offset: int = 0, limit: int = 100) -> Plan[DeadPage]:
    """One page of DEAD jobs, oldest first (lua/dead_list.lua)."""
    check_int(offset, "offset", 0, 2**31)
    check_int(limit, "limit", 1, MAX_BATCH)
    reply = yield from run(memory, dead_list_call(spec.keys, offset, limit))
    jobs = [
        DeadJob(
            id=text(reply[i]),
            dead_ms=int(reply[i + 1]),
            attempts=int(reply[i + 2]),
            max_attempts=int(reply[i + 3]),
            error=bytes(reply[i + 4]).decode("utf-8", "replace"),
            payload=bytes(reply[i + 5]),
        )
        for i in range(1, len(reply), 6)
    ]
    return DeadPage(total=int(reply[0]), jobs=jobs)


def dead_replay(
    spec: QueueSpec, memory: QueueMemory, ids: Sequence[str] | None = None, *, limit: int = 100, now_ms: int | None = None
) -> Plan[int]:
    """Move dead jobs back to the tail of READY with attempts reset
    (lua/dead_replay.lua). Returns how many moved.

    Args:
        ids: the jobs to replay (ids not in DEAD are skipped). ``None``: the
            ``limit`` oldest dead jobs, listed first with ``dead_list`` (the script
            always takes explicit ids, so a re-sent call moves nothing twice).
    """
    check_now(now_ms)
    chosen = yield from dead_ids(spec, memory, ids, limit)
    if not chosen:
        return 0
    replayed, _remaining = yield from run(memory, dead_replay_call(spec.keys, now_ms, chosen))
    return int(replayed)


def dead_purge(spec: QueueSpec, memory: QueueMemory, ids: Sequence[str] | None = None, *, limit: int = 100) -> Plan[int]:
    """Delete dead jobs for good (lua/dead_purge.lua): the given ``ids`` (ids not in
    DEAD are skipped), or the ``limit`` oldest. Returns how many were deleted."""
    chosen = yield from dead_ids(spec, memory, ids, limit)
    if not chosen:
        return 0
    purged, _remaining = yield from run(memory, dead_purge_call(spec.keys, chosen))
    return int(purged)


def dead_ids(spec: QueueSpec, memory: QueueMemory, ids: Sequence[str] | None, limit: int) -> Plan[list[str]]:
    """``ids`` checked, or the ids of the ``limit`` oldest dead jobs."""
    if ids is None:
        return [job.id for job in (yield from dead_list(spec, memory, 0, limit)).jobs]
    return check_ids(ids)
