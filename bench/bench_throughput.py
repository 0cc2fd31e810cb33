"""End-to-end throughput of one process, against raw limits measured in the same run,
and the Redis commands and round trips one job costs over its whole life.

Method: plain ``time.perf_counter`` loops, not pyperf. A throughput figure here is one
pass over N jobs ("enqueue N, then drain N with one process"), and a drain depends on
the enqueue before it, which does not fit pyperf's independent loop iterations.

Loopback latency on a shared virtual machine drifts by a factor of 2-3 within seconds,
so a pyqueue figure and the raw limit it is compared with must see the same drift.
Each repetition therefore interleaves them in blocks of 100 items, in a shuffled order
per block, and sums the time of each measurement over its blocks:

* enqueue phase, N items each: ``raw_lpush``, ``raw_evalsha``, ``enqueue_one``,
  ``raw_evalsha_pipelined_x100``, ``enqueue_batched_x100`` (the last one filling a second
  queue);
* drain phase, N items each: ``raw_lmove_lrem``, ``raw_evalsha_drain_phase``,
  ``drain_one`` (lease once, then ``ack_and_lease`` per job, from the queue
  ``enqueue_one`` filled) and ``drain_batched_x100`` (``lease(count=100)`` then
  ``ack_many``, from the queue ``enqueue_batched_x100`` filled).

A ratio is computed per repetition from measurements of the same phase, and the
report gives the median over repetitions (and the median rates). The definitions:

* ``raw_lpush``                   LPUSH, one item per call.
* ``raw_lmove_lrem``              LMOVE src->processing + LREM, per item (2 calls).
* ``raw_evalsha``                 EVALSHA of ``return 1``, one call per round trip.
* ``raw_evalsha_pipelined_x100``  the same, 100 calls pipelined per round trip.
* ``enqueue_one``                 Queue.enqueue, one job per call.
* ``enqueue_batched_x100``        Queue.enqueue_many, 100 jobs per call.
* ``drain_one``                   Queue.ack_and_lease, one job per call.
* ``drain_batched_x100``          Queue.lease(count=100) + Queue.ack_many per 100 jobs.

Then, on fresh queues, the lifecycle cost: the Redis server's CPU time, its commands
and the client's round trips per job over a job's whole life, for

* ``one_at_a_time``   Queue.enqueue per job + Queue.ack_and_lease per job (count=1);
* ``batched_x8``      Queue.enqueue_many of 8 + Queue.lease_call(ack=8, count=8), what
                      a worker's group commit sends;
* ``batched_x100``    the same with 100 jobs per call: the per-job floor of a lease call;
* ``dramatiq_like``   the reference: the Redis commands dramatiq's broker sends per
                      message (a dispatch script call per enqueue, per fetch of 8 and
                      per ack; 10.25 commands, 2.125 round trips per message);
* ``raw_list``        the bare list floor: LPUSH, LMOVE, LREM per item;
* ``raw_evalsha_x2``  two EVALSHA of ``return 1`` per item (the floor of two scripts).

They run interleaved in blocks of 200 jobs (shuffled order), ``--lifecycle-jobs`` each
per repetition. CPU is the growth of ``used_cpu_sys + used_cpu_user`` (INFO cpu) over
each block; commands come from ``INFO commandstats`` differences (which count the
commands scripts run inside Redis as well as the EVALSHA calls themselves); round trips
are counted on the client side. CPU per job is the median over blocks; a CPU ratio is
taken per round (blocks run back to back), the median over rounds reported.

With ``--baseline-lua DIR`` the two pyqueue lifecycles also run with the scripts of DIR
(say, ``git archive`` of an older ``lua/``), interleaved with the rest, so a change to the
scripts gets a before/after ratio from one run on one server.

Run::

    python bench/bench_throughput.py [--jobs 5000] [--repetitions 5] [--lifecycle-jobs 2000]
                                     [--baseline-lua DIR] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402

from pyqueue import Job, Outcome, Queue, connect  # noqa: E402
from pyqueue.drivers.scripts import SCRIPT_KEYS, lua_source  # noqa: E402
from pyqueue.drivers.queue import transport_of

PAYLOAD = b"p" * 64
LONG_LEASE_MS = 3_600_000
#: Jobs per enqueue_many / lease call in the batched measurements.
BATCH = 100
#: Items per interleaving block of every measurement.
BLOCK = 100
#: Commands the measurement itself sends; excluded from the per-job command count.
BOOKKEEPING_COMMANDS = frozenset({"config|resetstat", "info", "ping"})
#: Jobs per call in the batched lifecycle: what a worker's group commit sends.
GROUP = 8
#: Jobs per call in the large batched lifecycle (a lease call's per-call work over 100 jobs).
BIG_GROUP = 100
#: Jobs per interleaving block of the lifecycle measurements (a multiple of GROUP and
#: of BIG_GROUP).
LIFECYCLE_BLOCK = 200
#: The event stream bound of the events_* lifecycles (Queue.set_events).
EVENTS_BOUND = 10_000
#: name -> (Lifecycles method, description) of each lifecycle measured.
LIFECYCLES: dict[str, tuple[str, str]] = {
    "one_at_a_time": ("one_at_a_time", "enqueue x1 + ack_and_lease x1 per call"),
    f"batched_x{GROUP}": ("batched", f"enqueue_many x{GROUP} + lease_call(ack={GROUP}, count={GROUP})"),
    f"batched_x{BIG_GROUP}": ("batched_big", f"enqueue_many x{BIG_GROUP} + lease_call(ack={BIG_GROUP}, count={BIG_GROUP})"),
    "dramatiq_like": ("dramatiq_like", f"dramatiq's commands: enqueue, fetch (prefetch {GROUP}), ack scripts"),
    "raw_list": ("raw_list", "bare LPUSH + LMOVE + LREM per item"),
    "raw_evalsha_x2": ("raw_evalsha", "2 x EVALSHA 'return 1' per item (two-script floor)"),
    "lua_toy": ("lua_toy", "the 8-line Lua toy: enqueue, lease, ack scripts (3 EVALSHA, 8 commands inside)"),
}
#: The 8-line Lua toy queue the lean-scripts issue (#33) measures against: a job is a
#: hash field and a list entry; a lease pops the id and records a deadline on the server
#: clock; an ack removes the lease and the job. No fencing, tombstones, counters, replay
#: tokens, maintenance or events: what a job costs with none of pyqueue's guarantees.
LUA_TOY = {
    "enqueue": "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])\nredis.call('RPUSH', KEYS[2], ARGV[1])\nreturn 1",
    "lease": "local id = redis.call('LPOP', KEYS[2])\nif not id then return false end\n"
             "local t = redis.call('TIME')\nredis.call('ZADD', KEYS[3], t[1] * 1000 + ARGV[1], id)\n"
             "return {id, redis.call('HGET', KEYS[1], id)}",
    "ack": "if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then redis.call('HDEL', KEYS[1], ARGV[1]) end\nreturn 1",
}
#: A stand-in for dramatiq's Redis broker (its dispatch script), one call per command:
#: every call refreshes the worker's heartbeat (ZADD); enqueue stores the message and
#: appends its id; fetch pops up to `prefetch` ids, records each as unacked, and reads
#: the messages; ack forgets the id and deletes the message. The same Redis commands
#: per message as dramatiq sends (10 per message at a large prefetch), written here.
DRAMATIQ_LIKE = """
local ns, command, now, queue, worker = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
redis.call('ZADD', ns .. ':__heartbeats__', now, worker)
-- Per call, as dramatiq's script: the dead-letter queue's name, and the command's own
-- arguments (after the 8 common ones) copied into a table.
local canonical = string.sub(queue, -3) == '.DQ' and string.sub(queue, 1, -4) or queue
local dead_letters = ns .. ':' .. canonical .. '.XQ'
local args = {}
for i = 9, #ARGV do args[i - 8] = ARGV[i] end
local list = ns .. ':' .. queue
local messages = list .. '.msgs'
local unacked = ns .. ':__acks__.' .. worker .. '.' .. queue
if command == 'enqueue' then
  redis.call('HSET', messages, args[1], args[2])
  redis.call('RPUSH', list, args[1])
elseif command == 'fetch' then
  local ids = {}
  for i = 1, math.min(tonumber(args[1]), tonumber(ARGV[8])) do
    local id = redis.call('LPOP', list)
    if not id then break end
    ids[i] = id
    redis.call('SADD', unacked, id)
  end
  if #ids == 0 then return {} end
  local data = redis.call('HMGET', messages, unpack(ids))
  local reply = {}
  for i = 1, #ids do reply[2 * i - 1], reply[2 * i] = ids[i], data[i] end
  return reply
elseif command == 'ack' then
  if redis.call('SREM', unacked, args[1]) > 0 then redis.call('HDEL', messages, args[1]) end
elseif command == 'nack' then
  redis.call('ZADD', dead_letters, now, args[1])
end
return 1
"""
#: label -> (numerator, denominator, target): Redis CPU per job, each ratio at most its target.
CPU_RATIO_TARGETS: dict[str, tuple[str, str, float]] = {
    "one_at_a_time / dramatiq_like": ("one_at_a_time", "dramatiq_like", 1.0),
    f"batched_x{GROUP} / one_at_a_time": (f"batched_x{GROUP}", "one_at_a_time", 0.5),
}
#: The same, without a target: against the bare list commands and the two-script floor.
CPU_CONTEXT_RATIOS: dict[str, tuple[str, str]] = {
    "one_at_a_time / raw_list": ("one_at_a_time", "raw_list"),
    "one_at_a_time / raw_evalsha_x2": ("one_at_a_time", "raw_evalsha_x2"),
    "one_at_a_time / lua_toy": ("one_at_a_time", "lua_toy"),
    f"batched_x{GROUP} / lua_toy": (f"batched_x{GROUP}", "lua_toy"),
}

UNITS: dict[str, str] = {
    "raw_lpush": "items/s",
    "raw_lmove_lrem": "items/s",
    "raw_evalsha": "calls/s",
    "raw_evalsha_pipelined_x100": "calls/s",
    "raw_evalsha_drain_phase": "calls/s",
    "enqueue_one": "jobs/s",
    "enqueue_batched_x100": "jobs/s",
    "drain_one": "jobs/s",
    "drain_batched_x100": "jobs/s",
}
#: label -> (numerator, denominator, target): each ratio should be at least its target.
RATIO_TARGETS: dict[str, tuple[str, str, float]] = {
    "enqueue_one / raw_evalsha": ("enqueue_one", "raw_evalsha", 0.70),
    "enqueue_batched_x100 / raw_evalsha_pipelined_x100": ("enqueue_batched_x100", "raw_evalsha_pipelined_x100", 0.60),
    "drain_one / raw_evalsha (drain phase)": ("drain_one", "raw_evalsha_drain_phase", 0.60),
    "drain_batched_x100 / drain_one": ("drain_batched_x100", "drain_one", 3.0),
}
#: Context ratios without a target: pyqueue against the logic-free list commands.
CONTEXT_RATIOS: dict[str, tuple[str, str]] = {
    "enqueue_one / raw_lpush": ("enqueue_one", "raw_lpush"),
    "drain_one / raw_lmove_lrem": ("drain_one", "raw_lmove_lrem"),
}


class CountingRedis(redis.Redis):
    """A redis-py client that counts the commands it sends, one per round trip (no
    pipelines are used through it), so ``round_trips`` is the client-side call count."""

    round_trips: int = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def load_scripts(client: redis.Redis) -> None:
    """SCRIPT LOAD every pyqueue script so no timed call pays the NOSCRIPT detour."""
    for name in SCRIPT_KEYS:
        client.script_load(lua_source(name))


class Repetition:
    """One enqueue-N-then-drain-N pass with every measurement interleaved in blocks."""

    def __init__(self, raw: redis.Redis, pyqueue_client: redis.Redis, sha_return1: str, jobs: int, tag: str) -> None:
        self.raw = raw
        self.sha = sha_return1
        self.jobs = jobs
        self.tag = tag
        self.one = Queue(f"bench-tp-one-{tag}", pyqueue_client)
        self.batched = Queue(f"bench-tp-batched-{tag}", pyqueue_client)
        self.seconds: dict[str, float] = dict.fromkeys(UNITS, 0.0)
        self.rng = random.Random(tag)
        self._current: list[Job] = []  # drain_one's job in hand between blocks
        self._drained = {"one": 0, "batched": 0}

    def _timed_block(self, steps: dict[str, Callable[[], None]]) -> None:
        """Run one block of every measurement in a shuffled order, adding up times."""
        names = list(steps)
        self.rng.shuffle(names)
        for name in names:
            t0 = time.perf_counter()
            steps[name]()
            self.seconds[name] += time.perf_counter() - t0

    # -- enqueue phase ----------------------------------------------------------------------------

    def enqueue_phase(self) -> None:
        raw, sha = self.raw, self.sha
        lpush_key = f"bench-tp-lpush-{self.tag}"
        one, batched = self.one, self.batched
        batch = [PAYLOAD] * BATCH

        def raw_lpush() -> None:
            for _ in range(BLOCK):
                raw.lpush(lpush_key, PAYLOAD)

        def raw_evalsha() -> None:
            for _ in range(BLOCK):
                raw.evalsha(sha, 0)

        def raw_evalsha_pipelined() -> None:
            for _ in range(BLOCK // 100):
                pipe = raw.pipeline(transaction=False)
                for _ in range(100):
                    pipe.evalsha(sha, 0)
                pipe.execute()

        def enqueue_one() -> None:
            for _ in range(BLOCK):
                one.enqueue(PAYLOAD)

        def enqueue_batched() -> None:
            for _ in range(BLOCK // BATCH):
                batched.enqueue_many(batch)

        steps = {
            "raw_lpush": raw_lpush,
            "raw_evalsha": raw_evalsha,
            "raw_evalsha_pipelined_x100": raw_evalsha_pipelined,
            "enqueue_one": enqueue_one,
            "enqueue_batched_x100": enqueue_batched,
        }
        for _ in range(self.jobs // BLOCK):
            self._timed_block(steps)
        raw.unlink(lpush_key)

    # -- drain phase ------------------------------------------------------------------------------

    def drain_phase(self) -> None:
        raw, sha = self.raw, self.sha
        src, processing = f"bench-tp-src-{self.tag}", f"bench-tp-proc-{self.tag}"
        for start in range(0, self.jobs, 1000):  # untimed: the items LMOVE takes
            raw.rpush(src, *[b"%d:" % i + PAYLOAD for i in range(start, min(self.jobs, start + 1000))])
        one, batched = self.one, self.batched

        def raw_lmove_lrem() -> None:
            for _ in range(BLOCK):
                item = raw.lmove(src, processing, "LEFT", "RIGHT")
                raw.lrem(processing, 1, item)  # type: ignore[arg-type]  # redis-py types values as str; bytes work

        def raw_evalsha() -> None:
            for _ in range(BLOCK):
                raw.evalsha(sha, 0)

        def drain_one() -> None:
            # The first block starts the chain with one lease; after that every call acks
            # the job in hand and leases the next (the last one leases nothing).
            if not self._current and self._drained["one"] == 0:
                self._current = one.lease(LONG_LEASE_MS)
            for _ in range(BLOCK):
                _outcome, self._current = one.ack_and_lease(self._current[0], lease_ms=LONG_LEASE_MS)
                self._drained["one"] += 1

        def drain_batched() -> None:
            for _ in range(BLOCK // BATCH):
                jobs = batched.lease(LONG_LEASE_MS, count=BATCH)
                batched.ack_many(jobs)
                self._drained["batched"] += len(jobs)

        steps = {
            "raw_lmove_lrem": raw_lmove_lrem,
            "raw_evalsha_drain_phase": raw_evalsha,
            "drain_one": drain_one,
            "drain_batched_x100": drain_batched,
        }
        for _ in range(self.jobs // BLOCK):
            self._timed_block(steps)
        raw.unlink(src, processing)

    def check_and_drop(self) -> None:
        """Every job enqueued was drained and acked exactly once; then delete the queues."""
        for label, queue in (("one", self.one), ("batched", self.batched)):
            stats = queue.stats()
            if self._drained[label] != self.jobs or stats.ready or stats.leased or stats.acked != self.jobs:
                raise RuntimeError(f"drain {label} incomplete: drained {self._drained[label]} of {self.jobs}, {stats}")
            transport_of(queue).client.unlink(*queue.spec.keys.all())

    def rates_per_s(self) -> dict[str, float]:
        return {name: self.jobs / seconds for name, seconds in self.seconds.items()}


def cpu_us(admin: redis.Redis) -> float:
    """The server process's CPU time so far (INFO cpu: user + system, all threads), in us."""
    info = admin.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


def command_calls(admin: redis.Redis) -> dict[str, tuple[int, int]]:
    """INFO commandstats as command -> (calls, usec); scripts' inner commands included."""
    return {
        name.removeprefix("cmdstat_"): (int(stat["calls"]), int(stat["usec"]))
        for name, stat in admin.info("commandstats").items()
    }


class Lifecycles:
    """The whole life of a job (enqueue, lease, ack) in the ways LIFECYCLES lists, with
    the Redis server's CPU time, its commands and the client's round trips per job.

    Each repetition runs every lifecycle over the same number of jobs, interleaved in
    blocks of LIFECYCLE_BLOCK jobs in a shuffled order per round, so all of them see the
    same server and the same neighbours. Around each block: INFO commandstats, INFO cpu,
    the block, INFO cpu, INFO commandstats; only the CPU between the two INFO cpu calls
    counts (two INFO commands per block, a few us over hundreds of jobs). A pyqueue
    lifecycle keeps its leased jobs in hand from one block to the next, so every job
    costs exactly one enqueue share and one lease-call share: the lease call that
    leases a job acks it in the next call.
    """

    def __init__(self, url: str, tag: str, baseline_lua: Path | None = None) -> None:
        self.admin = _server.client_for(url)
        self.client = CountingRedis(connection_pool=connect(url).connection_pool)
        load_scripts(self.client)
        self.sha = self.client.script_load("return 1")
        self.queues = {
            "one": Queue(f"bench-tp-life-one-{tag}", self.client),
            "group": Queue(f"bench-tp-life-x{GROUP}-{tag}", self.client),
            "big": Queue(f"bench-tp-life-x{BIG_GROUP}-{tag}", self.client),
        }
        #: name -> the block it runs; with a baseline, its pyqueue lifecycles run too.
        self.runs: dict[str, Callable[[int], None]] = {
            name: getattr(self, method) for name, (method, _label) in LIFECYCLES.items()
        }
        self.labels = {name: label for name, (_method, label) in LIFECYCLES.items()}
        # The same lifecycles on queues opted in to their event stream (Queue.set_events):
        # what writing the events costs.
        self.queues["events_one"] = Queue(f"bench-tp-life-ev-one-{tag}", self.client)
        self.queues["events_group"] = Queue(f"bench-tp-life-ev-x{GROUP}-{tag}", self.client)
        self.queues["events_one"].set_events(EVENTS_BOUND)
        self.queues["events_group"].set_events(EVENTS_BOUND)
        self.runs["events_one_at_a_time"] = lambda n: self.one_at_a_time(n, "events_one")
        self.runs[f"events_batched_x{GROUP}"] = lambda n: self.batched(n, "events_group")
        self.labels["events_one_at_a_time"] = f"one_at_a_time on a queue keeping {EVENTS_BOUND} events"
        self.labels[f"events_batched_x{GROUP}"] = f"batched_x{GROUP} on a queue keeping {EVENTS_BOUND} events"
        if baseline_lua is not None:
            self.queues["base_one"] = Queue(f"bench-tp-life-base-one-{tag}", self.client, lua_directory=baseline_lua)
            self.queues["base_group"] = Queue(
                f"bench-tp-life-base-x{GROUP}-{tag}", self.client, lua_directory=baseline_lua
            )
            self.runs["baseline_one_at_a_time"] = lambda n: self.one_at_a_time(n, "base_one")
            self.runs[f"baseline_batched_x{GROUP}"] = lambda n: self.batched(n, "base_group")
            self.labels["baseline_one_at_a_time"] = f"one_at_a_time with the scripts of {baseline_lua}"
            self.labels[f"baseline_batched_x{GROUP}"] = f"batched_x{GROUP} with the scripts of {baseline_lua}"
        self.raw_keys = (f"bench-tp-life-src-{tag}", f"bench-tp-life-proc-{tag}")
        self.tag = f"bench-tp-life-dq-{tag}"
        self.dramatiq_sha = self.client.script_load(DRAMATIQ_LIKE)
        self.toy_sha = {verb: self.client.script_load(source) for verb, source in LUA_TOY.items()}
        self.toy_keys = tuple(f"bench-tp-life-toy-{tag}:{role}" for role in ("jobs", "ready", "leased"))
        self.toy_seq = 0
        self.dramatiq_seq = 0
        self.hand: dict[str, list[Job]] = {name: [] for name in self.queues}
        self.done: dict[str, int] = dict.fromkeys(self.queues, 0)
        self.rng = random.Random(tag)
        # The queues' first calls (the partition count check, loading a baseline's
        # scripts) stay out of every count.
        for queue in self.queues.values():
            queue.stats()
            queue.lease_call(count=0)
        self.client.ping()

    def one_at_a_time(self, n: int, which: str = "one") -> None:
        """Queue.enqueue per job, then Queue.ack_and_lease per job (count=1)."""
        one = self.queues[which]
        for _ in range(n):
            one.enqueue(PAYLOAD)
        for _ in range(n):
            hand = self.hand[which]
            if hand:
                outcome, self.hand[which] = one.ack_and_lease(hand[0], lease_ms=LONG_LEASE_MS)
                self.done[which] += outcome is Outcome.OK
            else:
                self.hand[which] = one.lease(LONG_LEASE_MS)

    def batched_big(self, n: int) -> None:
        """``batched`` with BIG_GROUP jobs per call."""
        self.batched(n, "big", BIG_GROUP)

    def batched(self, n: int, which: str = "group", size: int = GROUP) -> None:
        """Queue.enqueue_many of ``size`` jobs, then Queue.lease_call(ack=the ``size``
        jobs in hand, count=``size``): what a worker's group commit sends."""
        group = self.queues[which]
        batch = [PAYLOAD] * size
        for _ in range(n // size):
            group.enqueue_many(batch)
        for _ in range(n // size):
            leased = group.lease_call(ack=self.hand[which], count=size, lease_ms=LONG_LEASE_MS)
            self.done[which] += sum(outcome is Outcome.OK for outcome in leased.acks)
            self.hand[which] = leased.jobs

    def dramatiq_like(self, n: int) -> None:
        """DRAMATIQ_LIKE: enqueue per message; fetch GROUP at a time (a prefetching
        consumer) and ack per message."""
        client, sha, tag = self.client, self.dramatiq_sha, self.tag
        for _ in range(n):
            self.dramatiq_seq += 1
            client.evalsha(sha, 1, tag, "enqueue", int(time.time() * 1000), "default", "w1", 60_000, 0, "0", 7999,
                           self.dramatiq_seq, PAYLOAD)
        for _ in range(n // GROUP):
            reply = client.evalsha(sha, 1, tag, "fetch", int(time.time() * 1000), "default", "w1", 60_000, 0, "0",
                                   7999, GROUP)
            for message_id in reply[::2]:  # message ids at even positions
                client.evalsha(sha, 1, tag, "ack", int(time.time() * 1000), "default", "w1", 60_000, 0, "0", 7999,
                               message_id)

    def lua_toy(self, n: int) -> None:
        """LUA_TOY: one enqueue call per job, then one lease call and one ack call per job."""
        client, sha, keys = self.client, self.toy_sha, self.toy_keys
        for _ in range(n):
            self.toy_seq += 1
            client.evalsha(sha["enqueue"], 3, *keys, self.toy_seq, PAYLOAD)
        for _ in range(n):
            job_id, _payload = client.evalsha(sha["lease"], 3, *keys, LONG_LEASE_MS)
            client.evalsha(sha["ack"], 3, *keys, job_id)

    def raw_list(self, n: int) -> None:
        """A dramatiq-like bare reliable queue: LPUSH per item, then LMOVE to a
        processing list and LREM from it per item (3 commands, 3 round trips)."""
        client, (src, proc) = self.client, self.raw_keys
        for _ in range(n):
            client.lpush(src, PAYLOAD)
        for _ in range(n):
            item = client.lmove(src, proc, "RIGHT", "LEFT")
            client.lrem(proc, 1, item)  # type: ignore[arg-type]  # redis-py types values as str; bytes work

    def raw_evalsha(self, n: int) -> None:
        """Two EVALSHA of ``return 1`` per item: the floor of any two-script lifecycle."""
        client, sha = self.client, self.sha
        for _ in range(2 * n):
            client.evalsha(sha, 0)

    def repetition(self, jobs: int) -> dict[str, dict[str, Any]]:
        """Every lifecycle over ``jobs`` jobs; per lifecycle its CPU us, round trips,
        and command calls and usec (INFO commandstats differences)."""
        runs = self.runs
        totals: dict[str, dict[str, Any]] = {
            name: {"jobs": 0, "cpu_us": 0.0, "round_trips": 0, "calls": {}, "usec": {}, "blocks": []} for name in runs
        }
        for _ in range(jobs // LIFECYCLE_BLOCK):
            names = list(runs)
            self.rng.shuffle(names)
            for name in names:
                total = totals[name]
                stats0 = command_calls(self.admin)
                trips0 = self.client.round_trips
                cpu0 = cpu_us(self.admin)
                runs[name](LIFECYCLE_BLOCK)
                cpu1 = cpu_us(self.admin)
                trips1 = self.client.round_trips
                stats1 = command_calls(self.admin)
                total["jobs"] += LIFECYCLE_BLOCK
                total["cpu_us"] += cpu1 - cpu0
                total["blocks"].append((cpu1 - cpu0) / LIFECYCLE_BLOCK)
                total["round_trips"] += trips1 - trips0
                for command, (calls, usec) in stats1.items():
                    if command in BOOKKEEPING_COMMANDS:
                        continue
                    calls -= stats0.get(command, (0, 0))[0]
                    usec -= stats0.get(command, (0, 0))[1]
                    if calls:
                        total["calls"][command] = total["calls"].get(command, 0) + calls
                        total["usec"][command] = total["usec"].get(command, 0) + usec
        return totals

    def finish(self, jobs: int) -> None:
        """Ack what is still in hand, check every job was acked exactly once, drop the keys."""
        for name, queue in self.queues.items():
            if self.hand[name]:
                self.done[name] += sum(o is Outcome.OK for o in queue.ack_many(self.hand[name]))
                self.hand[name] = []
            stats = queue.stats()
            if self.done[name] != jobs or stats.acked != jobs or stats.ready or stats.leased:
                raise RuntimeError(f"lifecycle {name}: acked {self.done[name]} of {jobs}, {stats}")
            transport_of(queue).client.unlink(*queue.spec.keys.all())
        self.client.unlink(*self.raw_keys)
        if self.client.hlen(self.toy_keys[0]) or self.client.llen(self.toy_keys[1]):
            raise RuntimeError("lifecycle lua_toy: jobs left over")
        self.client.unlink(*self.toy_keys)
        dramatiq_keys = list(self.client.scan_iter(match=f"{self.tag}:*"))
        if self.client.llen(f"{self.tag}:default") or self.client.hlen(f"{self.tag}:default.msgs"):
            raise RuntimeError("lifecycle dramatiq_like: messages left over")
        if dramatiq_keys:
            self.client.unlink(*dramatiq_keys)


def per_job(total: dict[str, Any]) -> dict[str, Any]:
    """One lifecycle's totals as figures per job."""
    jobs = total["jobs"]
    calls = total["calls"]
    all_calls = sum(calls.values())
    evalsha = calls.get("evalsha", 0)
    return {
        "jobs": jobs,
        "cpu_us_per_job": total["cpu_us"] / jobs,
        "commands_per_job": all_calls / jobs,
        "commands_in_lua_per_job": (all_calls - evalsha) / jobs,
        "evalsha_per_job": evalsha / jobs,
        "round_trips_per_job": total["round_trips"] / jobs,
        # EVALSHA's usec covers the whole script, the commands it runs included.
        "server_script_us_per_job": total["usec"].get("evalsha", 0) / jobs,
        "per_command_per_job": {k: v / jobs for k, v in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))},
    }


def lifecycle_cost(url: str, jobs: int, repetitions: int, baseline_lua: Path | None = None) -> dict[str, Any]:
    """Redis CPU, commands and round trips per job of every lifecycle in LIFECYCLES,
    with ratios taken per round of blocks (median reported). Commands and round trips are
    summed over all repetitions (they do not vary)."""
    if jobs % LIFECYCLE_BLOCK:
        raise ValueError(f"--lifecycle-jobs must be a multiple of {LIFECYCLE_BLOCK}")
    bench = Lifecycles(url, str(time.time_ns()), baseline_lua)
    bench.repetition(LIFECYCLE_BLOCK)  # warm-up: connections, allocator, script cache; discarded
    reps = [bench.repetition(jobs) for _ in range(repetitions)]
    bench.finish(jobs * repetitions + LIFECYCLE_BLOCK)

    summed: dict[str, dict[str, Any]] = {}
    for name in bench.runs:
        merged: dict[str, Any] = {"jobs": 0, "cpu_us": 0.0, "round_trips": 0, "calls": {}, "usec": {}}
        for rep in reps:
            t = rep[name]
            merged["jobs"] += t["jobs"]
            merged["cpu_us"] += t["cpu_us"]
            merged["round_trips"] += t["round_trips"]
            for field in ("calls", "usec"):
                for k, v in t[field].items():
                    merged[field][k] = merged[field].get(k, 0) + v
        figures = per_job(merged)
        # Per block, then the median: a block that a neighbour's burst (or a stolen
        # vCPU) inflated moves the median little, where it would move a sum a lot.
        figures["cpu_us_per_job"] = statistics.median(x for rep in reps for x in rep[name]["blocks"])
        figures["cpu_us_per_job_mean"] = merged["cpu_us"] / merged["jobs"]
        figures["cpu_us_per_job_samples"] = [statistics.median(rep[name]["blocks"]) for rep in reps]
        figures["label"] = bench.labels[name]
        summed[name] = figures

    def round_ratios(num: str, den: str) -> tuple[float, list[float]]:
        # One ratio per round (blocks of the same round ran back to back), then medians.
        per_rep = [[a / b for a, b in zip(rep[num]["blocks"], rep[den]["blocks"])] for rep in reps]
        return statistics.median(x for rounds in per_rep for x in rounds), [statistics.median(r) for r in per_rep]

    ratios: dict[str, dict[str, Any]] = {}
    for label, (num, den, target) in CPU_RATIO_TARGETS.items():
        median, samples = round_ratios(num, den)
        ratios[label] = {"ratio": median, "samples": samples, "target": target, "met": median <= target}
    context = dict(CPU_CONTEXT_RATIOS)
    context["events_one_at_a_time / one_at_a_time"] = ("events_one_at_a_time", "one_at_a_time")
    context[f"events_batched_x{GROUP} / batched_x{GROUP}"] = (f"events_batched_x{GROUP}", f"batched_x{GROUP}")
    if baseline_lua is not None:
        context["one_at_a_time / baseline_one_at_a_time"] = ("one_at_a_time", "baseline_one_at_a_time")
        context[f"batched_x{GROUP} / baseline_batched_x{GROUP}"] = (f"batched_x{GROUP}", f"baseline_batched_x{GROUP}")
    for label, (num, den) in context.items():
        median, samples = round_ratios(num, den)
        ratios[label] = {"ratio": median, "samples": samples, "target": None, "met": None}
    one = summed["one_at_a_time"]
    return {
        # The one-at-a-time figures at the top level, as before.
        **{k: v for k, v in one.items() if k != "label"},
        "jobs_per_repetition": jobs,
        "repetitions": repetitions,
        "method": "INFO cpu (used_cpu_sys + used_cpu_user) and INFO commandstats around interleaved blocks "
        f"of {LIFECYCLE_BLOCK} jobs; CPU per job: median over blocks, ratios: median over rounds",
        "lifecycles": summed,
        "cpu_ratios": ratios,
        "targets": {"commands_per_job": 12, "round_trips_per_job": 2},
    }


def run(url: str, jobs: int, repetitions: int, lifecycle_jobs: int, baseline_lua: Path | None = None) -> dict[str, Any]:
    """All measurements; returns the report as a JSON-able dict."""
    if jobs % BLOCK:
        raise ValueError(f"--jobs must be a multiple of {BLOCK}")
    raw = _server.client_for(url)
    pyqueue_client = connect(url)
    load_scripts(pyqueue_client)
    sha = raw.script_load("return 1")

    samples: dict[str, list[float]] = {name: [] for name in UNITS}
    pairs = {label: (num, den) for label, (num, den, _target) in RATIO_TARGETS.items()} | CONTEXT_RATIOS
    ratio_samples: dict[str, list[float]] = {label: [] for label in pairs}
    for rep in range(repetitions + 1):
        # Repetition 0 warms connections, caches and the server's allocator; discarded.
        one = Repetition(raw, pyqueue_client, sha, jobs if rep else min(jobs, 1000), f"{time.time_ns()}-{rep}")
        one.enqueue_phase()
        one.drain_phase()
        one.check_and_drop()
        if rep == 0:
            continue
        rates = one.rates_per_s()
        for name, rate in rates.items():
            samples[name].append(rate)
        for label, (num, den) in pairs.items():
            ratio_samples[label].append(rates[num] / rates[den])

    ratios = {}
    for label, (_num, _den, target) in RATIO_TARGETS.items():
        median = statistics.median(ratio_samples[label])
        ratios[label] = {"ratio": median, "samples": ratio_samples[label], "target": target, "met": median >= target}
    return {
        "method": "time.perf_counter, interleaved blocks of 100, median of repetitions (not pyperf)",
        "jobs_per_measurement": jobs,
        "repetitions": repetitions,
        "payload_bytes": len(PAYLOAD),
        "rates": {
            name: {"unit": UNITS[name], "median_per_s": statistics.median(s), "samples_per_s": s}
            for name, s in samples.items()
        },
        "ratios": ratios,
        "context_ratios": {label: statistics.median(ratio_samples[label]) for label in CONTEXT_RATIOS},
        "lifecycle": lifecycle_cost(url, lifecycle_jobs, repetitions, baseline_lua),
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    lines = [
        f"throughput: {report['jobs_per_measurement']} items per measurement, median of "
        f"{report['repetitions']} repetitions ({report['method']})"
    ]
    for name, rate in report["rates"].items():
        lines.append(f"  {name:<28} {rate['median_per_s']:>10,.0f} {rate['unit']}")
    lines.append("ratios (pyqueue / raw limit, same phase of the same repetition; median):")
    for label, r in report["ratios"].items():
        verdict = "met" if r["met"] else "NOT met"
        lines.append(f"  {label:<52} {r['ratio']:7.3f}  target >= {r['target']:.2f}  {verdict}")
    for label, value in report["context_ratios"].items():
        lines.append(f"  {label:<52} {value:7.3f}  (context, no target)")
    life = report["lifecycle"]
    lines.append(
        f"lifecycle (enqueue + ack_and_lease, {life['jobs']} jobs): {life['commands_per_job']:.2f} commands/job "
        f"({life['evalsha_per_job']:.2f} EVALSHA + {life['commands_in_lua_per_job']:.2f} inside Lua; target <= 12), "
        f"{life['round_trips_per_job']:.3f} round trips/job (target <= 2), "
        f"{life['server_script_us_per_job']:.0f} us of script time/job"
    )
    for name, per_job in life["per_command_per_job"].items():
        lines.append(f"  {name:<20} {per_job:6.3f}/job")
    lines += lifecycle_lines(life)
    return "\n".join(lines)


def lifecycle_lines(life: dict[str, Any]) -> list[str]:
    """Redis CPU per job of every lifecycle, their ratios and their commands."""
    lines = [
        f"Redis CPU per job over the whole lifecycle ({life['jobs_per_repetition']} jobs each x "
        f"{life['repetitions']} repetitions; {life['method']}; samples: median per repetition):",
        f"  {'lifecycle':<24} {'cpu_us/job':>10} {'script_us':>9} {'cmds/job':>9} {'TYPE':>6} {'TIME':>6} {'trips/job':>9}"
        f"  {'samples (us/job)':<24} description",
    ]
    for name, fig in life["lifecycles"].items():
        cmds = fig["per_command_per_job"]
        samples = " ".join(f"{x:.1f}" for x in fig["cpu_us_per_job_samples"])
        lines.append(
            f"  {name:<24} {fig['cpu_us_per_job']:>10.1f} {fig['server_script_us_per_job']:>9.1f} "
            f"{fig['commands_per_job']:>9.2f} {cmds.get('type', 0):>6.2f} "
            f"{cmds.get('time', 0):>6.2f} {fig['round_trips_per_job']:>9.3f}  {samples:<24} {fig['label']}"
        )
    for label, r in life["cpu_ratios"].items():
        samples = " ".join(f"{x:.3f}" for x in r["samples"])
        if r["target"] is None:
            lines.append(f"  {label:<42} {r['ratio']:6.3f}  (context)  ({samples})")
        else:
            verdict = "met" if r["met"] else "NOT met"
            lines.append(f"  {label:<42} {r['ratio']:6.3f}  target <= {r['target']:.2f}  {verdict}  ({samples})")
    toy = life["lifecycles"].get("lua_toy")
    if toy:
        for name in ("one_at_a_time", f"batched_x{GROUP}"):
            fig = life["lifecycles"][name]
            lines.append(
                f"  {name} / lua_toy: script time {fig['server_script_us_per_job'] / toy['server_script_us_per_job']:.2f}x"
                f" (target <= 1.5 at one_at_a_time), commands {fig['commands_per_job'] / toy['commands_per_job']:.2f}x"
            )
    for name, fig in life["lifecycles"].items():
        if name.startswith("raw_"):
            continue
        breakdown = "  ".join(f"{k} {v:.3f}" for k, v in fig["per_command_per_job"].items())
        lines.append(f"  {name} commands/job: {breakdown}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--jobs", type=int, default=5000, help=f"items per measurement (multiple of {BLOCK})")
    parser.add_argument("--repetitions", type=int, default=5, help="repetitions; the median is reported")
    parser.add_argument(
        "--lifecycle-jobs", type=int, default=2000,
        help=f"jobs per lifecycle per repetition (multiple of {LIFECYCLE_BLOCK}) for CPU and commands per job",
    )
    parser.add_argument(
        "--baseline-lua", type=Path, default=None,
        help="also run the pyqueue lifecycles with the scripts of this directory (e.g. an older lua/), "
        "interleaved, for a before/after ratio measured in the same run",
    )
    parser.add_argument("--json-out", default=None, help="also write the report as JSON here")
    args = parser.parse_args()
    if not (BLOCK <= args.jobs <= 100_000 and 1 <= args.repetitions <= 50):
        parser.error(f"--jobs must be in [{BLOCK}, 100000] and --repetitions in [1, 50]")
    if not (LIFECYCLE_BLOCK <= args.lifecycle_jobs <= 20_000 and args.lifecycle_jobs % LIFECYCLE_BLOCK == 0):
        parser.error(f"--lifecycle-jobs must be a multiple of {LIFECYCLE_BLOCK} in [{LIFECYCLE_BLOCK}, 20000]")

    server: _server.LoopbackRedis | None = None
    if args.redis_url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
    _server.require_loopback(args.redis_url)
    try:
        report = run(args.redis_url, args.jobs, args.repetitions, args.lifecycle_jobs, args.baseline_lua)
    finally:
        if server is not None:
            server.stop()
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    print(format_report(report))


if __name__ == "__main__":
    main()
