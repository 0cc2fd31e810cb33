"""Debounce crash harness: producer processes send bursts of debounced tasks for a set
of keys while worker processes (``python -m pyqueue worker``) run them, and both are
SIGKILLed at random, on a real redis-server; a checker reads the queue all along.

Usage (the deep run)::

    python tests/debounce_crash.py --keys 40 --kills 80 --seconds 30

tests/test_debounce_crash.py runs it at CI size (12 keys, 20 kills, 8 s of sends).

1. A redis-server this harness starts (unix socket in a temporary directory; stopped by
   its PID); ``workers`` worker processes of tests/debounce_app.py with short leases
   (2 s), and ``producers`` producer processes, each sending for keys of its own
   (tests/debounce_app.py ``produce``: bursts of 1..6 sends, a debounce window of
   0.15 s).
2. Chaos for ``seconds``: every 0.1..0.5 s a random worker or producer is SIGKILLed (a
   producer may die mid-call) and replaced, up to ``kills`` kills.
3. All along, about 20 times a second, one atomic read (a Lua snapshot of the queue's
   scheduled jobs not yet due and their records): **at most one job per key waits**.
4. Then the producers stop, the queue drains, and the ledger is checked: for every key,
   **the last send that was answered ran to its end** (a run that returned with its
   arguments, or with a later send's), and every run ran the arguments of a send;
   nothing is left in the queue, and the key fields have no holder left once their
   windows have passed.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
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
from keyed_harness import Config, chaos, main  # noqa: E402

#: The checker's snapshot: the server's clock, and the scheduled jobs of the queue not
#: yet due with their records, in one atomic read (a test's own script, read only).
SNAPSHOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
if #ids == 0 then return {now} end
local records = redis.call('HMGET', KEYS[1], unpack(ids))
local out = {now}
for i, id in ipairs(ids) do out[#out + 1] = id; out[#out + 1] = records[i] or '' end
return out
"""


@dataclasses.dataclass
class Report:
    keys: int = 0
    kills: int = 0
    sends: int = 0
    debounced: int = 0
    runs: int = 0
    snapshots: int = 0
    most_waiting: int = 0  # the most jobs waiting for one key in any snapshot (must be <= 1)
    seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        return (f"[debounce] {self.keys} keys, {self.sends} sends answered ({self.debounced} debounced), "
                f"{self.runs} runs, {self.kills} kills, {self.snapshots} snapshots, at most {self.most_waiting} "
                f"waiting per key, {len(self.problems)} problems, {self.seconds:.1f} s")


def run(cfg: Config) -> Report:
    report = Report(keys=cfg.keys)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pq-debounce-") as tmp, RedisProcess(Path(tmp)) as server:
        logfile = Path(tmp) / "ledger.log"
        env = dict(os.environ, PYQUEUE_URL=server.url, DEBOUNCE_LOG=str(logfile),
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        import debounce_app

        from pyqueue import connect

        debounce_app.tasks.bind(connect(server.url))  # the checker reads; the others read PYQUEUE_URL
        q = debounce_app.tasks.queue(debounce_app.QUEUE)
        stop = threading.Event()
        checker = threading.Thread(target=watch, args=(server, q, stop, report), daemon=True)
        checker.start()
        try:
            chaos(cfg, "debounce_app", env, Path(tmp), q, report)
        finally:
            stop.set()
            checker.join(timeout=5)
        check(logfile, server, q, report)
        report.seconds = time.monotonic() - started
    return report


def watch(server: RedisProcess, q: Any, stop: threading.Event, report: Report) -> None:
    """The checker: at most one job per key waits (scheduled, not yet due), read atomically."""
    from pyqueue.tasks import envelope

    with server.client() as r:
        snapshot = r.register_script(SNAPSHOT)
        keys = [q.spec.keys.jobs, q.spec.keys.scheduled]
        while not stop.is_set():
            reply = snapshot(keys=keys)
            waiting: collections.Counter[str] = collections.Counter()
            for i in range(1, len(reply), 2):
                job_id, record = reply[i].decode(), reply[i + 1]
                payload = record.split(b"|", 3)[3] if record else b""
                try:
                    key = envelope.decode(payload).args[0]
                except Exception as exc:
                    report.problems.append(f"job {job_id}: record unreadable ({exc})")
                    continue
                waiting[key] += 1
            report.snapshots += 1
            if waiting:
                most = max(waiting.values())
                report.most_waiting = max(report.most_waiting, most)
                if most > 1:
                    report.problems.append(f"more than one job waits for a key: {dict(waiting)}")
            time.sleep(0.05)


def check(logfile: Path, server: RedisProcess, q: Any, report: Report) -> None:
    sent: dict[str, list[int]] = collections.defaultdict(list)  # key -> stamps of answered sends
    done: dict[str, list[int]] = collections.defaultdict(list)  # key -> stamps of runs that returned
    tried: set[tuple[str, int]] = set()  # every send made, answered or not (its producer killed)
    ran: list[tuple[str, int]] = []
    for line in logfile.read_text().splitlines():
        parts = line.split(" ")
        if parts[0] == "try":
            tried.add((parts[1], int(parts[2])))
        elif parts[0] == "sent":
            sent[parts[1]].append(int(parts[2]))
            report.sends += 1
            report.debounced += parts[4] == "debounced"
        elif parts[0] == "done":
            done[parts[1]].append(int(parts[2]))
        elif parts[0] == "run":
            ran.append((parts[1], int(parts[2])))
    report.runs = len(ran)
    for key, stamps in sorted(sent.items()):
        if not done.get(key) or max(done[key]) < max(stamps):
            report.problems.append(f"key {key}: its last answered send ({max(stamps)}) never ran to its end "
                                   f"(latest run that returned: {max(done.get(key) or [0])})")
    # A run's arguments are a send's (answered, or cut short by its producer's kill).
    for key, stamp in ran:
        if (key, stamp) not in tried:
            report.problems.append(f"key {key}: a run with stamp {stamp}, which no send had")
    if report.debounced == 0:
        report.problems.append("no send was debounced: the harness did not exercise the merge")
    s = q.stats()
    if s.ready + s.scheduled + s.leased + s.dead:
        report.problems.append(f"jobs left: {json.dumps(dataclasses.asdict(s))}")
    with server.client() as r:
        windows = r.zrangebyscore(q.spec.keys.windows, f"({int(time.time() * 1000)}", "+inf")
    if windows:
        report.problems.append(f"key fields still in force after the windows passed: {windows[:5]}")


if __name__ == "__main__":
    sys.exit(main(run, __doc__))
