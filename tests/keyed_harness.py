"""What the debounce and sequence crash harnesses (tests/debounce_crash.py,
tests/sequence_crash.py) share: producer processes, each sending for keys of its own
and replaced when SIGKILLed, and the wait for a queue to drain."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


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
