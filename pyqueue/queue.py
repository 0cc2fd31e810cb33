"""``Queue``: the driver's API for one queue. Each method runs exactly one script call.

Delivery semantics, in one place:

* **At least once.** A leased job runs until it is acked. If its worker dies, or its
  lease expires, or the worker is scrubbed, the job goes back to READY and runs again:
  a job may run more than once, never zero times while it is neither acked nor dead.
* **Exactly-once ack answer.** ``ack`` returns :attr:`Outcome.OK` at most once per job,
  ever, and only to the holder of the job's current lease. Code that must not repeat a
  side effect can act only after that answer, or pass ``job.fence`` downstream.
* **Fencing.** Every lease gets a new fence, larger than every earlier fence of the
  queue. A stale receipt (a lease that was reclaimed) changes nothing anywhere.
* **One clock.** Deadlines, delays and backoff are computed inside the scripts from the
  Redis server's ``TIME``. ``now_ms`` parameters exist for tests only.
* **Replay safety.** Every call can be sent twice with the same arguments (redis-py does
  so after a connection error) and has the effect of one call.

Threads: a ``Queue`` holds no mutable state beyond its redis-py client, whose
connection pool is thread-safe, so one ``Queue`` may be shared by threads.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
from binascii import crc_hqx
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis as redis_lib

from pyqueue.clients import Client, bytes_client, check_server, connect, embedded_redis, node_for_key
from pyqueue.errors import InvalidArgument, map_redis_error, mapped
from pyqueue.keys import QueueKeys, check_name
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
from pyqueue.scripts import Scripts

DEFAULT_PREFIX = "pq"
DEFAULT_LEASE_MS = 30_000
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_MS = 1_000
DEFAULT_BACKOFF_CAP_MS = 3_600_000
#: How long an acked job's id stays a duplicate for enqueue (its tombstone): long enough
#: for any retry of a lost enqueue reply, by redis-py or by the caller, to find it.
DEFAULT_KEEP_DONE_MS = 300_000
#: Most jobs promoted and most expired leases reclaimed by one call.
DEFAULT_MAINTENANCE_LIMIT = 100
#: Scripts accept at most this many jobs, receipts or ids per call.
MAX_BATCH = 1000
MAX_ID_BYTES = 256
#: Most partitions of one logical queue.
MAX_PARTITIONS = 1024
MAX_ERROR_BYTES = 65536

T = TypeVar("T")
log = logging.getLogger("pyqueue")

def check_int(value: object, name: str, lo: int, hi: int) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) in [lo, hi]; else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            raise InvalidArgument(f"{name} must be an integer, got {value!r}")
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def check_job_id(value: object) -> str:
    """Return ``value`` if it is a valid job id: 1..256 UTF-8 bytes, no control chars."""
    if not isinstance(value, str):
        raise InvalidArgument(f"job id must be a str, got {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_ID_BYTES or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(f"job id must be 1..{MAX_ID_BYTES} bytes without control characters, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"job id must be valid UTF-8, got {value!r}") from exc
    return value


def as_payload(value: object) -> bytes:
    """Payload bytes: ``bytes`` as they are, ``str`` encoded as UTF-8. Never pickle."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise InvalidArgument(f"payload must be bytes or str (use enqueue_json for objects), got {type(value).__name__}")


#: What enqueue.lua takes per job: (id, payload, delay_ms, max_attempts).
JobTuple = tuple[str, bytes, int, int]


def new_job(item: NewJob | bytes | str) -> JobTuple:
    """Validate one job to enqueue (a random id when none is given). Raises
    InvalidArgument before anything is sent."""
    new = item if isinstance(item, NewJob) else NewJob(item)
    return (
        check_job_id(new.job_id) if new.job_id is not None else os.urandom(16).hex(),
        as_payload(new.payload),
        check_int(new.delay_ms, "delay_ms", 0, 2**40),
        check_int(DEFAULT_MAX_ATTEMPTS if new.max_attempts is None else new.max_attempts, "max_attempts", 1, 10_000),
    )


def partition_of(job_id: str, partitions: int) -> int:
    """The partition of a job of a queue with ``partitions`` partitions: CRC16 (XMODEM,
    the checksum Redis Cluster hashes keys with, which every cluster client has) of the
    id's UTF-8 bytes, modulo ``partitions``. lua/README.md documents it for other
    languages; they must compute the same."""
    return crc_hqx(job_id.encode("utf-8"), 0) % partitions  # crc_hqx(data, 0) is CRC16-XMODEM


def partition_name(name: str, partition: int, partitions: int) -> str:
    """The name of one partition, a queue of its own: ``<name>#<p>``, or ``name`` itself
    when there is one partition."""
    return name if partitions == 1 else f"{name}#{partition}"


def _receipts(jobs: Iterable[Job]) -> list[str]:
    out = []
    for job in jobs:
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a Job from lease, got {type(job).__name__}")
        out.append(job.receipt)
    if not 1 <= len(out) <= MAX_BATCH:
        raise InvalidArgument(f"1..{MAX_BATCH} jobs per call, got {len(out)}")
    return out


def _str(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class Queue:
    """One named queue on one Redis server.

    Args:
        name: the queue name (1..128 printable ASCII characters, no spaces or braces).
        redis: a redis-py client of one server or a Redis Cluster (``RedisCluster``);
            ``None`` uses the process-wide embedded fakeredis. A client with
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
            of a Redis Cluster: ``Queue(name, partitions=K)`` with K > 1 returns a
            :class:`~pyqueue.partitioned.PartitionedQueue`, with the same verbs. Every
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
        lua_directory: tests only: load the scripts from another directory (the
            mutation tests load deliberately broken copies).
    """

    #: Partitions of this logical queue (see ``partitions``).
    partitions = 1

    def __new__(cls, name: str, redis: Client | None = None, *, partitions: int = 1, **kwargs: Any) -> Queue:
        if cls is Queue and check_int(partitions, "partitions", 1, MAX_PARTITIONS) > 1:
            from pyqueue.partitioned import PartitionedQueue  # it builds on this class

            made: Queue = super().__new__(PartitionedQueue)
            return made
        return super().__new__(cls)

    def __init__(
        self,
        name: str,
        redis: Client | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        owner: str | None = None,
        keep_done_ms: int = DEFAULT_KEEP_DONE_MS,
        partitions: int = 1,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        lua_directory: Path | None = None,
    ) -> None:
        self.name = check_name(name, "queue name")
        # Whose partition count guards this queue's calls: its own, or for a partition
        # its logical queue's; and whether it has been checked and recorded.
        self._partition_guard: Queue = self
        self._partitions_checked = False
        self.keys = QueueKeys(check_name(prefix, "prefix"), name)
        self.redis = bytes_client(redis if redis is not None else embedded_redis())
        self.owner = owner if owner is not None else "c" + secrets.token_hex(6)
        if not (1 <= len(self.owner) <= 64) or not all(c.isalnum() and c.isascii() or c in "_.:-" for c in self.owner):
            raise InvalidArgument(f"owner must be 1..64 characters of [A-Za-z0-9_.:-], got {self.owner!r}")
        self.keep_done_ms = check_int(keep_done_ms, "keep_done_ms", 0, 2**40)
        self.wait_replicas = check_int(wait_replicas, "wait_replicas", 0, 100)
        self.wait_timeout_ms = check_int(wait_timeout_ms, "wait_timeout_ms", 1, 86_400_000)  # 0 would wait forever
        self.scripts = Scripts(
            self.redis, lua_directory, wait_replicas=self.wait_replicas, wait_timeout_ms=self.wait_timeout_ms
        )

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

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, prefix={self.keys.prefix!r})"

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        guard = self._partition_guard
        if guard._partitions_checked:
            return mapped(fn, *args)
        # A queue object's first call: refuse another partition count before sending
        # anything, and record ours only once a call has succeeded, so that a call that
        # fails (bad input) writes nothing at all.
        guard.check_partitions(record=False)
        result = mapped(fn, *args)
        guard.check_partitions(record=True)
        return result

    def check_partitions(self, *, record: bool = True) -> None:
        """Refuse to go on if Redis records another partition count for this queue
        (``partitions`` in ``{<name>}``'s ``counters`` hash), and with ``record`` write
        ours if none is recorded yet (HSETNX, then HGET: one round trip). A queue object
        does this around its first call; a worker at start.

        Raises:
            InvalidArgument: producers or workers of this queue use another count.
        """
        counters = QueueKeys(self.keys.prefix, self.name).counters
        pipe = node_for_key(self.redis, counters).pipeline(transaction=False)
        if record:
            pipe.hsetnx(counters, "partitions", self.partitions)
        pipe.hget(counters, "partitions")
        try:
            recorded = pipe.execute()[-1]
        except redis_lib.RedisError as exc:
            raise map_redis_error(exc) from exc
        if recorded is not None and int(recorded) != self.partitions:
            raise InvalidArgument(
                f"queue {self.name!r} has {int(recorded)} partition(s) recorded in Redis, but this queue object "
                f"was made with partitions={self.partitions}: every producer and worker of a queue must use the "
                "same count (changing it needs the queue drained and its counters key deleted)"
            )
        self._partitions_checked = recorded is not None

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
            now_ms: tests only: override the server clock.

        Returns:
            The job id and whether it was added. A call re-sent after a lost reply
            reports ``added=False`` for the job it added the first time, and adds
            nothing even if that job has run and been acked since (within
            ``keep_done_ms``).

        Raises:
            InvalidArgument, WrongTypeError, OutcomeUnknown.
        """
        job = new_job(NewJob(payload, job_id, delay_ms, max_attempts))
        _check_now(now_ms)
        reply = self._call(self.scripts.enqueue, self.keys, now_ms, [job])
        return Enqueued(job[0], reply[2] == 1)

    def enqueue_json(self, obj: Any, **kwargs: Any) -> Enqueued:
        """``enqueue`` the JSON encoding of ``obj`` (compact, UTF-8); read it with ``Job.json()``."""
        from json import dumps

        return self.enqueue(dumps(obj, separators=(",", ":"), ensure_ascii=False), **kwargs)

    def enqueue_many(self, jobs: Iterable[NewJob | bytes | str], *, now_ms: int | None = None) -> list[Enqueued]:
        """Add up to 1000 jobs in one atomic call (lua/enqueue.lua).

        Duplicates (of existing jobs, or repeated ids within ``jobs``) are skipped and
        reported with ``added=False``; everything else is added.

        Raises:
            InvalidArgument (nothing sent), WrongTypeError, OutcomeUnknown.
        """
        batch = [new_job(item) for item in jobs]
        if not 1 <= len(batch) <= MAX_BATCH:
            raise InvalidArgument(f"1..{MAX_BATCH} jobs per call, got {len(batch)}")
        _check_now(now_ms)
        reply = self._call(self.scripts.enqueue, self.keys, now_ms, batch)
        return [Enqueued(job[0], flag == 1) for job, flag in zip(batch, reply[2:])]

    # -- lease / ack -----------------------------------------------------------------

    def lease(self, lease_ms: int = DEFAULT_LEASE_MS, count: int = 1, *, now_ms: int | None = None) -> list[Job]:
        """Lease up to ``count`` ready jobs (lua/lease.lua). Returns [] if none is ready.

        Before leasing, the same call promotes due scheduled jobs and reclaims expired
        leases (bounded). Each job gets a new fence and the deadline now + ``lease_ms``
        (server clock); ``extend`` pushes it back. A lease past its deadline stays
        valid until it is reclaimed; then the job runs again (at least once).
        """
        return self.lease_call(count=count, lease_ms=lease_ms, now_ms=now_ms).jobs

    def ack(self, job: Job, *, now_ms: int | None = None) -> Outcome:
        """Complete a leased job (lua/ack.lua).

        Returns :attr:`Outcome.OK` if this lease was current: the job is deleted, and no
        call will ever get OK for it again; its id stays a duplicate for enqueue for
        ``keep_done_ms``. :attr:`Outcome.STALE` if the job was
        reclaimed from this lease (it will run, or ran, again elsewhere);
        :attr:`Outcome.GONE` if it no longer exists. Only OK changes anything.
        """
        return self.ack_many([job], now_ms=now_ms)[0]

    def ack_many(self, jobs: Iterable[Job], *, now_ms: int | None = None) -> list[Outcome]:
        """``ack`` up to 1000 jobs in one atomic call (lua/ack.lua); one outcome each.
        ``now_ms``: tests only (it dates the tombstones)."""
        receipts = _receipts(jobs)
        _check_now(now_ms)
        reply = self._call(self.scripts.ack, self.keys, now_ms, self.keep_done_ms, receipts)
        return [Outcome(_str(s)) for s in reply]

    def ack_and_lease(
        self,
        job: Job,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        count: int = 1,
        call: str | None = None,
        now_ms: int | None = None,
    ) -> tuple[Outcome, list[Job]]:
        """Ack ``job`` and lease up to ``count`` more in one round trip (lua/lease.lua).

        The ack has exactly the semantics of ``ack``; the lease those of ``lease``.
        ``call``: see :meth:`lease_call`.
        """
        leased = self.lease_call(ack=[job], count=count, lease_ms=lease_ms, call=call, now_ms=now_ms)
        return leased.acks[0], leased.jobs

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
        """The whole lease call (lua/lease.lua): ack ``ack``, maintain, lease ``count``.

        Returns the jobs, the ack outcomes and when to look again (``next_due_ms``).
        The call token makes the call replay-safe: if the same call (same token) is sent
        again after a lost reply, by redis-py or by the caller, the script returns the
        jobs the first run leased. Default: a fresh random token; pass your own to
        retry a call yourself.
        """
        check_int(count, "count", 0, MAX_BATCH)
        check_int(lease_ms, "lease_ms", 1, 604_800_000)
        check_int(limit, "limit", 1, MAX_BATCH)
        _check_now(now_ms)
        receipts = _receipts(ack) if ack else []
        call = secrets.token_hex(8) if call is None else call
        reply = self._call(
            self.scripts.lease, self.keys, now_ms, self.owner, call, count, lease_ms, limit, self.keep_done_ms, receipts
        )
        return self.parse_lease(reply)

    def parse_lease(self, reply: list[Any]) -> Leased:
        """Turn lua/lease.lua's flat reply into a :class:`Leased`."""
        now, next_due, n_acks = int(reply[0]), int(reply[1]), int(reply[2])
        acks = [Outcome(_str(s)) for s in reply[3 : 3 + n_acks]]
        at = 3 + n_acks
        count = int(reply[at])
        jobs = []
        for i in range(count):
            receipt, job_id, payload, fence, attempt, max_attempts, deadline = reply[at + 1 + 7 * i : at + 8 + 7 * i]
            jobs.append(
                Job(
                    id=_str(job_id),
                    queue=self.name,
                    payload=bytes(payload),
                    fence=int(fence),
                    attempt=int(attempt),
                    max_attempts=int(max_attempts),
                    deadline_ms=int(deadline),
                    receipt=_str(receipt),
                )
            )
        return Leased(jobs=jobs, acks=acks, now_ms=now, next_due_ms=next_due)

    # -- failure paths ---------------------------------------------------------------

    def nack(
        self,
        job: Job,
        error: str = "",
        *,
        delay_ms: int | None = None,
        backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS,
        backoff_cap_ms: int = DEFAULT_BACKOFF_CAP_MS,
        now_ms: int | None = None,
    ) -> Nacked:
        """Fail this lease of ``job`` (lua/nack.lua); the attempt counts.

        If attempts reached max_attempts the job goes to DEAD with ``error``; otherwise
        it is scheduled again after ``delay_ms``, or after exponential backoff
        ``min(cap, base * 2^(attempt-1))`` with jitter (half of it random) when
        ``delay_ms`` is None. A stale receipt changes nothing.
        """
        (receipt,) = _receipts([job])
        if not isinstance(error, str) or len(error.encode("utf-8", "replace")) > MAX_ERROR_BYTES:
            raise InvalidArgument(f"error must be a str of at most {MAX_ERROR_BYTES} bytes")
        if delay_ms is not None:
            check_int(delay_ms, "delay_ms", 0, 2**40)
        check_int(backoff_base_ms, "backoff_base_ms", 1, 2**40)
        check_int(backoff_cap_ms, "backoff_cap_ms", 1, 2**40)
        _check_now(now_ms)
        status, state, at_ms = self._call(
            self.scripts.nack,
            self.keys,
            now_ms,
            receipt,
            error.encode("utf-8", "replace"),
            delay_ms,
            backoff_base_ms,
            backoff_cap_ms,
        )
        outcome = Outcome(_str(status))
        return Nacked(outcome, _str(state) if outcome else None, int(at_ms))

    def extend(self, jobs: Iterable[Job], lease_ms: int = DEFAULT_LEASE_MS, *, now_ms: int | None = None) -> list[Extended]:
        """Move the deadlines of current leases to now + ``lease_ms`` (lua/extend.lua).

        Never moves a deadline earlier. Stale receipts change nothing.
        """
        receipts = _receipts(jobs)
        check_int(lease_ms, "lease_ms", 1, 604_800_000)
        _check_now(now_ms)
        reply = self._call(self.scripts.extend, self.keys, now_ms, lease_ms, receipts)
        return [Extended(Outcome(_str(reply[i])), int(reply[i + 1])) for i in range(0, len(reply), 2)]

    def release(self, jobs: Iterable[Job]) -> list[Outcome]:
        """Give leases back to the head of READY without counting the attempt
        (lua/release.lua), e.g. at shutdown. Stale receipts change nothing."""
        reply = self._call(self.scripts.release, self.keys, _receipts(jobs))
        return [Outcome(_str(s)) for s in reply]

    def promote(self, limit: int = DEFAULT_MAINTENANCE_LIMIT, *, now_ms: int | None = None) -> Promoted:
        """Promote due scheduled jobs and reclaim expired leases, at most ``limit`` of
        each (lua/promote.lua). ``lease`` does this itself; call it to keep READY fresh
        without leasing."""
        check_int(limit, "limit", 1, MAX_BATCH)
        _check_now(now_ms)
        p, r, d, more, next_due = self._call(self.scripts.promote, self.keys, now_ms, limit)
        return Promoted(int(p), int(r), int(d), bool(more), int(next_due))

    def scrub(self, owner: str, *, limit: int = DEFAULT_MAINTENANCE_LIMIT, now_ms: int | None = None) -> Scrubbed:
        """End every lease ``owner`` (a dead service) holds in this queue (lua/scrub.lua):
        jobs go to the head of READY with the attempt counted, or to DEAD at their
        maximum. At most ``limit`` per call; ``more`` says to call again. Safe to run
        concurrently and twice. Never scrub a live owner: its jobs would run twice."""
        check_int(limit, "limit", 1, MAX_BATCH)
        _check_now(now_ms)
        scrubbed, dead, more = self._call(self.scripts.scrub, self.keys, now_ms, owner, limit)
        return Scrubbed(int(scrubbed), int(dead), bool(more))

    # -- inspection and dead letters -------------------------------------------------

    def stats(self, *, now_ms: int | None = None) -> Stats:
        """Counts per state, lag and counters, read atomically (lua/stats.lua)."""
        _check_now(now_ms)
        reply = self._call(self.scripts.stats, self.keys, now_ms)
        values = {_str(reply[i]): int(reply[i + 1]) for i in range(0, len(reply), 2)}
        return Stats(**values)

    def peek(self, *, now_ms: int | None = None) -> Peeked:
        """Whether this queue has work for a lease call, and when it will next
        (lua/peek.lua). Read-only; see :func:`peek_many` for several queues at once."""
        _check_now(now_ms)
        now, ready, next_due = self._call(self.scripts.peek, self.keys, now_ms)
        return Peeked(int(now), int(ready), int(next_due))

    def dead_list(self, offset: int = 0, limit: int = 100) -> DeadPage:
        """One page of DEAD jobs, oldest first (lua/dead_list.lua)."""
        check_int(offset, "offset", 0, 2**31)
        check_int(limit, "limit", 1, MAX_BATCH)
        reply = self._call(self.scripts.dead_list, self.keys, offset, limit)
        jobs = [
            DeadJob(
                id=_str(reply[i]),
                dead_ms=int(reply[i + 1]),
                attempts=int(reply[i + 2]),
                max_attempts=int(reply[i + 3]),
                error=bytes(reply[i + 4]).decode("utf-8", "replace"),
                payload=bytes(reply[i + 5]),
            )
            for i in range(1, len(reply), 6)
        ]
        return DeadPage(total=int(reply[0]), jobs=jobs)

    def dead_replay(self, ids: Sequence[str] | None = None, *, limit: int = 100, now_ms: int | None = None) -> int:
        """Move dead jobs back to the tail of READY with attempts reset
        (lua/dead_replay.lua). Returns how many moved.

        Args:
            ids: the jobs to replay (ids not in DEAD are skipped). ``None``: the
                ``limit`` oldest dead jobs, listed first with ``dead_list`` (the script
                always takes explicit ids, so a re-sent call moves nothing twice).
        """
        ids = self._dead_ids(ids, limit)
        _check_now(now_ms)
        if not ids:
            return 0
        replayed, _remaining = self._call(self.scripts.dead_replay, self.keys, now_ms, ids)
        return int(replayed)

    def dead_purge(self, ids: Sequence[str] | None = None, *, limit: int = 100) -> int:
        """Delete dead jobs for good (lua/dead_purge.lua): the given ``ids`` (ids not in
        DEAD are skipped), or the ``limit`` oldest. Returns how many were deleted."""
        ids = self._dead_ids(ids, limit)
        if not ids:
            return 0
        purged, _remaining = self._call(self.scripts.dead_purge, self.keys, ids)
        return int(purged)

    def _dead_ids(self, ids: Sequence[str] | None, limit: int) -> list[str]:
        if ids is None:
            return [job.id for job in self.dead_list(0, limit).jobs]
        checked = [check_job_id(i) for i in ids]
        if len(checked) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} ids per call, got {len(checked)}")
        return checked


def physical_queue(name: str, redis: Client, **kwargs: Any) -> Queue:
    """A queue addressed by its own name, such as one partition ``<name>#<p>`` of a
    partitioned queue: it never records or checks a partition count (its logical queue
    does). For workers that scrub a dead service's queues by the names it registered."""
    q = Queue(name, redis, **kwargs)
    q._partitions_checked = True  # nothing to check: the caller names the physical queue
    return q


def peek_many(queues: Sequence[Queue]) -> list[Peeked]:
    """``peek`` every queue in one round trip (a pipeline of lua/peek.lua calls); the
    queues must share one client. A worker serving many queues finds the first with work
    this way instead of one lease call per empty queue.

    Raises:
        the mapped error of the first call that failed (read-only: nothing was written).
    """
    if not queues:
        return []
    scripts = queues[0].scripts
    try:
        replies = scripts.run_pipelined("peek", [(q.keys, [""]) for q in queues])
    except redis_lib.RedisError as exc:
        raise map_redis_error(exc) from exc
    out = []
    for reply in replies:
        if isinstance(reply, redis_lib.RedisError):
            raise map_redis_error(reply) from reply
        now, ready, next_due = reply
        out.append(Peeked(int(now), int(ready), int(next_due)))
    return out


def _check_now(now_ms: int | None) -> None:
    if now_ms is not None:
        check_int(now_ms, "now_ms", 0, 2**53)
