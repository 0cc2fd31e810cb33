"""Shared test helpers: a queue state in which every script touches every key it takes,
and snapshots of the whole keyspace."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import redis

from pyqueue import NewJob, Queue
from pyqueue.drivers.scripts import lua_source
from pyqueue.drivers.facade import client_of, parts_of, physical

T0 = 1_000_000


def dump_all(client: Any) -> dict[bytes, bytes | None]:
    """Every key with its DUMP (of every primary of a cluster): equal snapshots mean
    nothing was written."""
    from conftest import all_keys

    return {k: client.dump(k) for k in all_keys(client)}


@dataclass(frozen=True)
class ArgvRule:
    """The ARGV counts a script's header allows: lo..hi, in steps of ``step`` from lo."""

    lo: int
    hi: int
    step: int = 1

    def allows(self, n: int) -> bool:
        return self.lo <= n <= self.hi and (n - self.lo) % self.step == 0


def argv_rule(name: str) -> ArgvRule:
    """The ARGV counts ``name``.lua's header allows (a call with another count is a
    PQ_CONTRACT error): ``ARGV (3)``, ``ARGV (6 or 7)``, or a list, ``ARGV (2 + 4n)``,
    whose length range is on its own line (``1..1000 receipts``, ``0..1000 receipts``,
    ``integer 1..1000, number of jobs``)."""
    text = lua_source(name).split("\n]]\n", 1)[0]
    spec = re.search(r"^ARGV \(([^)]*)\)", text, re.M)
    assert spec, f"{name}.lua: no 'ARGV (...)' line"
    if m := re.fullmatch(r"(\d+)", spec.group(1)):
        return ArgvRule(int(m.group(1)), int(m.group(1)))
    if m := re.fullmatch(r"(\d+) or (\d+)", spec.group(1)):
        return ArgvRule(int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"(?:(\d+) \+ )?(\d*)[a-z]", spec.group(1))
    assert m, f"{name}.lua: unreadable {spec.group(0)!r}"
    fixed, step = int(m.group(1) or 0), int(m.group(2) or 1)
    block = text[spec.start():].split("\n\n", 1)[0]
    items = re.search(r"\b(\d+)\.\.(\d+),? (?:receipts|job ids|number of jobs)", block)
    assert items, f"{name}.lua: the header gives no length range of its ARGV list"
    return ArgvRule(fixed + step * int(items.group(1)), fixed + step * int(items.group(2)), step)


def busy_queue(q: Queue, fair: bool = False) -> dict[str, Any]:
    """Put ``q`` in a state with something in every role, and return handles:

    ready jobs r0..r3; a scheduled job 'due' due at T0 + 10; a lease of 'poison' at its
    last attempt, expired at T0 + 5; a current lease 'held' (deadline T0 + 100_000),
    and a current lease 'retry' with attempts to spare; a dead job 'corpse'; ten
    tombstones done0..done9 that expire at T0 + 50 (the next ack trims them); progress
    of 'poison' and 'held'. The queue has opted in to its event stream, which holds
    the events of all that.
    With ``fair``, the queue uses fair scheduling (lua/README.md section 2.1) and holds
    something in its keys too: every job but r3 is in group 'g' (with a cap of 9), and
    r3 is ungrouped with priority 2.
    """
    g = {"group": "g"} if fair else {}
    q.set_events(1000)  # every state-changing script writes its events too (lua/README.md section 2.5)
    finisher = sibling(q, q.name, keep_done_ms=50)
    finisher.enqueue_many([NewJob(b"", job_id=f"done{i}") for i in range(10)], now_ms=T0)
    finisher.ack_many(finisher.lease(count=10, now_ms=T0), now_ms=T0)
    if fair:
        q.set_group_limit(9)
    q.enqueue(b"", job_id="corpse", max_attempts=1, now_ms=T0, **g)
    (corpse,) = q.lease(now_ms=T0)
    q.nack(corpse, "died", now_ms=T0)
    q.enqueue(b"p", job_id="poison", max_attempts=1, now_ms=T0, **g)
    (poison,) = q.lease(lease_ms=5, now_ms=T0)
    q.enqueue_many(
        [NewJob(b"h", job_id="held", **g), NewJob(b"t", job_id="retry", max_attempts=9, **g),
         NewJob(b"l", job_id="last", max_attempts=1, **g)],
        now_ms=T0,
    )
    held, retry, last = q.lease(lease_ms=100_000, count=3, now_ms=T0)
    q.progress(poison, b"p", now_ms=T0)  # progress under a lease that expires (a trim deletes it once reclaimed)
    q.progress(held, b"h", now_ms=T0)  # and under one that runs
    q.enqueue_many([NewJob(b"r", job_id=f"r{i}", **g) for i in range(3)], now_ms=T0)
    q.enqueue(b"r", job_id="r3", priority=2 if fair else 0, now_ms=T0)
    q.enqueue(b"d", job_id="due", delay_ms=10, now_ms=T0, **g)
    return {"poison": poison, "held": held, "retry": retry, "last": last, "fair": fair}


def calls_touching_every_key(q: Queue, h: dict[str, Any]) -> dict[str, tuple[str, list[Any]]]:
    """For each script variant, (script, ARGV) that reads or writes every key it takes,
    run at T0 + 60 on a :func:`busy_queue` (past its next maintenance, T0 + 50)."""
    now = T0 + 60
    held, retry, poison = h["held"].receipt, h["retry"].receipt, h["poison"].receipt
    group = "g" if h.get("fair") else ""  # on a fair busy queue, n1 is a job of group g
    return {
        "enqueue": ("enqueue", [now, 2, "n1", b"x", 0, 3, "", group, "", "", "n2", b"y", 50, 3, "", "", "", ""]),
        "lease": ("lease", [now, "w", "c1", 2, 1000, 100, 1000]),
        "ack_and_lease": ("lease", [now, "w", "c1", 2, 1000, 100, 1000, held, "w|x|9|9|r0"]),
        "ack": ("ack", [now, 1000, held, "w|c|99|1|r1"]),
        "ack_result": ("ack_result", [now, 1000, 3_600_000, 10, held, b"sdone", "w|c|99|1|r1", b"j1"]),
        "result": ("result", [now, "nope"]),
        "nack_to_scheduled": ("nack", [now, retry, "e", "", 100, 1000]),
        "nack_to_dead": ("nack", [now, h["last"].receipt, "e", "", 100, 1000]),
        "nack_final": ("nack", [now, retry, "e", "", 100, 1000, "1"]),  # to DEAD with attempts to spare
        "extend": ("extend", [now, 5000, held, "w|c|99|1|r1"]),
        "release": ("release", [now, held, "w|c|99|1|r1"]),
        "promote": ("promote", [now, 100]),
        "stats": ("stats", [now]),
        "dead_list": ("dead_list", [0, 10]),
        "dead_replay": ("dead_replay", [now, "corpse"]),
        "dead_purge": ("dead_purge", ["corpse"]),
    }


def restore_all(client: redis.Redis, snapshot: dict[bytes, bytes | None]) -> None:
    """Make the keyspace exactly ``snapshot`` (from :func:`dump_all`) again."""
    client.flushall()
    for key, value in snapshot.items():
        assert value is not None
        client.restore(key, 0, value)


def job_states(client: redis.Redis, q: Queue) -> dict[str, list[str]]:
    """Every job id found anywhere in the queue -> the states it is found in.

    Also checks the structural rules each state relies on: READY holds no id twice, the
    owners index holds exactly the receipts of LEASED, every receipt parses.
    """
    k = q.spec.keys
    states: dict[str, list[str]] = {}
    for raw in client.hkeys(k.jobs):
        states.setdefault(raw.decode(), [])
    ready = [i.decode() for i in client.lrange(k.ready, 0, -1)]
    assert len(ready) == len(set(ready)), f"an id twice in READY: {ready}"
    for i in ready:
        states.setdefault(i, []).append("ready")
    # READY jobs with meta (fair scheduling): "<group>|<rank>|<id>", rank 17 characters,
    # and each matches its job's meta entry "<priority>|<pos>|<group>".
    metas = {i.decode(): v.decode() for i, v in client.hgetall(k.meta).items()}
    for raw in client.zrange(k.gready, 0, -1):
        member = raw.decode()
        group, rest = member.split("|", 1)
        rank, job_id = rest[:17], rest[18:]
        assert rest[17] == "|" and job_id in metas, f"gready member {member!r} without its meta"
        priority, pos, meta_group = metas[job_id].split("|", 2)
        assert (meta_group, chr(53 - int(priority)) + pos) == (group, rank), f"{member!r} != meta {metas[job_id]!r}"
        states.setdefault(job_id, []).append("ready")
    assert set(metas) <= {i.decode() for i in client.hkeys(k.jobs)}, "meta kept for a job that is gone"
    for raw in client.zrange(k.scheduled, 0, -1):
        states.setdefault(raw.decode(), []).append("scheduled")
    receipts = client.zrange(k.leased, 0, -1)
    assert set(receipts) == set(client.zrange(k.owners, 0, -1)), "owners index out of step with LEASED"
    for raw in receipts:
        parts = raw.decode().split("|", 4)
        assert len(parts) == 5 and parts[2].isdigit() and parts[3].isdigit(), raw
        states.setdefault(parts[4], []).append("leased")
    for raw in client.zrange(k.dead, 0, -1):
        states.setdefault(raw.decode(), []).append("dead")
    assert set(client.hkeys(k.errors)) <= set(client.zrange(k.dead, 0, -1)), "an error kept for a job not dead"
    return states


def contents(client: redis.Redis) -> dict[bytes, object]:
    """Every key with its logical value (fakeredis's DUMP is a pickle whose bytes can
    differ for equal values, so "same state" compares this instead)."""
    out: dict[bytes, object] = {}
    for key in client.keys("*"):
        kind = client.type(key)
        if kind == b"string":
            out[key] = client.get(key)
        elif kind == b"list":
            out[key] = client.lrange(key, 0, -1)
        elif kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"set":
            out[key] = client.smembers(key)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            # The entries' fields, in order; their ids carry the server's clock.
            out[key] = (kind, [fields for _, fields in client.xrange(key)])
        else:
            out[key] = (kind, client.dump(key))
    return out


def sibling(q: Any, name: str, **settings: Any) -> Any:
    """A queue of ``q``'s driver and client (sync, or async seen through the test's
    ``Blocking`` wrapper) addressed by its own ``name`` (it checks no partition count),
    with ``settings``."""
    target = getattr(q, "_target", q)  # the AsyncQueue behind a Blocking wrapper
    made = physical(type(target)(name, client_of(target), prefix=target.spec.prefix, **settings))
    return made if target is q else q._wrap(made)


def queue_parts(q: Any) -> list[Any]:
    """:func:`pyqueue.drivers.facade.parts_of` of ``q``, sync or seen through the test's
    ``Blocking`` wrapper."""
    target = getattr(q, "_target", q)
    made = parts_of(target)
    return made if target is q else list(q._wrap(made))
