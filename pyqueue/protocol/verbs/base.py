"""The call every plan of a queue makes through (:func:`run`: the partition-count guard
around a queue object's first call), and the guard's own plan (:func:`check_partitions`)."""

from __future__ import annotations

from typing import Any

from pyqueue.protocol.core import Commands, Plan, Step
from pyqueue.protocol.errors import InvalidArgument, OutOfMemory
from pyqueue.protocol.spec import QueueMemory


def run(memory: QueueMemory, step: Step) -> Plan[Any]:
    """One call of a queue: the guard around a queue object's first call refuses
    another partition count before sending anything, and records ours only once a call
    has succeeded, so that a call that fails (bad input) writes nothing."""
    if memory.partitions_checked:
        return (yield step)
    yield from check_partitions(memory, record=False)
    reply = yield step
    if not memory.partitions_checked:  # the check found none recorded: record ours
        yield from record_partitions(memory)
    return reply


def check_partitions(memory: QueueMemory, *, record: bool = True) -> Plan[None]:
    """Refuse to go on if Redis records another partition count for this queue
    (``partitions`` in ``{<name>}``'s ``counters`` hash), and with ``record`` write
    ours if none is recorded yet. A queue object does this around its first call; a
    worker at start.

    The check reads (HGET); the record is a second round trip, sent only while
    nothing is recorded (see :func:`record_partitions`).

    Raises:
        InvalidArgument: producers or workers of this queue use another count.
    """
    agree_on_partitions(memory, (yield Commands(memory.counters, [("HGET", memory.counters, "partitions")]))[0])
    if record and not memory.partitions_checked:
        yield from record_partitions(memory)


def record_partitions(memory: QueueMemory) -> Plan[None]:
    """Record this object's partition count unless one is (HSETNX, then HGET), and
    check the one recorded. A server at its memory limit refuses that write: the
    count then stays unrecorded, nothing is raised (the call it follows has run, and
    a lease must not be orphaned by an error after it), and a later call tries again."""
    counters = memory.counters
    commands = [("HSETNX", counters, "partitions", memory.partitions), ("HGET", counters, "partitions")]
    try:
        recorded = (yield Commands(counters, commands))[-1]
    except OutOfMemory:
        return
    agree_on_partitions(memory, recorded)


def agree_on_partitions(memory: QueueMemory, recorded: bytes | None) -> None:
    """Refuse another recorded count (InvalidArgument); checked once one is recorded."""
    if recorded is not None and int(recorded) != memory.partitions:
        raise InvalidArgument(
            f"queue {memory.name!r} has {int(recorded)} partition(s) recorded in Redis, but this queue object "
            f"was made with partitions={memory.partitions}: every producer and worker of a queue must use the "
            "same count (changing it needs the queue drained and its counters key deleted)"
        )
    memory.partitions_checked = recorded is not None
