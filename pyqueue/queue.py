"""``QueueCore``: every verb of one queue, written once as a plan (see
:mod:`pyqueue.core`); ``Queue``: those plans over redis-py's blocking client
(``pyqueue.aio.AsyncQueue`` runs the same plans over redis.asyncio). Each verb runs one
script call (``dead_replay``/``dead_purge`` without ids list first; a partitioned
queue's, one per partition involved; a queue object's first call also checks the
partition count).

Delivery semantics, in one place:

* **At least once.** A leased job runs until it is acked. If its worker dies, or its
  lease expires, or the worker is scrubbed, the job goes back to READY and runs again:
  a job may run more than once, never zero times while it is neither acked nor dead.
* **Exactly-once ack answer.** ``ack`` returns :attr:`Outcome.OK` at most once per job,
  ever, and only to the holder of the job's current lease. Code that must not repeat a
  side effect can act only after that answer, or pass ``job.fence`` downstream. With
  ``wait_replicas``, an ack that ran but raised NotReplicated returned nothing; the
  same queue object's ack of that job sent again answers OK where it finds the job gone
  (the first send completed it), so that answer is not lost either.
* **Fencing.** Every lease gets a new fence, larger than every earlier fence of the
  queue. A stale receipt (a lease that was reclaimed) changes nothing anywhere.
* **One clock.** Deadlines, delays and backoff are computed inside the scripts from the
  Redis server's ``TIME``. ``now_ms`` parameters exist for tests only.
* **Replay safety.** Every call can be sent twice with the same arguments (redis-py does
  so after a connection error) and has the effect of one call.

Threads: a ``Queue`` holds no mutable state beyond its redis-py client (whose
connection pool is thread-safe) and the enqueues it coalesces (under a lock), so one
``Queue`` may be shared by threads.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import fields, replace
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pyqueue.clients import Client, bytes_client, check_server, connect, default_client
from pyqueue.core import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RESULTS,
    DEFAULT_PREFIX,
    DEFAULT_RESULT_TTL_MS,
    MAX_BATCH,
    MAX_CALL_PAYLOAD_BYTES,
    MAX_ERROR_BYTES,
    MAX_ID_BYTES,
    MAX_LEASE_MS,
    MAX_PARTITIONS,
    Commands,
    JobTuple,
    Pipelined,
    Plan,
    Step,
    SyncDriver,
    Verb,
    ack_call,
    ack_result_call,
    as_payload,
    cancel_call,
    check_ids,
    check_int,
    check_job_id,
    check_now,
    check_owner,
    dead_list_call,
    dead_purge_call,
    dead_replay_call,
    decode_result,
    encode_result,
    enqueue_call,
    extend_call,
    get_call,
    lease_call,
    limit_call,
    set_group_limit_call,
    groups_call,
    check_group,
    nack_call,
    new_batch,
    new_job,
    partition_name,
    partition_of,
    pause_call,
    peek_call,
    promote_call,
    ack_outcomes,
    receipts_of,
    release_call,
    result_call,
    resume_call,
    scrub_call,
    stats_call,
    text,
)
from pyqueue.errors import InvalidArgument, NotReplicated, OutOfMemory, map_redis_error
from pyqueue.keys import QueueKeys, check_name
from pyqueue.models import (
    Cancelled,
    DeadJob,
    DeadPage,
    Enqueued,
    GroupInfo,
    GroupsPage,
    Extended,
    Job,
    JobInfo,
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
from pyqueue.scripts import Scripts
from pyqueue.unconfirmed import UnconfirmedAcks

__all__ = [  # what other modules import from here (the core's names are re-exported)
    "DEFAULT_BACKOFF_BASE_MS", "DEFAULT_BACKOFF_CAP_MS", "DEFAULT_KEEP_DONE_MS", "DEFAULT_LEASE_MS",
    "DEFAULT_MAINTENANCE_LIMIT", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_PREFIX", "MAX_BATCH", "MAX_ERROR_BYTES",
    "MAX_ID_BYTES", "MAX_PARTITIONS", "JobTuple", "Queue", "QueueCore", "as_payload", "check_int",
    "check_job_id", "new_job", "partition_name", "partition_of", "peek_many", "physical_queue",
]

log = logging.getLogger("pyqueue")
#: Whether enqueues made at the same moment share a script call (``coalesce_enqueues``).
DEFAULT_COALESCE_ENQUEUES = True
#: wait_result reads the job's state again this long after its first read, then after
#: twice as long each time, up to WAIT_SLICE_MS apart: the endings that add no entry to
#: the finished stream (an ack without a result, a cancel, a death by lease expiry or
#: scrub) are seen within about the time already waited, and at most WAIT_SLICE_MS late.
WAIT_REREAD_FIRST_MS = 50
#: The longest time between two reads of the job's state in wait_result.
WAIT_SLICE_MS = 2_000
Q = TypeVar("Q", bound="QueueCore")


class QueueCore:
    """The verbs of one named queue, as plans (no I/O; see :mod:`pyqueue.core`), and
    the settings they use. :class:`Queue` and :class:`pyqueue.aio.AsyncQueue` are this
    class with a transport.

    Args:
        name: the queue name (1..128 printable ASCII characters, no spaces or braces).
        redis: a client of one server or a Redis Cluster: for :class:`Queue` a
            redis-py ``Redis`` or ``RedisCluster``, for :class:`~pyqueue.aio.AsyncQueue`
            their ``redis.asyncio`` counterparts. ``None`` uses the server named by the
            environment variable ``PYQUEUE_URL`` if it is set (one client per URL,
            shared by every such :class:`Queue` of the process; an
            :class:`~pyqueue.aio.AsyncQueue` gets a client of its own, closed by
            ``aclose``), else the process-wide embedded fakeredis; which one is logged
            once (see :func:`pyqueue.clients.default_client`). A client with
            ``decode_responses=True`` works too (see :func:`pyqueue.clients.bytes_client`).
        prefix: the first part of every key, ``<prefix>:{<name>}:<role>``.
        owner: who holds this queue object's leases, 1..64 of ``[A-Za-z0-9_.:-]``.
            Workers pass their service id so a dead worker's leases can be scrubbed;
            the default is a random id for this object.
        keep_done_ms: after this object acks a job, its id stays a duplicate for
            enqueue this long (a tombstone in ``done``), so an enqueue re-sent after a
            lost reply cannot run a finished job again. 0 keeps no tombstone: the id is
            free as soon as the job is acked. Costs about 140 bytes per acked job (with
            a 32-character id) for this long; see README, "Memory". Default 5 minutes.
        partitions: spread the queue over this many partitions (1..1024), each a queue
            of its own hash tag ``{<name>#<p>}``, so a busy queue spans several primaries
            of a Redis Cluster: with K > 1 the constructor returns the partitioned class
            (:class:`~pyqueue.partitioned.PartitionedQueue`,
            :class:`~pyqueue.aio.AsyncPartitionedQueue`), with the same verbs. Every
            producer and worker of a queue must use the same count: the count is
            recorded in Redis (``partitions`` in ``{<name>}``'s ``counters`` hash) at a
            queue object's first call, and a different count is refused
            (InvalidArgument) before anything else is sent.
        wait_replicas: opt-in durability (0..100, default 0: off). After every call
            that writes, ``WAIT wait_replicas wait_timeout_ms`` on the same connection:
            a call that returns had reached that many replicas; if fewer confirmed in
            time it raises :class:`~pyqueue.errors.NotReplicated` (an OutcomeUnknown:
            send the same call again). Replication stays asynchronous: this narrows the
            window in which a failover loses an acknowledged write, it does not close it
            (see :class:`~pyqueue.scripts.Scripts`). Works on one server with replicas
            and on a cluster.
        coalesce_enqueues: enqueues of this queue object made while one of its enqueue
            calls is in flight (by other threads or tasks) share the next call: one
            script run for them all, each caller still getting its own answer (added or
            duplicate) and the error of the call that carried its jobs. A lone enqueue
            is sent at once, never held back. Default on (see README, "Coalesced
            enqueues", for the figures behind that choice).
        max_payload_bytes: enqueue refuses a larger payload (PayloadTooLarge, an
            InvalidArgument) before sending anything; 1 byte .. 256 MiB, default 64 MiB.
            Redis would take up to 512 MB, but drops the connection past that (an
            OutcomeUnknown, after sending it again three times), and a value that large
            stalls the server for every client: keep large data in object storage.
        lua_directory: tests only: load the scripts from another directory (the
            mutation tests load deliberately broken copies).
    """

    #: Partitions of this logical queue (see ``partitions``).
    partitions = 1

    def __new__(cls: type[Q], name: str, redis: Any = None, *, partitions: int = 1, **kwargs: Any) -> Q:
        chosen: type[Any] = cls
        if check_int(partitions, "partitions", 1, MAX_PARTITIONS) > 1 and not getattr(cls, "is_partitioned", False):
            chosen = cls.partitioned_class()
        made: Q = object.__new__(chosen)
        return made

    @classmethod
    def partitioned_class(cls) -> type[QueueCore]:
        """The class a driver's constructor returns for K > 1 partitions."""
        raise NotImplementedError

    def __init__(
        self,
        name: str,
        redis: Any = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        owner: str | None = None,
        keep_done_ms: int = DEFAULT_KEEP_DONE_MS,
        partitions: int = 1,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        coalesce_enqueues: bool = DEFAULT_COALESCE_ENQUEUES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        lua_directory: Path | None = None,
    ) -> None:
        self.name = check_name(name, "queue name")
        # Whose partition count guards this queue's calls: its own, or for a partition
        # its logical queue's; and whether it has been checked and recorded.
        self._partition_guard: QueueCore = self
        self._partitions_checked = False
        self.keys = QueueKeys(check_name(prefix, "prefix"), name)
        self.owner = check_owner(owner if owner is not None else "c" + secrets.token_hex(6))
        self.keep_done_ms = check_int(keep_done_ms, "keep_done_ms", 0, 2**40)
        self.wait_replicas = check_int(wait_replicas, "wait_replicas", 0, 100)
        self.wait_timeout_ms = check_int(wait_timeout_ms, "wait_timeout_ms", 1, 86_400_000)  # 0 would wait forever
        if not isinstance(coalesce_enqueues, bool):
            raise InvalidArgument(f"coalesce_enqueues must be a bool, got {coalesce_enqueues!r}")
        self.coalesce_enqueues = coalesce_enqueues
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 1, MAX_CALL_PAYLOAD_BYTES)
        # Acks that ran but that too few replicas confirmed (shared with the partitions).
        self._unconfirmed = UnconfirmedAcks()
        self.open_transport(redis, lua_directory)

    #: The driver's transport: its scripts on its client (set by each driver).
    transport_class: Any = None

    def open_transport(self, redis: Any, lua_directory: Path | None) -> None:
        """Set up the driver's client and its transport with this queue's settings."""
        self.redis = self.driver_client(redis)
        self.scripts = self.transport_class(
            self.redis,
            lua_directory,
            wait_replicas=self.wait_replicas,
            wait_timeout_ms=self.wait_timeout_ms,
            coalesce=self.coalesce_enqueues,
        )

    @staticmethod
    def driver_client(redis: Any) -> Any:
        """The client this driver talks through: ``redis``, checked or adapted, or the
        embedded default for ``None``."""
        raise NotImplementedError

    def physical(self, name: str) -> Any:
        """A queue of this driver class named ``name`` (a partition ``<name>#<p>``) that
        shares this object's transport and settings, and never records or checks a
        partition count of its own (its logical queue, if any, does)."""
        part = object.__new__(self.single_class())
        # The same client, scripts and settings; not the verbs cached for this object.
        part.__dict__.update((k, v) for k, v in self.__dict__.items() if not isinstance(getattr(type(self), k, None), Verb))
        part.name, part.keys = check_name(name, "queue name"), QueueKeys(self.keys.prefix, name)
        part.owner = self.owner
        part._partition_guard, part._partitions_checked = part, True
        return part

    @classmethod
    def single_class(cls) -> type[QueueCore]:
        """The driver's class of one (unpartitioned) queue."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, prefix={self.keys.prefix!r})"

    def _run(self, step: Step) -> Plan[Any]:
        """One call of this queue: the guard around a queue object's first call refuses
        another partition count before sending anything, and records ours only once a
        call has succeeded, so that a call that fails (bad input) writes nothing."""
        guard = self._partition_guard
        if guard._partitions_checked:
            return (yield step)
        yield from guard.plan_check_partitions(record=False)
        reply = yield step
        if not guard._partitions_checked:  # the check found none recorded: record ours
            yield from guard._plan_record_partitions()
        return reply

    def _plan_acks(self, step: Step, receipts: Sequence[str], acks_of: Callable[[Any], list[Outcome]]) -> Plan[Any]:
        """Run ``step``, a call that acks ``receipts`` (their outcomes are
        ``acks_of(reply)``), and return its reply. If it raises NotReplicated, the
        receipts it acked are remembered, so that the ack sent again answers OK for them
        where it finds the job gone (see :mod:`pyqueue.unconfirmed`)."""
        try:
            return (yield from self._run(step))
        except NotReplicated as exc:
            if exc.reply is not None and not isinstance(exc.reply, Exception):
                self._unconfirmed.note(receipts, acks_of(exc.reply))
            raise

    def _resolved(self, receipts: Sequence[str], outcomes: list[Outcome]) -> list[Outcome]:
        """``outcomes`` of an ack of ``receipts``, GONE read as OK where an unconfirmed
        send of this object acked the receipt (costs one test while there is none)."""
        return self._unconfirmed.resolve(receipts, outcomes) if self._unconfirmed else outcomes

    def plan_check_partitions(self, *, record: bool = True) -> Plan[None]:
        """Refuse to go on if Redis records another partition count for this queue
        (``partitions`` in ``{<name>}``'s ``counters`` hash), and with ``record`` write
        ours if none is recorded yet. A queue object does this around its first call; a
        worker at start.

        The check reads (HGET); the record is a second round trip, sent only while
        nothing is recorded (see :meth:`_plan_record_partitions`).

        Raises:
            InvalidArgument: producers or workers of this queue use another count.
        """
        counters = QueueKeys(self.keys.prefix, self.name).counters
        self._agree_on_partitions((yield Commands(counters, [("HGET", counters, "partitions")]))[0])
        if record and not self._partitions_checked:
            yield from self._plan_record_partitions()

    def _plan_record_partitions(self) -> Plan[None]:
        """Record this object's partition count unless one is (HSETNX, then HGET), and
        check the one recorded. A server at its memory limit refuses that write: the
        count then stays unrecorded, nothing is raised (the call it follows has run, and
        a lease must not be orphaned by an error after it), and a later call tries again."""
        counters = QueueKeys(self.keys.prefix, self.name).counters
        record = [("HSETNX", counters, "partitions", self.partitions), ("HGET", counters, "partitions")]
        try:
            recorded = (yield Commands(counters, record))[-1]
        except OutOfMemory:
            return
        self._agree_on_partitions(recorded)

    def _agree_on_partitions(self, recorded: bytes | None) -> None:
        """Refuse another recorded count (InvalidArgument); checked once one is recorded."""
        if recorded is not None and int(recorded) != self.partitions:
            raise InvalidArgument(
                f"queue {self.name!r} has {int(recorded)} partition(s) recorded in Redis, but this queue object "
                f"was made with partitions={self.partitions}: every producer and worker of a queue must use the "
                "same count (changing it needs the queue drained and its counters key deleted)"
            )
        self._partitions_checked = recorded is not None

    check_partitions = Verb(plan_check_partitions)

    # -- enqueue ---------------------------------------------------------------------

    def plan_enqueue(
        self,
        payload: bytes | str,
        *,
        job_id: str | None = None,
        delay_ms: int = 0,
        max_attempts: int | None = None,
        priority: int = 0,
        group: str | None = None,
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
            now_ms: tests only: override the server clock.

        Returns:
            The job id and whether it was added. A call re-sent after a lost reply
            reports ``added=False`` for the job it added the first time, and adds
            nothing even if that job has run and been acked since (within
            ``keep_done_ms``).

        Raises:
            InvalidArgument, WrongTypeError, OutcomeUnknown.
        """
        new = NewJob(payload, job_id, delay_ms, max_attempts, priority, group)
        (added,) = yield from self.plan_enqueue_many([new], now_ms=now_ms)
        return added

    enqueue = Verb(plan_enqueue)

    def plan_enqueue_json(
        self,
        obj: Any,
        *,
        job_id: str | None = None,
        delay_ms: int = 0,
        max_attempts: int | None = None,
        priority: int = 0,
        group: str | None = None,
        now_ms: int | None = None,
    ) -> Plan[Enqueued]:
        """``enqueue`` the JSON encoding of ``obj`` (compact, UTF-8); read it with ``Job.json()``."""
        from json import dumps

        payload = dumps(obj, separators=(",", ":"), ensure_ascii=False)
        plan = self.plan_enqueue(payload, job_id=job_id, delay_ms=delay_ms, max_attempts=max_attempts,
                                 priority=priority, group=group, now_ms=now_ms)
        return (yield from plan)

    enqueue_json = Verb(plan_enqueue_json)

    def plan_enqueue_many(self, jobs: Iterable[NewJob | bytes | str], *, now_ms: int | None = None) -> Plan[list[Enqueued]]:
        """Add up to 1000 jobs in one atomic call (lua/enqueue.lua).

        Duplicates (of existing jobs, or repeated ids within ``jobs``) are skipped and
        reported with ``added=False``; everything else is added.

        Raises:
            InvalidArgument (nothing sent), WrongTypeError, OutcomeUnknown.
        """
        batch = new_batch(jobs, self.max_payload_bytes, self.partitions)
        check_now(now_ms)
        return (yield from self.plan_enqueue_batch(batch, now_ms))

    enqueue_many = Verb(plan_enqueue_many)

    def plan_enqueue_batch(self, batch: Sequence[JobTuple], now_ms: int | None) -> Plan[list[Enqueued]]:
        """``enqueue_many`` of jobs already validated (:func:`pyqueue.core.new_batch`)."""
        reply = yield from self._run(enqueue_call(self.keys, now_ms, batch))
        return [Enqueued(job[0], flag == 1) for job, flag in zip(batch, reply[2:])]

    # -- lease / ack -----------------------------------------------------------------

    def plan_lease(self, lease_ms: int = DEFAULT_LEASE_MS, count: int = 1, *, now_ms: int | None = None) -> Plan[list[Job]]:
        """Lease up to ``count`` ready jobs (lua/lease.lua). Returns [] if none is ready.

        Before leasing, the same call promotes due scheduled jobs and reclaims expired
        leases (bounded). Each job gets a new fence and the deadline now + ``lease_ms``
        (server clock); ``extend`` pushes it back. A lease past its deadline stays
        valid until it is reclaimed; then the job runs again (at least once).
        """
        return (yield from self.plan_lease_call(count=count, lease_ms=lease_ms, now_ms=now_ms)).jobs

    lease = Verb(plan_lease)

    def plan_ack(self, job: Job, *, now_ms: int | None = None) -> Plan[Outcome]:
        """Complete a leased job (lua/ack.lua).

        Returns :attr:`Outcome.OK` if this lease was current: the job is deleted, and no
        call will ever get OK for it again; its id stays a duplicate for enqueue for
        ``keep_done_ms``. :attr:`Outcome.STALE` if the job was
        reclaimed from this lease (it will run, or ran, again elsewhere);
        :attr:`Outcome.GONE` if it no longer exists. Only OK changes anything.

        Raises:
            NotReplicated: with ``wait_replicas``, the ack ran but too few replicas
                confirmed it. Send it again on this object: it answers OK if the job
                is gone because this send completed it (see :mod:`pyqueue.unconfirmed`).
        """
        return (yield from self.plan_ack_many([job], now_ms=now_ms))[0]

    ack = Verb(plan_ack)

    def plan_ack_many(self, jobs: Iterable[Job], *, now_ms: int | None = None) -> Plan[list[Outcome]]:
        """``ack`` up to 1000 jobs in one atomic call (lua/ack.lua); one outcome each.
        ``now_ms``: tests only (it dates the tombstones)."""
        receipts = receipts_of(jobs)
        check_now(now_ms)
        reply = yield from self._plan_acks(ack_call(self.keys, now_ms, self.keep_done_ms, receipts), receipts, ack_outcomes)
        return self._resolved(receipts, ack_outcomes(reply))

    ack_many = Verb(plan_ack_many)

    def plan_ack_result(
        self, job: Job, value: object, *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
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
            self.keys, now_ms, self.keep_done_ms, result_ttl_ms, max_results, [(receipt, encoded)]
        )
        reply = yield from self._plan_acks(step, [receipt], ack_outcomes)
        return self._resolved([receipt], ack_outcomes(reply))[0]

    ack_result = Verb(plan_ack_result)

    def plan_ack_result_many(
        self, jobs: Sequence[Job], values: Sequence[object], *, result_ttl_ms: int = DEFAULT_RESULT_TTL_MS,
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
            self.keys, now_ms, self.keep_done_ms, result_ttl_ms, max_results, list(zip(receipts, encoded))
        )
        return self._resolved(receipts, ack_outcomes((yield from self._plan_acks(step, receipts, ack_outcomes))))

    ack_result_many = Verb(plan_ack_result_many)

    def plan_ack_and_lease(
        self,
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
        leased = yield from self.plan_lease_call(ack=[job], count=count, lease_ms=lease_ms, call=call, now_ms=now_ms)
        return leased.acks[0], leased.jobs

    ack_and_lease = Verb(plan_ack_and_lease)

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
        step = lease_call(self.keys, now_ms, self.owner, call, count, lease_ms, limit, self.keep_done_ms, receipts)
        if not receipts:
            return self.parse_lease((yield from self._run(step)))
        leased = self.parse_lease((yield from self._plan_acks(step, receipts, lambda r: self.parse_lease(r).acks)))
        return replace(leased, acks=self._resolved(receipts, leased.acks)) if self._unconfirmed else leased

    lease_call = Verb(plan_lease_call)

    def parse_lease(self, reply: list[Any]) -> Leased:
        """Turn lua/lease.lua's flat reply into a :class:`Leased`."""
        now, next_due, n_acks = int(reply[0]), int(reply[1]), int(reply[2])
        acks = [Outcome(text(s)) for s in reply[3 : 3 + n_acks]]
        at = 3 + n_acks
        count = int(reply[at])
        jobs = []
        for i in range(count):
            receipt, job_id, payload, fence, attempt, max_attempts, deadline = reply[at + 1 + 7 * i : at + 8 + 7 * i]
            jobs.append(
                Job(
                    id=text(job_id),
                    queue=self.name,
                    payload=bytes(payload),
                    fence=int(fence),
                    attempt=int(attempt),
                    max_attempts=int(max_attempts),
                    deadline_ms=int(deadline),
                    receipt=text(receipt),
                )
            )
        return Leased(jobs=jobs, acks=acks, now_ms=now, next_due_ms=next_due)

    # -- failure paths ---------------------------------------------------------------

    def plan_nack(
        self,
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
            self.keys, now_ms, receipt, error.encode("utf-8", "replace"), delay_ms, backoff_base_ms, backoff_cap_ms,
            final,
        )
        status, state, at_ms = yield from self._run(step)
        outcome = Outcome(text(status))
        return Nacked(outcome, text(state) if outcome else None, int(at_ms))

    nack = Verb(plan_nack)

    def plan_extend(
        self, jobs: Iterable[Job], lease_ms: int = DEFAULT_LEASE_MS, *, now_ms: int | None = None
    ) -> Plan[list[Extended]]:
        """Move the deadlines of current leases to now + ``lease_ms`` (lua/extend.lua).

        Never moves a deadline earlier. Stale receipts change nothing.
        """
        receipts = receipts_of(jobs)
        check_int(lease_ms, "lease_ms", 1, MAX_LEASE_MS)
        check_now(now_ms)
        reply = yield from self._run(extend_call(self.keys, now_ms, lease_ms, receipts))
        return [Extended(Outcome(text(reply[i])), int(reply[i + 1])) for i in range(0, len(reply), 2)]

    extend = Verb(plan_extend)

    def plan_release(self, jobs: Iterable[Job]) -> Plan[list[Outcome]]:
        """Give leases back to the head of READY without counting the attempt
        (lua/release.lua), e.g. at shutdown. Stale receipts change nothing."""
        reply = yield from self._run(release_call(self.keys, receipts_of(jobs)))
        return [Outcome(text(s)) for s in reply]

    release = Verb(plan_release)

    def plan_promote(self, limit: int = DEFAULT_MAINTENANCE_LIMIT, *, now_ms: int | None = None) -> Plan[Promoted]:
        """Promote due scheduled jobs and reclaim expired leases, at most ``limit`` of
        each (lua/promote.lua). ``lease`` does this itself; call it to keep READY fresh
        without leasing."""
        check_int(limit, "limit", 1, MAX_BATCH)
        check_now(now_ms)
        p, r, d, more, next_due = yield from self._run(promote_call(self.keys, now_ms, limit))
        return Promoted(int(p), int(r), int(d), bool(more), int(next_due))

    promote = Verb(plan_promote)

    def plan_scrub(self, owner: str, *, limit: int = DEFAULT_MAINTENANCE_LIMIT, now_ms: int | None = None) -> Plan[Scrubbed]:
        """End every lease ``owner`` (a dead service) holds in this queue (lua/scrub.lua):
        jobs go to the head of READY with the attempt counted, or to DEAD at their
        maximum. At most ``limit`` per call; ``more`` says to call again. Safe to run
        concurrently and twice. Never scrub a live owner: its jobs would run twice."""
        check_int(limit, "limit", 1, MAX_BATCH)
        check_now(now_ms)
        scrubbed, dead, more = yield from self._run(scrub_call(self.keys, now_ms, owner, limit))
        return Scrubbed(int(scrubbed), int(dead), bool(more))

    scrub = Verb(plan_scrub)

    # -- inspection and dead letters -------------------------------------------------

    def plan_stats(self, *, now_ms: int | None = None) -> Plan[Stats]:
        """Counts per state, lag and counters, read atomically (lua/stats.lua)."""
        check_now(now_ms)
        return parse_stats((yield from self._run(stats_call(self.keys, now_ms))))

    stats = Verb(plan_stats)

    def plan_peek(self, *, now_ms: int | None = None) -> Plan[Peeked]:
        """Whether this queue has work for a lease call, and when it will next
        (lua/peek.lua). Read-only; see :func:`peek_many` for several queues at once."""
        check_now(now_ms)
        now, ready, next_due = yield from self._run(peek_call(self.keys, now_ms))
        return Peeked(int(now), int(ready), int(next_due))

    peek = Verb(plan_peek)

    def plan_get(self, job_id: str, *, with_payload: bool = False, now_ms: int | None = None) -> Plan[JobInfo]:
        """Where job ``job_id`` is, and what is known of it, read atomically
        (lua/get.lua): its state, attempts, due time, payload size (the payload itself
        only ``with_payload``), a dead job's last error, a leased job's deadline, owner
        and fence, an acked job's tombstone. O(1), but O(current leases) for a ready or
        leased job (the lease is found by its receipt); never O(queue length)."""
        check_job_id(job_id)
        check_now(now_ms)
        reply = yield from self._run(get_call(self.keys, now_ms, job_id, bool(with_payload)))
        now, state, attempts, max_attempts, due, size, payload, error, deadline, owner, fence, until = reply
        return JobInfo(
            id=job_id, queue=self.name, state=text(state), now_ms=int(now), attempts=int(attempts),
            max_attempts=int(max_attempts), due_ms=int(due), payload_bytes=int(size),
            payload=bytes(payload) if with_payload and text(state) not in ("done", "unknown") else None,
            error=bytes(error).decode("utf-8", "replace"), deadline_ms=int(deadline), owner=text(owner),
            fence=int(fence), done_until_ms=int(until),
        )

    get = Verb(plan_get)

    def plan_result(self, job_id: str, *, now_ms: int | None = None) -> Plan[JobResult]:
        """Job ``job_id``'s outcome now, without waiting (lua/result.lua): its kept
        result (``ok``), its last error (``dead``), ``pending``, ``done`` (ended with no
        result kept) or ``unknown``; see :class:`JobResult`."""
        info, _ = yield from self._read_result(check_job_id(job_id), now_ms)
        return info

    result = Verb(plan_result)

    def plan_wait_result(self, job_id: str, timeout_ms: int, *, now_ms: int | None = None) -> Plan[JobResult]:
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
        info, last_id = yield from self._read_result(job_id, now_ms)
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
                block = ("XREAD", "BLOCK", block_ms, "STREAMS", self.keys.finished, last_id)
                entries = stream_entries((yield Commands(self.keys.finished, [block]))[0])
                if entries and job_id not in (job for _, job in entries):
                    last_id = entries[-1][0]  # other jobs' outcomes: wait on until the next read
                    continue
            info, last_id = yield from self._read_result(job_id, now_ms)
            pause = min(pause * 2, WAIT_SLICE_MS / 1000)
            read_at = time.monotonic() + pause

    wait_result = Verb(plan_wait_result)

    def _read_result(self, job_id: str, now_ms: int | None) -> Plan[tuple[JobResult, str]]:
        """lua/result.lua: the outcome, and the newest entry of the finished stream."""
        check_now(now_ms)
        _now, state, finished_ms, value, last_id = yield from self._run(result_call(self.keys, now_ms, job_id))
        state = text(state)
        info = JobResult(
            id=job_id, queue=self.name, state=state, value=decode_result(bytes(value)) if state == "ok" else None,
            error=bytes(value).decode("utf-8", "replace") if state == "dead" else "", finished_ms=int(finished_ms),
        )
        return info, text(last_id)

    def plan_cancel(self, job_id: str, *, now_ms: int | None = None) -> Plan[Cancelled]:
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
        (state,) = yield from self._run(cancel_call(self.keys, now_ms, job_id, self.keep_done_ms))
        return Cancelled(id=job_id, queue=self.name, state=text(state))

    cancel = Verb(plan_cancel)

    def plan_limit(self, count: int, period_ms: int = 1000, *, burst: int = 1) -> Plan[bool]:
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
        *_, changed = yield from self._run(limit_call(self.keys, count, period_ms, burst))
        return bool(changed)

    limit = Verb(plan_limit)

    def plan_set_group_limit(self, cap: int | None, *, group: str | None = None) -> Plan[bool]:
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
        changed, _unparked = yield from self._run(set_group_limit_call(self.keys, name, arg))
        return bool(changed)

    set_group_limit = Verb(plan_set_group_limit)

    def plan_groups(self, offset: int = 0, limit: int = 100) -> Plan[GroupsPage]:
        """One page of the groups that have READY jobs (lua/groups.lua): those parked at
        their cap first, then in the order lease serves them; each with its READY jobs,
        its running leases and its cap. A group with leases running but nothing READY is
        not listed. Read only."""
        check_int(offset, "offset", 0, 2**31)
        check_int(limit, "limit", 1, MAX_BATCH)
        reply = yield from self._run(groups_call(self.keys, offset, limit))
        rows = reply[2:]
        groups = [
            GroupInfo(name=text(rows[i]), ready=int(rows[i + 2]), running=int(rows[i + 3]), cap=int(rows[i + 4]),
                      parked=int(rows[i + 1]) < 0, turn=int(rows[i + 1]), queue=self.name)
            for i in range(0, len(rows), 5)
        ]
        return GroupsPage(total=int(reply[0]), default_cap=int(reply[1]), groups=groups)

    groups = Verb(plan_groups)

    def plan_pause(self, *, now_ms: int | None = None) -> Plan[bool]:
        """Stop the queue from handing out jobs (lua/pause.lua); returns whether this
        call paused it (False: it was paused already). Enqueue, ack, nack, extend and
        the reclaim of expired leases go on; running jobs run to their end; workers
        wait on the wake marker, without polling, until :meth:`resume`."""
        check_now(now_ms)
        _paused_ms, changed = yield from self._run(pause_call(self.keys, now_ms))
        return bool(changed)

    pause = Verb(plan_pause)

    def plan_resume(self, *, now_ms: int | None = None) -> Plan[bool]:
        """Let a paused queue hand out jobs again and wake its workers
        (lua/resume.lua); returns whether this call resumed it (False: not paused)."""
        check_now(now_ms)
        _paused_ms, changed = yield from self._run(resume_call(self.keys, now_ms))
        return bool(changed)

    resume = Verb(plan_resume)

    def plan_dead_list(self, offset: int = 0, limit: int = 100) -> Plan[DeadPage]:
        """One page of DEAD jobs, oldest first (lua/dead_list.lua)."""
        check_int(offset, "offset", 0, 2**31)
        check_int(limit, "limit", 1, MAX_BATCH)
        reply = yield from self._run(dead_list_call(self.keys, offset, limit))
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

    dead_list = Verb(plan_dead_list)

    def plan_dead_replay(
        self, ids: Sequence[str] | None = None, *, limit: int = 100, now_ms: int | None = None
    ) -> Plan[int]:
        """Move dead jobs back to the tail of READY with attempts reset
        (lua/dead_replay.lua). Returns how many moved.

        Args:
            ids: the jobs to replay (ids not in DEAD are skipped). ``None``: the
                ``limit`` oldest dead jobs, listed first with ``dead_list`` (the script
                always takes explicit ids, so a re-sent call moves nothing twice).
        """
        check_now(now_ms)
        chosen = yield from self.plan_dead_ids(ids, limit)
        if not chosen:
            return 0
        replayed, _remaining = yield from self._run(dead_replay_call(self.keys, now_ms, chosen))
        return int(replayed)

    dead_replay = Verb(plan_dead_replay)

    def plan_dead_purge(self, ids: Sequence[str] | None = None, *, limit: int = 100) -> Plan[int]:
        """Delete dead jobs for good (lua/dead_purge.lua): the given ``ids`` (ids not in
        DEAD are skipped), or the ``limit`` oldest. Returns how many were deleted."""
        chosen = yield from self.plan_dead_ids(ids, limit)
        if not chosen:
            return 0
        purged, _remaining = yield from self._run(dead_purge_call(self.keys, chosen))
        return int(purged)

    dead_purge = Verb(plan_dead_purge)

    def plan_dead_ids(self, ids: Sequence[str] | None, limit: int) -> Plan[list[str]]:
        """``ids`` checked, or the ids of the ``limit`` oldest dead jobs."""
        if ids is None:
            return [job.id for job in (yield from self.plan_dead_list(0, limit)).jobs]
        return check_ids(ids)


class Queue(QueueCore, SyncDriver):
    """One named queue, driven with redis-py's blocking client (arguments: see
    :class:`QueueCore`). Each verb runs one script call (a partitioned queue's, one
    per partition involved).

    Threads: a ``Queue`` holds no mutable state beyond its redis-py client, whose
    connection pool is thread-safe, so one ``Queue`` may be shared by threads.
    """

    redis: Client
    scripts: Scripts

    @classmethod
    def partitioned_class(cls) -> type[QueueCore]:
        from pyqueue.partitioned import PartitionedQueue  # it builds on this class

        return PartitionedQueue

    @classmethod
    def single_class(cls) -> type[QueueCore]:
        return Queue

    transport_class = Scripts

    @staticmethod
    def driver_client(redis: Any) -> Client:
        client = bytes_client(redis if redis is not None else default_client())
        check_server(client)  # the eviction-policy warning: once per process and server
        return client

    def execute(self, step: Step) -> Any:
        return self.scripts.execute(step)

    @classmethod
    def from_url(
        cls,
        url: str,
        name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        retries: int = 3,
        keep_done_ms: int = DEFAULT_KEEP_DONE_MS,
        partitions: int = 1,
        wait_replicas: int = 0,
    ) -> Queue:
        """A queue on the server or cluster at ``url`` (``redis://``, ``rediss://``,
        ``unix://``, ``redis+cluster://``, or ``embedded``), with the client settings of
        :func:`pyqueue.clients.connect`. Logs a warning if the server may evict keys (see
        :func:`pyqueue.clients.check_server`)."""
        client = connect(url, retries=retries)
        check_server(client)
        return cls(
            name, client, prefix=prefix, keep_done_ms=keep_done_ms, partitions=partitions, wait_replicas=wait_replicas
        )


def physical_queue(name: str, redis: Client, **kwargs: Any) -> Queue:
    """A queue addressed by its own name, such as one partition ``<name>#<p>`` of a
    partitioned queue: it never records or checks a partition count (its logical queue
    does). For workers that scrub a dead service's queues by the names it registered."""
    q = Queue(name, redis, **kwargs)
    q._partitions_checked = True  # nothing to check: the caller names the physical queue
    return q


def plan_peek_many(queues: Sequence[QueueCore]) -> Plan[list[Peeked]]:
    """``peek`` every queue in one round trip per server (a pipeline of lua/peek.lua
    calls). A worker serving many queues finds the first with work this way instead of
    one lease call per empty queue.

    Raises:
        the mapped error of the first call that failed (read-only: nothing was written).
    """
    if not queues:
        return []
    replies = yield Pipelined("peek", [(q.keys, [""]) for q in queues])
    out = []
    for reply in replies:
        if isinstance(reply, Exception):
            raise map_redis_error(reply) from reply
        now, ready, next_due = reply
        out.append(Peeked(int(now), int(ready), int(next_due)))
    return out


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


def parse_stats(reply: Sequence[Any]) -> Stats:
    """lua/stats.lua's name/value pairs as :class:`Stats`."""
    return Stats(**{text(reply[i]): int(reply[i + 1]) for i in range(0, len(reply), 2)})


def sum_stats(each: Sequence[Stats]) -> Stats:
    """The figures of several partitions as one queue's: sums, but the largest
    ``lag_ms``, the latest ``now_ms`` and the latest ``paused_ms``."""
    summed = {f.name: sum(getattr(s, f.name) for s in each) for f in fields(Stats)}
    for latest in ("lag_ms", "now_ms", "paused_ms", "rate_limit", "rate_period_ms", "rate_burst"):
        summed[latest] = max(getattr(s, latest) for s in each)
    return Stats(**summed)


def plan_stats_many(queues: Sequence[QueueCore]) -> Plan[list[Stats]]:
    """``stats`` of every queue (a partitioned one summed over its partitions) in one
    round trip per server: a pipeline of lua/stats.lua calls, one per physical queue.
    For exporters that read many queues at once.

    Raises:
        the mapped error of the first call that failed (read-only: nothing was written).
    """
    parts = [getattr(q, "parts", [q]) for q in queues]
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


def stats_many(queues: Sequence[Queue]) -> list[Stats]:
    """:func:`plan_stats_many` on the queues' shared client."""
    return queues[0].drive(plan_stats_many(queues)) if queues else []


def peek_many(queues: Sequence[Queue]) -> list[Peeked]:
    """:func:`plan_peek_many` on the queues' shared client."""
    return queues[0].drive(plan_peek_many(queues)) if queues else []
