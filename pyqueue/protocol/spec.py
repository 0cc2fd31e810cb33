"""What a queue's plans take: a frozen :class:`QueueSpec` (which queue, whose leases, its
settings), and a small mutable :class:`QueueMemory` (what a queue object remembers
between calls). Both are I/O-free; :mod:`pyqueue.protocol.verbs` holds the plans.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace

from pyqueue.protocol.core import (
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_PREFIX,
    MAX_CALL_PAYLOAD_BYTES,
    MAX_PARTITIONS,
    check_int,
    check_owner,
    partition_name,
)
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.keys import QueueKeys, check_name
from pyqueue.protocol.unconfirmed import UnconfirmedAcks

#: Whether enqueues made at the same moment share a script call (``coalesce_enqueues``).
DEFAULT_COALESCE_ENQUEUES = True


def random_owner() -> str:
    """The lease owner of a queue object made without one: random, for this object."""
    return "c" + secrets.token_hex(6)


@dataclass(frozen=True)
class QueueSpec:
    """One queue, validated once (InvalidArgument for a bad value): its name and keys,
    who holds the leases its calls take, and its settings (the arguments of
    :class:`pyqueue.Queue`, which documents each). A partition of a partitioned queue
    has a spec of its own (:meth:`partition`): its name is ``<name>#<p>``, and
    ``partitions`` is still its logical queue's count (a job id drawn for a group is
    drawn in the group's partition)."""

    name: str
    prefix: str = DEFAULT_PREFIX
    owner: str = field(default_factory=random_owner)
    keep_done_ms: int = DEFAULT_KEEP_DONE_MS
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    partitions: int = 1
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    coalesce_enqueues: bool = DEFAULT_COALESCE_ENQUEUES
    #: The queue's keys, ``<prefix>:{<name>}:<role>`` (derived).
    keys: QueueKeys = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.partitions, "partitions", 1, MAX_PARTITIONS)
        check_name(self.name, "queue name")
        object.__setattr__(self, "keys", QueueKeys(check_name(self.prefix, "prefix"), self.name))
        check_owner(self.owner)
        check_int(self.keep_done_ms, "keep_done_ms", 0, 2**40)
        check_int(self.wait_replicas, "wait_replicas", 0, 100)
        check_int(self.wait_timeout_ms, "wait_timeout_ms", 1, 86_400_000)  # 0 would wait forever
        if not isinstance(self.coalesce_enqueues, bool):
            raise InvalidArgument(f"coalesce_enqueues must be a bool, got {self.coalesce_enqueues!r}")
        check_int(self.max_payload_bytes, "max_payload_bytes", 1, MAX_CALL_PAYLOAD_BYTES)

    def partition(self, p: int) -> QueueSpec:
        """The spec of partition ``p`` of this (logical) queue: ``<name>#<p>``."""
        return replace(self, name=partition_name(self.name, p, self.partitions))

    def partition_specs(self) -> list[QueueSpec]:
        """The specs of this queue's physical queues: its partitions, or itself."""
        return [self.partition(p) for p in range(self.partitions)] if self.partitions > 1 else [self]


class QueueMemory:
    """What one queue object remembers between calls; shared by a partitioned queue's
    partitions. Thread-safe where it must be (see each part).

    * The partition-count guard: whether this object has found its logical queue's
      partition count recorded in Redis as its own (``partitions`` in ``{<name>}``'s
      ``counters`` hash; see :func:`pyqueue.protocol.verbs.base.run`). A flag set once,
      by any thread: a race only repeats the read.
    * The acks that ran but that too few replicas confirmed
      (:class:`~pyqueue.protocol.unconfirmed.UnconfirmedAcks`).
    """

    def __init__(self, logical: QueueSpec, *, checked: bool = False) -> None:
        #: The logical queue whose count guards every call (its name and count).
        self.name, self.partitions = logical.name, logical.partitions
        #: The ``counters`` key the count is recorded in: the logical queue's.
        self.counters = logical.keys.counters
        self.partitions_checked = checked
        self.unconfirmed = UnconfirmedAcks()

    @classmethod
    def physical(cls, spec: QueueSpec) -> QueueMemory:
        """The state of a queue addressed by its own name (a partition ``<name>#<p>``
        named by a job, or by a dead service's registration): it never records or
        checks a partition count (its logical queue does)."""
        return cls(spec, checked=True)
