"""Sequence crash harness: producer processes send changes for a set of keys, each key a
sequence, while worker processes (``python -m pyqueue worker``) run them, and both are
SIGKILLed at random, on a real redis-server.

Usage (the deep run)::

    python tests/sequence_crash.py --keys 40 --kills 80 --seconds 30

tests/test_sequence_crash.py runs it at CI size (12 keys, 20 kills, 8 s of sends).

1. A redis-server this harness starts (unix socket in a temporary directory; stopped by
   its PID); ``workers`` worker processes of tests/sequence_app.py with short leases
   (2 s), and ``producers`` producer processes, each sending for keys of its own
   (tests/sequence_app.py ``produce``: runs of 1..4 changes; a change's number is its
   send's time, so a key's numbers grow in send order, across a producer's restarts).
2. Chaos for ``seconds``: every 0.1..0.5 s a random worker or producer is SIGKILLed (a
   producer may die mid-call) and replaced, up to ``kills`` kills.
3. Then the producers stop, the queue drains, and the ledger is checked, key by key:
   - **strict order**: a change's first run starts after the last run of the change sent
     before it (of those that ran) has returned: never two at once, never out of order,
     whatever the kills did to leases and retries;
   - every answered send ran to its end;
   - nothing is left: no job ready, scheduled, leased, dead or waiting in a sequence,
     and no sequence holds its key.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from crash_harness import RedisProcess  # noqa: E402
from keyed_harness import Config, chaos, main  # noqa: E402

@dataclasses.dataclass
class Report:
    keys: int = 0
    kills: int = 0
    sends: int = 0
    changes: int = 0  # changes that ran (answered sends, and unanswered ones the server took)
    runs: int = 0
    reruns: int = 0  # runs beyond a change's first (a kill, a lost lease)
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        return (f"[sequence] {self.keys} keys, {self.sends} sends answered, {self.changes} changes run in "
                f"{self.runs} runs ({self.reruns} again after a kill), {self.kills} kills, "
                f"{len(self.problems)} problems, {self.seconds:.1f} s")


def run(cfg: Config) -> Report:
    report = Report(keys=cfg.keys)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pq-sequence-") as tmp, RedisProcess(Path(tmp)) as server:
        logfile = Path(tmp) / "ledger.log"
        env = dict(os.environ, PYQUEUE_URL=server.url, SEQUENCE_LOG=str(logfile),
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        import sequence_app

        from pyqueue import connect

        sequence_app.tasks.bind(connect(server.url))  # this process reads; the others read PYQUEUE_URL
        q = sequence_app.tasks.queue(sequence_app.QUEUE)
        chaos(cfg, "sequence_app", env, Path(tmp), q, report)
        check(logfile, server, q, report)
        report.seconds = time.monotonic() - started
    return report


def check(logfile: Path, server: RedisProcess, q: Any, report: Report) -> None:
    first_run: dict[tuple[str, int], int] = {}  # (key, n) -> ledger line of its first run
    last_done: dict[tuple[str, int], int] = {}  # (key, n) -> ledger line of its last return
    runs: collections.Counter[tuple[str, int]] = collections.Counter()
    answered: set[tuple[str, int]] = set()
    for at, line in enumerate(logfile.read_text().splitlines()):
        parts = line.split(" ")
        change = (parts[1], int(parts[2]))
        if parts[0] == "sent":
            answered.add(change)
        elif parts[0] == "run":
            first_run.setdefault(change, at)
            runs[change] += 1
        elif parts[0] == "done":
            last_done[change] = at
    report.sends, report.changes = len(answered), len(first_run)
    report.runs = sum(runs.values())
    report.reruns = report.runs - len(runs)
    for change in sorted(answered - set(last_done)):
        report.problems.append(f"key {change[0]}: change {change[1]} was sent (answered) and never ran to its end")
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for key, n in first_run:
        by_key[key].append(n)
    for key, ns in sorted(by_key.items()):
        ns.sort()
        for before, after in zip(ns, ns[1:]):
            ended = last_done.get((key, before))
            if ended is None or first_run[(key, after)] < ended:
                report.problems.append(f"key {key}: change {after} started (line {first_run[(key, after)]}) before "
                                       f"change {before}, sent before it, had ended (line {ended})")
    s = q.stats()
    if s.ready + s.scheduled + s.leased + s.dead + s.sequenced:
        report.problems.append(f"jobs left: ready {s.ready}, scheduled {s.scheduled}, leased {s.leased}, "
                               f"dead {s.dead}, sequenced {s.sequenced}")
    with server.client() as r:
        heads = [f for f in r.hkeys(q.spec.keys.keyed) if f.startswith((b"s:", b"j:"))]
    if heads:
        report.problems.append(f"sequence entries left: {heads[:5]}")


if __name__ == "__main__":
    sys.exit(main(run, __doc__))
