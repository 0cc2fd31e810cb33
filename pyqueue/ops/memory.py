"""What a queue holds in Redis, by what holds it: ``pyqueue memory``.

Each key's ``MEMORY USAGE`` (Redis's own estimate, sampling 5 elements of a large
collection: exact for small keys, close for large ones; one command per key, pipelined
per node), summed by :data:`PARTS`. Read only. A server without ``MEMORY`` (the
embedded fakeredis) is measured by the length of each key's ``DUMP`` instead, its
serialized size, and :attr:`Memory.measure` says so. ``Stats.bytes`` and ``budget_bytes`` (a
byte budget, ``Queue.set_budget``) say what the budget counts: payload bytes alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from pyqueue.drivers.facade import parts_of
from pyqueue.drivers.queue import Queue, transport_of
from pyqueue.protocol.keys import ROLES

#: A queue's keys by what they hold (every role in one part).
PARTS: dict[str, tuple[str, ...]] = {
    "jobs": ("jobs", "ready", "scheduled", "leased", "owners", "dead", "errors", "meta", "gready", "ring", "groups"),
    "results": ("results", "result_expiry", "finished"),
    "tombstones": ("done", "expired"),
    "events": ("events",),
    # (the x:<id> entries naming a job's members live in `keyed`, under flow_control)
    "indexes": ("index",),
    "flow_control": ("keyed", "windows", "expires", "sequenced"),
    "steps": ("steps", "waiting"),
    "flows": ("fwait", "fpending", "flows", "flow_expiry"),
    "progress": ("progress", "progress_at"),
    "other": ("counters", "wake"),
}
assert sorted(r for roles in PARTS.values() for r in roles) == sorted(ROLES), "every role in one part"


@dataclass(frozen=True)
class Memory:
    """A queue's memory in Redis (bytes, ``MEMORY USAGE``), by part (:data:`PARTS`);
    a partitioned queue's summed over its partitions."""

    queue: str
    parts: dict[str, int]
    #: "memory usage", or "dump" where the server has no MEMORY command.
    measure: str
    #: The payload bytes its byte budget counts, and the budget (0: none).
    payload_bytes: int
    budget_bytes: int

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def memory_of(queue: Queue) -> Memory:
    """What ``queue`` holds in Redis (see the module)."""
    parts = dict.fromkeys(PARTS, 0)
    payload = budget = 0
    measure = "memory usage"
    for part in parts_of(queue):
        keys = [part.spec.keys.role(role) for roles in PARTS.values() for role in roles]
        client = transport_of(part).client
        try:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.memory_usage(key)
            sizes = [size or 0 for size in pipe.execute()]
        except redis.ResponseError as exc:
            if "unknown command" not in str(exc).lower():
                raise
            measure = "dump"
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.dump(key)
            sizes = [len(dumped or b"") for dumped in pipe.execute()]
        at = iter(sizes)
        for name, roles in PARTS.items():
            parts[name] += sum(next(at) for _ in roles)
        stats = part.stats()
        payload += stats.bytes
        budget += stats.budget_bytes
    return Memory(queue.name, parts, measure, payload, budget)
