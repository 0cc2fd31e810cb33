"""pyperf microbenchmarks: one state transition of pyqueue per benchmark, plus the raw
limits of the same server measured with bare redis-py and no queue logic.

Every figure is client-observed wall time per loop iteration (one call, unless the
benchmark's docstring says otherwise), over a loopback TCP connection to a real
redis-server. Setup (filling the queue, leasing the jobs a benchmark acks...) runs
before the clock starts; cleanup after it stops.

Run (starts and stops its own redis-server on a free 127.0.0.1 port)::

    python bench/bench_transitions.py --fast -o bench/results/transitions.json

or against a running loopback server: ``--redis-url redis://127.0.0.1:PORT/0``.
The parent process starts the server once; pyperf's worker processes receive its URL
through ``add_cmdline_args`` and never start one themselves.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
import uuid
from collections.abc import Callable

import _server

_server.use_checkout()

import pyperf  # type: ignore[import-untyped]  # noqa: E402  (pyperf ships no type hints)
import redis  # noqa: E402

from pyqueue import Job, NewJob, Queue, connect  # noqa: E402
from pyqueue.drivers.scripts import SCRIPT_KEYS, lua_source  # noqa: E402
from pyqueue.drivers.queue import transport_of

#: Every job carries this payload: small, fixed, so the figures are about the queue.
PAYLOAD = b"p" * 64
#: Leases in benchmarks that ack later never expire while the benchmark runs.
LONG_LEASE_MS = 3_600_000
#: Setup enqueues and leases in batches of this size (the scripts' MAX_BATCH).
SETUP_BATCH = 1000
#: The event stream bound of the *_events benchmarks (Queue.set_events).
EVENTS_BOUND = 10_000

TimeFunc = Callable[[int, str], float]

_raw_clients: dict[str, redis.Redis] = {}
_pyqueue_clients: dict[str, redis.Redis] = {}
_queue_seq = itertools.count()


def raw_client(url: str) -> redis.Redis:
    """The worker's bare redis-py client (one per process; connected outside timings)."""
    if url not in _raw_clients:
        _raw_clients[url] = _server.client_for(url)
        _raw_clients[url].ping()
    return _raw_clients[url]


def pyqueue_client(url: str) -> redis.Redis:
    """The worker's ``pyqueue.connect`` client: the settings applications use."""
    if url not in _pyqueue_clients:
        _pyqueue_clients[url] = connect(url)
        _pyqueue_clients[url].ping()
    return _pyqueue_clients[url]


def fresh_queue(url: str, label: str) -> Queue:
    """An empty queue with a name no other run uses, its scripts already loaded.

    Scripts are loaded here because redis-py sends EVALSHA first and SCRIPT LOAD only
    on NOSCRIPT: the first call of each script would otherwise pay two extra round
    trips inside the timed region.
    """
    client = pyqueue_client(url)
    for name in SCRIPT_KEYS:
        client.script_load(lua_source(name))
    return Queue(f"bench-{label}-{os.getpid()}-{next(_queue_seq)}", client)


def drop(queue: Queue) -> None:
    """Delete every key of ``queue`` (UNLINK: freed in the background, not in a timing)."""
    transport_of(queue).client.unlink(*queue.spec.keys.all())


def fill(queue: Queue, jobs: int, *, delay_ms: int = 0) -> None:
    """Enqueue ``jobs`` jobs in batches (setup only)."""
    for start in range(0, jobs, SETUP_BATCH):
        size = min(SETUP_BATCH, jobs - start)
        queue.enqueue_many([NewJob(PAYLOAD, delay_ms=delay_ms)] * size)


def lease_all(queue: Queue, jobs: int) -> list[Job]:
    """Lease ``jobs`` ready jobs in batches with a long lease (setup only)."""
    leased: list[Job] = []
    while len(leased) < jobs:
        batch = queue.lease(LONG_LEASE_MS, count=min(SETUP_BATCH, jobs - len(leased)))
        if not batch:
            raise RuntimeError(f"expected {jobs} ready jobs, leased {len(leased)}")
        leased += batch
    return leased


# -- raw limits: bare redis-py, no queue logic ---------------------------------------------


def bench_raw_lpush(loops: int, url: str) -> float:
    """Raw limit: LPUSH of one 64-byte item per call (the floor of a logic-free enqueue)."""
    client = raw_client(url)
    key = f"bench-raw-lpush-{os.getpid()}-{next(_queue_seq)}"
    lpush = client.lpush
    t0 = time.perf_counter()
    for _ in range(loops):
        lpush(key, PAYLOAD)
    elapsed = time.perf_counter() - t0
    client.unlink(key)
    return elapsed


def bench_raw_lmove_lrem(loops: int, url: str) -> float:
    """Raw limit: per item, LMOVE ready->processing then LREM it from processing (the
    classic reliable-queue pattern: 2 round trips per item, like lease + ack)."""
    client = raw_client(url)
    tag = f"{os.getpid()}-{next(_queue_seq)}"
    src, processing = f"bench-raw-src-{tag}", f"bench-raw-proc-{tag}"
    for start in range(0, loops, SETUP_BATCH):
        client.rpush(src, *[b"%d:" % i + PAYLOAD for i in range(start, min(loops, start + SETUP_BATCH))])
    lmove, lrem = client.lmove, client.lrem
    t0 = time.perf_counter()
    for _ in range(loops):
        item = lmove(src, processing, "LEFT", "RIGHT")
        lrem(processing, 1, item)  # type: ignore[arg-type]  # redis-py types values as str; bytes work
    elapsed = time.perf_counter() - t0
    client.unlink(src, processing)
    return elapsed


def bench_raw_evalsha_return1(loops: int, url: str) -> float:
    """Raw limit: EVALSHA of ``return 1``, one call per round trip (the floor of any
    one-script call: the round trip plus script dispatch, with no work in it)."""
    client = raw_client(url)
    sha = client.script_load("return 1")
    evalsha = client.evalsha
    t0 = time.perf_counter()
    for _ in range(loops):
        evalsha(sha, 0)
    return time.perf_counter() - t0


def bench_raw_evalsha_return1_pipelined_x100(loops: int, url: str) -> float:
    """Raw limit: 100 EVALSHA ``return 1`` calls pipelined in one round trip; time per
    round trip (the floor of sending 100 items per round trip through scripts)."""
    client = raw_client(url)
    sha = client.script_load("return 1")
    t0 = time.perf_counter()
    for _ in range(loops):
        pipe = client.pipeline(transaction=False)
        for _ in range(100):
            pipe.evalsha(sha, 0)
        pipe.execute()
    return time.perf_counter() - t0


def bench_bare_enqueue_script(loops: int, url: str) -> float:
    """Decomposition (no target): EVALSHA of lua/enqueue.lua for one job through bare
    redis-py, ids and arguments built before the clock starts. ``enqueue`` minus this is
    pyqueue's Python layer; this minus raw_evalsha_return1 is script work plus the
    encoding of 10 keys and 8 arguments."""
    client = raw_client(url)
    queue = fresh_queue(url, "bare-enqueue")
    sha = client.script_load(lua_source("enqueue"))
    keys = [queue.spec.keys.role(role) for role in SCRIPT_KEYS["enqueue"]]
    ids = [uuid.uuid4().hex for _ in range(loops)]
    evalsha = client.evalsha
    t0 = time.perf_counter()
    for job_id in ids:
        # ARGV as Scripts.enqueue sends it (contract v3): now_ms '' (server clock), n, then
        # id, payload, delay, max_attempts, priority '' and group '' per job
        evalsha(sha, len(keys), *keys, "", 1, job_id, PAYLOAD, 0, 5, "", "")
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


# -- pyqueue transitions ----------------------------------------------------------------------


def bench_enqueue(loops: int, url: str, events_bound: int = 0) -> float:
    """Queue.enqueue: one 64-byte job per call (lua/enqueue.lua, n = 1)."""
    queue = fresh_queue(url, "enqueue-events" if events_bound else "enqueue")
    if events_bound:
        queue.set_events(events_bound)
    enqueue = queue.enqueue
    t0 = time.perf_counter()
    for _ in range(loops):
        enqueue(PAYLOAD)
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_enqueue_events(loops: int, url: str) -> float:
    """Queue.enqueue as ``enqueue``, on a queue opted in to its event stream
    (Queue.set_events(10000)): the cost of writing the 'enqueued' event."""
    return bench_enqueue(loops, url, EVENTS_BOUND)


def bench_enqueue_many_x100(loops: int, url: str) -> float:
    """Queue.enqueue_many: 100 jobs per call; time per call (lua/enqueue.lua, n = 100)."""
    queue = fresh_queue(url, "enqueue-many")
    batch = [PAYLOAD] * 100
    enqueue_many = queue.enqueue_many
    t0 = time.perf_counter()
    for _ in range(loops):
        enqueue_many(batch)
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_lease_ack(loops: int, url: str) -> float:
    """Queue.lease (count 1) then Queue.ack of that job: 2 calls per iteration, with a
    backlog of ``loops`` ready jobs (lua/lease.lua + lua/ack.lua)."""
    queue = fresh_queue(url, "lease-ack")
    fill(queue, loops)
    lease, ack = queue.lease, queue.ack
    t0 = time.perf_counter()
    for _ in range(loops):
        (job,) = lease(LONG_LEASE_MS)
        ack(job)
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_ack_and_lease(loops: int, url: str, events_bound: int = 0) -> float:
    """Queue.ack_and_lease in steady state: each call acks the job leased by the
    previous one and leases the next, with a backlog of ready jobs (lua/lease.lua with
    one receipt); time per call = per job."""
    queue = fresh_queue(url, "ack-and-lease-events" if events_bound else "ack-and-lease")
    fill(queue, loops + 1)
    if events_bound:  # after the fill: the backlog's own events are not timed
        queue.set_events(events_bound)
    (job,) = queue.lease(LONG_LEASE_MS)
    ack_and_lease = queue.ack_and_lease
    t0 = time.perf_counter()
    for _ in range(loops):
        _outcome, (job,) = ack_and_lease(job, lease_ms=LONG_LEASE_MS)
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_ack_and_lease_events(loops: int, url: str) -> float:
    """Queue.ack_and_lease as ``ack_and_lease``, on a queue opted in to its event stream
    (Queue.set_events(10000)): the cost of writing the 'acked' and 'leased' events."""
    return bench_ack_and_lease(loops, url, EVENTS_BOUND)


def bench_nack(loops: int, url: str) -> float:
    """Queue.nack of a current lease (attempt 1 of 5: the job is rescheduled with
    backoff, lua/nack.lua); ``loops`` leases are taken before the clock starts."""
    queue = fresh_queue(url, "nack")
    fill(queue, loops)
    jobs = lease_all(queue, loops)
    nack = queue.nack
    t0 = time.perf_counter()
    for job in jobs:
        nack(job, "benchmark failure")
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_extend_x10(loops: int, url: str) -> float:
    """Queue.extend of a batch of 10 current leases per call (lua/extend.lua, r = 10)."""
    queue = fresh_queue(url, "extend")
    fill(queue, 10)
    jobs = lease_all(queue, 10)
    extend = queue.extend
    t0 = time.perf_counter()
    for _ in range(loops):
        extend(jobs, LONG_LEASE_MS)
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_promote_x10(loops: int, url: str) -> float:
    """Queue.promote(limit=10) with at least 10 due scheduled jobs per call: every call
    moves 10 jobs SCHEDULED -> READY (lua/promote.lua)."""
    queue = fresh_queue(url, "promote")
    fill(queue, loops * 10, delay_ms=1)
    time.sleep(0.005)  # let the 1 ms delays pass on the server clock
    promote = queue.promote
    t0 = time.perf_counter()
    for _ in range(loops):
        promote(10)
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_promote_idle(loops: int, url: str) -> float:
    """Queue.promote with nothing due (the periodic maintenance call of an idle queue:
    1000 ready jobs, no scheduled job, no lease)."""
    queue = fresh_queue(url, "promote-idle")
    fill(queue, 1000)
    promote = queue.promote
    t0 = time.perf_counter()
    for _ in range(loops):
        promote()
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_progress(loops: int, url: str) -> float:
    """Queue.progress of a 20-byte JSON value, by 20 running jobs in turn (lua/progress.lua):
    every call's trim looks at 11 entries of running jobs and moves them, the most it
    does (an ended job's entry is deleted instead, which costs about the same)."""
    queue = fresh_queue(url, "progress")
    fill(queue, 20)
    jobs = lease_all(queue, 20)
    progress, value = queue.progress, b'{"done":40,"of":100}'
    for job in jobs:
        progress(job, value)
    t0 = time.perf_counter()
    for i in range(loops):
        progress(jobs[i % 20], value)
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


def bench_stats(loops: int, url: str) -> float:
    """Queue.stats on a queue with 1000 ready, 100 leased and 100 scheduled jobs
    (lua/stats.lua: counts, lag and counters in one read-only call)."""
    queue = fresh_queue(url, "stats")
    fill(queue, 1100)
    fill(queue, 100, delay_ms=LONG_LEASE_MS)
    lease_all(queue, 100)
    stats = queue.stats
    t0 = time.perf_counter()
    for _ in range(loops):
        stats()
    elapsed = time.perf_counter() - t0
    drop(queue)
    return elapsed


#: (pyperf name, time function). The raw limits run first so a reader of the pyperf
#: output sees the floor before the figures measured against it.
BENCHMARKS: list[tuple[str, TimeFunc]] = [
    ("raw_lpush", bench_raw_lpush),
    ("raw_lmove_lrem", bench_raw_lmove_lrem),
    ("raw_evalsha_return1", bench_raw_evalsha_return1),
    ("raw_evalsha_return1_pipelined_x100", bench_raw_evalsha_return1_pipelined_x100),
    ("bare_enqueue_script", bench_bare_enqueue_script),
    ("enqueue", bench_enqueue),
    ("enqueue_events", bench_enqueue_events),
    ("enqueue_many_x100", bench_enqueue_many_x100),
    ("lease_ack", bench_lease_ack),
    ("ack_and_lease", bench_ack_and_lease),
    ("ack_and_lease_events", bench_ack_and_lease_events),
    ("nack", bench_nack),
    ("extend_x10", bench_extend_x10),
    ("promote_x10", bench_promote_x10),
    ("promote_idle", bench_promote_idle),
    ("progress", bench_progress),
    ("stats", bench_stats),
]


def _forward_args(cmd: list[str], args: argparse.Namespace) -> None:
    """pyperf hook: give each worker process the parent's server URL."""
    cmd.extend(("--redis-url", args.redis_url))


def main() -> None:
    runner = pyperf.Runner(add_cmdline_args=_forward_args)
    _server.add_server_arguments(runner.argparser)
    runner.metadata["payload_bytes"] = len(PAYLOAD)
    args = runner.parse_args()

    server: _server.LoopbackRedis | None = None
    if args.redis_url is None:
        if args.worker:
            raise SystemExit("a pyperf worker needs --redis-url (the parent passes it)")
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
    _server.require_loopback(args.redis_url)
    try:
        for name, func in BENCHMARKS:
            description = " ".join((func.__doc__ or name).split("\n\n")[0].split())
            runner.bench_time_func(name, func, args.redis_url, metadata={"description": description})
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
