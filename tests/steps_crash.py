"""Durable-steps crash harness: jobs of five committed steps, a durable sleep and a wait
for a signal, run by worker processes (``python -m pyqueue worker``) that are SIGKILLed
at random on a real redis-server; then a check of the ledger the runs wrote.

Usage (the deep run)::

    python tests/steps_crash.py --jobs 1000 --kills 60

tests/test_steps_crash.py runs it at CI size (200 jobs, 20 kills).

1. A redis-server this harness starts (unix socket in a temporary directory; stopped by
   its PID), and ``workers`` worker processes of tests/steps_app.py with short leases
   (2 s) and renewals (0.5 s), so a killed worker's jobs come back within seconds.
2. The jobs are sent, half before the chaos and half during it; the even ones are sent
   their signal ``go`` (some before their wait, some while they wait). Chaos: every
   0.2..0.8 s a random worker is SIGKILLed and replaced, until ``kills`` kills.
3. Every job's result is awaited and checked (its number plus 15, plus the signal's 100
   for the even ones).
4. The ledger (tests/steps_app.py) is checked, job by job:
   - each step's function ran, and every run of it but the last was in a process that
     was killed (a step runs again only when the run that called it died before its
     commit; once committed, never again);
   - from one run of a job to the next its attempt grows by at most 1, and only when
     the run before was in a killed process (a sleep or a wait uses no attempt);
   - nothing is left: no job ready, scheduled, leased or dead, and no ``steps`` or
     ``waiting`` key.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from crash_harness import RedisProcess  # noqa: E402
from flow_crash import Workers  # noqa: E402

WORKER_ARGS = ["--concurrency", "4", "--lease-ms", "2000", "--renew-ms", "500", "--expire-ms", "2500",
               "--block-ms", "200", "--grace-ms", "2000"]


@dataclasses.dataclass
class Config:
    jobs: int = 200
    kills: int = 20
    workers: int = 3
    seed: int = 1
    timeout_s: float = 240.0


@dataclasses.dataclass
class Report:
    jobs: int = 0
    kills: int = 0
    step_reruns: int = 0  # step function calls beyond the first (a kill before the commit)
    runs: int = 0  # task runs in all (first runs, after sleeps, waits and kills)
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        return (f"[steps] {self.jobs} jobs, {self.runs} runs, {self.kills} kills, {self.step_reruns} step "
                f"reruns after kills, {len(self.problems)} problems, {self.seconds:.1f} s")


def run(cfg: Config) -> Report:
    report = Report()
    rng = random.Random(cfg.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pq-steps-") as tmp, RedisProcess(Path(tmp)) as server:
        logfile = Path(tmp) / "ledger.log"
        env = dict(os.environ, PYQUEUE_URL=server.url, STEPS_LOG=str(logfile),
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        import steps_app

        from pyqueue import connect

        tasks = steps_app.tasks
        tasks.bind(connect(server.url))  # this process sends and signals; the workers read PYQUEUE_URL
        sent: list[tuple[Any, int, bool]] = []  # (handle, expected result, signalled)
        signalled_ids: set[str] = set()

        def send(part: int) -> None:
            for n in range(part * cfg.jobs // 2, (part + 1) * cfg.jobs // 2):
                signalled = n % 2 == 0
                sent.append((steps_app.five.send(n), n + 15 + (steps_app.SIGNAL_VALUE if signalled else 0), signalled))
                if n % 4 == 0:  # signalled at once: before its wait
                    signal_sent()

        def signal_sent() -> None:
            """Signal the even jobs sent so far, once each: those sent with a number that
            is a multiple of 4 at once (before their wait), the others later (while they
            wait, most of them)."""
            for handle, _, signalled in sent:
                if signalled and handle.id not in signalled_ids:
                    answer = handle.signal("go", steps_app.SIGNAL_VALUE)
                    if answer.status not in ("woke", "kept"):
                        report.problems.append(f"job {handle.id}: its signal was refused ({answer.status})")
                    signalled_ids.add(handle.id)

        send(0)
        workers = Workers(env, Path(tmp), cfg.workers, app="steps_app:tasks", args=WORKER_ARGS, self_kill=False)
        try:
            sent_rest = False
            while report.kills < cfg.kills:
                time.sleep(rng.uniform(0.2, 0.8))
                if report.kills % 3 == 0:
                    signal_sent()
                workers.kill_one(rng)
                report.kills += 1
                if not sent_rest and report.kills >= cfg.kills // 2:
                    send(1)
                    sent_rest = True
            if not sent_rest:
                send(1)
            signal_sent()
            deadline = time.monotonic() + cfg.timeout_s
            for handle, expected, _ in sent:
                try:
                    got = handle.result(timeout=max(1.0, deadline - time.monotonic()))
                except Exception as exc:  # reported, not raised: the check goes on
                    report.problems.append(f"job {handle.id}: {type(exc).__name__}: {exc}")
                    continue
                if got != expected:
                    report.problems.append(f"job {handle.id}: result {got!r}, expected {expected!r}")
            died = [p.pid for p in workers.procs if p.poll() is not None]
            if died:
                report.problems.append(f"workers died without being killed: {died}")
        finally:
            workers.stop()
        report.jobs = len(sent)
        check(tasks, [h.id for h, _, _ in sent], logfile, workers.killed, server, report)
        report.seconds = time.monotonic() - started
    return report


def check(tasks: Any, ids: list[str], logfile: Path, killed: set[int], server: RedisProcess, report: Report) -> None:
    import steps_app

    runs: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)  # job -> [(attempt, pid)]
    calls: dict[tuple[str, str], list[int]] = collections.defaultdict(list)  # (job, step) -> [pid]
    for line in logfile.read_text().splitlines():
        parts = line.split(" ")
        if parts[0] == "run":
            runs[parts[1]].append((int(parts[2]), int(parts[3])))
        else:
            calls[(parts[1], parts[2])].append(int(parts[4]))
    for job_id in ids:
        report.runs += len(runs[job_id])
        for i in range(steps_app.STEPS):
            pids = calls.get((job_id, f"s{i}"), [])
            if not pids:
                report.problems.append(f"job {job_id}: step s{i} never ran")
                continue
            report.step_reruns += len(pids) - 1
            unexplained = [pid for pid in pids[:-1] if pid not in killed]
            if unexplained:
                report.problems.append(f"job {job_id}: step s{i} ran again after a run in a process that was not "
                                       f"killed ({unexplained}; all: {pids})")
        for (a, pid), (b, _) in zip(runs[job_id], runs[job_id][1:]):
            if b not in (a, a + 1) or b == a + 1 and pid not in killed:
                report.problems.append(f"job {job_id}: attempt {a} -> {b} after a run in process {pid} "
                                       f"({'killed' if pid in killed else 'not killed'}): {runs[job_id]}")
    stats = tasks.queue("steps").stats()
    left = {"ready": stats.ready, "scheduled": stats.scheduled, "leased": stats.leased, "dead": stats.dead,
            "waiting": stats.waiting}
    if any(left.values()):
        report.problems.append(f"queue steps is not settled: {left}")
    with server.client() as r:
        step_keys = [k for k in r.keys("*") if k.endswith((b":steps", b":waiting"))]
    if step_keys:
        report.problems.append(f"step keys left: {step_keys}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(Config):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    cfg = Config(**{f.name: getattr(ap.parse_args(), f.name) for f in dataclasses.fields(Config)})
    report = run(cfg)
    print(report.line())
    for problem in report.problems[:20]:
        print("  problem:", problem)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
