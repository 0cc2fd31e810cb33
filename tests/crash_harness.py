"""Crash harness: worker processes SIGKILLed at every named crash point, and at random,
while they drain a queue on a real redis-server; then a total-queue checker.

Usage (the deep run)::

    python tests/crash_harness.py --trials 50 --jobs 5000

tests/test_crash.py runs it at CI size (3 trials x 1000 jobs) and, with
``PYQUEUE_DEEP=1``, at the deep size.

One trial:

1. A fresh keyspace on a redis-server this harness started (unix socket in a temporary
   directory, ``--save '' --appendonly no``; stopped by its PID). Enqueue ``jobs`` jobs
   (every 100th a slow one, 0.5..1 s, so that running leases get extended) and, after
   60% of them, a poison job (max_attempts 3; its handler SIGKILLs its own worker every
   time). The first half is enqueued before any worker starts, the rest while they run.
2. Chaos: ``workers`` worker processes (``python -m pyqueue worker
   crash_handlers:record``, ``crash_handlers:record_async`` on AsyncWorker, or the task
   layer's ``crash_handlers:tasks`` / ``tasks_async``, in turn; every third job is a
   task job), each started with one crash point (the point with the
   fewest hits so far, so every point is hit) and a probability that makes it die
   mid-run (:meth:`Config.probability`); the harness also SIGKILLs a random worker every
   0.5..2.5 s (sparing one whose point was never hit). Every dead worker is replaced,
   until nothing is ready, scheduled or leased.
3. Stop: SIGTERM the survivors; then a final drain by one clean worker (no crash
   points), run until the queue is settled and its renewals have scrubbed and
   forgotten every dead worker, then stopped with SIGTERM (it deregisters).
   Meanwhile the harness cancels every ``cancel_every``-th job at a random moment
   (whatever its state: ready, leased, scheduled), and every chaos worker carries the
   periodic job ``tick`` (``--every tick=<tick_every_s>s``), so ticks are enqueued by
   whichever workers are alive, across the kills.
4. Check (:func:`check_trial`): every enqueued id executed and acked exactly once but
   for those whose cancel ended them (never acked, gone from the queue, counted in
   ``stats.cancelled``); every tick enqueued once (``stats.enqueued`` counts one add
   per distinct tick that ran), run, and acked once; the
   poison DEAD after 3 attempts with its error text, redeliveries within the bound the
   kills imply, and no key left but the expected ones (a stopped worker's leaked
   private wake key, which expires by its TTL, is counted apart; ``--strict-keys`` makes it
   a violation).

**The redelivery bound.** A worker holds at most ``concurrency`` leases at once (one
per handler slot: a slot's ack-and-lease acks its job and leases the next in one
call), plus its ``prefetch`` (``--prefetch``: jobs leased ahead of its threads; the
bound below then counts concurrency + prefetch; "auto", the default, counts as
``concurrency``: the most it prefetches). A kill orphans at most those leases, and only an orphaned lease whose handler
had started produces a second execution. So executions - distinct ids executed (poison
excluded) <= concurrency x (kills + evictions) + leases lost by live workers, where an
eviction is a worker that lost its registration while alive (a stall longer than
``expire_ms``) and a lost lease is one a live worker logged as lost. Both are 0 in a
healthy run and reported.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # run as a script: make crash_handlers importable
    sys.path.insert(0, str(TESTS))

from crash_handlers import POISON_PREFIX, TASK_NAME  # noqa: E402

#: The periodic job every chaos worker carries: its ids are tick:<unix seconds>.
TICK_PREFIX = "tick:"

from pyqueue import DeadJob, NewJob, Queue, Stats  # noqa: E402
from pyqueue.tasks import envelope  # noqa: E402
from pyqueue.worker.crash import CRASH_POINTS  # noqa: E402
from pyqueue.drivers.queue import transport_of

PREFIX = "pq"


# -- a redis-server of our own ---------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the caller retries on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProcess:
    """A redis-server owned by this process.

    It listens on a unix socket in ``directory`` (or, with ``tcp``, on a free port of
    127.0.0.1 only), keeps its files there, and is stopped or SIGKILLed by its PID.
    :meth:`restart` starts it again on the same directory, socket path and port, so an
    append-only file written before a kill is replayed.
    """

    def __init__(self, directory: Path, *, tcp: bool = False, appendonly: bool = False,
                 extra: Sequence[str] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary = binary
        self.directory = directory
        self.socket: Path | None = None if tcp else directory / "redis.sock"
        self._short: tempfile.TemporaryDirectory[str] | None = None
        if self.socket is not None and len(str(self.socket).encode()) > 100:
            # A unix socket path holds at most 107 bytes: use a short directory for it.
            self._short = tempfile.TemporaryDirectory(prefix="pq-")
            self.socket = Path(self._short.name) / "redis.sock"
        self.port = 0
        self.appendonly = appendonly
        self.extra = tuple(extra)
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def _args(self) -> list[str]:
        args = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.directory),
                "--save", "", "--logfile", str(self.directory / "redis.log")]
        if self.socket is not None:
            args += ["--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args + list(self.extra)

    def start(self) -> None:
        """Start the server and wait until it answers PING (after loading its AOF)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        for _ in range(5):  # a TCP port picked free may be taken by the time we bind it
            if self.socket is None and not self.port:
                self.port = free_port()
            self.process = subprocess.Popen(self._args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
            if self._wait_ready(10.0):
                return
            self._reap()
            if self.socket is None:
                self.port = 0
        raise RuntimeError(f"redis-server did not start; see {self.directory / 'redis.log'}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            with self.client(socket_timeout=1) as client:
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError):  # BusyLoadingError is one
                    pass
            time.sleep(0.02)
        return False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def url(self) -> str:
        if self.socket is not None:
            return f"unix://{self.socket}"
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        """A plain redis-py client (close it, or use it as a context manager)."""
        if self.socket is not None:
            return redis.Redis(unix_socket_path=str(self.socket), **kwargs)  # type: ignore[arg-type]
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL the server (by PID) and reap it: no shutdown, no final fsync."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        """SIGTERM the server (by PID) and wait; SIGKILL if it does not exit in 10 s."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._reap()

    def _reap(self) -> None:
        if self.process is not None:
            self.process.wait()

    def restart(self) -> None:
        """Start again on the same directory, socket path and port."""
        self._reap()
        self.start()

    def __enter__(self) -> RedisProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._short is not None:
            self._short.cleanup()


# -- configuration and observations ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """One harness run. Defaults are the CI size; the CLI's defaults are the deep size."""

    trials: int = 3
    jobs: int = 1000
    #: worker processes alive at once during the chaos phase
    workers: int = 3
    #: handler threads per worker
    concurrency: int = 4
    #: jobs each worker leases ahead of its threads (--prefetch; "auto", the default: up
    #: to `concurrency` while the jobs are short): a kill orphans at most concurrency +
    #: prefetch leases
    prefetch: int | str = "auto"

    @property
    def most_prefetched(self) -> int:
        """The most jobs a worker holds leased beyond its threads."""
        return self.concurrency if self.prefetch == "auto" else int(self.prefetch)
    #: leases are extended every third of this: a worker must live that long to reach
    #: the in_extend crash point
    lease_ms: int = 2000
    renew_ms: int = 200
    expire_ms: int = 1000
    block_ms: int = 1000
    poison_max_attempts: int = 3
    #: high enough that kills alone never send a job to DEAD (a job would have to be
    #: orphaned this many times in a row)
    job_max_attempts: int = 100
    #: the harness SIGKILLs a random worker after a pause drawn from this range (seconds)
    external_kill_s: tuple[float, float] = (0.5, 2.5)
    #: most random work per job in the handler
    work_ms: float = 2.0
    #: every this many jobs one is slow: it runs for slow_ms, longer than the extension
    #: period (lease_ms / 3), so running leases are extended and in_extend is reached
    slow_every: int = 100
    slow_ms: tuple[int, int] = (500, 1000)
    #: a trial that has not settled by then is a failure (liveness, not speed)
    trial_timeout_s: float | None = None
    #: a stopped worker's leaked private wake key is a violation (see unexpected_keys)
    strict_keys: bool = False
    #: every this many jobs one is cancelled during the chaos (0: none)
    cancel_every: int = 25
    #: the chaos workers' periodic job ``tick`` runs every this many seconds (0: none)
    tick_every_s: int = 1
    #: 0: each chaos worker is one process. N > 0: each is a supervisor
    #: (``--processes N``) whose children carry its crash point; the harness SIGKILLs
    #: random children, and the supervisor replaces them and scrubs their leases.
    processes: int = 0
    #: seeds the harness's own choices (kill times, slow jobs); the workers' dice and the
    #: timing are not reproducible, so a seed narrows a rerun but does not replay it
    seed: int | None = None

    def timeout_s(self) -> float:
        return self.trial_timeout_s if self.trial_timeout_s is not None else 90.0 + self.jobs / 25

    def probability(self, point: str) -> float:
        """Per-check probability that a worker configured with ``point`` dies there.

        after_register is checked once (always dies: tests registration and the
        forgetting of the dead); after_lease once per lease round, mostly at start-up
        (dies at one of its first rounds); in_extend once per heartbeat extension while
        jobs run (dies at the first, lease_ms / 3 after start); the per-job points so that
        a worker lives for about jobs / 20 jobs (between 20 and 500), i.e. several kills
        per trial.
        """
        fixed = {"after_register": 1.0, "after_lease": 0.5, "in_extend": 1.0}  # EARLY_DEATHS
        if point in fixed:
            return fixed[point]
        return 1.0 / max(20, min(500, self.jobs // 20))


@dataclasses.dataclass
class WorkerRun:
    """One worker process of a trial, and how it ended."""

    index: int
    role: str  # "chaos" or "drain"
    point: str | None
    probability: float
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    killed_by_harness: bool = False
    terminated_by_harness: bool = False
    returncode: int | None = None
    #: "external", a crash point name, "poison", "clean", or "unexplained ..."
    death: str = ""
    evicted: bool = False
    lost_leases: int = 0
    #: A supervisor (``--processes``): its children's deaths by cause, and how many of
    #: its children the harness killed.
    supervised: bool = False
    child_deaths: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: pids of its children the harness SIGKILLed
    children_killed: set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class Observations:
    """Everything the checker looks at, as plain data (so the checker can be tested on
    made-up observations)."""

    queue: str
    namespace: str
    runs_key: str
    acks_key: str
    enqueued: list[str]
    poison_id: str
    poison_max_attempts: int
    #: the most leases one worker holds: its concurrency, plus its prefetch
    concurrency: int
    #: (id, fence) of every logged execution, in log order
    runs: list[tuple[str, int]]
    #: (id, fence) of every ack the worker saw answered ok
    acks: list[tuple[str, int]]
    stats: Stats
    #: every id still in the queue -> the states it is in
    states: dict[str, list[str]]
    dead: list[DeadJob]
    #: every key on the server with its type
    keys: dict[str, str]
    #: members of the queue's wake marker, if it exists
    wake_members: list[str]
    #: members of every service's private wake key left on the server
    service_wakes: dict[str, list[str]]
    deaths: dict[str, int]
    evictions: int
    lost_leases: int
    timed_out: bool = False
    worker_problems: list[str] = dataclasses.field(default_factory=list)
    #: ids whose cancel ended them (the cancel answered a live state)
    cancelled: list[str] = dataclasses.field(default_factory=list)
    #: count a stopped worker's private wake key holding just the stop marker as a
    #: violation (see unexpected_keys); off by default, since it expires by its TTL
    strict_keys: bool = False


@dataclasses.dataclass
class TrialReport:
    """The checker's verdict on one trial."""

    trial: int
    jobs: int
    executions: int = 0
    redeliveries: int = 0
    redelivery_bound: int = 0
    lost: int = 0
    unexpected: int = 0
    acked_twice: int = 0
    never_executed: int = 0
    fence_run_twice: int = 0
    acked_server: int = 0
    acked_observed: int = 0
    poison_runs: int = 0
    poison_dead: bool = False
    poison_error: str = ""
    leftover_keys: list[str] = dataclasses.field(default_factory=list)
    #: private wake keys left by workers that stopped cleanly (they expire by their TTL)
    wake_key_leaks: list[str] = dataclasses.field(default_factory=list)
    deaths: dict[str, int] = dataclasses.field(default_factory=dict)
    evictions: int = 0
    lost_leases: int = 0
    cancelled: int = 0
    #: distinct periodic ticks that ran
    ticks: int = 0
    workers: int = 0
    seconds: float = 0.0
    violations: list[str] = dataclasses.field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(n for cause, n in self.deaths.items() if cause != "clean")


# -- the checker -----------------------------------------------------------------------


def expected_error(max_attempts: int) -> re.Pattern[str]:
    """The dead error of a job whose every attempt killed its worker: scrubbed as a dead
    service, or (if its lease ran out first) reclaimed as expired."""
    return re.compile(rf"^(worker \S+ died|lease expired) on attempt {max_attempts} of {max_attempts}$")


def check_trial(trial: int, obs: Observations) -> TrialReport:
    """The total-queue checker (Jepsen's total-queue, for a queue that may redeliver).

    Every enqueued id must be executed at least once and acked exactly once, the poison
    must be DEAD after its attempts, nothing else may be left in the queue, and the
    keyspace must hold only the expected keys.
    """
    report = TrialReport(trial=trial, jobs=len(obs.enqueued), deaths=dict(obs.deaths), evictions=obs.evictions,
                         lost_leases=obs.lost_leases)
    v = report.violations
    v.extend(obs.worker_problems)
    if obs.timed_out:
        v.append("the chaos phase did not settle before the trial timeout")
    enqueued = set(obs.enqueued)
    if len(enqueued) != len(obs.enqueued):
        v.append("the harness enqueued an id twice")
    everything = enqueued | {obs.poison_id}
    cancelled = set(obs.cancelled)
    report.cancelled = len(cancelled)
    if cancelled - enqueued:
        v.append(f"cancelled ids the harness never enqueued: {sorted(cancelled - enqueued)[:5]}")
    finishing = enqueued - cancelled  # the jobs that must end acked

    runs_per_id = collections.Counter(job_id for job_id, _ in obs.runs)
    ticks = {job_id for job_id in runs_per_id if job_id.startswith(TICK_PREFIX)}
    report.ticks = len(ticks)
    report.executions = len(obs.runs)
    report.poison_runs = runs_per_id.get(obs.poison_id, 0)
    unexpected = set(runs_per_id) - everything - ticks
    report.unexpected = len(unexpected)
    if unexpected:
        v.append(f"unexpected: {len(unexpected)} executed ids were never enqueued, e.g. {sorted(unexpected)[:5]}")
    never = finishing - set(runs_per_id)
    report.never_executed = len(never)
    if never:
        v.append(f"never executed: {len(never)} ids, e.g. {sorted(never)[:5]}")
    fences = collections.Counter(fence for _, fence in obs.runs)
    report.fence_run_twice = sum(1 for n in fences.values() if n > 1)
    if report.fence_run_twice:
        v.append(f"{report.fence_run_twice} leases (fences) were executed more than once")

    # Lost: enqueued, and not (executed and gone from the queue). The poison must be DEAD.
    present = set(obs.states)
    lost = {i for i in finishing if i in present or i not in runs_per_id}
    report.lost = len(lost)
    if lost:
        sample = {i: obs.states.get(i, ["gone, never executed"]) for i in sorted(lost)[:5]}
        v.append(f"lost: {len(lost)} ids not acked, e.g. {sample}")
    if cancelled & present:
        v.append(f"cancelled jobs still in the queue: {sorted(cancelled & present)[:5]}")
    stray = present - everything
    if stray:
        v.append(f"ids left in the queue that the harness never enqueued (ticks?): {sorted(stray)[:5]}")

    # Acked exactly once: the worker-side log of ok answers, and the server's count.
    acks_per_id = collections.Counter(job_id for job_id, _ in obs.acks)
    report.acked_observed = len(obs.acks)
    report.acked_twice = sum(1 for n in acks_per_id.values() if n > 1)
    if report.acked_twice:
        twice = [i for i, n in acks_per_id.items() if n > 1]
        v.append(f"acked twice: {len(twice)} ids answered ok more than once, e.g. {twice[:5]}")
    acked_unknown = set(acks_per_id) - everything - ticks
    if acked_unknown:
        v.append(f"acks of ids never enqueued: {sorted(acked_unknown)[:5]}")
    if obs.poison_id in acks_per_id:
        v.append("the poison job was acked")
    if cancelled & set(acks_per_id):
        v.append(f"cancelled jobs acked: {sorted(cancelled & set(acks_per_id))[:5]}")
    s = obs.stats
    report.acked_server = s.acked
    if s.acked != len(finishing) + len(ticks):
        v.append(f"stats.acked = {s.acked}, expected {len(finishing) + len(ticks)} (each job not cancelled, and "
                 "each tick, acked exactly once)")
    if s.cancelled != len(cancelled):
        v.append(f"stats.cancelled = {s.cancelled}, expected {len(cancelled)}")
    if (s.ready, s.scheduled, s.leased, s.dead) != (0, 0, 0, 1):
        v.append(f"final counts ready/scheduled/leased/dead = {(s.ready, s.scheduled, s.leased, s.dead)}, "
                 "expected (0, 0, 0, 1)")
    # One add per job, and one per tick: a tick enqueued twice would be counted twice.
    if s.enqueued != len(everything) + len(ticks):
        v.append(f"stats.enqueued = {s.enqueued}, expected {len(everything) + len(ticks)} "
                 f"({len(everything)} jobs + {len(ticks)} ticks that ran, each added once)")

    # The poison: DEAD after exactly its attempts, with the text of a worker death.
    report.poison_dead = obs.states.get(obs.poison_id) == ["dead"]
    if not report.poison_dead:
        v.append(f"poison {obs.poison_id} is in {obs.states.get(obs.poison_id, 'no state (gone)')}, expected DEAD")
    if [d.id for d in obs.dead] != [obs.poison_id]:
        v.append(f"dead letters {[d.id for d in obs.dead]}, expected only {obs.poison_id}")
    for d in obs.dead:
        if d.id == obs.poison_id:
            report.poison_error = d.error
            if d.attempts != obs.poison_max_attempts or not expected_error(obs.poison_max_attempts).match(d.error):
                v.append(f"poison dead with attempts {d.attempts}/{d.max_attempts} and error {d.error!r}")
    if not 1 <= report.poison_runs <= obs.poison_max_attempts:
        v.append(f"the poison ran {report.poison_runs} times, expected 1..{obs.poison_max_attempts}")

    # Redeliveries within the bound the kills imply (module docstring).
    ordinary = [job_id for job_id, _ in obs.runs if job_id != obs.poison_id]
    report.redeliveries = len(ordinary) - len(set(ordinary))
    kills = sum(n for cause, n in obs.deaths.items() if cause != "clean")
    report.redelivery_bound = obs.concurrency * (kills + obs.evictions) + obs.lost_leases
    if report.redeliveries > report.redelivery_bound:
        v.append(f"{report.redeliveries} redeliveries exceed the bound {report.redelivery_bound} "
                 f"(concurrency {obs.concurrency} x ({kills} kills + {obs.evictions} evictions) + "
                 f"{obs.lost_leases} lost leases)")

    report.leftover_keys, report.wake_key_leaks = unexpected_keys(obs)
    if report.leftover_keys:
        v.append(f"unexpected leftover keys: {report.leftover_keys}")
    if report.wake_key_leaks and obs.strict_keys:
        v.append(f"private wake keys left by stopped workers: {report.wake_key_leaks}")
    return report


def unexpected_keys(obs: Observations) -> tuple[list[str], list[str]]:
    """Keys that should not be there at the end of a trial: (unexpected, wake key leaks).

    Expected: the queue's ``jobs``/``dead``/``errors`` (holding only the poison, checked
    above), ``counters``, a raised ``wake`` marker, the acked jobs' tombstones ``done``; the namespace's id counter ``seq``;
    the harness's two logs. Every other key (READY, SCHEDULED, LEASED, the owners index,
    a service key, a dead service's entries in ``ids``/``expiry``/``queues``) is
    unexpected.

    A service's private wake key holding just the stop marker is listed apart: the
    heartbeat may raise it for the stop after the deregistration deleted it (about 1
    stop in 200); it carries a 60 s TTL, so it goes by itself. Any other private wake
    key is unexpected.
    """
    q = f"{PREFIX}:{{{obs.queue}}}:"
    ns = f"{PREFIX}:{{{obs.namespace}}}:service:"
    allowed = {q + "jobs": "hash", q + "dead": "zset", q + "errors": "hash", q + "counters": "hash",
               q + "done": "zset", ns + "seq": "string", obs.runs_key: "list", obs.acks_key: "list"}
    bad, leaks = [], []
    for key, kind in sorted(obs.keys.items()):
        if key == q + "wake" and kind == "zset" and obs.wake_members == ["wake"]:
            continue
        if key.startswith(ns) and _SERVICE_WAKE.match(key[len(ns):]) and obs.service_wakes.get(key) == ["stop"]:
            leaks.append(key)
            continue
        if allowed.get(key) != kind:
            bad.append(f"{key} ({kind})")
    return bad, leaks


_SERVICE_WAKE = re.compile(r"^\d+:wake$")


# -- running workers -------------------------------------------------------------------


#: Crash points, longest-lived first (see Trial.next_point).
SPAWN_ORDER = ("in_extend", *(p for p in CRASH_POINTS if p != "in_extend"))
#: The points a worker dies at soon after its start (Config.probability): after_register
#: at once, after_lease at one of its first lease rounds, in_extend at its first
#: extension. The others let it live for many jobs.
EARLY_DEATHS = frozenset({"after_register", "after_lease", "in_extend"})

def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has ended and waits to be reaped (or is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


_CRASH_LINE = re.compile(rb"crash point (\w+): SIGKILL")
_POISON_LINE = re.compile(rb"poison job \S+ attempt \d+: SIGKILL")
# The same two lines with the pid of the process that wrote them (the log format's
# ``name[pid]:``): a supervisor's log holds the lines of all its children.
_SELF_KILL_PID = re.compile(rb"\[(\d+)\]: (?:crash point \w+|poison job \S+ attempt \d+): SIGKILL")
_EVICTED = re.compile(rb"lost its registration")
_LOST_LEASE = re.compile(rb"lost its lease|finished but its lease was lost")
# A supervisor's lines about its children (pyqueue/worker/supervisor.py).
# Every line about a child's SIGKILL names its pid: a death is one pid, whether its
# supervisor logged "... after <s>; replacing it" or, stopping, only "worker process <pid>
# killed by SIGKILL" (a child dying as its trial ended).
_CHILD_KILLED = re.compile(rb"worker process (\d+) killed by SIGKILL")
_CHILD_SCRUBBED = re.compile(rb"worker process \d+ killed by SIGKILL: \d+ of its leases are back")
_CHILD_UNREGISTERED = re.compile(rb"worker process \d+ killed by SIGKILL before it registered")
_CHILD_EXITED = re.compile(rb"worker process \d+ exited (\d+) after")


class Trial:
    """Runs one trial on ``server`` and collects its observations."""

    def __init__(self, server: RedisProcess, cfg: Config, number: int, workdir: Path, rng: random.Random,
                 hits: collections.Counter[str], carried: collections.Counter[str] | None = None) -> None:
        self.server, self.cfg, self.number, self.rng, self.hits = server, cfg, number, rng, hits
        #: Per crash point, the supervisors of earlier trials that carried it (see next_point).
        self.carried: collections.Counter[str] = carried if carried is not None else collections.Counter()
        self.workdir = workdir / f"trial-{number}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.queue = f"crash{number}"
        self.namespace = f"crash{number}"
        self.runs_key = f"crash:{{{self.queue}}}:runs"
        self.acks_key = f"crash:{{{self.queue}}}:acks"
        self.poison_id = f"{POISON_PREFIX}-{number}"
        self.workers: list[WorkerRun] = []
        self.problems: list[str] = []
        self.cancelled: list[str] = []

    # worker processes

    def spawn(self, role: str, point: str | None) -> WorkerRun:
        cfg = self.cfg
        env = dict(os.environ)
        env.pop("PYQUEUE_CRASH_POINT", None)
        env.pop("PYQUEUE_CRASH_PROBABILITY", None)
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p),
            PQ_CRASH_URL=self.server.url, PQ_CRASH_RUNS=self.runs_key, PQ_CRASH_ACKS=self.acks_key,
            PQ_CRASH_WORK_MS=str(cfg.work_ms),
        )
        probability = 0.0
        if point is not None:
            probability = cfg.probability(point)
            env.update(PYQUEUE_CRASH_POINT=point, PYQUEUE_CRASH_PROBABILITY=repr(probability))
        argv = [sys.executable, "-m", "pyqueue", "--url", self.server.url, "--namespace", self.namespace,
                "worker", self.handler_of(len(self.workers)), "-q", self.queue, "--concurrency", str(cfg.concurrency),
                "--lease-ms", str(cfg.lease_ms), "--renew-ms", str(cfg.renew_ms), "--expire-ms", str(cfg.expire_ms),
                "--block-ms", str(cfg.block_ms)]
        argv += ["--prefetch", str(cfg.prefetch)]
        if cfg.tick_every_s and role == "chaos":  # the drain worker adds none: it must settle
            # A tick is killed as often as any job: it gets the jobs' attempts, not the default 5.
            argv += ["--every", f"tick={cfg.tick_every_s}s", "--schedule-attempts", str(cfg.job_max_attempts)]
        supervised = bool(cfg.processes) and role == "chaos"
        if supervised:
            # Children die at the crash point over and over, by design: none of those
            # deaths is a crash loop. With the default, every death within 10 s of a
            # start counted as one, and past the fifth in a row each replacement waited
            # 10 s: a trial whose three supervisors all carried fast-dying points (two
            # in_extend and after_lease) drained at a few jobs a minute and ran past
            # its 240 s timeout in CI (stop 34).
            argv += ["--processes", str(cfg.processes), "--fast-death-ms", "0"]
        index = len(self.workers)
        log_path = self.workdir / f"worker-{index}-{role}-{point or 'clean'}.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
        run = WorkerRun(index, role, point, probability, proc, log_path, time.monotonic(), supervised=supervised)
        self.workers.append(run)
        return run

    @staticmethod
    def handler_of(index: int) -> str:
        """Workers take turns: the raw handler, the async one (on AsyncWorker), and the
        task layer's worker of a Tasks object, sync and async (which also runs the raw
        jobs): all meet the same crash points and the same checker."""
        return ("crash_handlers:record", "crash_handlers:record_async", "crash_handlers:tasks",
                "crash_handlers:tasks_async")[index % 4]

    def next_point(self) -> str:
        """The crash point with the fewest hits plus workers started with it in this trial
        (alive or not), so that the points take turns and every one is hit: counting only
        live workers gave a point back to the front each time its worker was killed from
        outside, and a supervised run, whose supervisors' hits are read from their logs
        at the end, once started none with before_ack or ack_sent. A supervisor lives through
        its trial, so a supervised trial carries only ``workers`` points: those carried in
        earlier trials count too (``carried``), or a point its supervisor did not hit in
        one trial took a later trial's slot again and a point never started in any
        (ack_sent, in a CI run of 2 trials). Ties go to the points
        that need a long life first: a worker reaches in_extend only after lease_ms / 3
        of busy work, so it should start while the queue is full."""
        started = collections.Counter(w.point for w in self.workers if w.point)
        if not self.cfg.processes:
            return min(SPAWN_ORDER, key=lambda p: (self.hits[p] + started[p] + self.carried[p], SPAWN_ORDER.index(p)))
        # Supervised: at most one supervisor of a trial carries a point whose children
        # die young (EARLY_DEATHS), and the points go by how often they were carried.
        # Its children are replaced at once, so with two or three such supervisors the
        # trial's slow jobs were leased almost only by children about to die: CI-size
        # runs saw slow jobs killed 100 times, their max_attempts, and sent to DEAD.
        young = any(p in EARLY_DEATHS for p in started)
        points = [p for p in SPAWN_ORDER if not (young and p in EARLY_DEATHS)]
        return min(points, key=lambda p: (self.carried[p] + started[p], self.hits[p], SPAWN_ORDER.index(p)))

    def point_reached(self, w: WorkerRun) -> bool:
        """Whether the crash point of ``w`` has been hit: by a worker that died at it, or,
        for a supervisor, by one of its children (they write to its log as they die)."""
        if not w.point:
            return False  # the drain workers: never killed from outside
        if self.hits[w.point] > 0:
            return True
        return w.supervised and f"crash point {w.point}: SIGKILL".encode() in w.log_path.read_bytes()

    def live(self) -> list[WorkerRun]:
        return [w for w in self.workers if w.returncode is None]

    def reap(self) -> list[WorkerRun]:
        """Classify every worker that ended since the last call."""
        ended = []
        for w in self.live():
            code = w.proc.poll()
            if code is None:
                continue
            w.returncode = code
            out = w.log_path.read_bytes()
            crash = _CRASH_LINE.search(out)
            w.evicted = bool(_EVICTED.search(out))
            w.lost_leases = len(_LOST_LEASE.findall(out))
            if w.supervised:
                self.count_child_deaths(w, out)
            if code == -signal.SIGKILL:
                if crash:
                    w.death = crash.group(1).decode()
                    if w.death != w.point:
                        self.problems.append(f"worker {w.index} configured {w.point} died at {w.death}")
                    self.hits[w.death] += 1
                elif _POISON_LINE.search(out):
                    w.death = "poison"
                elif w.killed_by_harness:
                    w.death = "external"
                else:
                    w.death = "unexplained SIGKILL"
            elif code == -signal.SIGTERM and w.terminated_by_harness:
                w.death = "external"  # stopped during start-up, before its signal handler was set
            elif code == 0:
                w.death = "clean"
                if not (w.terminated_by_harness or w.role == "drain" or w.evicted):
                    w.death = "unexplained exit 0"
            else:
                w.death = f"unexplained exit {code}"
            if w.death.startswith("unexplained"):
                tail = out.decode(errors="replace")[-2000:]
                self.problems.append(f"worker {w.index} ({w.role}, {w.point}): {w.death}; log tail:\n{tail}")
            ended.append(w)
        return ended

    def count_child_deaths(self, w: WorkerRun, out: bytes) -> None:
        """A supervisor's children's deaths, from its log (the children write to it too):
        each SIGKILL is a crash point's, the poison's or the harness's; any other is
        unexplained, and so is a child killed without its leases scrubbed at once."""
        for point in _CRASH_LINE.findall(out):
            w.child_deaths[point.decode()] += 1
            self.hits[point.decode()] += 1
        w.child_deaths["poison"] += len(_POISON_LINE.findall(out))
        # A child the harness killed just as it was killing itself (after its crash
        # point's or the poison's line, before its own SIGKILL landed) died once: its
        # line explains it, and it is not counted as killed from outside too. With
        # children replaced at once, after_register children die about once a second,
        # and CI saw this window hit (46 explanations of 45 deaths).
        self_killed = {int(pid) for pid in _SELF_KILL_PID.findall(out)}
        w.child_deaths["external"] += len(w.children_killed - self_killed)
        killed = len(set(_CHILD_KILLED.findall(out)))
        if killed != sum(w.child_deaths.values()):
            self.problems.append(f"supervisor {w.index}: {killed} children killed by SIGKILL, but "
                                 f"{dict(w.child_deaths)} explained")
        scrubbed, unregistered = len(_CHILD_SCRUBBED.findall(out)), len(_CHILD_UNREGISTERED.findall(out))
        if scrubbed + unregistered != killed:
            self.problems.append(f"supervisor {w.index}: {killed} children killed, {scrubbed} scrubbed at once, "
                                 f"{unregistered} before they registered")
        w.evicted = False
        evictions = len(_EVICTED.findall(out))
        w.child_deaths["evicted"] += evictions
        others = [m.decode() for m in _CHILD_EXITED.findall(out) if m not in (b"0", b"75")]
        if others:
            self.problems.append(f"supervisor {w.index}: children exited {others}")

    def kill_child(self, w: WorkerRun) -> bool:
        """SIGKILL a random child of the supervisor ``w`` (found by its parent PID)."""
        out = subprocess.run(["pgrep", "-P", str(w.proc.pid)], capture_output=True, text=True).stdout
        # A child that died already (its own crash point, or the poison job) and is not
        # reaped yet is a zombie, which SIGKILL "kills" without error: it is not counted
        # as killed from outside (its death is its crash point's, or the poison's).
        children = [int(pid) for pid in out.split() if not _zombie(int(pid))]
        if not children:
            return False
        victim = self.rng.choice(children)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            # The child ended (its own crash point, or the poison job) between pgrep and
            # the kill: the supervisor replaces it anyway, and this tick kills nothing.
            return False
        w.children_killed.add(victim)
        return True

    def kill_all(self) -> None:
        """SIGKILL every live worker (by PID) and reap it; used on errors."""
        for w in self.live():
            if w.proc.poll() is None:
                w.killed_by_harness = True
                os.kill(w.proc.pid, signal.SIGKILL)
            w.proc.wait()
        self.reap()

    # phases

    def payload(self, n: int) -> bytes:
        """Every ``slow_every``-th job is slow (its payload is how many ms it sleeps).
        Every third job is a task job: the same, as a task envelope."""
        slow_ms = 0
        if self.cfg.slow_every and n % self.cfg.slow_every == self.cfg.slow_every // 2:
            slow_ms = self.rng.randint(*self.cfg.slow_ms)
        if n % 3 == 1:
            return envelope.encode(TASK_NAME, [slow_ms], {}, {"enqueued_ms": 0})
        return str(slow_ms).encode() if slow_ms else b""

    def settled(self, q: Queue) -> bool:
        s = q.stats()
        return s.ready == 0 and s.scheduled == 0 and s.leased == 0

    def run(self) -> Observations:
        cfg = self.cfg
        with self.server.client() as admin:
            admin.flushall()
        q = Queue.from_url(self.server.url, self.queue)
        try:
            ids = [f"job-{self.number}-{i}" for i in range(cfg.jobs)]
            pending = [NewJob(self.payload(n), job_id=i, max_attempts=cfg.job_max_attempts) for n, i in enumerate(ids)]
            # The poison comes after 60% of the jobs: early on, its kills (one about every
            # expire_ms) would cut short the workers that must live a while to reach their
            # crash point (in_extend).
            poison = NewJob(b"poison", job_id=self.poison_id, max_attempts=cfg.poison_max_attempts)
            pending.insert(cfg.jobs * 6 // 10, poison)
            first, pending = pending[: cfg.jobs // 2], pending[cfg.jobs // 2 :]
            added = []
            for i in range(0, len(first), 1000):
                added += q.enqueue_many(first[i : i + 1000])
            # The jobs to cancel, each once it is enqueued, one per round of the loop.
            to_cancel = [i for n, i in enumerate(ids) if cfg.cancel_every and n % cfg.cancel_every == 7]
            self.rng.shuffle(to_cancel)
            deadline = time.monotonic() + cfg.timeout_s()
            next_kill = time.monotonic() + self.rng.uniform(*cfg.external_kill_s)
            killed_from_outside = False
            timed_out = False
            while True:
                self.reap()
                # A supervisor of a point its children reach with any job (after_lease;
                # after_register with none) must have seen it hit before the trial ends:
                # beside two supervisors whose children live long, its children may find the
                # queue drained before their first lease (CI once saw after_lease never hit).
                # The chaos workers' periodic ticks give them a job a second meanwhile.
                if not pending and self.settled(q) and all(
                    self.point_reached(w) for w in self.live()
                    if w.supervised and w.point in ("after_lease", "after_register")
                ):
                    break
                while len(self.live()) < cfg.workers:
                    self.spawn("chaos", self.next_point())
                if pending:  # the second half arrives while workers run (wake-ups)
                    added += q.enqueue_many(pending[:250])
                    pending = pending[250:]
                enqueued_ids = {a.job_id for a in added}
                target = next((i for i in to_cancel if i in enqueued_ids), None)
                if target is not None:
                    to_cancel.remove(target)
                    if q.cancel(target).cancelled:  # else it had been acked already: no change
                        self.cancelled.append(target)
                now = time.monotonic()
                if now >= next_kill:
                    # Spare a worker whose crash point was never hit yet: let it get there.
                    # A supervisor too, until its children's log shows its point hit: its
                    # children, killed at random, once never reached ack_sent in a run.
                    # Until the trial's first kill from outside, a tick that kills
                    # nothing (no worker may be killed yet, or the child picked had just
                    # died) tries again next round, not after a whole interval: a short
                    # trial must still see one. After it, the interval holds either way
                    # (retrying every tick would kill far more often than it).
                    victims = [w for w in self.live() if now - w.started > 0.3 and self.point_reached(w)]
                    killed = False
                    if victims:
                        victim = self.rng.choice(victims)
                        if victim.supervised:  # the supervisor replaces its child and scrubs
                            killed = self.kill_child(victim)
                        else:
                            victim.killed_by_harness = True
                            os.kill(victim.proc.pid, signal.SIGKILL)
                            killed = True
                    killed_from_outside = killed_from_outside or killed
                    if killed_from_outside:
                        next_kill = now + self.rng.uniform(*cfg.external_kill_s)
                if now > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
            if not all(a.added for a in added):
                self.problems.append("an enqueue of a fresh id answered duplicate")
            self.stop_survivors()
            self.drain(q)
            return self.observe(q, ids, timed_out)
        finally:
            self.kill_all()
            transport_of(q).client.close()

    def stop_survivors(self) -> None:
        """SIGTERM every live worker: a graceful stop (finish, release, deregister)."""
        for w in self.live():
            w.terminated_by_harness = True
            w.proc.send_signal(signal.SIGTERM)
        for w in self.live():
            try:
                w.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.problems.append(f"worker {w.index} did not stop within 20 s of SIGTERM")
                w.killed_by_harness = True
                os.kill(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
        self.reap()

    def drain(self, q: Queue) -> None:
        """One clean worker (no crash points), run until the queue is settled and it has
        forgotten every dead worker (its renewals find them, it scrubs their leases and
        forgets them), then stopped with SIGTERM (it deregisters). Replaced if the
        poison kills it.

        Not ``--burst``: a burst worker returns once the queue is drained, but a renewal
        lists at most 20 dead services, so forgetting them all can take several
        renewals after that.
        """
        ns = f"{PREFIX}:{{{self.namespace}}}:service:"
        deadline = time.monotonic() + self.cfg.timeout_s()
        with self.server.client() as c:
            for _ in range(2 * self.cfg.poison_max_attempts + 2):
                before = self._seq(c)
                w = self.spawn("drain", None)
                while w.proc.poll() is None and time.monotonic() < deadline:
                    # Done: settled, and the namespace lists one service, alive: this one
                    # (registered after the spawn).
                    listed = [int(m) for m in c.zrange(ns + "expiry", 0, -1)]
                    if (self.settled(q) and len(listed) == 1 and listed[0] > before
                            and c.exists(ns + str(listed[0]))):
                        w.terminated_by_harness = True
                        w.proc.send_signal(signal.SIGTERM)
                        try:
                            w.proc.wait(20)
                        except subprocess.TimeoutExpired:
                            self.problems.append("the drain worker did not stop within 20 s of SIGTERM")
                        self.reap()
                        return
                    time.sleep(0.05)
                self.reap()
                if time.monotonic() >= deadline:
                    break
        self.problems.append("the drain did not settle the queue and forget the dead workers in time")

    def _seq(self, c: redis.Redis) -> int:
        return int(c.get(f"{PREFIX}:{{{self.namespace}}}:service:seq") or 0)

    def observe(self, q: Queue, ids: list[str], timed_out: bool) -> Observations:
        with self.server.client() as c:
            runs = [_parse_log(x) for x in c.lrange(self.runs_key, 0, -1)]
            acks = [_parse_log(x) for x in c.lrange(self.acks_key, 0, -1)]
            keys = {k.decode(): c.type(k).decode() for k in c.scan_iter(count=1000)}
            wake_members = [m.decode() for m in c.zrange(q.spec.keys.wake, 0, -1)]
            service_wakes = {k: [m.decode() for m in c.zrange(k, 0, -1)] for k, kind in keys.items()
                             if kind == "zset" and k.endswith(":wake") and ":service:" in k}
            states = queue_states(c, q)
        deaths = collections.Counter(w.death for w in self.workers)
        for w in self.workers:
            deaths.update(w.child_deaths)
        evictions = sum(w.evicted for w in self.workers) + deaths.pop("evicted", 0)
        return Observations(
            queue=self.queue, namespace=self.namespace, runs_key=self.runs_key, acks_key=self.acks_key,
            enqueued=ids, poison_id=self.poison_id, poison_max_attempts=self.cfg.poison_max_attempts,
            concurrency=self.cfg.concurrency + self.cfg.most_prefetched, runs=runs, acks=acks, stats=q.stats(), states=states,
            dead=q.dead_list(0, 1000).jobs, keys=keys, wake_members=wake_members, service_wakes=service_wakes,
            deaths=dict(deaths), strict_keys=self.cfg.strict_keys,
            evictions=evictions, lost_leases=sum(w.lost_leases for w in self.workers),
            timed_out=timed_out, worker_problems=list(self.problems), cancelled=list(self.cancelled),
        )


def _parse_log(raw: bytes) -> tuple[str, int]:
    job_id, fence = raw.decode().split(" ")[:2]
    return job_id, int(fence)


def queue_states(client: redis.Redis, q: Queue) -> dict[str, list[str]]:
    """Every job id found anywhere in the queue -> the states it is found in ([] for a
    record in no state). Reads each structure whole: fine for a few thousand jobs."""
    k = q.spec.keys
    c: Any = client  # redis-py's reply types are too loose to be useful here
    states: dict[str, list[str]] = {raw.decode(): [] for raw in c.hkeys(k.jobs)}
    for raw in c.lrange(k.ready, 0, -1):
        states.setdefault(raw.decode(), []).append("ready")
    for raw in c.zrange(k.scheduled, 0, -1):
        states.setdefault(raw.decode(), []).append("scheduled")
    for raw in c.zrange(k.leased, 0, -1):
        states.setdefault(raw.decode().split("|", 4)[4], []).append("leased")
    for raw in c.zrange(k.dead, 0, -1):
        states.setdefault(raw.decode(), []).append("dead")
    return states


# -- the whole run ---------------------------------------------------------------------


@dataclasses.dataclass
class Summary:
    cfg: Config
    reports: list[TrialReport]
    hits: dict[str, int]
    seconds: float
    seed: int

    @property
    def violations(self) -> list[str]:
        return [f"trial {r.trial}: {v}" for r in self.reports for v in r.violations]

    def total(self, field: str) -> int:
        return sum(int(getattr(r, field)) for r in self.reports)

    def render(self) -> str:
        cfg, reports = self.cfg, self.reports
        deaths: collections.Counter[str] = collections.Counter()
        for r in reports:
            deaths.update(r.deaths)
        kills = sum(n for cause, n in deaths.items() if cause != "clean")
        poison_ok = sum(1 for r in reports if r.poison_dead)
        errors = sorted({re.sub(r"worker \S+ died", "worker <owner> died", r.poison_error) for r in reports})
        prefetch = f" + prefetch {cfg.prefetch}"
        lines = [
            f"crash harness: {len(reports)} trials x {cfg.jobs} jobs (+1 poison each), {cfg.workers} workers at a "
            f"time x concurrency {cfg.concurrency}{prefetch}; lease {cfg.lease_ms} ms, renew {cfg.renew_ms} ms, "
            f"expire {cfg.expire_ms} ms; seed {self.seed}",
            f"workers started: {self.total('workers')}; kills: {kills} (external {deaths['external']}, "
            f"crash points {sum(deaths[p] for p in CRASH_POINTS)}, poison {deaths['poison']}); "
            f"clean stops: {deaths['clean']}; evictions: {self.total('evictions')}; "
            f"leases lost by live workers: {self.total('lost_leases')}",
            "hits per crash point: " + ", ".join(f"{p} {self.hits.get(p, 0)}" for p in CRASH_POINTS),
            f"executions: {self.total('executions')}; redeliveries: {self.total('redeliveries')} "
            f"(bound concurrency x kills per trial, summed: {self.total('redelivery_bound')}; "
            f"largest trial {max((r.redeliveries for r in reports), default=0)})",
            f"lost: {self.total('lost')}; unexpected: {self.total('unexpected')}; acked twice: "
            f"{self.total('acked_twice')}; never executed: {self.total('never_executed')}; leases run twice: "
            f"{self.total('fence_run_twice')}",
            f"acked (server count): {self.total('acked_server')} of {self.total('jobs')} jobs, less "
            f"{self.total('cancelled')} cancelled, plus {self.total('ticks')} periodic ticks (each enqueued once); "
            f"ok answers seen by workers: {self.total('acked_observed')}",
            f"poison: DEAD in {poison_ok}/{len(reports)} trials, runs {self.total('poison_runs')}; errors: {errors}",
            "leftover keys: " + ("none unexpected" if not self.total_leftovers() else
                                 f"{self.total_leftovers()} unexpected (see violations)")
            + f"; private wake keys left by stopped workers (expiring by TTL, "
            f"{'a violation' if cfg.strict_keys else 'tolerated without --strict-keys'}): "
            f"{sum(len(r.wake_key_leaks) for r in reports)}",
            f"time: {self.seconds:.1f} s ({self.seconds / max(1, len(reports)):.1f} s per trial)",
        ]
        v = self.violations
        lines.append(f"RESULT: {'PASS' if not v else 'FAIL'} ({len(v)} violations)")
        lines += [f"  {x}" for x in v[:50]]
        return "\n".join(lines)

    def total_leftovers(self) -> int:
        return sum(len(r.leftover_keys) for r in self.reports)


def run(cfg: Config, workdir: Path, *, progress: bool = False) -> Summary:
    """Run ``cfg.trials`` trials on one redis-server started in ``workdir``."""
    seed = cfg.seed if cfg.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    hits: collections.Counter[str] = collections.Counter()
    carried: collections.Counter[str] = collections.Counter()
    reports = []
    started = time.monotonic()
    with RedisProcess(workdir) as server:
        for number in range(cfg.trials):
            t0 = time.monotonic()
            trial = Trial(server, cfg, number, workdir, rng, hits, carried)
            obs = trial.run()
            carried.update(w.point for w in trial.workers if w.supervised and w.point)
            report = check_trial(number, obs)
            report.workers = len(trial.workers)
            report.seconds = time.monotonic() - t0
            reports.append(report)
            if progress:
                print(f"trial {number}: {report.seconds:.1f} s, {report.workers} workers, kills {report.kills} "
                      f"{dict(report.deaths)}, redeliveries {report.redeliveries}/{report.redelivery_bound}, "
                      f"violations {len(report.violations)}", flush=True)
                for line in report.violations:
                    print(f"  {line}", flush=True)
    return Summary(cfg, reports, dict(hits), time.monotonic() - started, seed)


@contextmanager
def workspace(keep: bool) -> Iterator[Path]:
    """A temporary directory for the server and the worker logs (kept with --keep)."""
    path = Path(tempfile.mkdtemp(prefix="pyqueue-crash-"))
    try:
        yield path
    finally:
        if keep:
            print(f"logs kept in {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=Config.workers)
    parser.add_argument("--concurrency", type=int, default=Config.concurrency)
    parser.add_argument("--prefetch", default=Config.prefetch,
                        help="each worker leases this many jobs ahead of its threads, or auto (the default)")
    parser.add_argument("--lease-ms", type=int, default=Config.lease_ms)
    parser.add_argument("--processes", type=int, default=0,
                        help="each chaos worker is a supervisor of this many processes (default 0: a plain worker)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--strict-keys", action="store_true",
                        help="count a stopped worker's leaked private wake key (it expires by its TTL) as a violation")
    parser.add_argument("--keep", action="store_true", help="keep the server's directory and the worker logs")
    parser.add_argument("-q", "--quiet", action="store_true", help="no line per trial")
    args = parser.parse_args(argv)
    cfg = Config(trials=args.trials, jobs=args.jobs, workers=args.workers, concurrency=args.concurrency,
                 lease_ms=args.lease_ms, seed=args.seed, strict_keys=args.strict_keys, processes=args.processes,
                 prefetch=args.prefetch)
    with workspace(args.keep) as workdir:
        summary = run(cfg, workdir, progress=not args.quiet)
    print(summary.render())
    return 0 if not summary.violations else 1


if __name__ == "__main__":
    sys.exit(main())
