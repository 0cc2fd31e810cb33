"""Shared test helpers: a queue state in which every script touches every key it takes,
and snapshots of the whole keyspace."""

from __future__ import annotations

from typing import Any

import redis

from pyqueue import NewJob, Queue

T0 = 1_000_000


def dump_all(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key with its DUMP: equal snapshots mean nothing was written."""
    return {k: client.dump(k) for k in sorted(client.keys("*"))}


def busy_queue(q: Queue) -> dict[str, Any]:
    """Put ``q`` in a state with something in every role, and return handles:

    ready jobs r0..r3; a scheduled job 'due' due at T0 + 10; a lease of 'poison' at its
    last attempt, expired at T0 + 5; a current lease 'held' (deadline T0 + 100_000),
    and a current lease 'retry' with attempts to spare; a dead job 'corpse'.
    """
    q.enqueue(b"", job_id="corpse", max_attempts=1, now_ms=T0)
    (corpse,) = q.lease(now_ms=T0)
    q.nack(corpse, "died", now_ms=T0)
    q.enqueue(b"p", job_id="poison", max_attempts=1, now_ms=T0)
    (poison,) = q.lease(lease_ms=5, now_ms=T0)
    q.enqueue_many(
        [NewJob(b"h", job_id="held"), NewJob(b"t", job_id="retry", max_attempts=9), NewJob(b"l", job_id="last", max_attempts=1)],
        now_ms=T0,
    )
    held, retry, last = q.lease(lease_ms=100_000, count=3, now_ms=T0)
    q.enqueue_many([NewJob(b"r", job_id=f"r{i}") for i in range(4)], now_ms=T0)
    q.enqueue(b"d", job_id="due", delay_ms=10, now_ms=T0)
    return {"poison": poison, "held": held, "retry": retry, "last": last}


def calls_touching_every_key(q: Queue, h: dict[str, Any]) -> dict[str, tuple[str, list[Any]]]:
    """For each script variant, (script, ARGV) that reads or writes every key it takes,
    run at T0 + 60 on a :func:`busy_queue` (past its next maintenance, T0 + 50)."""
    now = T0 + 60
    held, retry, poison = h["held"].receipt, h["retry"].receipt, h["poison"].receipt
    return {
        "enqueue": ("enqueue", [now, 2, "n1", b"x", 0, 3, "n2", b"y", 50, 3]),
        "lease": ("lease", [now, "w", "c1", 2, 1000, 100]),
        "ack_and_lease": ("lease", [now, "w", "c1", 2, 1000, 100, held, "w|x|9|9|r0"]),
        "ack": ("ack", [held, "w|c|99|1|r1"]),
        "nack_to_scheduled": ("nack", [now, retry, "e", "", 100, 1000]),
        "nack_to_dead": ("nack", [now, h["last"].receipt, "e", "", 100, 1000]),
        "extend": ("extend", [now, 5000, held, "w|c|99|1|r1"]),
        "release": ("release", [held, "w|c|99|1|r1"]),
        "promote": ("promote", [now, 100]),
        "stats": ("stats", [now]),
        "dead_list": ("dead_list", [0, 10]),
        "dead_replay": ("dead_replay", [now, "corpse"]),
        "dead_purge": ("dead_purge", ["corpse"]),
    }
