"""A worker's settings, checked once, and the queues it serves.

:class:`WorkerSettings` holds every number and name a :class:`~pyqueue.worker.Worker`
is configured with; it is frozen and validated when made, so no part of the worker
checks an option again or reads one from the worker. :class:`Served` is the queues a
worker leases from, opened once from their names. The worker hands each part the
settings and the queues, and the part reads what it uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from pyqueue.drivers.clients import Client
from pyqueue.drivers.facade import parts_of
from pyqueue.drivers.queue import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_PREFIX,
    Queue,
    check_int,
)
from pyqueue.ops.service import DEFAULT_EXPIRE_MS, DEFAULT_NAMESPACE
from pyqueue.protocol.core import DEFAULT_MAX_RESULTS
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.verbs.flows import DEFAULT_FLOW_CHECK_MS

__all__ = ["Served", "WorkerOptions", "WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs (the arguments of :class:`~pyqueue.worker.Worker`, which
    documents each). Made once; every value is checked here.

    Raises:
        InvalidArgument: a value out of its range, or ``renew_ms`` more than half of
            ``expire_ms``, or ``batch_wait_ms`` without ``batch``.
    """

    prefix: str = DEFAULT_PREFIX
    namespace: str = DEFAULT_NAMESPACE
    concurrency: int = 1
    prefetch: int | Literal["auto"] = "auto"
    lease_ms: int = DEFAULT_LEASE_MS
    block_ms: int = 10_000
    renew_ms: int = 15_000
    expire_ms: int = DEFAULT_EXPIRE_MS
    grace_ms: int = 30_000
    backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS
    backoff_cap_ms: int = DEFAULT_BACKOFF_CAP_MS
    keep_done_ms: int = DEFAULT_KEEP_DONE_MS
    #: Queue name -> partition count, for partitioned queues (None: none is).
    partitions: Mapping[str, int] | None = None
    wait_replicas: int = 0
    keep_results_ms: int | None = None
    max_results: int = DEFAULT_MAX_RESULTS
    batch: int | None = None
    batch_wait_ms: int | None = None
    flow_check_ms: int = DEFAULT_FLOW_CHECK_MS

    def __post_init__(self) -> None:
        check_int(self.concurrency, "concurrency", 1, 1000)
        if self.prefetch != "auto":
            if isinstance(self.prefetch, str):
                raise InvalidArgument(f"prefetch must be an integer 0..1000 or 'auto', got {self.prefetch!r}")
            check_int(self.prefetch, "prefetch", 0, 1000)
        check_int(self.lease_ms, "lease_ms", 100, 604_800_000)
        check_int(self.block_ms, "block_ms", 10, 600_000)
        check_int(self.renew_ms, "renew_ms", 100, 86_400_000)
        check_int(self.expire_ms, "expire_ms", 1_000, 86_400_000)
        if self.renew_ms * 2 > self.expire_ms:
            raise InvalidArgument("renew_ms must be at most half of expire_ms")
        check_int(self.grace_ms, "grace_ms", 0, 86_400_000)
        check_int(self.backoff_base_ms, "backoff_base_ms", 1, 2**40)
        check_int(self.backoff_cap_ms, "backoff_cap_ms", 1, 2**40)
        check_int(self.keep_done_ms, "keep_done_ms", 0, 2**40)
        check_int(self.wait_replicas, "wait_replicas", 0, 100)
        if self.keep_results_ms is not None:
            check_int(self.keep_results_ms, "keep_results_ms", 1, 2**40)
        check_int(self.max_results, "max_results", 1, 10_000_000)
        check_int(self.flow_check_ms, "flow_check_ms", 1, 86_400_000)
        # batch and batch_wait_ms are checked with the handler (BatchRunner.of): what is
        # allowed depends on whether the handler sets its own batches.

    @property
    def fixed_prefetch(self) -> int:
        """The jobs held leased ahead of the handler threads at all times (0 under "auto")."""
        return 0 if self.prefetch == "auto" else self.prefetch

    @property
    def auto_prefetch(self) -> int:
        """The jobs held leased ahead while the jobs are short, under "auto" (else 0):
        as many as there are handler threads (:class:`~pyqueue.worker.running.Pace`)."""
        return self.concurrency if self.prefetch == "auto" else 0


def parse_prefetch(value: str) -> int | Literal["auto"]:
    """A ``--prefetch`` option's text: ``auto``, or an integer 0..1000.

    Raises:
        InvalidArgument: anything else.
    """
    if value == "auto":
        return "auto"
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"prefetch must be an integer 0..1000 or 'auto', got {value!r}") from None
    check_int(number, "prefetch", 0, 1000)
    return number


class WorkerOptions(TypedDict, total=False):
    """The keyword arguments of :class:`~pyqueue.worker.Worker` that make its
    :class:`WorkerSettings` (a misspelt one is a type error)."""

    prefix: str
    namespace: str
    concurrency: int
    prefetch: int | Literal["auto"]
    lease_ms: int
    block_ms: int
    renew_ms: int
    expire_ms: int
    grace_ms: int
    backoff_base_ms: int
    backoff_cap_ms: int
    keep_done_ms: int
    partitions: Mapping[str, int] | None
    wait_replicas: int
    keep_results_ms: int | None
    max_results: int
    batch: int | None
    batch_wait_ms: int | None
    flow_check_ms: int


@dataclass(frozen=True)
class Served:
    """The queues a worker leases from, opened once.

    Attributes:
        names: the names it was given, highest priority first.
        logical: those queues (a partitioned one as one queue).
        groups: per logical queue, the queues a lease call goes to: its partitions, or itself.
        queues: every queue leased from, in priority order (partitions in partition order).
        by_name: each of ``queues`` by its (physical) name.
    """

    names: tuple[str, ...]
    logical: tuple[Queue, ...]
    groups: tuple[tuple[Queue, ...], ...]
    queues: tuple[Queue, ...]
    by_name: Mapping[str, Queue]

    @staticmethod
    def open(names: Sequence[str], redis: Client, settings: WorkerSettings) -> Served:
        """The queues named ``names`` on ``redis``, with the settings' prefix, partition
        counts, ``keep_done_ms`` and ``wait_replicas``.

        Raises:
            InvalidArgument: no name or a repeated one, a bad name, or a partition count
                for a queue not in ``names``.
        """
        if isinstance(names, str):
            raise InvalidArgument(f"a worker's queues are a list of names, got the string {names!r}: give [{names!r}]")
        if not names or len(set(names)) != len(names):
            raise InvalidArgument("a worker serves one or more distinct queues")
        partitions = settings.partitions or {}
        unknown = sorted(set(partitions) - set(names))
        if unknown:
            raise InvalidArgument(f"partitions given for queues this worker does not serve: {unknown}")
        logical = tuple(
            Queue(name, redis, prefix=settings.prefix, keep_done_ms=settings.keep_done_ms,
                  partitions=partitions.get(name, 1), wait_replicas=settings.wait_replicas)
            for name in names
        )
        groups = tuple(tuple(parts_of(q)) for q in logical)
        queues = tuple(q for group in groups for q in group)
        return Served(tuple(names), logical, groups, queues, {q.name: q for q in queues})

    @property
    def first_group(self) -> tuple[Queue, ...]:
        """The queues of the first (highest-priority) queue, where a handler thread
        that acks also leases its next job."""
        return self.groups[0]

    @property
    def partitioned_first(self) -> bool:
        """Whether the first queue is partitioned (a slot then leases in one partition
        at most :data:`~pyqueue.worker.executor.PARTITION_STREAK` times in a row)."""
        return len(self.groups[0]) > 1
