"""A logical queue spread over K partitions: K queues of their own hash tags, so a busy
queue can span every primary of a Redis Cluster (DESIGN §9).

``Queue(name, partitions=K)`` with K > 1 drives a :class:`PartitionedQueue`: the plans
of K specs, routed (a :class:`~pyqueue.protocol.plans.QueuePlans`, like a single
queue's :class:`~pyqueue.protocol.plans.SingleQueue`). Its partitions are ordinary
queues named ``<name>#0`` .. ``<name>#<K-1>`` (keys ``<prefix>:{<name>#<p>}:<role>``): the Lua scripts do not know about partitions, a
partition is just a queue. A job lives in partition :func:`~pyqueue.protocol.core.partition_of`
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

The routing is :class:`Partitions`; each verb's plan is a function over it, written
once here, and :class:`PartitionedQueue` binds them (as :class:`SingleQueue` binds
the single queue's).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from pyqueue.protocol.core import (
    keys_of,
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    DEFAULT_MAX_RESULTS,
    DEFAULT_RESULT_TTL_MS,
    MAX_BATCH,
    JobTuple,
    Plan,
    check_int,
    check_ids,
    check_job_id,
    check_key,
    check_now,
    partition_name,
    partition_of,
    plan_each,
)
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import (
    RateLimit,
    Cancelled,
    SequenceSkipped,
    DeadJob,
    DeadPage,
    Enqueued,
    Extended,
    GroupsPage,
    Job,
    JobEntry,
    SearchPage,
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
from pyqueue.protocol.plans import QueuePlans, SingleQueue
from pyqueue.protocol.spec import QueueMemory, QueueSpec
from pyqueue.protocol.verbs.base import check_partitions as check_partition_count
from pyqueue.protocol.verbs.events import EventPage, EventsSetting, Since
from pyqueue.protocol.verbs.flows import FlowDone, FlowRecord, Ref, Waiting
from pyqueue.protocol.verbs import produce
from pyqueue.protocol.verbs.progress import Progress, check_progress_ids, check_progress_job
from pyqueue.protocol.verbs.steps import Committed, JobSteps, ParkAnswer, ParkKind, Signalled, check_leased
from pyqueue.protocol.verbs.reading import check_browse, peek_many, sum_stats
from pyqueue.protocol.verbs.search import DEFAULT_SCAN_MOST, check_search

P = ParamSpec("P")
T = TypeVar("T")


def queue_plans(spec: QueueSpec, memory: QueueMemory) -> QueuePlans:
    """The plans of the queue ``spec`` names: a :class:`PartitionedQueue` for more than
    one partition, else a :class:`SingleQueue` (what a façade's constructor composes)."""
    if spec.partitions > 1:
        return PartitionedQueue(spec, memory)
    return SingleQueue(spec, memory)


class Partitions:
    """One logical queue's partitions (``parts``: a :class:`SingleQueue` per partition,
    sharing the logical queue's memory, so its partition-count guard covers them all),
    and how a job or an id is routed to one. Thread-safe: the rotation's cursor is
    locked."""

    def __init__(self, spec: QueueSpec, memory: QueueMemory) -> None:
        if "#" in spec.name:
            raise InvalidArgument(
                f"a partitioned queue's name cannot contain '#' (its partitions are <name>#<p>): {spec.name!r}"
            )
        self.spec, self.memory = spec, memory
        self.parts = [SingleQueue(part, memory) for part in spec.partition_specs()]
        self.by_name = {part.spec.name: part for part in self.parts}
        self._cursor = itertools.count()
        self._cursor_lock = threading.Lock()

    @property
    def count(self) -> int:
        return self.spec.partitions

    def set_owner(self, owner: str) -> None:
        """The lease owner of the logical queue and every partition."""
        self.spec = replace(self.spec, owner=owner)
        for part in self.parts:
            part.set_owner(owner)

    def ready(self) -> Plan[None]:
        """Before a call that does not go through a partition's own guarded call (a
        peek): refuse another partition count; record nothing."""
        if not self.memory.partitions_checked:
            yield from check_partition_count(self.memory, record=False)

    def part_of(self, job: Job) -> SingleQueue:
        """The partition a leased job came from (by ``job.queue``)."""
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a Job from lease, got {type(job).__name__}")
        part = self.by_name.get(job.queue)
        if part is None:
            raise InvalidArgument(f"job {job.id!r} is from queue {job.queue!r}, not a partition of {self.spec.name!r}")
        return part

    def part_for(self, job_id: str) -> SingleQueue:
        """The partition that holds job ``job_id`` (the one enqueue chose by its id).

        Raises:
            InvalidArgument: not a valid job id.
        """
        return self.parts[partition_of(check_job_id(job_id), self.count)]

    def route(self, jobs: Iterable[Job]) -> dict[int, list[tuple[int, Job]]]:
        """Jobs grouped by partition index, each with its position in ``jobs``."""
        groups: dict[int, list[tuple[int, Job]]] = {}
        for position, job in enumerate(jobs):
            groups.setdefault(self.parts.index(self.part_of(job)), []).append((position, job))
        if not 1 <= sum(len(g) for g in groups.values()) <= MAX_BATCH:
            raise InvalidArgument(f"1..{MAX_BATCH} jobs per call")
        return groups

    def rotation(self, call: str | None = None) -> list[SingleQueue]:
        """The partitions, starting at one that moves on with every call: a partition
        with work is at most K - 1 calls away from being asked first. A caller's own
        call token fixes the start instead, so a re-sent call asks in the same order."""
        if call is not None:
            start = partition_of(call, self.count)
        else:
            with self._cursor_lock:
                start = next(self._cursor) % self.count
        return self.parts[start:] + self.parts[:start]

    def per_partition(
        self, jobs: Iterable[Job], plan: Callable[[SingleQueue, list[Job]], Plan[list[T]]]
    ) -> Plan[list[T]]:
        """``plan`` run in each partition involved with its jobs; the answers in the
        order of ``jobs``."""
        out: list[T] = []
        positions: list[int] = []
        for p, group in self.route(jobs).items():
            positions += [position for position, _ in group]
            out += yield from plan(self.parts[p], [job for _, job in group])
        ordered: list[Any] = [None] * len(out)
        for position, answer in zip(positions, out):
            ordered[position] = answer
        return ordered


# -- the job's path: enqueue, lease, its endings, results ------------------------------


def enqueue_batch(layout: Partitions, /, batch: Sequence[JobTuple], now_ms: int | None) -> Plan[list[Enqueued]]:
    """Each job into its partition: atomic per partition only, one call per
    partition that receives jobs (every job was validated before anything is sent)."""
    groups: dict[int, list[int]] = {}
    for position, job in enumerate(batch):
        part = partition_of(job[0], layout.count)
        if job[5] and partition_of(job[5], layout.count) != part:
            raise InvalidArgument(
                f"job {job[0]!r} of group {job[5]!r}: on a queue of {layout.count} partitions a job of a group "
                "lives in its group's partition, and this id falls in another; let pyqueue choose the id "
                "(job_id=None), or choose one in the group's partition (pyqueue.protocol.core.partition_of)"
            )
        for key in keys_of(job[7]):
            if partition_of(key, layout.count) != part:
                raise InvalidArgument(
                    f"job {job[0]!r} of key {key!r}: on a queue of {layout.count} partitions a keyed job lives in "
                    "its key's partition (its state is kept there), and this id or group falls in another; let "
                    "pyqueue choose the id (job_id=None), and give a keyed job a group in the key's partition, if any"
                )
        groups.setdefault(part, []).append(position)
    out: list[Enqueued | None] = [None] * len(batch)
    for p, positions in groups.items():
        target = layout.parts[p]
        answers = yield from produce.enqueue_batch(target.spec, target.memory, [batch[i] for i in positions], now_ms)
        for i, answer in zip(positions, answers):
            out[i] = answer
    return [answer for answer in out if answer is not None]


def enqueue_many(layout: Partitions, /, jobs: Iterable[NewJob | bytes | str], *, now_ms: int | None = None) -> Plan[list[Enqueued]]:
    """As :func:`pyqueue.protocol.verbs.produce.enqueue_many`, each job in its
    partition (:func:`enqueue_batch`): atomic per partition only."""
    return (yield from enqueue_batch(layout, produce.checked_batch(layout.spec, jobs, now_ms), now_ms))


def enqueue(
    layout: Partitions,
    /,
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
    """As :func:`pyqueue.protocol.verbs.produce.enqueue`, in the partition of the job's id."""
    new = NewJob(payload, job_id, delay_ms, max_attempts, priority, group, expires_ms, debounce_ms, throttle_ms, key,
                 sequence, on_failure, rate_key, rate_limit, cost, task)
    (added,) = yield from enqueue_many(layout, [new], now_ms=now_ms)
    return added


def enqueue_json(
    layout: Partitions,
    /,
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
    """As :func:`pyqueue.protocol.verbs.produce.enqueue_json`, in the partition of the job's id."""
    plan = enqueue(layout, produce.json_payload(obj), job_id=job_id, delay_ms=delay_ms, max_attempts=max_attempts,
                   priority=priority, group=group, expires_ms=expires_ms, debounce_ms=debounce_ms,
                   throttle_ms=throttle_ms, key=key, sequence=sequence, on_failure=on_failure,
                   rate_key=rate_key, rate_limit=rate_limit, cost=cost, task=task, now_ms=now_ms)
    return (yield from plan)


def lease_call(
    layout: Partitions,
    /,
    *,
    ack: Sequence[Job] = (),
    count: int = 1,
    lease_ms: int = DEFAULT_LEASE_MS,
    limit: int = DEFAULT_MAINTENANCE_LIMIT,
    call: str | None = None,
    now_ms: int | None = None,
) -> Plan[Leased]:
    """As :func:`pyqueue.protocol.verbs.consume.lease_call`: acks ``ack`` (in their
    partitions), then leases up to ``count`` jobs from the first partition with work in
    rotating order (see the module docstring). ``next_due_ms`` is the earliest of all
    partitions.

    ``call``: with a token of your own, every partition is asked in an order fixed
    by the token, with that token, until one hands out jobs: a re-sent call gets
    back the first run's leases unless a partition asked before theirs gained work
    in between (then those leases are reclaimed at their deadline)."""
    check_int(count, "count", 0, MAX_BATCH)
    acks = (yield from ack_many(layout, ack, now_ms=now_ms)) if ack else []
    yield from layout.ready()
    order = layout.rotation(call)
    peeked = dict(zip((q.spec.name for q in order), (yield from peek_many([q.spec for q in order]))))
    next_due_ms, clock = -1, 0
    for part in order:
        seen = peeked[part.spec.name]
        clock = seen.now_ms
        if count and (seen.has_work or call is not None):
            leased = yield from part.lease_call(count=count, lease_ms=lease_ms, limit=limit, call=call, now_ms=now_ms)
            if leased.jobs:
                return Leased(jobs=leased.jobs, acks=acks, now_ms=leased.now_ms, next_due_ms=-1)
            due = leased.next_due_ms
        else:
            due = seen.next_due_ms
        if due >= 0 and (next_due_ms < 0 or due < next_due_ms):
            next_due_ms = due
    return Leased(jobs=[], acks=acks, now_ms=clock if now_ms is None else now_ms, next_due_ms=next_due_ms)


def lease(layout: Partitions, /, lease_ms: int = DEFAULT_LEASE_MS, count: int = 1, *, now_ms: int | None = None) -> Plan[list[Job]]:
    """As :func:`pyqueue.protocol.verbs.consume.lease`, from the first partition with
    work in rotating order (:func:`lease_call`)."""
    return (yield from lease_call(layout, count=count, lease_ms=lease_ms, now_ms=now_ms)).jobs


def ack_and_lease(
    layout: Partitions,
    /,
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
    return (yield from layout.part_of(job).ack_and_lease(job, lease_ms=lease_ms, count=count, call=call, now_ms=now_ms))


def ack(layout: Partitions, /, job: Job, *, now_ms: int | None = None) -> Plan[Outcome]:
    """As :func:`pyqueue.protocol.verbs.consume.ack`, in the job's partition."""
    return (yield from ack_many(layout, [job], now_ms=now_ms))[0]


def ack_many(layout: Partitions, /, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]:
    """As :func:`pyqueue.protocol.verbs.consume.ack_many`; one call per partition involved."""
    return (yield from layout.per_partition(jobs, lambda part, group: part.ack_many(group, now_ms=now_ms)))


def ack_result(
    layout: Partitions, /, job: Job, value: object, *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
    max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None,
) -> Plan[Outcome]:
    """As :func:`pyqueue.protocol.verbs.consume.ack_result`, in the job's partition (its
    results and their bound are per partition)."""
    plan = layout.part_of(job).ack_result(job, value, result_ttl_ms=result_ttl_ms, max_results=max_results, now_ms=now_ms)
    return (yield from plan)


def ack_result_many(
    layout: Partitions, /, jobs: Sequence[Job], values: Sequence[object], *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
    max_results: int = DEFAULT_MAX_RESULTS, now_ms: int | None = None,
) -> Plan[list[Outcome]]:
    """As :func:`pyqueue.protocol.verbs.consume.ack_result_many`; one call per partition involved."""
    if len(values) != len(jobs):
        raise InvalidArgument(f"{len(jobs)} jobs and {len(values)} values: one value per job")
    value_of = {job.receipt: value for job, value in zip(jobs, values) if isinstance(job, Job)}
    return (yield from layout.per_partition(jobs, lambda part, group: part.ack_result_many(
        group, [value_of[job.receipt] for job in group], result_ttl_ms=result_ttl_ms, max_results=max_results,
        now_ms=now_ms,
    )))


def nack(layout: Partitions, /, job: Job, error: str = "", **kwargs: Any) -> Plan[Nacked]:
    """As :func:`pyqueue.protocol.verbs.consume.nack`, in the job's partition."""
    return (yield from layout.part_of(job).nack(job, error, **kwargs))


def extend(
    layout: Partitions, /, jobs: Iterable[Job], lease_ms: int = DEFAULT_LEASE_MS, *, now_ms: int | None = None
) -> Plan[list[Extended]]:
    """As :func:`pyqueue.protocol.verbs.consume.extend`; one call per partition involved."""
    return (yield from layout.per_partition(jobs, lambda part, group: part.extend(group, lease_ms, now_ms=now_ms)))


def release(layout: Partitions, /, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]:
    """As :func:`pyqueue.protocol.verbs.consume.release`; one call per partition involved."""
    return (yield from layout.per_partition(jobs, lambda part, group: part.release(group, now_ms=now_ms)))


def result(layout: Partitions, /, job_id: str, *, now_ms: int | None = None) -> Plan[JobResult]:
    """As :func:`pyqueue.protocol.verbs.reading.result`, in the id's partition."""
    return (yield from layout.part_for(job_id).result(job_id, now_ms=now_ms))


def results(layout: Partitions, /, job_ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[JobResult]]:
    """As :func:`pyqueue.protocol.verbs.reading.results`: one round trip per partition involved."""
    out: list[JobResult | None] = [None] * len(job_ids)
    by_part: dict[int, list[int]] = {}
    for i, job_id in enumerate(job_ids):
        by_part.setdefault(partition_of(check_job_id(job_id), layout.count), []).append(i)
    for p, indexes in by_part.items():
        found = yield from layout.parts[p].results([job_ids[i] for i in indexes], now_ms=now_ms)
        for i, info in zip(indexes, found):
            out[i] = info
    return [info for info in out if info is not None]


def wait_result(layout: Partitions, /, job_id: str, timeout_ms: int, *, now_ms: int | None = None) -> Plan[JobResult]:
    """As :func:`pyqueue.protocol.verbs.reading.wait_result`, in the id's partition."""
    return (yield from layout.part_for(job_id).wait_result(job_id, timeout_ms, now_ms=now_ms))


# -- flows and progress: in the partition of the job (or the flow id) -----------------


def flow_wait(layout: Partitions, /, job: NewJob, waits_for: Sequence[Ref], **kwargs: Any) -> Plan[str]:
    """As :func:`pyqueue.protocol.verbs.flows.flow_wait`, in the partition of the job's id."""
    if job.job_id is None:
        raise InvalidArgument("a waiting job needs its id (a flow's ids are deterministic)")
    return (yield from layout.part_for(job.job_id).flow_wait(job, waits_for, **kwargs))


def flow_done(layout: Partitions, /, job_id: str, ended: Sequence[tuple[str, str, str]], **kwargs: Any) -> Plan[FlowDone]:
    """As :func:`pyqueue.protocol.verbs.flows.flow_done`, in the partition of ``job_id``."""
    return (yield from layout.part_for(job_id).flow_done(job_id, ended, **kwargs))


def flow_record(layout: Partitions, /, flow_id: str, record: bytes | str, keep_ms: int, **kwargs: Any) -> Plan[str]:
    """As :func:`pyqueue.protocol.verbs.flows.flow_record`, in the partition of ``flow_id``."""
    return (yield from layout.part_for(flow_id).flow_record(flow_id, record, keep_ms, **kwargs))


def flow_show(layout: Partitions, /, flow_id: str, **kwargs: Any) -> Plan[FlowRecord | None]:
    """As :func:`pyqueue.protocol.verbs.flows.flow_show`, in the partition of ``flow_id``."""
    return (yield from layout.part_for(flow_id).flow_show(flow_id, **kwargs))


def flow_due(layout: Partitions, /, limit: int = 100) -> Plan[list[Waiting]]:
    """As :func:`pyqueue.protocol.verbs.flows.flow_due`, from every partition (``limit`` each)."""
    found = yield from plan_each(part.flow_due(limit) for part in layout.parts)
    return [waiting for each in found for waiting in each]


def progress(layout: Partitions, /, job: Job, value: bytes | str, **kwargs: Any) -> Plan[Outcome]:
    """As :func:`pyqueue.protocol.verbs.progress.progress`, in the partition of the job."""
    return (yield from layout.part_for(check_progress_job(job).id).progress(job, value, **kwargs))


def step(layout: Partitions, /, job: Job, name: str, value: bytes, **kwargs: Any) -> Plan[Committed]:
    """As :func:`pyqueue.protocol.verbs.steps.step`, in the partition of the job."""
    return (yield from layout.part_for(check_leased(job, "step").id).step(job, name, value, **kwargs))


def park(layout: Partitions, /, job: Job, kind: ParkKind, name: str, for_ms: int, **kwargs: Any) -> Plan[ParkAnswer]:
    """As :func:`pyqueue.protocol.verbs.steps.park`, in the partition of the job."""
    return (yield from layout.part_for(check_leased(job, "park").id).park(job, kind, name, for_ms, **kwargs))


def signal(layout: Partitions, /, job_id: str, name: str, payload: bytes = b"", **kwargs: Any) -> Plan[Signalled]:
    """As :func:`pyqueue.protocol.verbs.steps.signal`, in the id's partition."""
    return (yield from layout.part_for(job_id).signal(job_id, name, payload, **kwargs))


def steps(layout: Partitions, /, job_id: str, **kwargs: Any) -> Plan[JobSteps]:
    """As :func:`pyqueue.protocol.verbs.steps.steps`, in the id's partition."""
    return (yield from layout.part_for(job_id).steps(job_id, **kwargs))


def progress_of(layout: Partitions, /, ids: Iterable[str]) -> Plan[dict[str, Progress]]:
    """As :func:`pyqueue.protocol.verbs.progress.progress_of`: one read per partition
    holding any of ``ids``."""
    checked = check_progress_ids(ids)
    by_part: dict[int, list[str]] = {}
    for job_id in checked:
        by_part.setdefault(partition_of(job_id, layout.count), []).append(job_id)
    found: dict[str, Progress] = {}
    for part in (yield from plan_each(layout.parts[p].progress_of(ids) for p, ids in by_part.items())):
        found.update(part)
    return {job_id: found[job_id] for job_id in checked if job_id in found}


# -- maintenance, inspection, job control, dead letters: every partition, or one -------


def promote(layout: Partitions, /, limit: int = DEFAULT_MAINTENANCE_LIMIT, *, now_ms: int | None = None) -> Plan[Promoted]:
    """As :func:`pyqueue.protocol.verbs.control.promote`, in every partition (``limit`` per partition)."""
    answers = yield from plan_each(part.promote(limit, now_ms=now_ms) for part in layout.parts)
    due = [a.next_due_ms for a in answers if a.next_due_ms >= 0]
    return Promoted(
        sum(a.promoted for a in answers), sum(a.reclaimed for a in answers), sum(a.dead for a in answers),
        any(a.more for a in answers), min(due) if due else -1,
    )


def scrub(layout: Partitions, /, owner: str, *, limit: int = DEFAULT_MAINTENANCE_LIMIT, now_ms: int | None = None) -> Plan[Scrubbed]:
    """As :func:`pyqueue.protocol.verbs.control.scrub`, in every partition (``limit`` per partition)."""
    answers = yield from plan_each(part.scrub(owner, limit=limit, now_ms=now_ms) for part in layout.parts)
    return Scrubbed(sum(a.scrubbed for a in answers), sum(a.dead for a in answers), any(a.more for a in answers))


def partition_stats(layout: Partitions, /, *, now_ms: int | None = None) -> Plan[list[Stats]]:
    """``stats`` of each partition, in partition order."""
    return (yield from plan_each(part.stats(now_ms=now_ms) for part in layout.parts))


def stats(layout: Partitions, /, *, now_ms: int | None = None) -> Plan[Stats]:
    """The sum over the partitions (not read atomically across them); ``lag_ms`` is
    the largest and ``now_ms`` the latest."""
    return sum_stats((yield from partition_stats(layout, now_ms=now_ms)))


def peek(layout: Partitions, /, *, now_ms: int | None = None) -> Plan[Peeked]:
    """Whether any partition has work, and the earliest next due time of all."""
    yield from layout.ready()
    if now_ms is not None:
        each = yield from plan_each(part.peek(now_ms=now_ms) for part in layout.parts)
    else:
        each = yield from peek_many([part.spec for part in layout.parts])
    due = [p.next_due_ms for p in each if p.next_due_ms >= 0]
    return Peeked(min(p.now_ms for p in each), sum(p.ready for p in each), min(due) if due else -1)


def pause(layout: Partitions, /, *, now_ms: int | None = None) -> Plan[bool]:
    """As :func:`pyqueue.protocol.verbs.control.pause`, every partition (True if any was running)."""
    return any((yield from plan_each(part.pause(now_ms=now_ms) for part in layout.parts)))


def resume(layout: Partitions, /, *, now_ms: int | None = None) -> Plan[bool]:
    """As :func:`pyqueue.protocol.verbs.control.resume`, every partition (True if any was paused)."""
    return any((yield from plan_each(part.resume(now_ms=now_ms) for part in layout.parts)))


def get(layout: Partitions, /, job_id: str, *, with_payload: bool = False, now_ms: int | None = None) -> Plan[JobInfo]:
    """As :func:`pyqueue.protocol.verbs.reading.get`, in the id's partition (``queue`` names it)."""
    return (yield from layout.part_for(job_id).get(job_id, with_payload=with_payload, now_ms=now_ms))


def cancel(layout: Partitions, /, job_id: str, *, now_ms: int | None = None) -> Plan[Cancelled]:
    """As :func:`pyqueue.protocol.verbs.control.cancel`, in the id's partition (``queue`` names it)."""
    return (yield from layout.part_for(job_id).cancel(job_id, now_ms=now_ms))


def cancel_many(layout: Partitions, /, job_ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[Cancelled]]:
    """As :func:`pyqueue.protocol.verbs.control.cancel_many`: each id in its partition;
    the answers in the order of ``job_ids``."""
    ids = check_ids(job_ids)
    answers = yield from plan_each(part.cancel_many(group, now_ms=now_ms) for part, group in by_partition(layout, ids))
    by_id = {a.id: a for answer in answers for a in answer}
    return [by_id[job_id] for job_id in ids]


def sequence_skip(layout: Partitions, /, key: str, *, now_ms: int | None = None) -> Plan[SequenceSkipped]:
    """As :func:`pyqueue.protocol.verbs.control.sequence_skip`, in the key's partition
    (a keyed job lives there)."""
    return (yield from layout.parts[partition_of(check_key(key), layout.count)].sequence_skip(key, now_ms=now_ms))


def set_rate_limit(layout: Partitions, /, key: str, rate: RateLimit | str | None) -> Plan[bool]:
    """As :func:`pyqueue.protocol.verbs.control.set_rate_limit`, in the key's partition
    (where its jobs live, when the rate key picks it)."""
    return (yield from layout.parts[partition_of(check_key(key), layout.count)].set_rate_limit(key, rate))


def defer_key(layout: Partitions, /, job: Job, delay_ms: int, **kwargs: Any) -> Plan[int | None]:
    """As :func:`pyqueue.protocol.verbs.consume.defer_key`, in the partition of the job."""
    return (yield from layout.part_for(check_progress_job(job).id).defer_key(job, delay_ms, **kwargs))


def set_budget(layout: Partitions, /, max_bytes: int | None) -> Plan[bool]:
    """As :func:`pyqueue.protocol.verbs.control.set_budget`, in every partition: each
    holds at most its share, ``max_bytes / partitions`` rounded up (an enqueue is refused
    when its own partition is full)."""
    share = share_of(layout, max_bytes, "max_bytes", 2**50)
    return any((yield from plan_each(part.set_budget(share) for part in layout.parts)))


def set_result_budget(layout: Partitions, /, max_bytes: int | None) -> Plan[bool]:
    """As :func:`pyqueue.protocol.verbs.control.set_result_budget`, in every partition:
    each keeps at most its share, ``max_bytes / partitions`` rounded up."""
    share = share_of(layout, max_bytes, "max_bytes", 2**50)
    return any((yield from plan_each(part.set_result_budget(share) for part in layout.parts)))


def set_tombstone_limit(layout: Partitions, /, max_count: int | None) -> Plan[bool]:
    """As :func:`pyqueue.protocol.verbs.control.set_tombstone_limit`, in every
    partition: each keeps at most its share, ``max_count / partitions`` rounded up."""
    share = share_of(layout, max_count, "max_count", 2**40)
    return any((yield from plan_each(part.set_tombstone_limit(share) for part in layout.parts)))


def set_indexes(layout: Partitions, /, on: bool = True, *, now_ms: int | None = None) -> Plan[int | None]:
    """As :func:`pyqueue.protocol.verbs.search.set_indexes`, in every partition: since
    when every partition keeps them (the latest), or None."""
    answers = yield from plan_each(part.set_indexes(on, now_ms=now_ms) for part in layout.parts)
    return None if None in answers else max(a for a in answers if a is not None)


def search(layout: Partitions, /, *, cursor: str = "", count: int = 100, scan_most: int = DEFAULT_SCAN_MOST,
           **where: Any) -> Plan[SearchPage]:
    """As :func:`pyqueue.protocol.verbs.search.search`, over the partitions in order
    (``JobEntry.queue`` names each job's partition; a group's jobs are all in its
    partition). The cursor is "<partition>:<that partition's cursor>"."""
    check_search(where.get("state"), where.get("task"), where.get("group"), where.get("error"),
                 where.get("since_ms"), where.get("until_ms"), count)
    p, part_cursor = 0, ""
    if cursor:
        head, _, part_cursor = cursor.partition(":")
        if not head.isdigit() or int(head) >= layout.count:
            raise InvalidArgument(f"cursor {cursor!r} is not one of this queue's search pages")
        p = int(head)
    jobs: list[JobEntry] = []
    examined, since, latest = 0, None, 0
    while p < layout.count and len(jobs) < count and examined < scan_most:
        page = yield from layout.parts[p].search(cursor=part_cursor, count=count - len(jobs),
                                                 scan_most=scan_most - examined, **where)
        jobs += page.jobs
        examined, since, latest = examined + page.examined, page.indexed_since_ms, max(latest, page.now_ms)
        part_cursor = page.cursor
        if not part_cursor:
            p += 1
    next_cursor = f"{p}:{part_cursor}" if p < layout.count else ""
    return SearchPage(jobs=jobs, cursor=next_cursor, examined=examined, indexed_since_ms=since, now_ms=latest)


def promote_now(layout: Partitions, /, ids: Sequence[str], *, now_ms: int | None = None) -> Plan[list[str]]:
    """As :func:`pyqueue.protocol.verbs.search.promote_now`: each id in its partition."""
    answers = yield from plan_each(part.promote_now(group, now_ms=now_ms)
                                   for part, group in by_partition(layout, check_ids(ids)))
    return [job_id for answer in answers for job_id in answer]


def set_group_limit(layout: Partitions, /, cap: int | None, *, group: str | None = None) -> Plan[bool]:
    """As :func:`pyqueue.protocol.verbs.control.set_group_limit`, in every partition: a
    group's jobs all live in its partition, so the cap there is the group's cap across
    the queue (True if any partition changed)."""
    return any((yield from plan_each(part.set_group_limit(cap, group=group) for part in layout.parts)))


def groups(layout: Partitions, /, offset: int = 0, limit: int = 100) -> Plan[GroupsPage]:
    """As :func:`pyqueue.protocol.verbs.control.groups`, for every partition: ``offset``
    and ``limit`` apply in each (a group lives in one partition; ``GroupInfo.queue``
    names it), and ``total`` is the sum."""
    pages = yield from plan_each(part.groups(offset, limit) for part in layout.parts)
    return GroupsPage(
        total=sum(page.total for page in pages),
        default_cap=max(page.default_cap for page in pages),
        groups=[group for page in pages for group in page.groups],
    )


def limit(layout: Partitions, /, count: int, period_ms: int = 1000, *, burst: int = 1) -> Plan[bool]:
    """Refused: a cap on the logical queue would have to be shared out between its
    partitions, and a share per partition would slow a backlog that sits in one."""
    raise InvalidArgument(
        f"{layout.spec.name} has {layout.count} partitions: a rate limit applies to an unpartitioned queue only"
    )
    yield  # a generator, like every plan


def set_events(layout: Partitions, /, bound: int) -> Plan[EventsSetting]:
    """As :func:`pyqueue.protocol.verbs.events.set_events`, in every partition (each
    keeps its own stream of ``bound`` events); ``previous`` is the largest bound found,
    ``length`` the sum."""
    answers = yield from plan_each(part.set_events(bound) for part in layout.parts)
    return EventsSetting(max(a.previous for a in answers), sum(a.length for a in answers))


def events(layout: Partitions, /, since: Since = None, count: int = 100, *, block_ms: int = 0) -> Plan[EventPage]:
    """Refused: each partition has its own stream, numbered on its own, so one
    number cannot say where a reader of the whole queue is. Read each partition's
    events: ``Queue(partition_name(name, p, partitions))`` (``pyqueue events`` takes
    the partition's name too)."""
    raise InvalidArgument(
        f"{layout.spec.name} has {layout.count} partitions, each with its own event stream: read one partition's "
        f"events (queue {partition_name(layout.spec.name, 0, layout.count)!r} and the others)"
    )
    yield  # a generator, like every plan


def recent_events(layout: Partitions, /, count: int = 50) -> Plan[EventPage]:
    """Refused, as :func:`events`."""
    return (yield from events(layout))


def browse(layout: Partitions, /, state: str, start: int = 0, count: int = 50, *, now_ms: int | None = None) -> Plan[JobPage]:
    """As :func:`pyqueue.protocol.verbs.reading.browse`, over the partitions in order:
    ranks ``start`` .. ``start + count - 1`` of partition 0's jobs in ``state``
    followed by partition 1's, and so on (``JobEntry.queue`` names each job's
    partition); ``total`` is the sum. One call per partition, one after another: each
    partition's part is a snapshot of one moment, the page as a whole is not."""
    state = check_browse(state, start, count)
    check_now(now_ms)
    jobs: list[JobEntry] = []
    total, latest = 0, 0
    for part in layout.parts:
        want = count - len(jobs)
        # A partition after the page is full is still read (one job) for its total.
        page = yield from part.browse(state, max(0, start - total), max(want, 1), now_ms=now_ms)
        if want > 0:
            jobs += page.jobs
        total += page.total
        latest = max(latest, page.now_ms)
    return JobPage(state=state, total=total, start=start, now_ms=latest, jobs=jobs)


def dead_list(layout: Partitions, /, offset: int = 0, limit: int = 100) -> Plan[DeadPage]:
    """One page of DEAD over all partitions, oldest first (merged by time of death;
    at most ``offset + limit`` <= 1000 are read per partition)."""
    check_int(offset, "offset", 0, 2**31)
    check_int(limit, "limit", 1, MAX_BATCH)
    if offset + limit > MAX_BATCH:
        raise InvalidArgument(f"offset + limit must be at most {MAX_BATCH} for a partitioned queue")
    pages = yield from plan_each(part.dead_list(0, offset + limit) for part in layout.parts)
    merged: list[DeadJob] = sorted((j for page in pages for j in page.jobs), key=lambda j: (j.dead_ms, j.id))
    return DeadPage(total=sum(page.total for page in pages), jobs=merged[offset : offset + limit])


def dead_replay(
    layout: Partitions, /, ids: Sequence[str] | None = None, *, limit: int = 100, now_ms: int | None = None
) -> Plan[int]:
    """As :func:`pyqueue.protocol.verbs.control.dead_replay`: each id in its partition."""
    groups = yield from _dead_groups(layout, ids, limit)
    return sum((yield from plan_each(part.dead_replay(group, now_ms=now_ms) for part, group in groups)))


def dead_purge(layout: Partitions, /, ids: Sequence[str] | None = None, *, limit: int = 100) -> Plan[int]:
    """As :func:`pyqueue.protocol.verbs.control.dead_purge`: each id in its partition."""
    groups = yield from _dead_groups(layout, ids, limit)
    return sum((yield from plan_each(part.dead_purge(group) for part, group in groups)))


def _dead_groups(layout: Partitions, /, ids: Sequence[str] | None, limit: int) -> Plan[list[tuple[SingleQueue, list[str]]]]:
    """``ids`` checked (or the ``limit`` oldest dead jobs of the queue), by partition."""
    chosen = check_ids(ids) if ids is not None else [job.id for job in (yield from dead_list(layout, 0, limit)).jobs]
    return by_partition(layout, chosen)


def by_partition(layout: Partitions, ids: Sequence[str]) -> list[tuple[SingleQueue, list[str]]]:
    """``ids`` grouped by the partition each lives in (its id's), in partition order."""
    groups: dict[int, list[str]] = {}
    for job_id in ids:
        groups.setdefault(partition_of(job_id, layout.count), []).append(job_id)
    return [(layout.parts[p], group) for p, group in sorted(groups.items())]


def share_of(layout: Partitions, total: int | None, name: str, most: int) -> int | None:
    """A queue-wide cap ``total`` (None or 0: none; InvalidArgument outside 0..``most``)
    as each partition's share, rounded up."""
    check_int(0 if total is None else total, name, 0, most)
    return -(-total // layout.count) if total else None


def check_partitions(layout: Partitions, /, *, record: bool = True) -> Plan[None]:
    """As :func:`pyqueue.protocol.verbs.base.check_partitions`: the logical queue's count."""
    return (yield from check_partition_count(layout.memory, record=record))


# -- the plans as one object ------------------------------------------------------------


class Routed(Generic[P, T]):
    """A plan function of this module bound to the :class:`Partitions` of the
    :class:`PartitionedQueue` it is read from."""

    def __init__(self, plan: Callable[Concatenate[Partitions, P], Plan[T]]) -> None:
        self.plan = plan
        self.__doc__ = plan.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> Routed[P, T]: ...

    @overload
    def __get__(self, obj: PartitionedQueue, owner: type) -> Callable[P, Plan[T]]: ...

    def __get__(self, obj: PartitionedQueue | None, owner: type) -> Routed[P, T] | Callable[P, Plan[T]]:
        if obj is None:
            return self
        plan, layout = self.plan, obj.layout

        def routed(*args: P.args, **kwargs: P.kwargs) -> Plan[T]:
            return plan(layout, *args, **kwargs)

        return routed


class PartitionedQueue:
    """The plans of one logical queue over ``spec.partitions`` partitions (see the
    module docstring): a :class:`~pyqueue.protocol.plans.QueuePlans`, as a single
    queue's :class:`~pyqueue.protocol.plans.SingleQueue` is. No I/O: a façade
    (:class:`pyqueue.Queue`, :class:`pyqueue.aio.AsyncQueue`) drives it."""

    def __init__(self, spec: QueueSpec, memory: QueueMemory) -> None:
        self.layout = Partitions(spec, memory)

    def __repr__(self) -> str:
        spec = self.layout.spec
        return f"PartitionedQueue({spec.name!r}, prefix={spec.prefix!r}, partitions={spec.partitions})"

    @property
    def spec(self) -> QueueSpec:
        return self.layout.spec

    @property
    def memory(self) -> QueueMemory:
        return self.layout.memory

    @property
    def parts(self) -> list[SingleQueue]:
        """The partitions' plans, in partition order."""
        return self.layout.parts

    def set_owner(self, owner: str) -> None:
        self.layout.set_owner(owner)

    check_partitions = Routed(check_partitions)
    enqueue = Routed(enqueue)
    enqueue_json = Routed(enqueue_json)
    enqueue_many = Routed(enqueue_many)
    lease = Routed(lease)
    lease_call = Routed(lease_call)
    ack = Routed(ack)
    ack_many = Routed(ack_many)
    ack_and_lease = Routed(ack_and_lease)
    ack_result = Routed(ack_result)
    ack_result_many = Routed(ack_result_many)
    nack = Routed(nack)
    extend = Routed(extend)
    release = Routed(release)
    stats = Routed(stats)
    partition_stats = Routed(partition_stats)
    peek = Routed(peek)
    get = Routed(get)
    browse = Routed(browse)
    result = Routed(result)
    results = Routed(results)
    wait_result = Routed(wait_result)
    promote = Routed(promote)
    scrub = Routed(scrub)
    cancel = Routed(cancel)
    cancel_many = Routed(cancel_many)
    sequence_skip = Routed(sequence_skip)
    set_rate_limit = Routed(set_rate_limit)
    set_budget = Routed(set_budget)
    set_result_budget = Routed(set_result_budget)
    set_tombstone_limit = Routed(set_tombstone_limit)
    set_indexes = Routed(set_indexes)
    search = Routed(search)
    promote_now = Routed(promote_now)
    defer_key = Routed(defer_key)
    limit = Routed(limit)
    set_group_limit = Routed(set_group_limit)
    groups = Routed(groups)
    pause = Routed(pause)
    resume = Routed(resume)
    dead_list = Routed(dead_list)
    dead_replay = Routed(dead_replay)
    dead_purge = Routed(dead_purge)
    flow_wait = Routed(flow_wait)
    flow_done = Routed(flow_done)
    flow_due = Routed(flow_due)
    flow_record = Routed(flow_record)
    flow_show = Routed(flow_show)
    progress = Routed(progress)
    progress_of = Routed(progress_of)
    step = Routed(step)
    park = Routed(park)
    signal = Routed(signal)
    steps = Routed(steps)
    set_events = Routed(set_events)
    events = Routed(events)
    recent_events = Routed(recent_events)
