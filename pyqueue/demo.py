"""``pyqueue demo``: the project's main job, end to end.

Sends a few thousand runs of two tasks (``send_email`` and ``build_report``, each on
its own queue), runs workers on them, kills one worker
mid-way, shows its jobs recovered by the others (scrubbed, long before their leases
would expire), and checks the promises at the end: nothing lost, nothing acked twice.

On the embedded fakeredis the workers are threads of this process and the kill is
simulated (the worker stops renewing and abandons its leases, as SIGKILL leaves them);
with ``--url`` they are ``pyqueue worker`` processes and the kill is a real SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis as redis_lib

from pyqueue.drivers.clients import Client, connect
from pyqueue.drivers.queue import Queue
from pyqueue.ops.service import Services
from pyqueue.tasks import Tasks, current_job
from pyqueue.worker import Worker

QUEUES = ("demo-emails", "demo-reports")
NAMESPACE = "demo"
#: Short service expiry so the dead worker is found in seconds; long leases, so the
#: recovery shown is the scrub, not lease expiry.
RENEW_MS, EXPIRE_MS, LEASE_MS = 500, 2_000, 120_000
CONCURRENCY = 4

_client: Client | None = None


def executions_key(prefix: str) -> str:
    return f"{prefix}:{{demo}}:executions"


#: The demo's tasks; ``pyqueue worker pyqueue.demo:tasks`` serves them.
tasks = Tasks()


def _record_run() -> None:
    """10 ms of "work", then a durable record of the run (the job's id)."""
    global _client
    if _client is None:
        _client = connect(os.environ["PYQUEUE_URL"])
    time.sleep(0.01)
    _client.rpush(executions_key(os.environ.get("PYQUEUE_PREFIX", "pq")), current_job().id)


# Each run's job id is the queue and its number (`unique=`), so the checks at the end
# can name every run that should have happened.
@tasks.task(queue=QUEUES[0], unique=lambda n, to: f"{QUEUES[0]}-{n}")
def send_email(n: int, to: str) -> None:
    """Pretend to send an email."""
    _record_run()


@tasks.task(queue=QUEUES[1], unique=lambda n: f"{QUEUES[1]}-{n}")
def build_report(n: int) -> None:
    """Pretend to build a report."""
    _record_run()


class _Say:
    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last_bar = -1

    def line(self, text: str) -> None:
        if self.tty and self.last_bar >= 0:
            sys.stdout.write("\n")
            self.last_bar = -1
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def bar(self, done: int, total: int, note: str) -> None:
        pct = done * 100 // max(total, 1)
        if self.tty:
            filled = pct * 40 // 100
            sys.stdout.write(f"\r  [{'#' * filled}{'.' * (40 - filled)}] {done}/{total} {note:<40}")
            sys.stdout.flush()
            self.last_bar = pct
        elif pct // 20 != self.last_bar // 20:
            sys.stdout.write(f"  {done}/{total} done {note}\n")
            self.last_bar = pct


class DashboardStarter(Protocol):
    """Starts the demo's dashboard (the CLI passes
    :func:`pyqueue.dashboard.server.start_demo_dashboard` with its port: this floor does
    not import the dashboard's)."""

    def __call__(
        self, client: Client, *, url: str, prefix: str, queues: Sequence[str], namespace: str,
        say: Callable[[str], None],
    ) -> Lingering: ...


class Lingering(Protocol):
    """A started dashboard: serves until Ctrl-C once the demo has ended."""

    def linger(self, say: Callable[[str], None]) -> None: ...


def run_demo(
    *, url: str = "embedded", prefix: str = "pq", jobs: int = 3000, workers: int = 3,
    dashboard: DashboardStarter | None = None,
) -> int:
    """Run the demo; returns 0 if every check passed. ``dashboard``: also serve the
    dashboard (on 127.0.0.1) from before the first enqueue until Ctrl-C after the end,
    so its charts hold the whole run (needs the ``dashboard`` extra)."""
    global _client
    say = _Say()
    client = connect(url)
    _client = client
    os.environ["PYQUEUE_URL"], os.environ["PYQUEUE_PREFIX"] = url, prefix
    queues = [Queue(name, client, prefix=prefix) for name in QUEUES]
    services = Services(client, namespace=NAMESPACE, prefix=prefix)
    for q in queues:  # a clean slate for the demo's own keys only
        client.delete(*q.spec.keys.all())
    client.delete(executions_key(prefix))
    workers = max(2, workers)

    say.line(f"pyqueue demo on {'the embedded fakeredis' if url == 'embedded' else url}")
    serving = None
    if dashboard is not None:
        serving = dashboard(client, url=url, prefix=prefix, queues=QUEUES, namespace=NAMESPACE, say=say.line)
    split = {QUEUES[0]: jobs * 2 // 3, QUEUES[1]: jobs - jobs * 2 // 3}
    tasks.bind(client, prefix=prefix)
    for start in range(0, split[QUEUES[0]], 500):
        send_email.send_many([send_email.s(n, f"user{n}@example.com") for n in range(start, min(start + 500, split[QUEUES[0]]))])
    say.line(f"  sent {split[QUEUES[0]]} send_email tasks to {QUEUES[0]}")
    for start in range(0, split[QUEUES[1]], 500):
        build_report.send_many([(n,) for n in range(start, min(start + 500, split[QUEUES[1]]))])
    say.line(f"  sent {split[QUEUES[1]]} build_report tasks to {QUEUES[1]}")

    pool = _ThreadWorkers(client, prefix) if url == "embedded" else _ProcessWorkers(url, prefix)
    for _ in range(workers):
        pool.start()
    say.line(f"  started {workers} workers ({pool.kind}), {CONCURRENCY} handler threads each, serving "
             f"{QUEUES[0]} first, then {QUEUES[1]}")

    victim, victim_owner, killed_at, in_flight, scrubbed_at = -1, "", 0.0, 0, 0.0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            stats = [q.stats() for q in queues]
            done = sum(s.acked for s in stats)
            note = ""
            if not killed_at and done >= jobs * 0.3:
                # Kill the worker holding the most leases, so there is something to recover.
                held = [(_held(client, queues, pool.owner(i)), i) for i in range(workers)]
                in_flight, victim = max(held)
                if in_flight > 0:
                    victim_owner = pool.owner(victim)
                    pool.kill(victim)
                    killed_at = time.monotonic()
                    time.sleep(0.05)  # a call the victim had in flight has landed by now
                    in_flight = _held(client, queues, victim_owner)
                    say.line(f"  killed worker {victim_owner} ({pool.kill_kind}) holding {in_flight} leased jobs")
            if killed_at and not scrubbed_at and sum(s.scrubbed for s in stats) > 0:
                scrubbed_at = time.monotonic()
                say.line(f"  its {sum(s.scrubbed for s in stats)} leases were scrubbed back to ready "
                         f"{scrubbed_at - killed_at:.1f} s after the kill (leases would expire after "
                         f"{LEASE_MS // 1000} s)")
            if killed_at and not scrubbed_at:
                note = "(waiting for the dead worker's key to expire)"
            say.bar(done, jobs, note)
            if done >= jobs and all(s.leased == 0 and s.ready == 0 for s in stats):
                break
            # Look often while no worker has been seen holding a lease to kill: a fast
            # drain holds each lease only briefly, and could end before a slow poll saw one.
            time.sleep(0.01 if done >= jobs * 0.3 and not killed_at else 0.1)
    finally:
        pool.stop_all()

    stats = [q.stats() for q in queues]
    say.line("")
    say.line("  queue          enqueued  acked  ready  scheduled  leased  dead  reclaimed  scrubbed")
    for q, s in zip(queues, stats):
        say.line(f"  {q.name:<14} {s.enqueued:>8} {s.acked:>6} {s.ready:>6} {s.scheduled:>10} {s.leased:>7} "
                 f"{s.dead:>5} {s.reclaimed:>10} {s.scrubbed:>9}")
    raw_runs: Any = client.lrange(executions_key(prefix), 0, -1)
    runs = [raw.decode() for raw in raw_runs]
    redeliveries = len(runs) - len(set(runs))
    expected = {f"{name}-{i}" for name, n in split.items() for i in range(n)}
    checks = [
        ("nothing lost: every job ran at least once", set(runs) == expected),
        ("nothing acked twice: acks answered OK == jobs enqueued",
         sum(s.acked for s in stats) == sum(s.enqueued for s in stats) == jobs),
        ("nothing left behind: no job ready, scheduled, leased or dead",
         all(s.ready == s.scheduled == s.leased == s.dead == 0 for s in stats)),
        (f"the killed worker's jobs were recovered by scrub ({sum(s.scrubbed for s in stats)} leases)",
         bool(scrubbed_at)),
        (f"redeliveries ({redeliveries}) only for jobs the killed worker held ({in_flight})",
         redeliveries <= in_flight),
        ("every worker that was not killed stopped cleanly and deregistered",
         pool.clean_exits() and all(i.owner == victim_owner for i in services.list() if i.alive)),
    ]
    say.line("")
    for text, ok in checks:
        say.line(f"  [{'ok' if ok else 'FAILED'}] {text}")
    if serving is not None:
        serving.linger(say.line)
    return 0 if all(ok for _, ok in checks) else 1


def _held(client: Client, queues: list[Queue], owner: str) -> int:
    """How many leases ``owner`` holds in ``queues`` (from the owners index)."""
    return sum(len(client.zrangebylex(q.spec.keys.owners, f"[{owner}|", f"({owner}}}")) for q in queues)


class _Workers:
    kind = ""
    kill_kind = ""

    def start(self) -> None:
        raise NotImplementedError

    def owner(self, index: int) -> str:
        raise NotImplementedError

    def kill(self, index: int) -> None:
        raise NotImplementedError

    def stop_all(self) -> None:
        raise NotImplementedError

    def clean_exits(self) -> bool:
        raise NotImplementedError


class _ThreadWorkers(_Workers):
    kind = "threads of this process"
    kill_kind = "simulated SIGKILL"

    def __init__(self, client: Client, prefix: str) -> None:
        self.client, self.prefix = client, prefix
        self.workers: list[Worker] = []
        self.threads: list[threading.Thread] = []
        self.killed: set[int] = set()
        logging.getLogger("pyqueue.worker").setLevel(logging.WARNING)

    def start(self) -> None:
        worker = tasks.worker(QUEUES, redis=self.client, prefix=self.prefix, namespace=NAMESPACE,
                              concurrency=CONCURRENCY, lease_ms=LEASE_MS, renew_ms=RENEW_MS, expire_ms=EXPIRE_MS,
                              block_ms=1_000)
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
        thread.start()
        self.workers.append(worker)
        self.threads.append(thread)

    def owner(self, index: int) -> str:
        while self.workers[index].service is None:
            time.sleep(0.01)
        return self.workers[index].service.owner  # type: ignore[union-attr]

    def kill(self, index: int) -> None:
        self.killed.add(index)
        self.workers[index].kill()

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop("demo finished")
        for thread in self.threads:
            thread.join(30)

    def clean_exits(self) -> bool:
        return not any(t.is_alive() for t in self.threads)


class _ProcessWorkers(_Workers):
    kind = "pyqueue worker processes"
    kill_kind = "SIGKILL"

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.procs: list[subprocess.Popen[Any]] = []
        self.killed: set[int] = set()
        self.services = Services(connect(url), namespace=NAMESPACE, prefix=prefix)

    def start(self) -> None:
        before = {i.id for i in self.services.list()}
        args = [sys.executable, "-m", "pyqueue", "--url", self.url, "--prefix", self.prefix, "--namespace", NAMESPACE,
                "worker", "pyqueue.demo:tasks", "--concurrency", str(CONCURRENCY), "--lease-ms", str(LEASE_MS),
                "--renew-ms", str(RENEW_MS), "--expire-ms", str(EXPIRE_MS), "--block-ms", "1000"]
        for name in QUEUES:
            args += ["-q", name]
        env = dict(os.environ, PYQUEUE_URL=self.url, PYQUEUE_PREFIX=self.prefix)
        self.procs.append(subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL))
        for _ in range(500):  # wait for its registration, so owner() can name it
            if {i.id for i in self.services.list()} - before:
                return
            time.sleep(0.01)

    def owner(self, index: int) -> str:
        pid = self.procs[index].pid
        for info in self.services.list():
            if info.pid == pid and info.alive:
                return info.owner
        raise RuntimeError(f"worker process {pid} is not registered")

    def kill(self, index: int) -> None:
        self.killed.add(index)
        os.kill(self.procs[index].pid, signal.SIGKILL)
        self.procs[index].wait()

    def stop_all(self) -> None:
        for i, proc in enumerate(self.procs):
            if i not in self.killed and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()

    def clean_exits(self) -> bool:
        return all(p.returncode == 0 for i, p in enumerate(self.procs) if i not in self.killed)
