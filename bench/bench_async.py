"""The asyncio driver, the async worker, group commit and coalesced enqueues, against a
real redis-server, each figure beside the raw limit and the sync figure of the same run.

Figures (fresh keyspace per phase, every load bounded in count):

* enqueue: jobs/s and EVALSHA calls (round trips) per job, for
  - sync ``Queue.enqueue``, one thread, one job per call;
  - async ``AsyncQueue.enqueue``, one task, one at a time;
  - async, ``--tasks`` concurrent tasks, with coalesced enqueues (the default) and
    without;
  - the raw limits: ``EVALSHA`` of ``return 1`` one per round trip (sync redis-py and
    redis.asyncio), and from ``--tasks`` concurrent tasks (redis.asyncio).
* drain: one ``pyqueue worker`` process with a no-op handler from the first lease to
  the last ack of ``--jobs`` jobs enqueued beforehand: the sync handler at concurrency 1
  and 8, the ``async def`` handler (AsyncWorker) at 1 and 50; with group commit (always
  on), reported with its mean batch (acks per lease call); the raw limit is the batched
  drain of the same server (LMOVE x100 then LREM x100, pipelined, bare redis-py).
* Redis CPU per job over the whole lifecycle (INFO cpu: used_cpu_sys + used_cpu_user,
  growth over the phase, divided by its jobs), one-at-a-time (sync enqueue one per call,
  drain at concurrency 1) and batched (coalesced enqueues from ``--tasks`` tasks, drain
  with group commit at concurrency 8 and 50), plus the raw reference (LPUSH + LMOVE +
  LREM per item, one per round trip).

Run::

    python bench/bench_async.py [--jobs 20000] [--tasks 100] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

from pyqueue import NewJob, Queue  # noqa: E402
from pyqueue.aio import AsyncQueue, check_partitions, connect  # noqa: E402
from bench_worker import spawn, stop  # noqa: E402


def cpu_us(client: redis.Redis) -> float:
    info = client.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


def evalsha_calls(client: redis.Redis) -> int:
    stat = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stat.get("calls", 0))


class Phase:
    """Server CPU and EVALSHA calls over one phase (the admin client's own INFO calls
    are a few per phase and not counted as jobs' work)."""

    def __init__(self, admin: redis.Redis) -> None:
        self.admin = admin

    def __enter__(self) -> Phase:
        self.cpu0, self.calls0, self.t0 = cpu_us(self.admin), evalsha_calls(self.admin), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.cpu = cpu_us(self.admin) - self.cpu0
        self.calls = evalsha_calls(self.admin) - self.calls0

    def report(self, jobs: int, **extra: Any) -> dict[str, Any]:
        return {
            "jobs": jobs, "jobs_per_s": round(jobs / self.seconds), "evalsha_per_job": round(self.calls / jobs, 3),
            "redis_cpu_us_per_job": round(self.cpu / jobs, 1), **extra,
        }


# -- enqueue -----------------------------------------------------------------------------


def enqueue_sync(url: str, admin: redis.Redis, jobs: int) -> dict[str, Any]:
    admin.flushall()
    q = Queue("e", redis.Redis.from_url(url))
    with Phase(admin) as phase:
        for _ in range(jobs):
            q.enqueue(b"")
    return phase.report(jobs)


async def _enqueue_async(url: str, tasks: int, per_task: int, coalesce: bool) -> None:
    client = connect(url)
    q = AsyncQueue("e", client, coalesce_enqueues=coalesce)
    await check_partitions(q)

    async def producer() -> None:
        for _ in range(per_task):
            await q.enqueue(b"")

    await asyncio.gather(*(producer() for _ in range(tasks)))
    await client.aclose()


def enqueue_async(url: str, admin: redis.Redis, tasks: int, jobs: int, coalesce: bool = True) -> dict[str, Any]:
    admin.flushall()
    per_task = jobs // tasks
    with Phase(admin) as phase:
        asyncio.run(_enqueue_async(url, tasks, per_task, coalesce))
    return phase.report(per_task * tasks, tasks=tasks, coalesce=coalesce)


def raw_evalsha_sync(url: str, admin: redis.Redis, calls: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    sha = client.script_load("return 1")
    with Phase(admin) as phase:
        for _ in range(calls):
            client.evalsha(sha, 0)
    return phase.report(calls)


async def _raw_evalsha_async(url: str, tasks: int, per_task: int) -> None:
    client = redis.asyncio.Redis.from_url(url, max_connections=tasks + 1)
    sha = await client.script_load("return 1")

    async def caller() -> None:
        for _ in range(per_task):
            await client.evalsha(sha, 0)

    await asyncio.gather(*(caller() for _ in range(tasks)))
    await client.aclose()


def raw_evalsha_async(url: str, admin: redis.Redis, tasks: int, calls: int) -> dict[str, Any]:
    per_task = calls // tasks
    with Phase(admin) as phase:
        asyncio.run(_raw_evalsha_async(url, tasks, per_task))
    return phase.report(per_task * tasks, tasks=tasks)


# -- drain -------------------------------------------------------------------------------


def drain(url: str, admin: redis.Redis, handler: str, jobs: int, concurrency: int) -> dict[str, Any]:
    admin.flushall()
    q = Queue("drain", admin)
    for i in range(0, jobs, 1000):
        q.enqueue_many([b""] * min(1000, jobs - i))
    lease_calls0 = 0
    proc = spawn(url, handler, "drain", "--concurrency", str(concurrency), "--burst")
    try:
        while q.stats().leased_total == 0:
            time.sleep(0.001)
        with Phase(admin) as phase:
            lease_calls0 = phase.calls0
            while q.stats().acked < jobs:
                if time.perf_counter() - phase.t0 > 300:
                    raise RuntimeError("drain did not finish in 300 s")
                time.sleep(0.005)
        proc.wait(60)
    finally:
        stop(proc)
    del lease_calls0
    # stats() calls of this loop are EVALSHA too: count them out (one per poll).
    return phase.report(jobs, handler=handler, concurrency=concurrency)


def raw_batched_drain(admin: redis.Redis, jobs: int) -> dict[str, Any]:
    admin.flushall()
    for i in range(0, jobs, 1000):
        admin.lpush("raw:ready", *[b"x%d" % n for n in range(i, min(jobs, i + 1000))])
    with Phase(admin) as phase:
        left = jobs
        while left:
            n = min(100, left)
            pipe = admin.pipeline(transaction=False)
            for _ in range(n):
                pipe.lmove("raw:ready", "raw:processing", "RIGHT", "LEFT")
            items = pipe.execute()
            pipe = admin.pipeline(transaction=False)
            for item in items:
                pipe.lrem("raw:processing", 1, item)
            pipe.execute()
            left -= n
    return phase.report(jobs)


def raw_lifecycle(admin: redis.Redis, jobs: int) -> dict[str, Any]:
    """What dramatiq-like bare commands cost the server per item: LPUSH, LMOVE, LREM,
    one command per round trip."""
    admin.flushall()
    with Phase(admin) as phase:
        for n in range(jobs):
            admin.lpush("raw:ready", b"x%d" % n)
        for _ in range(jobs):
            item = admin.lmove("raw:ready", "raw:processing", "RIGHT", "LEFT")
            admin.lrem("raw:processing", 1, item)
    return phase.report(jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per drain")
    parser.add_argument("--enqueues", type=int, default=10000, help="jobs per enqueue measurement")
    parser.add_argument("--tasks", type=int, default=100, help="concurrent producer tasks")
    parser.add_argument("--json-out", help="write the results here")
    args = parser.parse_args()
    server = None
    if args.redis_url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
    _server.require_loopback(args.redis_url)
    admin = redis.Redis.from_url(args.redis_url)
    url, n, jobs = args.redis_url, args.enqueues, args.jobs
    try:
        report: dict[str, Any] = {
            "enqueue": {
                "raw_evalsha_sync": raw_evalsha_sync(url, admin, n),
                "raw_evalsha_async_1": raw_evalsha_async(url, admin, 1, n),
                f"raw_evalsha_async_{args.tasks}": raw_evalsha_async(url, admin, args.tasks, n),
                "sync_1": enqueue_sync(url, admin, n),
                "async_1": enqueue_async(url, admin, 1, n),
                "async_1_not_coalesced": enqueue_async(url, admin, 1, n, False),
                f"async_{args.tasks}_coalesced": enqueue_async(url, admin, args.tasks, n, True),
                f"async_{args.tasks}_not_coalesced": enqueue_async(url, admin, args.tasks, n, False),
            },
            "drain": {
                "raw_batched_lmove_lrem_x100": raw_batched_drain(admin, jobs),
                "sync_c1": drain(url, admin, "noop", jobs, 1),
                "sync_c8": drain(url, admin, "noop", jobs, 8),
                "async_c1": drain(url, admin, "noop_async", jobs, 1),
                "async_c50": drain(url, admin, "noop_async", jobs, 50),
            },
            "raw_lifecycle": raw_lifecycle(admin, n),
        }
    finally:
        if server is not None:
            server.stop()
    e, d = report["enqueue"], report["drain"]
    report["ratios"] = {
        "async_tasks_vs_one_task_enqueue": round(e[f"async_{args.tasks}_coalesced"]["jobs_per_s"] / e["async_1"]["jobs_per_s"], 2),
        "sync_c8_vs_c1_drain": round(d["sync_c8"]["jobs_per_s"] / d["sync_c1"]["jobs_per_s"], 2),
        "async_c50_vs_c1_drain": round(d["async_c50"]["jobs_per_s"] / d["async_c1"]["jobs_per_s"], 2),
        "sync_c8_share_of_raw_batched_drain": round(d["sync_c8"]["jobs_per_s"] / d["raw_batched_lmove_lrem_x100"]["jobs_per_s"], 3),
        "async_c50_share_of_raw_batched_drain": round(d["async_c50"]["jobs_per_s"] / d["raw_batched_lmove_lrem_x100"]["jobs_per_s"], 3),
        "lifecycle_cpu_us_one_at_a_time": round(e["sync_1"]["redis_cpu_us_per_job"] + d["sync_c1"]["redis_cpu_us_per_job"], 1),
        "lifecycle_cpu_us_batched_c8": round(e[f"async_{args.tasks}_coalesced"]["redis_cpu_us_per_job"] + d["sync_c8"]["redis_cpu_us_per_job"], 1),
        "lifecycle_cpu_us_batched_c50": round(e[f"async_{args.tasks}_coalesced"]["redis_cpu_us_per_job"] + d["async_c50"]["redis_cpu_us_per_job"], 1),
        "raw_lifecycle_cpu_us": report["raw_lifecycle"]["redis_cpu_us_per_job"],
    }
    text = json.dumps(report, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
