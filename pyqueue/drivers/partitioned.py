"""A logical queue spread over K partitions: K queues of their own hash tags, so a busy
queue can span every primary of a Redis Cluster (DESIGN §9).

``Queue(name, partitions=K)`` with K > 1 returns a :class:`PartitionedQueue`. Its
partitions are ordinary queues named ``<name>#0`` .. ``<name>#<K-1>`` (keys
``<prefix>:{<name>#<p>}:<role>``): the Lua scripts do not know about partitions, a
partition is just a queue. A job lives in partition :func:`~pyqueue.drivers.queue.partition_of`
of its id (CRC16 of the id, modulo K), so everything that holds per job holds as for one
queue: uniqueness and idempotent enqueue by id, tombstones, fencing, the exactly-once ack
answer. What changes:

* ``enqueue_many`` is atomic per partition, not across partitions (one script call per
  partition that receives jobs); each job still gets its own answer.
* ``lease`` peeks at every partition (one pipelined round trip per primary) and leases
  from the first that has work, starting at a partition that rotates with every call,
  so no partition starves. Leased jobs carry their partition's name in ``job.queue``;
  ``ack``, ``nack``, ``extend`` and ``release`` route by it.
* ``stats``, ``peek``, ``promote``, ``scrub`` and ``dead_*`` cover every partition;
  ``partition_stats`` gives each one's figures.
* Fences grow per partition, not across the logical queue (a fence is compared only
  between leases of one job, which always lives in one partition).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from pyqueue.protocol.core import (
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    DEFAULT_MAX_RESULTS,
    DEFAULT_RESULT_TTL_MS,
    MAX_BATCH,
    MAX_PARTITIONS,
    JobTuple,
    Plan,
    Verb,
    check_int,
    check_job_id,
    check_now,
    partition_name,
    partition_of,
    plan_each,
)
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import (
    Cancelled,
    DeadJob,
    DeadPage,
    Enqueued,
    GroupsPage,
    Extended,
    Job,
    JobEntry,
    JobInfo,
    JobPage,
    JobResult,
    Leased,
    Nacked,
    NewJob,
    Outcome,
    Peeked,
    Promoted,
    Scrubbed,
    Stats,
)
from pyqueue.drivers.queue import Queue, QueueCore, plan_peek_many, sum_stats
from pyqueue.protocol.verbs.reading import check_browse
from pyqueue.protocol.verbs.flows import FlowDone, FlowRecord, Ref, Waiting
from pyqueue.protocol.verbs.events import EventPage, EventsSetting, Since
from pyqueue.protocol.verbs.progress import Progress, check_progress_ids, check_progress_job


class PartitionedParts(QueueCore):
    """One logical queue's partitions (``parts``: queues of the same driver class sharing
    its transport), how a job or an id is routed to one, and the verbs of a job's path:
    enqueue, lease, its endings, results. :class:`PartitionedCore` adds the rest."""

    is_partitioned = True

    def __init__(self, name: str, redis: Any = None, *, partitions: int = 1, **kwargs: Any) -> None:
        if "#" in name:
            raise InvalidArgument(f"a partitioned queue's name cannot contain '#' (its partitions are <name>#<p>): {name!r}")
        super().__init__(name, redis, **kwargs)
        self.partitions = check_int(partitions, "partitions", 2, MAX_PARTITIONS)
        self.parts: list[Any] = [self.physical(partition_name(name, p, self.partitions)) for p in range(self.partitions)]
        self._by_name = {part.name: part for part in self.parts}
        for part in self.parts:
            part._partition_guard = self  # the logical queue's count guards every partition
        self._cursor = itertools.count()
        self._cursor_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, prefix={self.keys.prefix!r}, partitions={self.partitions})"

    @property
    def owner(self) -> str:
        """The lease owner of every partition (a worker sets its service's)."""
        return self._owner

    @owner.setter
    def owner(self, value: str) -> None:
        self._owner = value
        for part in getattr(self, "parts", ()):
            part.owner = value

    def _ready(self) -> Plan[None]:
        """Before a call that does not go through a partition's own checked call (a
        peek): refuse another partition count; record nothing."""
        if not self._partitions_checked:
            yield from self.plan_check_partitions(record=False)

    def part_of(self, job: Job) -> QueueCore:
        """The partition a leased job came from (by ``job.queue``)."""
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a Job from lease, got {type(job).__name__}")
        part: QueueCore | None = self._by_name.get(job.queue)
        if part is None:
            raise InvalidArgument(f"job {job.id!r} is from queue {job.queue!r}, not a partition of {self.name!r}")
        return part

    def part_for(self, job_id: str) -> QueueCore:
        """The partition that holds job ``job_id`` (the one enqueue chose by its id).

        Raises:
            InvalidArgument: not a valid job id.
        """
        part: QueueCore = self.parts[partition_of(check_job_id(job_id), self.partitions)]
        return part

    def _route(self, jobs: Iterable[Job]) -> dict[int, list[tuple[int, Job]]]:
        """Jobs grouped by partition index, each with its position in ``jobs``."""
        groups: dict[int, list[tuple[int, Job]]] = {}
        for position, job in enumerate(jobs):
            groups.setdefault(self.parts.index(self.part_of(job)), []).append((position, job))
        if not 1 <= sum(len(g) for g in groups.values()) <= MAX_BATCH:
            raise InvalidArgument(f"1..{MAX_BATCH} jobs per call")
        return groups

    def _rotation(self, call: str | None = None) -> list[Any]:
        """The partitions, starting at one that moves on with every call: a partition
        with work is at most K - 1 calls away from being asked first. A caller's own
        call token fixes the start instead, so a re-sent call asks in the same order."""
        if call is not None:
            start = partition_of(call, self.partitions)
        else:
            with self._cursor_lock:
                start = next(self._cursor) % self.partitions
        return self.parts[start:] + self.parts[:start]

    # -- enqueue ---------------------------------------------------------------------

    def plan_enqueue_batch(self, batch: Sequence[JobTuple], now_ms: int | None) -> Plan[list[Enqueued]]:
        """Each job into its partition: atomic per partition only, one call per
        partition that receives jobs (every job was validated before anything is sent)."""
        groups: dict[int, list[int]] = {}
        for position, job in enumerate(batch):
            part = partition_of(job[0], self.partitions)
            if job[5] and partition_of(job[5], self.partitions) != part:
                raise InvalidArgument(
                    f"job {job[0]!r} of group {job[5]!r}: on a queue of {self.partitions} partitions a job of a group "
                    "lives in its group's partition, and this id falls in another; let pyqueue choose the id "
                    "(job_id=None), or choose one in the group's partition (pyqueue.protocol.core.partition_of)"
                )
            groups.setdefault(part, []).append(position)
        out: list[Enqueued | None] = [None] * len(batch)
        for p, positions in groups.items():
            answers = yield from self.parts[p].plan_enqueue_batch([batch[i] for i in positions], now_ms)
            for i, answer in zip(positions, answers):
                out[i] = answer
        return [answer for answer in out if answer is not None]

    # -- lease / ack -----------------------------------------------------------------

    def plan_lease_call(
        self,
        *,
        ack: Sequence[Job] = (),
        count: int = 1,
        lease_ms: int = DEFAULT_LEASE_MS,
        limit: int = DEFAULT_MAINTENANCE_LIMIT,
        call: str | None = None,
        now_ms: int | None = None,
    ) -> Plan[Leased]:
        """As :meth:`QueueCore.plan_lease_call`: acks ``ack`` (in their partitions),
        then leases up to ``count`` jobs from the first partition with work in rotating
        order (see the module docstring). ``next_due_ms`` is the earliest of all
        partitions.

        ``call``: with a token of your own, every partition is asked in an order fixed
        by the token, with that token, until one hands out jobs: a re-sent call gets
        back the first run's leases unless a partition asked before theirs gained work
        in between (then those leases are reclaimed at their deadline)."""
        check_int(count, "count", 0, MAX_BATCH)
        acks = (yield from self.plan_ack_many(ack, now_ms=now_ms)) if ack else []
        yield from self._ready()
        order = self._rotation(call)
        peeked = dict(zip((q.name for q in order), (yield from plan_peek_many(order))))
        next_due_ms, clock = -1, 0
        for part in order:
            seen = peeked[part.name]
            clock = seen.now_ms
            if count and (seen.has_work or call is not None):
                leased = yield from part.plan_lease_call(
                    count=count, lease_ms=lease_ms, limit=limit, call=call, now_ms=now_ms
                )
                if leased.jobs:
                    return Leased(jobs=leased.jobs, acks=acks, now_ms=leased.now_ms, next_due_ms=-1)
                due = leased.next_due_ms
            else:
                due = seen.next_due_ms
            if due >= 0 and (next_due_ms < 0 or due < next_due_ms):
                next_due_ms = due
        return Leased(jobs=[], acks=acks, now_ms=clock if now_ms is None else now_ms, next_due_ms=next_due_ms)

    def plan_ack_and_lease(
        self,
        job: Job,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        count: int = 1,
        call: str | None = None,
        now_ms: int | None = None,
    ) -> Plan[tuple[Outcome, list[Job]]]:
        """Ack ``job`` and lease up to ``count`` more *from its partition* in one round
        trip (lua/lease.lua). A worker bounds how long it keeps doing so, so that the
        other partitions get their turn."""
        plan = self.part_of(job).plan_ack_and_lease(job, lease_ms=lease_ms, count=count, call=call, now_ms=now_ms)
        return (yield from plan)

    def plan_ack_many(self, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]:
        """As :meth:`QueueCore.plan_ack_many`; one call per partition involved."""
        return (yield from self._per_partition(jobs, lambda part, group: part.plan_ack_many(group, now_ms=now_ms)))

    def plan_ack_result(
        self, job: Job, value: object, *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
        max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None,
    ) -> Plan[Outcome]:
        """As :meth:`QueueCore.plan_ack_result`, in the job's partition (its results
        and their bound are per partition)."""
        plan = self.part_of(job).plan_ack_result(
            job, value, result_ttl_ms=result_ttl_ms, max_results=max_results, now_ms=now_ms
        )
        return (yield from plan)

    def plan_ack_result_many(
        self, jobs: Sequence[Job], values: Sequence[object], *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
        max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None,
    ) -> Plan[list[Outcome]]:
        """As :meth:`QueueCore.plan_ack_result_many`; one call per partition involved."""
        if len(values) != len(jobs):
            raise InvalidArgument(f"{len(jobs)} jobs and {len(values)} values: one value per job")
        value_of = {job.receipt: value for job, value in zip(jobs, values) if isinstance(job, Job)}
        return (yield from self._per_partition(jobs, lambda part, group: part.plan_ack_result_many(
            group, [value_of[job.receipt] for job in group], result_ttl_ms=result_ttl_ms, max_results=max_results,
            now_ms=now_ms,
        )))

    def plan_result(self, job_id: str, *, now_ms: int | None = None) -> Plan[JobResult]:
        """As :meth:`QueueCore.plan_result`, in the id's partition."""
        return (yield from self.part_for(job_id).plan_result(job_id, now_ms=now_ms))

    def plan_results(self, job_ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[JobResult]]:
        """As :meth:`QueueCore.plan_results`: one round trip per partition involved."""
        out: list[JobResult | None] = [None] * len(job_ids)
        by_part: dict[int, list[int]] = {}
        for i, job_id in enumerate(job_ids):
            by_part.setdefault(partition_of(check_job_id(job_id), self.partitions), []).append(i)
        for p, indexes in by_part.items():
            found = yield from self.parts[p].plan_results([job_ids[i] for i in indexes], now_ms=now_ms)
            for i, info in zip(indexes, found):
                out[i] = info
        return [info for info in out if info is not None]

    def plan_wait_result(self, job_id: str, timeout_ms: int, *, now_ms: int | None = None) -> Plan[JobResult]:
        """As :meth:`QueueCore.plan_wait_result`, in the id's partition."""
        return (yield from self.part_for(job_id).plan_wait_result(job_id, timeout_ms, now_ms=now_ms))

    def plan_extend(
        self, jobs: Iterable[Job], lease_ms: int = DEFAULT_LEASE_MS, *, now_ms: int | None = None
    ) -> Plan[list[Extended]]:
        """As :meth:`QueueCore.plan_extend`; one call per partition involved."""
        return (yield from self._per_partition(jobs, lambda part, group: part.plan_extend(group, lease_ms, now_ms=now_ms)))

    def plan_release(self, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]:
        """As :meth:`QueueCore.plan_release`; one call per partition involved."""
        return (yield from self._per_partition(jobs, lambda part, group: part.plan_release(group, now_ms=now_ms)))

    def _per_partition(self, jobs: Iterable[Job], plan: Any) -> Plan[list[Any]]:
        out: list[Any] = []
        positions: list[int] = []
        for p, group in self._route(jobs).items():
            positions += [position for position, _ in group]
            out += yield from plan(self.parts[p], [job for _, job in group])
        ordered: list[Any] = [None] * len(out)
        for position, answer in zip(positions, out):
            ordered[position] = answer
        return ordered

    def plan_flow_wait(self, job: NewJob, waits_for: Sequence[Ref], **kwargs: Any) -> Plan[str]:
        """As :meth:`QueueCore.plan_flow_wait`, in the partition of the job's id."""
        if job.job_id is None:
            raise InvalidArgument("a waiting job needs its id (a flow's ids are deterministic)")
        return (yield from self.part_for(job.job_id).plan_flow_wait(job, waits_for, **kwargs))

    def plan_flow_done(self, job_id: str, ended: Sequence[tuple[str, str, str]], **kwargs: Any) -> Plan[FlowDone]:
        """As :meth:`QueueCore.plan_flow_done`, in the partition of ``job_id``."""
        return (yield from self.part_for(job_id).plan_flow_done(job_id, ended, **kwargs))

    def plan_flow_record(self, flow_id: str, record: bytes | str, keep_ms: int, **kwargs: Any) -> Plan[str]:
        """As :meth:`QueueCore.plan_flow_record`, in the partition of ``flow_id``."""
        return (yield from self.part_for(flow_id).plan_flow_record(flow_id, record, keep_ms, **kwargs))

    def plan_flow_show(self, flow_id: str, **kwargs: Any) -> Plan[FlowRecord | None]:
        """As :meth:`QueueCore.plan_flow_show`, in the partition of ``flow_id``."""
        return (yield from self.part_for(flow_id).plan_flow_show(flow_id, **kwargs))

    def plan_progress(self, job: Job, value: bytes | str, **kwargs: Any) -> Plan[Outcome]:
        """As :meth:`QueueCore.plan_progress`, in the partition of the job."""
        return (yield from self.part_for(check_progress_job(job).id).plan_progress(job, value, **kwargs))

    def plan_progress_of(self, ids: Iterable[str]) -> Plan[dict[str, Progress]]:
        """As :meth:`QueueCore.plan_progress_of`: one read per partition holding any of ``ids``."""
        checked = check_progress_ids(ids)
        by_part: dict[int, list[str]] = {}
        for job_id in checked:
            by_part.setdefault(partition_of(job_id, self.partitions), []).append(job_id)
        found: dict[str, Progress] = {}
        for part in (yield from plan_each(self.parts[p].plan_progress_of(ids) for p, ids in by_part.items())):
            found.update(part)
        return {job_id: found[job_id] for job_id in checked if job_id in found}

    def plan_flow_due(self, limit: int = 100) -> Plan[list[Waiting]]:
        """As :meth:`QueueCore.plan_flow_due`, from every partition (``limit`` each)."""
        found = yield from plan_each(part.plan_flow_due(limit) for part in self.parts)
        return [waiting for each in found for waiting in each]

    def plan_nack(self, job: Job, error: str = "", **kwargs: Any) -> Plan[Nacked]:
        """As :meth:`QueueCore.plan_nack`, in the job's partition."""
        return (yield from self.part_of(job).plan_nack(job, error, **kwargs))


class PartitionedCore(PartitionedParts):
    """The plans of one logical queue over ``partitions`` partitions (see the module
    docstring), shared by :class:`PartitionedQueue` and
    :class:`pyqueue.aio.AsyncPartitionedQueue`: the job's path
    (:class:`PartitionedParts`) plus maintenance, inspection, job control and the dead
    letters, each over every partition or in the one a job id routes to."""

    def plan_promote(self, limit: int = DEFAULT_MAINTENANCE_LIMIT, *, now_ms: int | None = None) -> Plan[Promoted]:
        """As :meth:`QueueCore.plan_promote`, in every partition (``limit`` per partition)."""
        answers = yield from plan_each(part.plan_promote(limit, now_ms=now_ms) for part in self.parts)
        due = [a.next_due_ms for a in answers if a.next_due_ms >= 0]
        return Promoted(
            sum(a.promoted for a in answers), sum(a.reclaimed for a in answers), sum(a.dead for a in answers),
            any(a.more for a in answers), min(due) if due else -1,
        )

    def plan_scrub(self, owner: str, *, limit: int = DEFAULT_MAINTENANCE_LIMIT, now_ms: int | None = None) -> Plan[Scrubbed]:
        """As :meth:`QueueCore.plan_scrub`, in every partition (``limit`` per partition)."""
        answers = yield from plan_each(part.plan_scrub(owner, limit=limit, now_ms=now_ms) for part in self.parts)
        return Scrubbed(sum(a.scrubbed for a in answers), sum(a.dead for a in answers), any(a.more for a in answers))

    def plan_partition_stats(self, *, now_ms: int | None = None) -> Plan[list[Stats]]:
        """``stats`` of each partition, in partition order."""
        return (yield from plan_each(part.plan_stats(now_ms=now_ms) for part in self.parts))

    partition_stats = Verb(plan_partition_stats)

    def plan_stats(self, *, now_ms: int | None = None) -> Plan[Stats]:
        """The sum over the partitions (not read atomically across them); ``lag_ms`` is
        the largest and ``now_ms`` the latest."""
        return sum_stats((yield from self.plan_partition_stats(now_ms=now_ms)))

    def plan_peek(self, *, now_ms: int | None = None) -> Plan[Peeked]:
        """Whether any partition has work, and the earliest next due time of all."""
        yield from self._ready()
        if now_ms is not None:
            each = yield from plan_each(part.plan_peek(now_ms=now_ms) for part in self.parts)
        else:
            each = yield from plan_peek_many(self.parts)
        due = [p.next_due_ms for p in each if p.next_due_ms >= 0]
        return Peeked(min(p.now_ms for p in each), sum(p.ready for p in each), min(due) if due else -1)

    def plan_pause(self, *, now_ms: int | None = None) -> Plan[bool]:
        """As :meth:`QueueCore.plan_pause`, every partition (True if any was running)."""
        return any((yield from plan_each(part.plan_pause(now_ms=now_ms) for part in self.parts)))

    def plan_resume(self, *, now_ms: int | None = None) -> Plan[bool]:
        """As :meth:`QueueCore.plan_resume`, every partition (True if any was paused)."""
        return any((yield from plan_each(part.plan_resume(now_ms=now_ms) for part in self.parts)))

    def plan_get(self, job_id: str, *, with_payload: bool = False, now_ms: int | None = None) -> Plan[JobInfo]:
        """As :meth:`QueueCore.plan_get`, in the id's partition (``queue`` names it)."""
        return (yield from self.part_for(job_id).plan_get(job_id, with_payload=with_payload, now_ms=now_ms))

    def plan_set_group_limit(self, cap: int | None, *, group: str | None = None) -> Plan[bool]:
        """As :meth:`QueueCore.plan_set_group_limit`, in every partition: a group's jobs
        all live in its partition, so the cap there is the group's cap across the queue
        (True if any partition changed)."""
        plans = (part.plan_set_group_limit(cap, group=group) for part in self.parts)
        return any((yield from plan_each(plans)))

    def plan_groups(self, offset: int = 0, limit: int = 100) -> Plan[GroupsPage]:
        """As :meth:`QueueCore.plan_groups`, for every partition: ``offset`` and ``limit``
        apply in each (a group lives in one partition; ``GroupInfo.queue`` names it), and
        ``total`` is the sum."""
        pages = yield from plan_each(part.plan_groups(offset, limit) for part in self.parts)
        return GroupsPage(
            total=sum(page.total for page in pages),
            default_cap=max(page.default_cap for page in pages),
            groups=[group for page in pages for group in page.groups],
        )

    def plan_limit(self, count: int, period_ms: int = 1000, *, burst: int = 1) -> Plan[bool]:
        """Refused: a cap on the logical queue would have to be shared out between its
        partitions, and a share per partition would slow a backlog that sits in one."""
        raise InvalidArgument(
            f"{self.name} has {self.partitions} partitions: a rate limit applies to an unpartitioned queue only"
        )
        yield  # a generator, like every plan

    def plan_set_events(self, bound: int) -> Plan[EventsSetting]:
        """As :meth:`QueueCore.plan_set_events`, in every partition (each keeps its own
        stream of ``bound`` events); ``previous`` is the largest bound found, ``length``
        the sum."""
        answers = yield from plan_each(part.plan_set_events(bound) for part in self.parts)
        return EventsSetting(max(a.previous for a in answers), sum(a.length for a in answers))

    def plan_events(self, since: Since = None, count: int = 100, *, block_ms: int = 0) -> Plan[EventPage]:
        """Refused: each partition has its own stream, numbered on its own, so one
        number cannot say where a reader of the whole queue is. Read each partition's
        events: ``Queue(partition_name(name, p, partitions))`` (``pyqueue events`` takes
        the partition's name too)."""
        raise InvalidArgument(
            f"{self.name} has {self.partitions} partitions, each with its own event stream: read one partition's "
            f"events (queue {partition_name(self.name, 0, self.partitions)!r} and the others)"
        )
        yield  # a generator, like every plan

    def plan_recent_events(self, count: int = 50) -> Plan[EventPage]:
        """Refused, as :meth:`plan_events`."""
        return (yield from self.plan_events())

    def plan_cancel(self, job_id: str, *, now_ms: int | None = None) -> Plan[Cancelled]:
        """As :meth:`QueueCore.plan_cancel`, in the id's partition (``queue`` names it)."""
        return (yield from self.part_for(job_id).plan_cancel(job_id, now_ms=now_ms))

    def plan_browse(self, state: str, start: int = 0, count: int = 50, *, now_ms: int | None = None) -> Plan[JobPage]:
        """As :meth:`QueueCore.plan_browse`, over the partitions in order: ranks
        ``start`` .. ``start + count - 1`` of partition 0's jobs in ``state`` followed
        by partition 1's, and so on (``JobEntry.queue`` names each job's partition);
        ``total`` is the sum. One call per partition, one after another: each
        partition's part is a snapshot of one moment, the page as a whole is not."""
        state = check_browse(state, start, count)
        check_now(now_ms)
        jobs: list[JobEntry] = []
        total, latest = 0, 0
        for part in self.parts:
            want = count - len(jobs)
            # A partition after the page is full is still read (one job) for its total.
            page = yield from part.plan_browse(state, max(0, start - total), max(want, 1), now_ms=now_ms)
            if want > 0:
                jobs += page.jobs
            total += page.total
            latest = max(latest, page.now_ms)
        return JobPage(state=state, total=total, start=start, now_ms=latest, jobs=jobs)

    def plan_dead_list(self, offset: int = 0, limit: int = 100) -> Plan[DeadPage]:
        """One page of DEAD over all partitions, oldest first (merged by time of death;
        at most ``offset + limit`` <= 1000 are read per partition)."""
        check_int(offset, "offset", 0, 2**31)
        check_int(limit, "limit", 1, MAX_BATCH)
        if offset + limit > MAX_BATCH:
            raise InvalidArgument(f"offset + limit must be at most {MAX_BATCH} for a partitioned queue")
        pages = yield from plan_each(part.plan_dead_list(0, offset + limit) for part in self.parts)
        merged: list[DeadJob] = sorted((j for page in pages for j in page.jobs), key=lambda j: (j.dead_ms, j.id))
        return DeadPage(total=sum(page.total for page in pages), jobs=merged[offset : offset + limit])

    def plan_dead_replay(
        self, ids: Sequence[str] | None = None, *, limit: int = 100, now_ms: int | None = None
    ) -> Plan[int]:
        """As :meth:`QueueCore.plan_dead_replay`: each id in its partition."""
        groups = yield from self._dead_groups(ids, limit)
        return sum((yield from plan_each(part.plan_dead_replay(group, now_ms=now_ms) for part, group in groups)))

    def plan_dead_purge(self, ids: Sequence[str] | None = None, *, limit: int = 100) -> Plan[int]:
        """As :meth:`QueueCore.plan_dead_purge`: each id in its partition."""
        groups = yield from self._dead_groups(ids, limit)
        return sum((yield from plan_each(part.plan_dead_purge(group) for part, group in groups)))

    def _dead_groups(self, ids: Sequence[str] | None, limit: int) -> Plan[list[tuple[Any, list[str]]]]:
        chosen = yield from self.plan_dead_ids(ids, limit)
        groups: dict[int, list[str]] = {}
        for job_id in chosen:
            groups.setdefault(partition_of(job_id, self.partitions), []).append(job_id)
        return [(self.parts[p], group) for p, group in sorted(groups.items())]


class PartitionedQueue(PartitionedCore, Queue):
    """One logical queue over ``partitions`` partitions, driven with redis-py's blocking
    client. Made by ``Queue(name, partitions=K)``; takes the same arguments.
    Thread-safe as :class:`~pyqueue.Queue` is."""

    parts: list[Queue]
