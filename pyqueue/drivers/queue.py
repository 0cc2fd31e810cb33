"""``Queue``: every verb of one queue, written once as a plan function
(:mod:`pyqueue.protocol.verbs`, over a :class:`~pyqueue.protocol.spec.QueueSpec`),
driven over redis-py's blocking client (``pyqueue.aio.AsyncQueue`` drives the same plans
over redis.asyncio; :mod:`pyqueue.drivers.facade` declares the verbs of both). Each verb
runs one script call (``dead_replay``/``dead_purge`` without ids list first; a partitioned
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

Threads: see :class:`Queue`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pyqueue.drivers.clients import Client, bytes_client, check_server, connect, default_client
from pyqueue.drivers.facade import QueueFacade, physical, plans_of
from pyqueue.drivers.scripts import Scripts
from pyqueue.protocol.core import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_MAINTENANCE_LIMIT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PREFIX,
    MAX_BATCH,
    MAX_ERROR_BYTES,
    MAX_ID_BYTES,
    MAX_PARTITIONS,
    JobTuple,
    Plan,
    Step,
    SyncDriver,
    as_payload,
    check_int,
    check_job_id,
    drive as drive_plan,
    new_job,
    partition_name,
    partition_of,
)
from pyqueue.protocol.models import Peeked, Stats
from pyqueue.protocol.verbs.reading import peek_many as plan_peek_many
from pyqueue.protocol.verbs.reading import stats_many as plan_stats_many

__all__ = [  # what other modules import from here (the core's names are re-exported)
    "DEFAULT_BACKOFF_BASE_MS", "DEFAULT_BACKOFF_CAP_MS", "DEFAULT_KEEP_DONE_MS", "DEFAULT_LEASE_MS",
    "DEFAULT_MAINTENANCE_LIMIT", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_PREFIX", "MAX_BATCH", "MAX_ERROR_BYTES",
    "MAX_ID_BYTES", "MAX_PARTITIONS", "JobTuple", "Queue", "as_payload", "check_int", "check_job_id", "drive",
    "new_job", "partition_name", "partition_of", "peek_many", "physical_queue", "plans_of", "stats_many",
    "transport_of",
]

T = TypeVar("T")


class Queue(QueueFacade, SyncDriver):
    """One named queue, driven with redis-py's blocking client: its public names are
    its verbs, ``name``, ``spec`` (the settings below, validated) and ``from_url``.
    Each verb runs one script call (a partitioned queue's, one per partition involved).

    Threads: a ``Queue`` holds no mutable state beyond its redis-py client (whose
    connection pool is thread-safe), its memory of unconfirmed acks and of the
    partition-count check (:class:`~pyqueue.protocol.spec.QueueMemory`), and the
    enqueues it coalesces (under a lock), so one ``Queue`` may be shared by threads.

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
            of a Redis Cluster: with K > 1 the queue drives the plans of a
            :class:`~pyqueue.drivers.partitioned.PartitionedQueue`, with the same verbs. Every
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

    _scripts: Scripts

    def _open(self, redis: Any, lua_directory: Path | None) -> None:
        client = bytes_client(redis if redis is not None else default_client())
        check_server(client)  # the eviction-policy warning: once per process and server
        spec = self.spec
        self._scripts = Scripts(
            client, lua_directory, wait_replicas=spec.wait_replicas, wait_timeout_ms=spec.wait_timeout_ms,
            coalesce=spec.coalesce_enqueues,
        )

    def _execute(self, step: Step) -> Any:
        return self._scripts.execute(step)

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


def transport_of(queue: Queue) -> Scripts:
    """The transport ``queue`` runs its plans on: its scripts on its client
    (``.client``), for the floors above that send steps of their own."""
    return queue._scripts


def drive(queue: Queue, plan: Plan[T]) -> T:
    """Run ``plan`` (a plan of ``queue``'s own, :func:`plans_of`, or one over its spec)
    to its end on ``queue``'s transport, as a verb of ``queue`` runs its plan."""
    return drive_plan(queue._execute, plan)


def check_partitions(queue: Queue) -> None:
    """Refuse to go on if Redis records another partition count for ``queue``, and
    record its own if none is (:func:`pyqueue.protocol.verbs.base.check_partitions`):
    what a worker does at start.

    Raises:
        InvalidArgument: producers or workers of this queue use another count.
    """
    drive(queue, plans_of(queue).check_partitions())


def physical_queue(name: str, redis: Client, **kwargs: Any) -> Queue:
    """A queue addressed by its own name, such as one partition ``<name>#<p>`` of a
    partitioned queue: it never records or checks a partition count (its logical queue
    does). For workers that scrub a dead service's queues by the names it registered."""
    return physical(Queue(name, redis, **kwargs))


def stats_many(queues: Sequence[Queue]) -> list[Stats]:
    """:func:`pyqueue.protocol.verbs.reading.stats_many` on the queues' shared client."""
    return drive(queues[0], plan_stats_many([q.spec for q in queues])) if queues else []


def peek_many(queues: Sequence[Queue]) -> list[Peeked]:
    """:func:`pyqueue.protocol.verbs.reading.peek_many` on the queues' shared client."""
    return drive(queues[0], plan_peek_many([q.spec for q in queues])) if queues else []
