"""``QueueCore``: every verb of one queue, written once as a plan (see
:mod:`pyqueue.protocol.core`), made of the verb groups in :mod:`pyqueue.protocol.verbs` (produce,
consume, reading, control) plus the settings and the partition-count guard here;
``Queue``: those plans over redis-py's blocking client (``pyqueue.aio.AsyncQueue`` runs
the same plans over redis.asyncio). Each verb runs one
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
import secrets
from dataclasses import fields
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pyqueue.drivers.clients import Client, bytes_client, check_server, connect, default_client
from pyqueue.protocol.core import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_PREFIX,
    MAX_BATCH,
    MAX_CALL_PAYLOAD_BYTES,
    MAX_ERROR_BYTES,
    MAX_ID_BYTES,
    MAX_PARTITIONS,
    Commands,
    JobTuple,
    Pipelined,
    Plan,
    Step,
    SyncDriver,
    Verb,
    as_payload,
    check_int,
    check_job_id,
    check_owner,
    new_job,
    partition_name,
    partition_of,
)
from pyqueue.protocol.errors import InvalidArgument, OutOfMemory, map_redis_error
from pyqueue.protocol.keys import QueueKeys, check_name
from pyqueue.protocol.models import (
    Peeked,
    Stats,
)
from pyqueue.drivers.scripts import Scripts
from pyqueue.protocol.unconfirmed import UnconfirmedAcks
from pyqueue.protocol.verbs.consume import ConsumeVerbs
from pyqueue.protocol.verbs.control import ControlVerbs
from pyqueue.protocol.verbs.flows import FlowVerbs
from pyqueue.protocol.verbs.produce import ProduceVerbs
from pyqueue.protocol.verbs.events import EventVerbs
from pyqueue.protocol.verbs.progress import ProgressVerbs
from pyqueue.protocol.verbs.reading import ReadingVerbs, parse_stats

__all__ = [  # what other modules import from here (the core's names are re-exported)
    "DEFAULT_BACKOFF_BASE_MS", "DEFAULT_BACKOFF_CAP_MS", "DEFAULT_KEEP_DONE_MS", "DEFAULT_LEASE_MS",
    "DEFAULT_MAINTENANCE_LIMIT", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_PREFIX", "MAX_BATCH", "MAX_ERROR_BYTES",
    "MAX_ID_BYTES", "MAX_PARTITIONS", "JobTuple", "Queue", "QueueCore", "as_payload", "check_int",
    "check_job_id", "new_job", "partition_name", "partition_of", "peek_many", "physical_queue",
]

log = logging.getLogger("pyqueue")
#: Whether enqueues made at the same moment share a script call (``coalesce_enqueues``).
DEFAULT_COALESCE_ENQUEUES = True
Q = TypeVar("Q", bound="QueueCore")


class QueueCore(ProduceVerbs, ConsumeVerbs, ReadingVerbs, ControlVerbs, FlowVerbs, ProgressVerbs, EventVerbs):
    """The verbs of one named queue, as plans (no I/O; see :mod:`pyqueue.protocol.core`), and
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
            once (see :func:`pyqueue.drivers.clients.default_client`). A client with
            ``decode_responses=True`` works too (see :func:`pyqueue.drivers.clients.bytes_client`).
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
            (:class:`~pyqueue.drivers.partitioned.PartitionedQueue`,
            :class:`~pyqueue.aio.AsyncPartitionedQueue`), with the same verbs. Every
            producer and worker of a queue must use the same count: the count is
            recorded in Redis (``partitions`` in ``{<name>}``'s ``counters`` hash) at a
            queue object's first call, and a different count is refused
            (InvalidArgument) before anything else is sent.
        wait_replicas: opt-in durability (0..100, default 0: off). After every call
            that writes, ``WAIT wait_replicas wait_timeout_ms`` on the same connection:
            a call that returns had reached that many replicas; if fewer confirmed in
            time it raises :class:`~pyqueue.protocol.errors.NotReplicated` (an OutcomeUnknown:
            send the same call again). Replication stays asynchronous: this narrows the
            window in which a failover loses an acknowledged write, it does not close it
            (see :class:`~pyqueue.drivers.scripts.Scripts`). Works on one server with replicas
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
        from pyqueue.drivers.partitioned import PartitionedQueue  # it builds on this class

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
        :func:`pyqueue.drivers.clients.connect`. Logs a warning if the server may evict keys (see
        :func:`pyqueue.drivers.clients.check_server`)."""
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
