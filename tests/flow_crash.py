"""Flow crash harness: chords and chains run by worker processes that are SIGKILLed at
random, and paused past their leases (zombies), on a real redis-server; then a check
that every continuation ran for one job, exactly when all it waited for had ended.

Usage (the deep run)::

    python tests/flow_crash.py --chords 200 --members 10 --chains 200 --length 5 --kills 25

tests/test_flows_crash.py runs it at CI size.

1. A redis-server this harness starts (unix socket in a temporary directory; stopped by
   its PID), and ``workers`` processes ``python -m pyqueue worker flow_app:tasks`` with
   short leases (2 s), renewals (0.5 s) and flow checks (1 s), so that the work of a
   killed worker comes back within seconds (lease expiry, scrub) and a report lost with
   it is made by a flow check.
2. Half the flows are sent before the chaos, half during it: ``chords`` chords of
   ``members`` members (``member``) and a ``callback``, and ``chains`` chains of
   ``length`` ``step`` s. Chaos: every 0.2..0.8 s a random worker is SIGKILLed and
   replaced, or (one event in four) SIGSTOPped for 3 s (past its leases: another worker
   runs its jobs, and its acks come back stale) and then SIGCONTed, until ``kills``
   kills. Every other worker also SIGKILLs itself, with probability SELF_KILL_P, right
   after an ack answered OK and before it reports the job's end (the crash point
   ``before_report``): then only a flow check can report it.
3. Every flow's result is awaited (``FlowHandle.result``) and checked: a chord's
   callback got the sum of its members, a chain's last step the start plus its length.
4. The log (tests/flow_app.py: one line per run that got to its end) is checked: every
   continuation (a callback, a chain step after the first) ran, and only as one job,
   its attempts distinct (a rerun after a kill is attempt + 1 of the same job, never a
   second job); the callbacks' queue counts one enqueue per chord; nothing is left
   waiting, ready, scheduled, leased or dead; no flow key (``fwait``, ``fpending``) is
   left.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from crash_harness import RedisProcess  # noqa: E402

WORKER_ARGS = ["--concurrency", "4", "--lease-ms", "2000", "--renew-ms", "500", "--expire-ms", "2500",
               "--block-ms", "200", "--grace-ms", "2000", "--flow-check-ms", "1000"]
#: The chance that a self-killing worker dies after an ack, before its report.
SELF_KILL_P = 0.05
#: How long a zombie stays stopped: past its leases (2 s) and its registration (2.5 s).
PAUSE_S = 3.0


@dataclasses.dataclass
class Config:
    chords: int = 40
    members: int = 5
    chains: int = 40
    length: int = 3
    kills: int = 6
    workers: int = 3
    seed: int = 1
    timeout_s: float = 240.0


@dataclasses.dataclass
class Report:
    flows: int = 0
    kills: int = 0
    zombies: int = 0
    self_kills: int = 0  # workers that died after an ack, before reporting it
    reruns: int = 0  # continuation runs beyond the first (a kill after its log line)
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        return (f"[flows] {self.flows} flows, {self.kills} kills, {self.self_kills} deaths between an ack and its "
                f"report, {self.zombies} zombies, {self.reruns} continuation "
                f"reruns after kills, {len(self.problems)} problems, {self.seconds:.1f} s")


class Workers:
    """The worker processes (``python -m pyqueue worker APP ARGS``), replaced as they are
    killed; the PIDs of those killed. With ``self_kill``, every other worker also dies by
    itself now and then, right after an ack that answered OK and before it reports the
    job's end (tests/steps_crash.py uses these workers too, without)."""

    def __init__(self, env: dict[str, str], logdir: Path, count: int, app: str = "flow_app:tasks",
                 args: list[str] = WORKER_ARGS, self_kill: bool = True) -> None:
        self.env, self.logdir, self.app, self.args, self.self_kill = env, logdir, app, args, self_kill
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()
        self.started = 0
        for _ in range(count):
            self.spawn()

    def spawn(self) -> None:
        self.started += 1
        out = open(self.logdir / f"worker{self.started}.log", "wb")
        # A self-killing worker dies after an ack before its report: a flow check must report it.
        env = dict(self.env, PYQUEUE_CRASH_POINT="before_report", PYQUEUE_CRASH_PROBABILITY=str(SELF_KILL_P))
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "worker", self.app, *self.args],
            cwd=HERE, env=env if self.self_kill and self.started % 2 else self.env, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        ))
        out.close()

    def replace_dead(self) -> int:
        """Replace the workers that died by themselves; how many."""
        dead = [p for p in self.procs if p.poll() is not None]
        for p in dead:
            self.procs.remove(p)
            self.spawn()
        return len(dead)

    def kill_one(self, rng: random.Random) -> None:
        victim = rng.choice([p for p in self.procs if p.poll() is None] or self.procs)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.killed.add(victim.pid)
        self.procs.remove(victim)
        self.spawn()

    def pause_one(self, rng: random.Random) -> threading.Thread:
        victim = rng.choice([p for p in self.procs if p.poll() is None] or self.procs)
        os.kill(victim.pid, signal.SIGSTOP)

        def resume() -> None:
            time.sleep(PAUSE_S)
            if victim.poll() is None:
                os.kill(victim.pid, signal.SIGCONT)

        thread = threading.Thread(target=resume, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run(cfg: Config) -> Report:
    report = Report()
    rng = random.Random(cfg.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pq-flows-") as tmp, RedisProcess(Path(tmp)) as server:
        logfile = Path(tmp) / "runs.log"
        env = dict(os.environ, PYQUEUE_URL=server.url, FLOW_LOG=str(logfile),
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        import flow_app

        import pyqueue.tasks.flows as task_flows
        from pyqueue import chain, chord, connect

        tasks = flow_app.tasks
        tasks.bind(connect(server.url))  # this process sends; the workers read PYQUEUE_URL
        check_ms, task_flows.FLOW_CHECK_MS = task_flows.FLOW_CHECK_MS, 1000
        sends: list[tuple[Any, Any, str]] = []

        def send(part: int) -> None:
            for c in range(part * cfg.chords // 2, (part + 1) * cfg.chords // 2):
                values = [c * 1000 + i for i in range(cfg.members)]
                flow = chord([flow_app.member.s(v) for v in values], flow_app.callback.s()).send()
                sends.append((flow, sum(values), "chord"))
            for k in range(part * cfg.chains // 2, (part + 1) * cfg.chains // 2):
                first = 10**6 + k * 100
                flow = chain(flow_app.step.s(first), *[flow_app.step.s() for _ in range(cfg.length - 1)]).send()
                sends.append((flow, first + cfg.length, "chain"))

        send(0)
        workers = Workers(env, Path(tmp), cfg.workers)
        resumes: list[threading.Thread] = []
        try:
            sent_rest = False
            events = 0
            while report.kills < cfg.kills:
                time.sleep(rng.uniform(0.2, 0.8))
                report.self_kills += workers.replace_dead()
                events += 1
                if events % 4 == 0:
                    resumes.append(workers.pause_one(rng))
                    report.zombies += 1
                else:
                    workers.kill_one(rng)
                    report.kills += 1
                if not sent_rest and report.kills >= cfg.kills // 2:
                    send(1)
                    sent_rest = True
            if not sent_rest:
                send(1)
            for t in resumes:
                t.join()
            deadline = time.monotonic() + cfg.timeout_s
            for flow, expected, _ in sends:
                report.self_kills += workers.replace_dead()
                try:
                    got = flow.result(timeout=max(1.0, deadline - time.monotonic()))
                except Exception as exc:  # reported, not raised: the check goes on
                    report.problems.append(f"flow {flow.id}: {type(exc).__name__}: {exc}")
                    continue
                if got != expected:
                    report.problems.append(f"flow {flow.id}: result {got!r}, expected {expected!r}")
        finally:
            workers.stop()
            task_flows.FLOW_CHECK_MS = check_ms
        report.flows = len(sends)
        check(cfg, tasks, sends, logfile, server, report)
        report.seconds = time.monotonic() - started
    return report


def check(cfg: Config, tasks: Any, sends: list[tuple[Any, Any, str]], logfile: Path, server: RedisProcess,
          report: Report) -> None:
    runs: dict[str, list[int]] = collections.defaultdict(list)
    for line in logfile.read_text().splitlines():
        kind, job_id, attempt, _ = line.split(" ")
        runs[job_id].append(int(attempt))
    # A chord's continuation is its callback (compiled last); a chain's, every step but the first.
    chord_callbacks = [flow.steps[-1][1] for flow, _, kind in sends if kind == "chord"]
    continuations = chord_callbacks + [job_id for flow, _, kind in sends if kind == "chain" for _, job_id in flow.steps[1:]]
    for job_id in continuations:
        attempts = runs.get(job_id, [])
        if not attempts:
            report.problems.append(f"continuation {job_id} never ran to its end")
        elif len(set(attempts)) != len(attempts):
            report.problems.append(f"continuation {job_id} ran twice in one attempt: {attempts}")
        report.reruns += max(0, len(attempts) - 1)
    callbacks = tasks.queue("callbacks").stats()
    members = tasks.queue("members").stats()
    if callbacks.enqueued != len(chord_callbacks):
        report.problems.append(f"the callbacks' queue counts {callbacks.enqueued} enqueues for {len(chord_callbacks)} chords")
    for name, stats in (("callbacks", callbacks), ("members", members)):
        left = {"ready": stats.ready, "scheduled": stats.scheduled, "leased": stats.leased, "dead": stats.dead}
        if any(left.values()):
            report.problems.append(f"queue {name} is not settled: {left}")
    with server.client() as r:
        flow_keys = [k for k in r.keys("*") if k.endswith((b":fwait", b":fpending"))]
    if flow_keys:
        report.problems.append(f"flow keys left: {flow_keys}")


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
