"""One logical queue on a Redis Cluster of 3 primaries: ``partitions=1`` (one hash tag,
one primary) against ``partitions=3`` (three tags, placed on three primaries).

For each: N jobs are enqueued beforehand (``enqueue_many``, per partition), then W
``pyqueue worker`` processes (concurrency C, a no-op handler, ``--burst``) drain them.
Figures:

* jobs/s from the first lease to the last ack (``stats``);
* Redis CPU per job on each primary: the growth of ``used_cpu_sys + used_cpu_user``
  (INFO cpu) over the drain, in µs, divided by the jobs. With one partition the whole
  cost lands on one primary; with three it is shared. A primary's CPU per job is what
  caps its throughput (1 s / µs per job), so the capacity of a bigger cluster is about
  (primaries × 1 s / µs per job per primary) as long as partitions ≥ primaries and the
  clients keep up.

On this 2-core machine the worker processes and the three primaries share the cores,
so jobs/s measures the whole machine; the CPU per job per primary is the figure to
project from. Every load is bounded (jobs, time).

    python bench/bench_partitions.py --jobs 20000 --workers 3 --concurrency 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402
from bench_cluster import LoopbackCluster, spawn, stop_process  # noqa: E402
from redis.crc import key_slot  # noqa: E402

from pyqueue import NewJob, Queue  # noqa: E402


def spread_name(cluster: LoopbackCluster, partitions: int) -> str:
    """A queue name whose ``partitions`` partitions sit on as many different primaries
    (``partitions`` <= primaries)."""
    ranges = [(port, a, b) for port, node in cluster.topology().items() if "master" in node["flags"]
              for a, b in node["slots"]]

    def primary(tag: str) -> int:
        slot = key_slot(f"pq:{{{tag}}}:jobs".encode())
        return next(port for port, a, b in ranges if a <= slot <= b)

    for i in range(100_000):
        name = f"orders{i}"
        tags = [name] if partitions == 1 else [f"{name}#{p}" for p in range(partitions)]
        if len({primary(tag) for tag in tags}) == partitions:
            return name
    raise RuntimeError("no name spreads over the primaries")


def cpu_us(node: redis.Redis) -> float:
    info = node.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


def calls(nodes: dict[int, redis.Redis]) -> Counter[str]:
    """Commands served so far, summed over ``nodes`` (INFO commandstats; the commands
    a script runs count too)."""
    total: Counter[str] = Counter()
    for node in nodes.values():
        for name, stat in node.info("commandstats").items():
            total[name.removeprefix("cmdstat_")] += int(stat["calls"])
    return total


def drain(cluster: LoopbackCluster, partitions: int, jobs: int, workers: int, concurrency: int) -> dict[str, Any]:
    cluster.flushall()
    client = cluster.client()
    name = spread_name(cluster, partitions)
    q = Queue(name, client, partitions=partitions)
    for i in range(0, jobs, 1000):
        q.enqueue_many([NewJob(b"x" * 64) for _ in range(min(1000, jobs - i))])
    primaries = {port: cluster.node(port) for port in cluster.primaries()}
    extra = ["--partitions", f"{name}={partitions}"] if partitions > 1 else []
    before = {port: cpu_us(node) for port, node in primaries.items()}
    calls_before = calls(primaries)
    procs = [spawn(cluster.url(), cluster.url(), "noop", [name], "--concurrency", str(concurrency), "--burst",
                   *extra) for _ in range(workers)]
    try:
        while q.stats().leased_total == 0:
            time.sleep(0.002)
        started = time.perf_counter()
        while q.stats().acked < jobs:
            if time.perf_counter() - started > 300:
                raise RuntimeError("the drain did not finish in 300 s")
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
    finally:
        for proc in procs:
            stop_process(proc)
    after = {port: cpu_us(node) for port, node in primaries.items()}
    served = calls(primaries) - calls_before
    per_job = {str(port): round((after[port] - before[port]) / jobs, 1) for port in primaries}
    stats = q.stats()
    return {
        "partitions": partitions, "queue": name, "jobs": jobs, "workers": workers, "concurrency": concurrency,
        "seconds": round(elapsed, 3), "jobs_per_s": round(jobs / elapsed), "acked": stats.acked,
        "redis_cpu_us_per_job_per_primary": per_job,
        "redis_cpu_us_per_job_total": round(sum(per_job.values()), 1),
        "busiest_primary_cpu_us_per_job": max(per_job.values()),
        "script_calls_per_job": round(served["evalsha"] / jobs, 2),
        "commands_per_job": {name: round(n / jobs, 2) for name, n in served.most_common(12) if n >= jobs / 100},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-server", help="redis-server binary (default: from PATH)")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json-out", help="write the results here")
    args = parser.parse_args()
    cluster = LoopbackCluster(args.redis_server).start()
    try:
        runs = [drain(cluster, k, args.jobs, args.workers, args.concurrency) for k in (1, 3)]
    finally:
        cluster.stop()
    one, three = runs
    report = {
        "runs": runs,
        "jobs_per_s_ratio_3_to_1": round(three["jobs_per_s"] / one["jobs_per_s"], 2),
        "busiest_primary_cpu_ratio_3_to_1": round(
            three["busiest_primary_cpu_us_per_job"] / one["busiest_primary_cpu_us_per_job"], 2
        ),
    }
    text = json.dumps(report, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n", encoding="utf-8")
    print(text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
