"""What the debounce and sequence crash harnesses (tests/debounce_crash.py,
tests/sequence_crash.py) share: their size, producer processes (each sending for keys
of its own, replaced when SIGKILLed), the chaos that kills producers and workers, the
wait for a queue to drain, and the command line."""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flow_crash import Workers

HERE = Path(__file__).resolve().parent

#: Short leases, so that a killed worker's jobs come back within seconds.
WORKER_ARGS = ["--concurrency", "4", "--lease-ms", "2000", "--renew-ms", "500", "--expire-ms", "2500",
               "--block-ms", "200", "--grace-ms", "2000"]


@dataclasses.dataclass
class Config:
    keys: int = 12
    kills: int = 20
    producers: int = 3
    workers: int = 3
    seconds: float = 8.0
    seed: int = 1
    timeout_s: float = 120.0


class Producers:
    """The producer processes, each with keys of its own, replaced as they are killed:
    each runs ``<app>.produce(keys, until, seed)`` (``cfg``: keys, producers, timeout_s)."""

    def __init__(self, app: str, env: dict[str, str], logdir: Path, cfg: Any, until: float) -> None:
        self.app, self.env, self.logdir, self.cfg, self.until = app, env, logdir, cfg, until
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.started = 0
        for slot in range(cfg.producers):
            self.spawn(slot)

    def keys_of(self, slot: int) -> list[str]:
        return [f"k{i}" for i in range(self.cfg.keys) if i % self.cfg.producers == slot]

    def spawn(self, slot: int) -> None:
        self.started += 1
        left = max(0.0, self.until - time.monotonic())
        code = (f"import time, {self.app}; {self.app}.produce({self.keys_of(slot)!r}, time.monotonic() + {left!r}, "
                f"{self.started})")
        out = open(self.logdir / f"producer{self.started}.log", "wb")
        self.procs[slot] = subprocess.Popen([sys.executable, "-c", code], cwd=HERE, env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()

    def kill_one(self, rng: random.Random) -> None:
        slot = rng.choice(sorted(self.procs))
        victim = self.procs[slot]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.spawn(slot)

    def wait(self) -> list[int]:
        """Wait for every producer to finish its time; the exit codes of those that failed."""
        failed = []
        for p in self.procs.values():
            try:
                code = p.wait(timeout=self.cfg.timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait()
            if code != 0:
                failed.append(code)
        return failed


def settle(q: Any, timeout_s: float, report: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = q.stats()
        if s.ready + s.scheduled + s.leased + s.sequenced == 0:
            return
        time.sleep(0.2)
    s = q.stats()
    report.problems.append(f"the queue did not drain: ready {s.ready}, scheduled {s.scheduled}, leased {s.leased}, "
                           f"sequenced {s.sequenced}")


def chaos(cfg: Config, app: str, env: dict[str, str], logdir: Path, q: Any, report: Any) -> None:
    """Workers of ``app``'s tasks and its producers for ``cfg.seconds``; every 0.1..0.5 s
    one of them (a coin decides which kind) SIGKILLed and replaced, up to ``cfg.kills``
    (counted in ``report.kills``); then the producers finish and the queue drains. Every
    process is stopped by its PID on the way out."""
    rng = random.Random(cfg.seed)
    workers = Workers(env, logdir, cfg.workers, app=f"{app}:tasks", args=WORKER_ARGS, self_kill=False)
    producers = Producers(app, env, logdir, cfg, time.monotonic() + cfg.seconds)
    try:
        while report.kills < cfg.kills and time.monotonic() < producers.until:
            time.sleep(rng.uniform(0.1, 0.5))
            if rng.random() < 0.5:
                producers.kill_one(rng)
            else:
                workers.kill_one(rng)
            report.kills += 1
        failed = producers.wait()
        if failed:
            report.problems.append(f"producers exited with {failed}")
        settle(q, cfg.timeout_s, report)
        died = [p.pid for p in workers.procs if p.poll() is not None]
        if died:
            report.problems.append(f"workers died without being killed: {died}")
    finally:
        workers.stop()
        for p in producers.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def main(run: Callable[[Config], Any], doc: str) -> int:
    """The harness's command line: ``--keys``, ``--kills``, ... as :class:`Config`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for f in dataclasses.fields(Config):
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    cfg = Config(**{f.name: getattr(ap.parse_args(), f.name) for f in dataclasses.fields(Config)})
    report = run(cfg)
    print(report.line())
    for problem in report.problems[:20]:
        print("  problem:", problem)
    return 1 if report.problems else 0
