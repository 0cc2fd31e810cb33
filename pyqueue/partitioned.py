"""A logical queue spread over K partitions: K queues of their own hash tags, so a busy
queue can span every primary of a Redis Cluster (DESIGN §9).

``Queue(name, partitions=K)`` with K > 1 returns a :class:`PartitionedQueue`. Its
partitions are ordinary queues named ``<name>#0`` .. ``<name>#<K-1>`` (keys
``<prefix>:{<name>#<p>}:<role>``): the Lua scripts do not know about partitions, a
partition is just a queue. A job lives in partition :func:`~pyqueue.queue.partition_of`
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
from dataclasses import fields
from typing import Any, TypeVar

from pyqueue.clients import Client
from pyqueue.errors import InvalidArgument
from pyqueue.models import (
    DeadJob,
    DeadPage,
    Enqueued,
    Extended,
    Job,
    Leased,
    Nacked,
    NewJob,
    Outcome,
    Peeked,
    Promoted,
    Scrubbed,
    Stats,
)
from pyqueue.queue import (
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    MAX_BATCH,
    MAX_PARTITIONS,
    Queue,
    check_int,
    check_job_id,
    new_job,
    partition_name,
    partition_of,
    peek_many,
    physical_queue,
)

T = TypeVar("T")


class PartitionedQueue(Queue):
    """One logical queue over ``partitions`` partitions (see the module docstring).
    Made by ``Queue(name, partitions=K)``; takes the same arguments. Thread-safe as
    :class:`~pyqueue.Queue` is."""

    def __init__(self, name: str, redis: Client | None = None, *, partitions: int = 1, **kwargs: Any) -> None:
        super().__init__(name, redis, **kwargs)
        if "#" in name:
            raise InvalidArgument(f"a partitioned queue's name cannot contain '#' (its partitions are <name>#<p>): {name!r}")
        self.partitions = check_int(partitions, "partitions", 2, MAX_PARTITIONS)
        self.parts = [
            physical_queue(partition_name(name, p, self.partitions), self.redis, **{**kwargs, "owner": self.owner})
            for p in range(self.partitions)
        ]
        self._by_name = {part.name: part for part in self.parts}
        for part in self.parts:
            part._partition_guard = self  # the logical queue's count guards every partition
        self._cursor = itertools.count()
        self._cursor_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, prefix={self.keys.prefix!r}, partitions={self.partitions})"

    @property
    def owner(self) -> str:
        """The lease owner of every partition (a worker sets its service's)."""
        return self._owner

    @owner.setter
    def owner(self, value: str) -> None:
        self._owner = value
        for part in getattr(self, "parts", ()):
            part.owner = value

    def _ready(self) -> None:
        """Before a call that does not go through a partition's own checked call (a
        peek): refuse another partition count; record nothing."""
        if not self._partitions_checked:
            self.check_partitions(record=False)

    def part_of(self, job: Job) -> Queue:
        """The partition a leased job came from (by ``job.queue``)."""
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a Job from lease, got {type(job).__name__}")
        part = self._by_name.get(job.queue)
        if part is None:
            raise InvalidArgument(f"job {job.id!r} is from queue {job.queue!r}, not a partition of {self.name!r}")
        return part

    def _route(self, jobs: Iterable[Job]) -> dict[int, list[tuple[int, Job]]]:
        """Jobs grouped by partition index, each with its position in ``jobs``."""
        groups: dict[int, list[tuple[int, Job]]] = {}
        for position, job in enumerate(jobs):
            groups.setdefault(self.parts.index(self.part_of(job)), []).append((position, job))
        if not 1 <= sum(len(g) for g in groups.values()) <= MAX_BATCH:
            raise InvalidArgument(f"1..{MAX_BATCH} jobs per call")
        return groups

    def _rotation(self, call: str | None = None) -> list[Queue]:
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

    def enqueue(
        self,
        payload: bytes | str,
        *,
        job_id: str | None = None,
        delay_ms: int = 0,
        max_attempts: int | None = None,
        now_ms: int | None = None,
    ) -> Enqueued:
        """As :meth:`Queue.enqueue`, into the job's partition."""
        job = new_job(NewJob(payload, job_id, delay_ms, max_attempts))
        part = self.parts[partition_of(job[0], self.partitions)]
        return part.enqueue(job[1], job_id=job[0], delay_ms=job[2], max_attempts=job[3], now_ms=now_ms)

    def enqueue_many(self, jobs: Iterable[NewJob | bytes | str], *, now_ms: int | None = None) -> list[Enqueued]:
        """As :meth:`Queue.enqueue_many`, but atomic per partition only: one call per
        partition that receives jobs. Every job is validated before anything is sent."""
        batch = [new_job(item) for item in jobs]
        if not 1 <= len(batch) <= MAX_BATCH:
            raise InvalidArgument(f"1..{MAX_BATCH} jobs per call, got {len(batch)}")
        groups: dict[int, list[int]] = {}
        for position, job in enumerate(batch):
            groups.setdefault(partition_of(job[0], self.partitions), []).append(position)
        out: list[Enqueued | None] = [None] * len(batch)
        for p, positions in groups.items():
            news = [NewJob(batch[i][1], batch[i][0], batch[i][2], batch[i][3]) for i in positions]
            for i, answer in zip(positions, self.parts[p].enqueue_many(news, now_ms=now_ms)):
                out[i] = answer
        return [answer for answer in out if answer is not None]

    # -- lease / ack -----------------------------------------------------------------

    def lease_call(
        self,
        *,
        ack: Sequence[Job] = (),
        count: int = 1,
        lease_ms: int = DEFAULT_LEASE_MS,
        limit: int = DEFAULT_MAINTENANCE_LIMIT,
        call: str | None = None,
        now_ms: int | None = None,
    ) -> Leased:
        """As :meth:`Queue.lease_call`: acks ``ack`` (in their partitions), then leases
        up to ``count`` jobs from the first partition with work in rotating order (see
        the module docstring). ``next_due_ms`` is the earliest of all partitions.

        ``call``: with a token of your own, every partition is asked in an order fixed
        by the token, with that token, until one hands out jobs: a re-sent call gets
        back the first run's leases unless a partition asked before theirs gained work
        in between (then those leases are reclaimed at their deadline)."""
        check_int(count, "count", 0, MAX_BATCH)
        acks = self.ack_many(ack, now_ms=now_ms) if ack else []
        self._ready()
        order = self._rotation(call)
        peeked = dict(zip((q.name for q in order), peek_many(order)))
        next_due_ms, clock = -1, 0
        for part in order:
            seen = peeked[part.name]
            clock = seen.now_ms
            if count and (seen.has_work or call is not None):
                leased = part.lease_call(count=count, lease_ms=lease_ms, limit=limit, call=call, now_ms=now_ms)
                if leased.jobs:
                    return Leased(jobs=leased.jobs, acks=acks, now_ms=leased.now_ms, next_due_ms=-1)
                due = leased.next_due_ms
            else:
                due = seen.next_due_ms
            if due >= 0 and (next_due_ms < 0 or due < next_due_ms):
                next_due_ms = due
        return Leased(jobs=[], acks=acks, now_ms=clock if now_ms is None else now_ms, next_due_ms=next_due_ms)

    def ack_and_lease(
        self,
        job: Job,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        count: int = 1,
        call: str | None = None,
        now_ms: int | None = None,
    ) -> tuple[Outcome, list[Job]]:
        """Ack ``job`` and lease up to ``count`` more *from its partition* in one round
        trip (lua/lease.lua). A worker bounds how long it keeps doing so, so that the
        other partitions get their turn."""
        return self.part_of(job).ack_and_lease(job, lease_ms=lease_ms, count=count, call=call, now_ms=now_ms)

    def ack_many(self, jobs: Iterable[Job], *, now_ms: int | None = None) -> list[Outcome]:
        """As :meth:`Queue.ack_many`; one call per partition involved."""
        return self._per_partition(jobs, lambda part, group: part.ack_many(group, now_ms=now_ms))

    def extend(self, jobs: Iterable[Job], lease_ms: int = DEFAULT_LEASE_MS, *, now_ms: int | None = None) -> list[Extended]:
        """As :meth:`Queue.extend`; one call per partition involved."""
        return self._per_partition(jobs, lambda part, group: part.extend(group, lease_ms, now_ms=now_ms))

    def release(self, jobs: Iterable[Job]) -> list[Outcome]:
        """As :meth:`Queue.release`; one call per partition involved."""
        return self._per_partition(jobs, lambda part, group: part.release(group))

    def _per_partition(self, jobs: Iterable[Job], call: Any) -> list[Any]:
        out: list[Any] = []
        positions: list[int] = []
        for p, group in self._route(jobs).items():
            positions += [position for position, _ in group]
            out += call(self.parts[p], [job for _, job in group])
        ordered: list[Any] = [None] * len(out)
        for position, answer in zip(positions, out):
            ordered[position] = answer
        return ordered

    def nack(self, job: Job, error: str = "", **kwargs: Any) -> Nacked:
        """As :meth:`Queue.nack`, in the job's partition."""
        return self.part_of(job).nack(job, error, **kwargs)

    # -- maintenance and inspection --------------------------------------------------

    def promote(self, limit: int = DEFAULT_MAINTENANCE_LIMIT, *, now_ms: int | None = None) -> Promoted:
        """As :meth:`Queue.promote`, in every partition (``limit`` per partition)."""
        answers = [part.promote(limit, now_ms=now_ms) for part in self.parts]
        due = [a.next_due_ms for a in answers if a.next_due_ms >= 0]
        return Promoted(
            sum(a.promoted for a in answers), sum(a.reclaimed for a in answers), sum(a.dead for a in answers),
            any(a.more for a in answers), min(due) if due else -1,
        )

    def scrub(self, owner: str, *, limit: int = DEFAULT_MAINTENANCE_LIMIT, now_ms: int | None = None) -> Scrubbed:
        """As :meth:`Queue.scrub`, in every partition (``limit`` per partition)."""
        answers = [part.scrub(owner, limit=limit, now_ms=now_ms) for part in self.parts]
        return Scrubbed(sum(a.scrubbed for a in answers), sum(a.dead for a in answers), any(a.more for a in answers))

    def partition_stats(self, *, now_ms: int | None = None) -> list[Stats]:
        """:meth:`Queue.stats` of each partition, in partition order."""
        return [part.stats(now_ms=now_ms) for part in self.parts]

    def stats(self, *, now_ms: int | None = None) -> Stats:
        """The sum over the partitions (not read atomically across them); ``lag_ms`` is
        the largest and ``now_ms`` the latest."""
        each = self.partition_stats(now_ms=now_ms)
        summed = {f.name: sum(getattr(s, f.name) for s in each) for f in fields(Stats)}
        summed["lag_ms"] = max(s.lag_ms for s in each)
        summed["now_ms"] = max(s.now_ms for s in each)
        return Stats(**summed)

    def peek(self, *, now_ms: int | None = None) -> Peeked:
        """Whether any partition has work, and the earliest next due time of all."""
        self._ready()
        each = [part.peek(now_ms=now_ms) for part in self.parts] if now_ms is not None else peek_many(self.parts)
        due = [p.next_due_ms for p in each if p.next_due_ms >= 0]
        return Peeked(min(p.now_ms for p in each), sum(p.ready for p in each), min(due) if due else -1)

    def dead_list(self, offset: int = 0, limit: int = 100) -> DeadPage:
        """One page of DEAD over all partitions, oldest first (merged by time of death;
        at most ``offset + limit`` <= 1000 are read per partition)."""
        check_int(offset, "offset", 0, 2**31)
        check_int(limit, "limit", 1, MAX_BATCH)
        if offset + limit > MAX_BATCH:
            raise InvalidArgument(f"offset + limit must be at most {MAX_BATCH} for a partitioned queue")
        pages = [part.dead_list(0, offset + limit) for part in self.parts]
        merged: list[DeadJob] = sorted((j for page in pages for j in page.jobs), key=lambda j: (j.dead_ms, j.id))
        return DeadPage(total=sum(page.total for page in pages), jobs=merged[offset : offset + limit])

    def dead_replay(self, ids: Sequence[str] | None = None, *, limit: int = 100, now_ms: int | None = None) -> int:
        """As :meth:`Queue.dead_replay`: each id in its partition."""
        return sum(
            part.dead_replay(group, now_ms=now_ms) for part, group in self._dead_groups(ids, limit)
        )

    def dead_purge(self, ids: Sequence[str] | None = None, *, limit: int = 100) -> int:
        """As :meth:`Queue.dead_purge`: each id in its partition."""
        return sum(part.dead_purge(group) for part, group in self._dead_groups(ids, limit))

    def _dead_groups(self, ids: Sequence[str] | None, limit: int) -> list[tuple[Queue, list[str]]]:
        chosen = [job.id for job in self.dead_list(0, limit).jobs] if ids is None else [check_job_id(i) for i in ids]
        if len(chosen) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} ids per call, got {len(chosen)}")
        groups: dict[int, list[str]] = {}
        for job_id in chosen:
            groups.setdefault(partition_of(job_id, self.partitions), []).append(job_id)
        return [(self.parts[p], group) for p, group in sorted(groups.items())]
