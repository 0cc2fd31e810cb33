"""Periodic jobs under kills: ticks enqueued over ``--minutes`` (default 10) by
``--workers`` (3) ``pyqueue worker`` processes that all carry the schedule
``--every tick=5s``, while one of them, at random, is SIGKILLed (by its PID) and started
again every 20..40 s. Expected: exactly one job per tick.

Figures (bench/results/schedules.json):

* ticks expected: the 5 s ticks from the moment all workers ran to the end of the run;
* ticks enqueued: distinct tick ids that exist (any state, or acked less than
  keep_done_ms ago: a tombstone) or ran, and the queue's ``enqueued`` counter: equal when
  no tick was added twice;
* enqueue duplicates: the ``duplicates`` counter (every worker sends every tick; all but
  the first send are duplicates);
* ticks missing: expected ticks with no job;
* ticks run: distinct ticks whose handler ran, total runs, and runs again after a kill
  (at least once is the promise: a job whose worker died mid-run runs again);
* lateness: from a tick's time to its first run's start, on the server clock (ticks of
  the window).

The handler (:func:`record`, run by the worker processes with ``PYTHONPATH=bench``)
logs ``<id> <server ms>`` in a Redis list as its first act, then works 0..1 s, so kills
land on running tick jobs too. At the end the survivors are stopped with SIGTERM and
one in-process worker drains what the killed ones held (scrubbed when their
registrations expire, or reclaimed when their leases do).

    python bench/bench_schedules.py [--minutes 10] [--every-s 5] [--workers 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402

from pyqueue import Job, Queue  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
RUNS_KEY = "bench:{schedules}:runs"
QUEUE = "ticks"
NAMESPACE = "bench"
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["BENCH_URL"])
    return _client


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def record(job: Job) -> None:
    """The worker processes' handler: log the run (job id, server ms), then work 0..1 s."""
    client = _redis()
    client.rpush(RUNS_KEY, f"{job.id} {server_ms(client)}")
    time.sleep(random.uniform(0, 1.0))


def spawn(url: str, every_s: int, log_dir: Path, worker_args: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=f"{BENCH_DIR}{os.pathsep}{_server.REPO_ROOT}", BENCH_URL=url)
    log_path = log_dir / f"worker-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "--url", url, "--namespace", NAMESPACE, "worker",
             "bench_schedules:record", "-q", QUEUE, "--every", f"tick={every_s}s", *worker_args],
            env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )


def alive_pids(client: redis.Redis) -> set[int]:
    from pyqueue.ops.service import Services

    return {s.pid for s in Services(client, namespace=NAMESPACE).list() if s.alive}


def wait_registered(client: redis.Redis, procs: list[subprocess.Popen[bytes]], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not {p.pid for p in procs} <= alive_pids(client):
        if time.monotonic() > deadline:
            raise RuntimeError("worker processes did not register")
        time.sleep(0.05)


def percentile(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] if ordered else -1


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from pyqueue.worker import Worker

    client = _server.client_for(url)
    client.flushall()
    q = Queue(QUEUE, client)
    rng = random.Random(args.seed)
    worker_args = ["--concurrency", "2", "--lease-ms", str(args.lease_ms), "--renew-ms", str(args.renew_ms),
                   "--expire-ms", str(args.expire_ms)]
    log_dir = Path(tempfile.mkdtemp(prefix="pyqueue-bench-schedules-"))
    start_ms = server_ms(client)
    procs = [spawn(url, args.every_s, log_dir, worker_args) for _ in range(args.workers)]
    kills = 0
    try:
        wait_registered(client, procs)
        covered_from_ms = server_ms(client)
        until = time.monotonic() + args.minutes * 60
        print(f"{args.workers} workers up; running {args.minutes} min with a kill every "
              f"{args.kill_min_s}..{args.kill_max_s} s", flush=True)
        while True:
            pause = rng.uniform(args.kill_min_s, args.kill_max_s)
            if time.monotonic() + pause > until:
                time.sleep(max(0.0, until - time.monotonic()))
                break
            time.sleep(pause)
            i = rng.randrange(len(procs))
            procs[i].kill()  # SIGKILL, by PID
            procs[i].wait(10)
            kills += 1
            procs[i] = spawn(url, args.every_s, log_dir, worker_args)
            print(f"  kill {kills}: worker {i} (pid {procs[i].pid} now)", flush=True)
        covered_to_ms = server_ms(client)
        wait_registered(client, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    end_ms = server_ms(client)

    def drain(job: Job) -> None:
        client.rpush(RUNS_KEY, f"{job.id} {server_ms(client)}")

    Worker([QUEUE], drain, redis=client, namespace=NAMESPACE, renew_ms=500, expire_ms=2_000,
           block_ms=args.lease_ms + 5_000, lease_ms=args.lease_ms).run(burst=True, install_signal_handlers=False)

    every = args.every_s
    stats = q.stats()
    first, last = start_ms // 1000 - every, end_ms // 1000 + every
    # A tick's job exists while it waits, runs or is dead, and for keep_done_ms after its
    # ack (the tombstone); older acked ticks are known by their runs.
    present = [t for t in range(first - first % every, last + 1, every)
               if q.get(f"tick:{t}").state != "unknown"]
    expected = [t for t in range(covered_from_ms // 1000 - (covered_from_ms // 1000) % every + every,
                                 covered_to_ms // 1000 + 1, every)]
    runs: dict[str, list[int]] = {}
    for item in client.lrange(RUNS_KEY, 0, -1):
        job_id, at = item.decode().split()
        runs.setdefault(job_id, []).append(int(at))
    present = sorted(set(present) | {int(job_id.split(":")[1]) for job_id in runs})
    # Over the window's ticks (the first workers' first round enqueues a tick that was already past).
    lateness = [min(runs[f"tick:{t}"]) - t * 1000 for t in expected if f"tick:{t}" in runs]
    logs = "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("*.log")))
    present_set = set(present)
    report = {
        "config": {"minutes": args.minutes, "every_s": every, "workers": args.workers,
                   "kill_every_s": [args.kill_min_s, args.kill_max_s], "worker_args": worker_args,
                   "keep_done_ms": 300_000},
        "kills": kills,
        "ticks_expected": len(expected),
        "ticks_enqueued_distinct": len(present),
        "ticks_enqueued_in_window": len(present_set & set(expected)),
        "enqueued_counter": stats.enqueued,
        "ticks_added_twice": stats.enqueued - len(present),
        "enqueue_duplicates": stats.duplicates,
        "ticks_missing": sorted(set(expected) - present_set),
        "ticks_run_distinct": len(runs),
        "runs_total": sum(len(v) for v in runs.values()),
        "runs_again_after_a_kill": sum(len(v) - 1 for v in runs.values()),
        "ticks_enqueued_not_run": sorted(f"tick:{t}" for t in present_set if f"tick:{t}" not in runs),
        "dead": stats.dead,
        "first_run_lateness_ms": {"p50": percentile(lateness, 50), "p99": percentile(lateness, 99),
                                  "max": max(lateness, default=-1)},
        "skipped_tick_warnings": logs.count("was not enqueued in time"),
        "tracebacks_in_worker_logs": logs.count("Traceback"),
    }
    return report


def summary(report: dict[str, Any]) -> str:
    c = report["config"]
    late = report["first_run_lateness_ms"]
    return "\n".join([
        f"periodic jobs: {c['workers']} workers, --every tick={c['every_s']}s, {c['minutes']} min, "
        f"{report['kills']} SIGKILLs (one every {c['kill_every_s'][0]}..{c['kill_every_s'][1]} s, restarted at once)",
        f"  ticks expected        {report['ticks_expected']}",
        f"  ticks enqueued        {report['ticks_enqueued_distinct']} distinct ids "
        f"({report['ticks_enqueued_in_window']} in the window; enqueued counter {report['enqueued_counter']}, "
        f"added twice {report['ticks_added_twice']})",
        f"  enqueue duplicates    {report['enqueue_duplicates']}",
        f"  ticks missing         {len(report['ticks_missing'])}",
        f"  ticks run             {report['ticks_run_distinct']} distinct, {report['runs_total']} runs "
        f"({report['runs_again_after_a_kill']} again after a kill); enqueued but never run: "
        f"{len(report['ticks_enqueued_not_run'])}; dead {report['dead']}",
        f"  first run after tick  p50 {late['p50']} ms, p99 {late['p99']} ms, max {late['max']} ms",
        f"  worker logs           {report['skipped_tick_warnings']} skipped-tick warnings, "
        f"{report['tracebacks_in_worker_logs']} tracebacks",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every-s", type=int, default=5)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-min-s", type=float, default=20.0)
    parser.add_argument("--kill-max-s", type=float, default=40.0)
    parser.add_argument("--lease-ms", type=int, default=10_000)
    parser.add_argument("--renew-ms", type=int, default=2_000)
    parser.add_argument("--expire-ms", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json-out", default=str(BENCH_DIR / "results" / "schedules.json"),
                        help="write the results here (default bench/results/schedules.json; '' for none)")
    args = parser.parse_args()
    if args.redis_url:
        _server.require_loopback(args.redis_url)
        report = measure(args.redis_url, args)
    else:
        with _server.LoopbackRedis(args.redis_server) as server:
            report = measure(server.url, args)
    print(summary(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
