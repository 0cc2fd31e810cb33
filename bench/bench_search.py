"""What indexes cost and what a search over a large queue takes (lua/set_indexes.lua,
lua/search.lua, issue #39), against a real redis-server (its own, on a free loopback
port, unless ``--redis-url``).

1. **Indexes on and off**, one call at a time (``--calls`` per measure): enqueue of a
   job without a task or group, of one with a task name, and of one with a group, on a
   queue without indexes and on one with them (jobs without either also on one that
   holds indexed jobs); and ack-and-lease of the same jobs as a busy worker makes them
   (the ack of an indexed job removes its index members). Each
   line: the server's time per EVALSHA (``INFO commandstats``, µs), the commands a call
   ran, its ratio to the plain call of the same run (no task, no group, no indexes) and
   to the same jobs on a queue without indexes.
2. **Search over ``--jobs`` jobs** (default 1,000,000) in one queue with indexes on:
   20 task names in turn, 1000 groups at random; 2% dead (4 error classes: TimeoutError,
   half of them as ``asyncio.exceptions.TimeoutError``, ConnectionError, ValueError,
   KeyError), 0.2% leased, 30% of the rest scheduled (1 h to 1 day ahead), the rest
   ready. The fill (``enqueue_many`` of 1000; the dead ones leased 1000 a call and
   nacked with ``final=True``) is timed, with ``used_memory`` before and after and the
   ``MEMORY USAGE`` of ``index`` and ``keyed`` (the index's "x:<id>" entries). Then each
   search, ``--repetitions`` times, wall clock median (``Queue.search`` as a caller
   makes it: a first page of 100, or a complete search of pages of 500 as
   ``pyqueue.ops.find.matching`` reads them), with the jobs found and examined, the
   script calls, the commands they ran, their server time, and the longest single
   script call (one more pass, one script call per ``Queue.search``: what the search
   blocks the server for at once).

    python bench/bench_search.py [--jobs 1000000] [--calls 4000] [--repetitions 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import _server

_server.use_checkout()

from bench_flow_control import LEASE_MS, busy_worker, fresh, measured  # noqa: E402

from pyqueue import NewJob, Queue  # noqa: E402

TASKS = (
    "send_invoice", "send_email", "send_sms", "resize_image", "render_pdf", "charge_card", "refund_payment",
    "sync_crm", "export_csv", "import_csv", "index_document", "generate_report", "notify_slack", "call_webhook",
    "update_search", "compute_tax", "archive_order", "fetch_rates", "transcode_video", "cleanup_tmp",
)
GROUPS = tuple(f"tenant-{k:04d}" for k in range(1000))
#: A dead job's error, by its number modulo 10: TimeoutError 4 in 10 (half of them as
#: asyncio's), ConnectionError 3, ValueError 2, KeyError 1.
ERRORS = (
    "TimeoutError: read timed out after 30.0 s",
    "asyncio.exceptions.TimeoutError: the upstream call took longer than 10 s",
    "TimeoutError: read timed out after 30.0 s",
    "asyncio.exceptions.TimeoutError: the upstream call took longer than 10 s",
    "ConnectionError: connection reset by peer",
    "ConnectionError: Error 111 connecting to billing:443. Connection refused.",
    "ConnectionError: connection reset by peer",
    "ValueError: invoice total must be positive, got -12.50",
    "ValueError: unknown currency 'XXX'",
    "KeyError: 'customer_id'",
)
PAYLOAD = b"p" * 64
BATCH = 1000
LONG_LEASE_MS = 86_400_000
#: A complete search reads pages of this many (pyqueue.ops.find.matching's page_size).
PAGE = 500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs in the searched queue")
    parser.add_argument("--calls", type=int, default=4000, help="calls per measure of part 1")
    parser.add_argument("--repetitions", type=int, default=5,
                        help="rounds of part 1 and timed runs of each search (median)")
    parser.add_argument("--max-fill-s", type=float, default=300.0,
                        help="stop filling after this long and search what was filled")
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if not (1000 <= args.jobs <= 2_000_000 and 100 <= args.calls <= 100_000 and 1 <= args.repetitions <= 20
            and 10 <= args.max_fill_s <= 1800):
        parser.error("--jobs in [1000, 2000000], --calls in [100, 100000], --repetitions in [1, 20], "
                     "--max-fill-s in [10, 1800]")
    if args.redis_url:
        _server.require_loopback(args.redis_url)
        run(args.redis_url, args)
    else:
        with _server.LoopbackRedis() as server:
            run(server.url, args)


# -- 1. indexes on and off ----------------------------------------------------------------


def job(kind: str, i: int) -> NewJob:
    """A job without a task or group ('plain'), with a task (20 in turn), or with a
    group (100 in turn)."""
    if kind == "task":
        return NewJob(PAYLOAD, task=TASKS[i % len(TASKS)])
    if kind == "group":
        return NewJob(PAYLOAD, group=GROUPS[i % 100])
    return NewJob(PAYLOAD)


#: How a queue keeps indexes: none; on; on, with indexed jobs in it (one sent with a
#: task before the measure, so its `indexed` flag is set: the jobs measured have none).
MODES = {"off": "no indexes", "on": "indexes", "held": "queue with indexed jobs"}


def indexed_queue(client: Any, label: str, mode: str) -> Queue:
    q = fresh(client, f"{label}-{mode}")
    if mode != "off":
        q.set_indexes(True)
    if mode == "held":
        q.enqueue_many([NewJob(b"marker", task="marker", delay_ms=LONG_LEASE_MS)])
    return q


def enqueues(client: Any, n: int, kind: str, mode: str) -> tuple[float, float]:
    """enqueue_many of one job a call (the path a task's send takes)."""
    q = indexed_queue(client, "enq-" + kind, mode)
    q.enqueue_many([job(kind, -1)])  # scripts loaded, keys made

    def calls() -> None:
        for i in range(n):
            q.enqueue_many([job(kind, i)])

    return measured(client, calls, n)


def acks(client: Any, n: int, kind: str, mode: str) -> tuple[float, float]:
    q = indexed_queue(client, "ack-" + kind, mode)
    for start in range(0, n + 1, BATCH):
        q.enqueue_many([job(kind, start + i) for i in range(min(BATCH, n + 1 - start))])
    return measured(client, busy_worker(q, n), n)


Measure = Callable[[Any, int, str, str], tuple[float, float]]

#: (what the jobs carry, the queue's modes measured); the first line of each verb is its plain call.
KINDS = (("plain", "no task or group", ("off", "on", "held")), ("task", "a task", ("off", "on")),
         ("group", "a group", ("off", "on")))


def costs(client: Any, n: int, repetitions: int) -> None:
    """Every measure once per round, ``repetitions`` rounds: the median server time of
    each (the commands are the same every round). Ratios: to the verb's plain call (no
    task or group, no indexes), and to the same jobs on a queue without indexes."""
    print(f"\n1. indexes on and off: {n} calls per measure, median of {repetitions} rounds (lease_ms {LEASE_MS})")
    # (label, measure, kind, mode, row of the plain call, row of the same jobs without indexes)
    plan: list[tuple[str, Measure, str, str, int, int]] = []
    verbs: tuple[tuple[str, Measure], ...] = (("enqueue", enqueues), ("ack+lease", acks))
    for verb, measure in verbs:
        plain = len(plan)
        for kind, what, modes in KINDS:
            unindexed = len(plan)
            for mode in modes:
                plan.append((f"{verb}, {what}, {MODES[mode]}", measure, kind, mode, plain, unindexed))
    times: list[list[float]] = [[] for _ in plan]
    commands: list[float] = [0.0] * len(plan)
    for _ in range(repetitions):
        for k, (_label, run_one, kind, mode, _p, _u) in enumerate(plan):
            us, commands[k] = run_one(client, n, kind, mode)
            times[k].append(us)
        drop(client, "pq:{bench-flow-*")
    print("\nper call                                                 server us  commands  vs plain  vs no indexes")
    for k, (label, _m, _k, _mode, plain, unindexed) in enumerate(plan):
        us = statistics.median(times[k])
        base, same = statistics.median(times[plain]), statistics.median(times[unindexed])
        print(f"{label:55} {us:9.1f}  {commands[k]:8.2f}  {us / base:7.2f}x  {us / same:12.2f}x")


# -- 2. search over a large queue ----------------------------------------------------------


def drop(client: Any, pattern: str) -> None:
    for key in client.scan_iter(pattern, count=1000):
        client.delete(key)


def used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Filler:
    """Fills one queue, batch by batch: each job gets the next task in turn and a group
    at random (seeded)."""

    def __init__(self, q: Queue, deadline: float) -> None:
        self.q, self.deadline, self.sent = q, deadline, 0
        self.rng = random.Random(39)

    def batch(self, size: int, scheduled_share: float = 0.0) -> None:
        jobs = []
        for _ in range(size):
            delay = self.rng.randrange(3_600_000, LONG_LEASE_MS) if self.rng.random() < scheduled_share else 0
            jobs.append(NewJob(PAYLOAD, task=TASKS[self.sent % len(TASKS)], group=self.rng.choice(GROUPS),
                               delay_ms=delay))
            self.sent += 1
        self.q.enqueue_many(jobs)

    def lease_batch(self, size: int, lease_ms: int) -> list[Any]:
        """Enqueue ``size`` ready jobs (nothing else is ready) and lease them all."""
        self.batch(size)
        held: list[Any] = []
        while len(held) < size:
            got = self.q.lease(lease_ms=lease_ms, count=min(BATCH, size - len(held)))
            if not got:
                raise RuntimeError(f"leased {len(held)} of {size}: jobs other than the batch's were ready?")
            held += got
        return held

    def late(self) -> bool:
        return time.monotonic() > self.deadline


def fill(client: Any, q: Queue, n: int, max_fill_s: float) -> dict[str, Any]:
    """Dead first (leased and nacked 1000 at a time), then leased, then the rest ready or
    scheduled: the dead and leased jobs are leased while nothing else is ready."""
    n_dead, n_leased = n // 50, n // 500
    filler = Filler(q, time.monotonic() + max_fill_s)
    start = time.perf_counter()
    dead = 0
    dead_since_ms = None
    while dead < n_dead and not filler.late():
        for job in filler.lease_batch(min(BATCH, n_dead - dead), LEASE_MS):
            if dead == n_dead // 2:
                dead_since_ms = server_ms(client)  # the later half of the deaths
            q.nack(job, ERRORS[dead % len(ERRORS)], final=True)
            dead += 1
    dead_s = time.perf_counter() - start
    leased = 0
    while leased < n_leased and not filler.late():
        leased += len(filler.lease_batch(min(BATCH, n_leased - leased), LONG_LEASE_MS))
    while filler.sent < n and not filler.late():
        filler.batch(min(BATCH, n - filler.sent), scheduled_share=0.3)
    return {"jobs": filler.sent, "dead": dead, "leased": leased, "seconds": time.perf_counter() - start,
            "dead_seconds": dead_s, "dead_since_ms": dead_since_ms or server_ms(client)}


def script_stats(client: Any) -> tuple[int, int, int]:
    """EVALSHA calls, their server µs, and the commands the scripts ran, since the last
    CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    inner = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config"))
    return evalsha["calls"], evalsha["usec"], inner


def one_search(q: Queue, complete: bool, count: int, scan_most: int | None, filt: dict[str, Any],
               each: Callable[[], None] | None = None) -> tuple[int, int]:
    """A first page of ``count`` (``Queue.search`` goes on until it has them), or every
    page to the end; ``scan_most=1``: one script call per ``Queue.search``, ``each``
    called after it. Returns the jobs found and examined."""
    cursor, found, examined = "", 0, 0
    extra: dict[str, Any] = {} if scan_most is None else {"scan_most": scan_most}
    while True:
        page = q.search(cursor=cursor, count=count if complete else count - found, **extra, **filt)
        found, examined, cursor = found + len(page.jobs), examined + page.examined, page.cursor
        if each is not None:
            each()
        if not cursor or (not complete and found >= count):
            return found, examined


def searches(client: Any, q: Queue, label: str, complete: bool, count: int, repetitions: int,
             filt: dict[str, Any]) -> dict[str, Any]:
    # First (it also loads the script): one script call per Queue.search, each timed alone.
    longest = [0]

    def note() -> None:
        longest[0] = max(longest[0], script_stats(client)[1])
        client.config_resetstat()

    client.config_resetstat()
    one_search(q, complete, count, 1, filt, note)
    walls, server = [], []
    budget = time.monotonic() + 60.0  # at most a minute of repetitions per search
    for _ in range(repetitions):
        client.config_resetstat()
        t0 = time.perf_counter()
        found, examined = one_search(q, complete, count, None, filt)
        walls.append(time.perf_counter() - t0)
        calls, usec, commands = script_stats(client)
        server.append(usec / 1000)
        if time.monotonic() > budget:
            break
    return {"label": label, "wall_ms": statistics.median(walls) * 1000, "runs": len(walls), "found": found,
            "examined": examined, "calls": calls, "commands": commands, "server_ms": statistics.median(server),
            "longest_ms": longest[0] / 1000}


def search_bench(client: Any, n: int, repetitions: int, max_fill_s: float) -> None:
    q = Queue(f"bench-search-{uuid.uuid4().hex[:8]}", client)
    q.set_indexes(True)
    before = used_memory(client)
    f = fill(client, q, n, max_fill_s)
    after = used_memory(client)
    index_bytes = client.memory_usage(q.spec.keys.index, samples=0) or 0
    keyed_bytes = client.memory_usage(q.spec.keys.keyed, samples=0) or 0
    st = q.stats()
    jobs = f["jobs"]
    print(f"\n2. search: filled {jobs} jobs in {f['seconds']:.1f} s ({jobs / f['seconds']:.0f} jobs/s; the "
          f"{f['dead']} dead, leased and nacked, took {f['dead_seconds']:.1f} s), {f['leased']} leased"
          + ("" if jobs == n else f" (stopped at --max-fill-s {max_fill_s:.0f}: {jobs} of {n})"))
    print(f"   queue: ready {st.ready}, scheduled {st.scheduled}, leased {st.leased}, dead {st.dead}; "
          f"{len(TASKS)} tasks in turn, {len(GROUPS)} groups at random")
    print(f"   used_memory {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB: "
          f"{(after - before) / jobs:.0f} bytes/job")
    print(f"   MEMORY USAGE index {index_bytes / 2**20:.1f} MiB ({index_bytes / jobs:.0f} bytes/job, 2 members a job), "
          f"keyed {keyed_bytes / 2**20:.1f} MiB ({keyed_bytes / jobs:.0f} bytes/job): the index "
          f"{(index_bytes + keyed_bytes) / jobs:.0f} bytes/job, "
          f"{(index_bytes + keyed_bytes) / max(after - before, 1):.0%} of the queue's memory")

    task, group = TASKS[3], GROUPS[42]
    since = f["dead_since_ms"]
    plan = [
        (f"task={task}, first page of 100", False, 100, {"task": task}),
        (f"task={task}, first page of 1", False, 1, {"task": task}),
        (f"task={task}, state=ready, first page of 100", False, 100, {"task": task, "state": "ready"}),
        (f"group={group}, complete", True, PAGE, {"group": group}),
        (f"group={group}, state=dead, complete", True, PAGE, {"group": group, "state": "dead"}),
        ("state=dead, error=TimeoutError, since (half the deaths), complete", True, PAGE,
         {"state": "dead", "error": "TimeoutError", "since_ms": since}),
        (f"state=dead, task={task}, error=ValueError, complete", True, PAGE,
         {"state": "dead", "task": task, "error": "ValueError"}),
        ("state=ready (no index), first page of 100", False, 100, {"state": "ready"}),
        ("state=scheduled (no index), first page of 100", False, 100, {"state": "scheduled"}),
        ("no filter (HSCAN of jobs), first page of 100", False, 100, {}),
    ]
    rows = [searches(client, q, label, complete, count, repetitions, filt) for label, complete, count, filt in plan]
    print(f"\n{f'search (median of up to {repetitions} runs)':64} {'wall ms':>8}  {'found':>6}  {'examined':>8}  "
          "calls  commands  server ms  longest call ms")
    for r in rows:
        print(f"{r['label']:64} {r['wall_ms']:8.1f}  {r['found']:6}  {r['examined']:8}  {r['calls']:5}  "
              f"{r['commands']:8}  {r['server_ms']:9.1f}  {r['longest_ms']:15.2f}")
    drop(client, f"pq:{{{q.name}}}:*")


def run(url: str, args: argparse.Namespace) -> None:
    client = _server.client_for(url)
    print(f"redis-server {client.info('server')['redis_version']}, {time.strftime('%Y-%m-%d')}")
    costs(client, args.calls, args.repetitions)
    search_bench(client, args.jobs, args.repetitions, args.max_fill_s)


if __name__ == "__main__":
    main()
