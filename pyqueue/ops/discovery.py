"""Finding queues in Redis for tools that are not told their names: the CLI's
``stats`` and ``dead list``, and the metrics exporter.

A queue is found by its ``counters`` hash (every queue that was ever used has one),
with a client-side ``SCAN`` of every primary: O(keys), and a queue has at most ten keys
whatever its number of jobs. A queue's partition count is read from its record
(``partitions`` in ``{<name>}``'s counters), so a partitioned queue is opened as one
logical queue and its partitions are not listed again.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyqueue.drivers.clients import Client, node_for_key, primaries
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.keys import QueueKeys
from pyqueue.drivers.queue import Queue, physical_queue


def discover_queues(client: Client, prefix: str) -> list[str]:
    """Every queue name under ``prefix`` (partitions ``<name>#<p>`` included), sorted."""
    names = set()
    for node in primaries(client):
        for key in node.scan_iter(match=f"{prefix}:{{*}}:counters", count=1000):
            text = key.decode() if isinstance(key, bytes) else str(key)
            names.add(text[len(prefix) + 2 : text.rindex("}:counters")])
    return sorted(names)


def recorded_partitions(client: Client, name: str, prefix: str) -> int:
    """The partition count recorded for queue ``name`` in Redis; 1 when none is."""
    counters = QueueKeys(prefix, name).counters
    recorded = node_for_key(client, counters).hget(counters, "partitions")
    return int(recorded) if recorded else 1


def open_queue(client: Client, name: str, prefix: str) -> Queue:
    """The queue ``name`` with the partition count recorded for it in Redis; one
    partition ``<base>#<p>`` of a partitioned queue as a queue of its own."""
    base, sep, index = name.rpartition("#")
    if sep and index.isdigit() and int(index) < recorded_partitions(client, base, prefix) > 1:
        return physical_queue(name, client, prefix=prefix)
    return Queue(name, client, prefix=prefix, partitions=recorded_partitions(client, name, prefix))


def logical_queues(client: Client, prefix: str, names: Sequence[str] | None = None) -> list[Queue]:
    """The queues named (default: every queue found), each partitioned one once as a
    logical queue, its partitions not repeated."""
    queues = [open_queue(client, name, prefix) for name in (names or discover_queues(client, prefix))]
    partitions = {part.name for q in queues if q.spec.partitions > 1 for part in q.spec.partition_specs()}
    return [q for q in queues if q.name not in partitions]


def existing_queue(client: Client, name: str, prefix: str) -> Queue:
    """:func:`open_queue` of a queue that exists: one that was ever used has a
    ``counters`` hash. For tools that change a queue by the name a person typed, so that
    a typo is refused instead of creating a queue no worker serves.

    Raises:
        InvalidArgument: no queue ``name`` under ``prefix``; the message names those there.
    """
    counters = QueueKeys(prefix, name).counters
    if not node_for_key(client, counters).exists(counters):
        known = [n for n in discover_queues(client, prefix) if "#" not in n]
        there = f"the queues there: {', '.join(known[:20])}" + (", ..." if len(known) > 20 else "") if known else "none is"
        raise InvalidArgument(
            f"no queue {name!r} under prefix {prefix!r} (a queue exists once something was enqueued to it or a "
            f"worker served it); {there}"
        )
    return open_queue(client, name, prefix)
