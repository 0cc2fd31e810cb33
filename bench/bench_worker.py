"""Worker benchmarks: what a `pyqueue worker` process does against a real redis-server.

Figures (each a separate phase, with a fresh keyspace):

* latency: enqueue -> handler start with an idle worker (blocked on its wake marker),
  p50/p99 over `--samples` jobs sent one at a time with idle gaps in between. Both
  timestamps are this host's wall clock (``time.time_ns``) taken in two processes.
  Measured twice: the worker serving one queue, and serving `--many-queues` queues
  with every job in the last (lowest-priority) one, the others empty.
* lateness: delayed jobs (random delays) -> how late each handler starts after its
  due time, on the Redis server's clock (the handler reads TIME; the due time is the
  job record's).
* recovery: a worker holding leases is SIGKILLed; time until those jobs run in another
  worker, split into "until its registration expired" and "from expiry to running
  elsewhere" (the scrub interval is the live worker's renewal period).
* idle: commands per second one idle worker sends (INFO commandstats over a window,
  counting EVALSHA as one command, and also with the commands run inside Lua).
* drain: jobs/s for one `pyqueue worker` process with a no-op handler, at concurrency 1
  and 8, from the first lease to the last ack of N jobs enqueued beforehand.
* processes: the same drain with `--processes 1` and `--processes 2` (concurrency 8
  each, under the supervisor; `--prefetch P` for each child), with the Redis server's CPU time (INFO cpu) per job and
  its share of one core: the scaling from one process to two, and its projection to
  more cores (Redis, one core, is the bound: 1e6 / its µs per job).
* supervised recovery: under `--processes 2`, a child holding 4 leases (600 s long) is
  SIGKILLed; time until those jobs run in the other child (the supervisor scrubs the
  dead child's leases as soon as it reaps it, instead of waiting for the registration
  to expire as in "recovery").

Worker processes run ``bench/worker_handlers.py`` handlers. Every load is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402

from pyqueue import NewJob, Queue  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def spawn(
    url: str, handler: str, queues: str | Sequence[str], *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A `pyqueue worker` process serving ``queues`` (highest priority first) with
    ``worker_handlers:<handler>``."""
    served = [queues] if isinstance(queues, str) else list(queues)
    full_env = dict(os.environ, PYTHONPATH=f"{BENCH_DIR}{os.pathsep}{_server.REPO_ROOT}", BENCH_URL=url, **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "pyqueue", "--url", url, "--namespace", "bench", "worker",
         f"worker_handlers:{handler}", *[arg for name in served for arg in ("-q", name)], *extra],
        env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_registered(client: redis.Redis, count: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while client.llen("pq:{bench}:service:ids") < count:
        if time.monotonic() > deadline:
            raise RuntimeError("worker did not register")
        time.sleep(0.01)


def bench_latency(url: str, samples: int, queues: int = 1) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    names = [f"lat{i}" for i in range(queues - 1)] + ["lat"]  # the job's queue comes last
    q = Queue("lat", client)
    proc = spawn(url, "stamp", names, "--block-ms", "10000")
    try:
        wait_registered(client, 1)
        time.sleep(0.5)
        latencies_us = []
        for i in range(samples):
            time.sleep(random.uniform(0.01, 0.03))  # idle: the worker is blocked again
            sent_ns = time.time_ns()
            q.enqueue(b"", job_id=f"l{i}")
            _key, started = client.blpop(["bench:{stamps}"], timeout=10) or (None, None)
            if started is None:
                raise RuntimeError("handler did not start within 10 s")
            latencies_us.append((int(started) - sent_ns) / 1000)
    finally:
        stop(proc)
    return {"queues": queues, "samples": samples, "p50_us": percentile(latencies_us, 50),
            "p99_us": percentile(latencies_us, 99), "max_us": max(latencies_us), "mean_us": statistics.fmean(latencies_us)}


def bench_lateness(url: str, samples: int) -> dict[str, Any]:
    client: Any = redis.Redis.from_url(url)  # redis-py's reply types are too loose to help here
    client.flushall()
    q = Queue("late", client)
    proc = spawn(url, "server_stamp", "late", "--block-ms", "10000")
    try:
        wait_registered(client, 1)
        time.sleep(0.5)
        q.enqueue_many([NewJob(b"", job_id=f"d{i}", delay_ms=random.randint(100, 3000)) for i in range(samples)])
        due = {}
        for job_id, record in client.hgetall(q.spec.keys.jobs).items():
            due[job_id.decode()] = int(record.split(b"|", 3)[2])
        lateness_ms = []
        for _ in range(samples):
            item = client.blpop(["bench:{stamps}"], timeout=10)
            if item is None:
                raise RuntimeError("a delayed job did not start")
            job_id, started_ms = item[1].decode().split(" ")
            lateness_ms.append(int(started_ms) - due[job_id])
    finally:
        stop(proc)
    return {"samples": samples, "p50_ms": percentile(lateness_ms, 50), "p99_ms": percentile(lateness_ms, 99),
            "max_ms": max(lateness_ms), "early": sum(1 for x in lateness_ms if x < 0)}


def bench_recovery(url: str, trials: int, renew_ms: int, expire_ms: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    results = []
    for _ in range(trials):
        client.flushall()
        q = Queue("rec", client)
        q.enqueue_many([NewJob(b"", job_id=f"r{i}") for i in range(4)])
        timing = ["--renew-ms", str(renew_ms), "--expire-ms", str(expire_ms), "--lease-ms", "600000"]
        victim = spawn(url, "hold", "rec", "--concurrency", "4", *timing, env={"BENCH_HOLD_S": "600"})
        try:
            deadline = time.monotonic() + 20
            while client.llen("bench:{started}") < 4:
                if time.monotonic() > deadline:
                    raise RuntimeError("victim did not start four jobs")
                time.sleep(0.005)
            service_key = client.keys("pq:{bench}:service:[0-9]*")[0]
            victim.kill()
            killed_ns = time.time_ns()
            victim.wait()
            rescuer = spawn(url, "stamp", "rec", "--concurrency", "4", *timing)
            try:
                expired_ns = 0
                stamps: list[int] = []
                while len(stamps) < 4:
                    if not expired_ns and not client.exists(service_key):
                        expired_ns = time.time_ns()
                    item = client.blpop(["bench:{stamps}"], timeout=0.01)
                    if item is not None:
                        stamps.append(int(item[1]))
                    if time.time_ns() - killed_ns > 120e9:
                        raise RuntimeError("jobs not recovered within 120 s")
                first_ns = min(stamps)
                results.append({"kill_to_running_s": (first_ns - killed_ns) / 1e9,
                                "kill_to_expiry_s": (expired_ns - killed_ns) / 1e9 if expired_ns else None,
                                "expiry_to_running_s": (first_ns - expired_ns) / 1e9 if expired_ns else None})
            finally:
                stop(rescuer)
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait()
    return {"trials": trials, "renew_ms": renew_ms, "expire_ms": expire_ms, "lease_ms": 600000,
            "kill_to_running_s": [r["kill_to_running_s"] for r in results],
            "expiry_to_running_s": [r["expiry_to_running_s"] for r in results],
            "max_kill_to_running_s": max(float(r["kill_to_running_s"] or 0) for r in results),
            "max_expiry_to_running_s": max(float(r["expiry_to_running_s"] or 0) for r in results)}


def bench_idle(url: str, window_s: float) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    proc = spawn(url, "noop", "idle")  # defaults: block 10 s, renew 15 s
    try:
        wait_registered(client, 1)
        time.sleep(2)
        client.config_resetstat()
        time.sleep(window_s)
        stats = client.info("commandstats")
    finally:
        stop(proc)
    ours = {"cmdstat_config", "cmdstat_info"}
    calls = {k[8:]: v["calls"] for k, v in stats.items() if k not in ours}
    inside_lua = {"time", "hget", "hset", "pexpire", "zadd", "zscore", "type", "zrangebyscore", "zrange",
                  "lrange", "hmget", "zrangebylex", "llen", "zcount", "zmscore", "zremrangebyrank"}
    sent = {k: v for k, v in calls.items() if k not in inside_lua or k in ("evalsha",)}
    return {"window_s": window_s, "calls": calls, "sent_per_s": sum(sent.values()) / window_s,
            "all_per_s": sum(calls.values()) / window_s}


def bench_drain(url: str, jobs: int, concurrency: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    q = Queue("drain", client)
    for i in range(0, jobs, 1000):
        q.enqueue_many([b""] * min(1000, jobs - i))
    proc = spawn(url, "noop", "drain", "--concurrency", str(concurrency), "--burst")
    try:
        while q.stats().leased_total == 0:
            time.sleep(0.001)
        started = time.perf_counter()
        while q.stats().acked < jobs:
            if time.perf_counter() - started > 300:
                raise RuntimeError("drain did not finish in 300 s")
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        proc.wait(60)
    finally:
        stop(proc)
    return {"jobs": jobs, "concurrency": concurrency, "seconds": elapsed, "jobs_per_s": jobs / elapsed}


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def bench_processes(url: str, jobs: int, processes: int, concurrency: int = 8, prefetch: str = "auto") -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.flushall()
    q = Queue("drain", client)
    for i in range(0, jobs, 1000):
        q.enqueue_many([b""] * min(1000, jobs - i))
    proc = spawn(url, "noop", "drain", "--concurrency", str(concurrency), "--processes", str(processes),
                 "--prefetch", str(prefetch), "--burst")
    try:
        while q.stats().leased_total == 0:
            time.sleep(0.001)
        started, cpu0 = time.perf_counter(), redis_cpu_s(client)
        while q.stats().acked < jobs:
            if time.perf_counter() - started > 300:
                raise RuntimeError("drain did not finish in 300 s")
            time.sleep(0.005)
        elapsed, cpu = time.perf_counter() - started, redis_cpu_s(client) - cpu0
        proc.wait(60)
    finally:
        stop(proc)
    us_per_job = cpu / jobs * 1e6
    return {"jobs": jobs, "processes": processes, "concurrency": concurrency, "prefetch": prefetch, "seconds": elapsed,
            "jobs_per_s": jobs / elapsed, "redis_cpu_us_per_job": us_per_job, "redis_cpu_share": cpu / elapsed,
            "redis_bound_jobs_per_s": 1e6 / us_per_job}


def bench_supervised_recovery(url: str, trials: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    results = []
    for _ in range(trials):
        client.flushall()
        proc = spawn(url, "hold_first", "rec", "--concurrency", "4", "--processes", "2", "--lease-ms", "600000",
                     env={"BENCH_HOLD_S": "600"})
        try:
            wait_registered(client, 2)
            Queue("rec", client).enqueue_many([NewJob(b"", job_id=f"r{i}") for i in range(4)])
            deadline = time.monotonic() + 20
            while client.llen("bench:{started}") < 4:
                if time.monotonic() > deadline:
                    raise RuntimeError("the children did not start four jobs")
                time.sleep(0.005)
            holders = {int(x.split()[1]) for x in client.lrange("bench:{started}", 0, -1)}
            victim = max(holders, key=lambda pid: sum(
                int(x.split()[1]) == pid for x in client.lrange("bench:{started}", 0, -1)))
            held = sum(int(x.split()[1]) == victim for x in client.lrange("bench:{started}", 0, -1))
            os.kill(victim, signal.SIGKILL)
            killed_ns = time.time_ns()
            stamps: list[int] = []
            while len(stamps) < held:
                item = client.blpop(["bench:{stamps}"], timeout=0.01)
                if item is not None:
                    stamps.append(int(item[1]))
                if time.time_ns() - killed_ns > 60e9:
                    raise RuntimeError("jobs not recovered within 60 s")
            results.append({"held": held, "kill_to_running_s": (min(stamps) - killed_ns) / 1e9,
                            "kill_to_all_running_s": (max(stamps) - killed_ns) / 1e9})
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # drains: the held jobs are released after the grace
                proc.send_signal(signal.SIGTERM)  # second signal: kill the children and scrub
                proc.wait(30)
    return {"trials": trials, "lease_ms": 600000, "runs": results,
            "max_kill_to_all_running_s": max(r["kill_to_all_running_s"] for r in results)}


PHASES = ("latency", "latency_many_queues", "lateness", "recovery", "idle", "drain", "processes",
          "supervised_recovery")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--samples", type=int, default=500, help="latency samples")
    parser.add_argument("--many-queues", type=int, default=50, help="queues served in the second latency run")
    parser.add_argument("--delayed", type=int, default=300, help="delayed jobs for lateness")
    parser.add_argument("--recovery-trials", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=60.0, help="idle measurement window")
    parser.add_argument("--drain-jobs", type=int, default=20000)
    parser.add_argument("--prefetch", default="auto", help="the processes phase's workers' --prefetch (default auto)")
    parser.add_argument("--json-out", help="write the results here")
    parser.add_argument("--only", action="append", choices=PHASES, help="run only these phases (repeat)")
    args = parser.parse_args()
    server = None
    if args.redis_url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
    _server.require_loopback(args.redis_url)
    try:
        url = args.redis_url
        phases = {
            "latency": lambda: bench_latency(url, args.samples),
            "latency_many_queues": lambda: bench_latency(url, args.samples, args.many_queues),
            "lateness": lambda: bench_lateness(url, args.delayed),
            "recovery": lambda: bench_recovery(url, args.recovery_trials, renew_ms=1000, expire_ms=3000),
            "idle": lambda: bench_idle(url, args.idle_s),
            "drain": lambda: [bench_drain(url, args.drain_jobs, c) for c in (1, 8)],
            "processes": lambda: [bench_processes(url, args.drain_jobs, p, prefetch=args.prefetch) for p in (1, 2)],
            "supervised_recovery": lambda: bench_supervised_recovery(url, args.recovery_trials),
        }
        report = {name: phases[name]() for name in PHASES if not args.only or name in args.only}
    finally:
        if server is not None:
            server.stop()
    text = json.dumps(report, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
