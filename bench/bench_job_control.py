"""Job control, measured against a real redis-server: rate-limit accuracy and cancel latency.

    python bench/bench_job_control.py                    # both, the issue's settings
    python bench/bench_job_control.py --rate-seconds 10  # a shorter rate run

Figures (bench/results/job_control.json):

* **rate**: ``--workers`` ``pyqueue worker`` processes (concurrency 4 each) drain a queue
  limited to ``--rate`` leases per second (``pyqueue limit``-equivalent ``Queue.limit``,
  burst 1) for ``--rate-seconds``. Each lease's time is taken from the server clock
  (``deadline_ms - lease_ms`` of the job, set by lease.lua), so the figures are the
  limit's own: leases per second over the run, the fewest and most in any one-second
  bucket, and the most in any sliding window of one period (the limit promises at most
  ``rate + burst - 1``). With burst 1 a permit a worker takes late (by its round trip
  after the wake-up) is not made up, so the rate achieved is a little below the limit;
  ``--burst 2`` banks that lateness.
* **cancel**: one worker with the default lease (30 s, so extended every 10 s) runs
  ``--cancels`` handlers that wait on ``job.cancelled``; each job is cancelled at a
  random moment, and the latency is the time from the ``cancel`` call's return to the
  handler seeing the flag (one host, one clock). Expected: uniform over 0..lease_ms/3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402

from pyqueue import Job, NewJob, Queue  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
RATE_QUEUE, CANCEL_QUEUE = "bench-rate", "bench-cancel"
LEASES_KEY = "bench:{rate}:leases"
NAMESPACE = "bench-job-control"
_client: redis.Redis | None = None


def record_lease(job: Job) -> None:
    """The rate run's handler: log the lease's server time (the deadline minus the lease)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["BENCH_URL"])
    _client.rpush(LEASES_KEY, job.deadline_ms - int(os.environ["BENCH_LEASE_MS"]))


def measure_rate(url: str, args: argparse.Namespace) -> dict[str, Any]:
    client = _server.client_for(url)
    q = Queue(RATE_QUEUE, client)
    total = int(args.rate * args.rate_seconds * 2)  # never runs dry
    for i in range(0, total, 1000):
        q.enqueue_many([NewJob(b"") for _ in range(min(1000, total - i))])
    q.limit(args.rate, 1000, burst=args.burst)
    lease_ms = 30_000
    env = dict(os.environ, PYTHONPATH=f"{BENCH_DIR}{os.pathsep}{_server.REPO_ROOT}", BENCH_URL=url,
               BENCH_LEASE_MS=str(lease_ms))
    logs = tempfile.mkdtemp(prefix="pyqueue-bench-rate-")
    procs = []
    for n in range(args.workers):
        with open(Path(logs) / f"worker-{n}.log", "wb") as log_file:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "pyqueue", "--url", url, "--namespace", NAMESPACE, "worker",
                 "bench_job_control:record_lease", "-q", RATE_QUEUE, "--concurrency", "4",
                 "--lease-ms", str(lease_ms)],
                env=env, stdout=log_file, stderr=subprocess.STDOUT,
            ))
    try:
        time.sleep(args.rate_seconds + 3)  # start-up, then the measured span
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    stamps = sorted(int(x) for x in client.lrange(LEASES_KEY, 0, -1))
    # The measured span: whole seconds from the second lease-second on (start-up excluded).
    start = stamps[0] // 1000 * 1000 + 1000
    span = [t for t in stamps if start <= t < start + args.rate_seconds * 1000]
    buckets = [0] * args.rate_seconds
    for t in span:
        buckets[(t - start) // 1000] += 1
    most_in_window, j = 0, 0
    for i, t in enumerate(span):
        while span[j] <= t - 1000:
            j += 1
        most_in_window = max(most_in_window, i - j + 1)
    return {
        "limit_per_s": args.rate, "burst": args.burst, "workers": args.workers, "concurrency": 4,
        "seconds": args.rate_seconds, "leases": len(span),
        "leases_per_s": round(len(span) / args.rate_seconds, 2),
        "ratio_to_limit": round(len(span) / args.rate_seconds / args.rate, 4),
        "fewest_in_a_second": min(buckets), "most_in_a_second": max(buckets),
        "most_in_any_1s_window": most_in_window,
    }


def measure_cancel(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from pyqueue.worker import Worker

    client = _server.client_for(url)
    q = Queue(CANCEL_QUEUE, client)
    started: dict[str, threading.Event] = {}
    seen_at: dict[str, float] = {}

    def handle(job: Job) -> None:
        started[job.id].set()
        if job.cancelled.wait(600):  # longer than every cancel of the run takes
            seen_at[job.id] = time.monotonic()

    ids = [f"c{i}" for i in range(args.cancels)]
    for job_id in ids:
        started[job_id] = threading.Event()
    q.enqueue_many([NewJob(b"", job_id=i) for i in ids])
    worker = Worker([CANCEL_QUEUE], handle, redis=client, namespace=NAMESPACE, concurrency=args.cancels)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    rng = random.Random(args.seed)
    cancelled_at: dict[str, float] = {}
    try:
        for job_id in ids:
            assert started[job_id].wait(30), "the worker did not start the job"
        for job_id in ids:
            time.sleep(rng.uniform(0, worker.lease_ms / 3000))  # a random phase of the extension cycle
            assert q.cancel(job_id).state == "leased"
            cancelled_at[job_id] = time.monotonic()
        deadline = time.monotonic() + worker.lease_ms / 1000
        while len(seen_at) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop("bench finished")
        thread.join(60)
    latencies = sorted(round((seen_at[i] - cancelled_at[i]) * 1000) for i in ids if i in seen_at)
    return {
        "lease_ms": worker.lease_ms, "extension_every_ms": worker.lease_ms // 3, "cancels": len(ids),
        "seen": len(latencies), "latency_ms": latencies,
        "median_ms": latencies[len(latencies) // 2] if latencies else -1, "max_ms": max(latencies, default=-1),
        "stats_cancelled": q.stats().cancelled, "stats_acked": q.stats().acked, "stats_nacked": q.stats().nacked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--rate", type=int, default=50, help="the limit, leases per second (default 50)")
    parser.add_argument("--rate-seconds", type=int, default=60)
    parser.add_argument("--burst", type=int, default=1, help="the limit's burst (default 1)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes for the rate run")
    parser.add_argument("--cancels", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--skip", choices=["rate", "cancel"], action="append", default=[])
    parser.add_argument("--json-out", default=str(BENCH_DIR / "results" / "job_control.json"),
                        help="write the results here ('' for none)")
    args = parser.parse_args()

    def run(url: str) -> dict[str, Any]:
        report: dict[str, Any] = {}
        if "rate" not in args.skip:
            report["rate"] = measure_rate(url, args)
            print("rate:", json.dumps(report["rate"]))
        if "cancel" not in args.skip:
            report["cancel"] = measure_cancel(url, args)
            print("cancel:", json.dumps(report["cancel"]))
        return report

    if args.redis_url:
        _server.require_loopback(args.redis_url)
        report = run(args.redis_url)
    else:
        with _server.LoopbackRedis(args.redis_server) as server:
            report = run(server.url)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
