"""Redis Cluster benchmarks: pyqueue on a real local cluster of 3 primaries and 3 replicas
(loopback, started by this script, stopped by PID), through slot moves and failovers.

Figures (each phase with a fresh keyspace; every load bounded in jobs and time):

* serve again: one ``pyqueue worker`` process (``worker_handlers:stamp``) serves a queue
  that a paced producer feeds; the queue's primary is SIGKILLed; time from the kill to
  the first handler start after it, over ``--serve-trials`` trials (median, max), next
  to the time until the producer's first acknowledged enqueue after the kill (when the
  slot took writes again: the cluster's own failover time). The killed node is
  restarted as a replica after each trial.
* reshard run / failover run: an in-process Worker (concurrency 4) drains a preloaded
  queue while a producer enqueues with its own ids; ``redis-cli --cluster reshard``
  moves a range of slots holding the queue back and forth (reshard run), or the queue's
  primary is SIGKILLed (failover run). Per job id: handler runs and OK ack answers.
  Reported: lost (acknowledged, never run), run twice, acked OK twice.
* acknowledged enqueues lost: ``--ack-loss-failovers`` times, a producer enqueues as
  fast as it can with its own ids, the queue's primary is SIGKILLed, and once the
  replica took over, every acknowledged id is looked up in the queue's jobs hash (no
  job is consumed): the ones missing were lost by asynchronous replication.
  ``--wait-replicas N`` passes ``wait_replicas=N`` to ``Queue`` where it exists.
* idle and latency: one ``pyqueue worker`` process serving 3 queues on 3 different
  primaries (every job in the last) against the same worker serving 1 queue:
  commands/s while idle (INFO commandstats summed over every primary, EVALSHA counted
  as one command) and enqueue -> handler start p50/p99.

Handler stamps go to a separate plain redis-server (the "sink"), so they neither touch
the cluster nor count in its command statistics.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402
from redis.cluster import RedisCluster  # noqa: E402
from redis.crc import key_slot  # noqa: E402

from pyqueue import Job, NewJob, Outcome, Queue  # noqa: E402
from pyqueue.protocol.errors import PyQueueError  # noqa: E402
from pyqueue.worker import Worker  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
NODE_TIMEOUT_MS = 1000


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports of 127.0.0.1 that were free a moment ago."""
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(int(s.getsockname()[1]))
    for s in sockets:
        s.close()
    return ports


class LoopbackCluster:
    """A Redis Cluster of ``primaries`` primaries with one replica each on 127.0.0.1
    (``redis-server --cluster-enabled yes`` + ``redis-cli --cluster create``), no
    persistence, cluster-node-timeout 1000 ms. Every process is signalled by its PID.
    The same approach as tests/conftest.py's RedisClusterProcesses."""

    def __init__(self, binary: str | None = None, primaries: int = 3) -> None:
        self.binary = binary or shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(self.binary).exists():
            raise FileNotFoundError("redis-server not found; pass --redis-server PATH")
        self.primary_count = primaries
        self.workdir = tempfile.TemporaryDirectory(prefix="pyqueue-bench-cluster-")
        ports = free_ports(4 * primaries)
        self.ports = ports[: 2 * primaries]
        self.bus_ports = dict(zip(self.ports, ports[2 * primaries :]))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> LoopbackCluster:
        for port in self.ports:
            self._start_node(port)
        for port in self.ports:
            self._wait_ping(port)
        create = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, timeout=60,
        )
        if create.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout.decode()}{create.stderr.decode()}")
        self.wait_healthy(60)
        return self

    def _start_node(self, port: int) -> None:
        node_dir = Path(self.workdir.name) / str(port)
        node_dir.mkdir(exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-port", str(self.bus_ports[port]), "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--dir", str(node_dir), "--save", "",
             "--appendonly", "no", "--repl-diskless-sync-delay", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _wait_ping(self, port: int) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                if self._ask(port, "PING"):
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} did not start") from None
                time.sleep(0.02)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=2)

    def _ask(self, port: int, *command: Any) -> Any:
        client = self.node(port)
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def alive(self, port: int) -> bool:
        return self.processes[port].poll() is None

    def url(self, avoid: Sequence[int] = ()) -> str:
        """A ``redis+cluster://`` URL naming a live node not in ``avoid``."""
        port = next(p for p in self.ports if self.alive(p) and p not in avoid)
        return f"redis+cluster://127.0.0.1:{port}"

    def client(self) -> RedisCluster:
        port = next(p for p in self.ports if self.alive(p))
        return RedisCluster(host="127.0.0.1", port=port)

    def node_id(self, port: int) -> str:
        return str(self._ask(port, "CLUSTER", "MYID").decode())

    def topology(self, port: int | None = None) -> dict[int, dict[str, Any]]:
        """``CLUSTER NODES`` by client port: flags, master's port, slot ranges, open slots."""
        asked = port if port is not None else next(p for p in self.ports if self.alive(p))
        rows = [line.split() for line in self._ask(asked, "CLUSTER", "NODES").decode().splitlines() if line.strip()]
        port_of = {row[0]: int(row[1].split("@")[0].rsplit(":", 1)[1]) for row in rows}
        out: dict[int, dict[str, Any]] = {}
        for row in rows:
            slots, opened = [], False
            for item in row[8:]:
                if item.startswith("["):
                    opened = True
                else:
                    first, _, last = item.partition("-")
                    slots.append((int(first), int(last or first)))
            out[port_of[row[0]]] = {"flags": set(row[2].split(",")), "master": port_of.get(row[3]),
                                    "slots": slots, "open": opened}
        return out

    def primaries(self) -> list[int]:
        return sorted(p for p, n in self.topology().items() if "master" in n["flags"] and n["slots"])

    def primary_of_slot(self, slot: int) -> int:
        for port, n in self.topology().items():
            if "master" in n["flags"] and any(a <= slot <= b for a, b in n["slots"]):
                return port
        raise LookupError(f"no primary serves slot {slot}")

    def kill(self, port: int) -> tuple[float, int]:
        """SIGKILL a node by its PID; (time.monotonic(), time.time_ns()) of the kill."""
        self.processes[port].send_signal(signal.SIGKILL)
        at = (time.monotonic(), time.time_ns())
        self.processes[port].wait(10)
        return at

    def wait_failed_over(self, dead: int, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                owners = self.primaries()
                states = {self._cluster_info(p).get("cluster_state") for p in self.ports if self.alive(p)}
                if dead not in owners and len(owners) == self.primary_count and states == {"ok"}:
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {dead}'s slots were not taken over within {timeout_s} s")
            time.sleep(0.05)

    def restart(self, port: int, timeout_s: float = 40) -> None:
        """Start a killed node again once its replica took over (started empty while it
        still owned slots, it would win them back empty): it rejoins as a replica."""
        self.wait_failed_over(port, timeout_s)
        self._start_node(port)
        self._wait_ping(port)
        self.wait_healthy(timeout_s)

    def failover(self, replica: int, timeout_s: float = 30) -> None:
        """Coordinated ``CLUSTER FAILOVER`` on a replica; wait until the cluster is healthy."""
        self._ask(replica, "CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout_s
        while replica not in self.primaries():
            if time.monotonic() > deadline:
                raise RuntimeError(f"CLUSTER FAILOVER on {replica} did not finish")
            time.sleep(0.05)
        self.wait_healthy(timeout_s)

    def _cluster_info(self, port: int) -> dict[str, str]:
        text = self._ask(port, "CLUSTER", "INFO").decode()
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def health_problems(self) -> list[str]:
        """Empty when every node runs, says ok with all slots covered, the nodes agree,
        ``primary_count`` primaries serve slots, each with a replica in sync, nothing is
        flagged failing and no slot is open."""
        problems = [f"node {p} is not running" for p in self.ports if not self.alive(p)]
        if problems:
            return problems
        views = {}
        try:
            for port in self.ports:
                info = self._cluster_info(port)
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    problems.append(f"node {port}: {info.get('cluster_state')}")
                views[port] = self.topology(port)
        except redis.RedisError as exc:
            return [str(exc)]
        owners = {tuple(sorted((a, b, q) for q, n in v.items() if "master" in n["flags"] for a, b in n["slots"]))
                  for v in views.values()}
        if len(owners) != 1:
            problems.append("the nodes disagree about the slots")
        for port, view in views.items():
            for p, n in view.items():
                if n["flags"] & {"fail", "fail?", "handshake", "noaddr"} or n["open"]:
                    problems.append(f"node {port} sees {p}: {n['flags']} open={n['open']}")
        view = views[self.ports[0]]
        primaries = [p for p, n in view.items() if "master" in n["flags"] and n["slots"]]
        if len(primaries) != self.primary_count:
            problems.append(f"{len(primaries)} primaries")
        for primary in primaries:
            synced = False
            for replica in (p for p, n in view.items() if n["master"] == primary):
                client = self.node(replica)
                try:
                    info = client.info("replication")
                    synced = synced or info.get("master_link_status") == "up"
                except redis.RedisError:
                    pass
                finally:
                    client.close()
            if not synced:
                problems.append(f"primary {primary} has no replica in sync")
        return problems

    def wait_healthy(self, timeout_s: float = 40) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            problems = self.health_problems()
            if not problems:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster is not healthy after {timeout_s} s: {problems}")
            time.sleep(0.1)

    def heal(self) -> None:
        for port in self.ports:
            if not self.alive(port):
                self.restart(port)
        self.wait_healthy()

    def flushall(self) -> None:
        for port in self.primaries():
            self._ask(port, "FLUSHALL")

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workdir.cleanup()


def queue_on(cluster: LoopbackCluster, port: int, prefix: str = "b", slots: tuple[int, int] | None = None) -> str:
    """A queue name whose slot the primary at ``port`` serves (within ``slots``)."""
    ranges = cluster.topology()[port]["slots"]
    for i in range(200_000):
        slot = key_slot(f"pq:{{{prefix}{i}}}:jobs".encode())
        if any(a <= slot <= b for a, b in ranges) and (slots is None or slots[0] <= slot <= slots[1]):
            return f"{prefix}{i}"
    raise RuntimeError("no queue name fits")


class LogCount(logging.Handler):
    """Counts pyqueue's log records by level (the worker's warnings during faults)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname] += 1
        if record.levelno >= logging.WARNING and len(self.samples) < 5:
            self.samples.append(record.getMessage()[:300])

    def take(self) -> dict[str, Any]:
        out = {"by_level": dict(self.counts), "first_warnings": list(self.samples)}
        self.counts.clear()
        self.samples.clear()
        return out


LOGS = LogCount()


# -- worker processes -------------------------------------------------------------------


def spawn(url: str, sink_url: str, handler: str, queues: Sequence[str], *extra: str,
          log_path: Path | None = None) -> subprocess.Popen[bytes]:
    """A ``pyqueue worker`` process (as bench_worker.spawn) on the cluster ``url``; the
    handler's stamps go to the sink server (``BENCH_URL``)."""
    env = dict(os.environ, PYTHONPATH=f"{BENCH_DIR}{os.pathsep}{_server.REPO_ROOT}", BENCH_URL=sink_url)
    stderr: Any = log_path.open("ab") if log_path is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "--url", url, "--namespace", "bench", "worker",
             f"worker_handlers:{handler}", *[arg for name in queues for arg in ("-q", name)], *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )
    finally:
        if log_path is not None:
            stderr.close()


def stop_process(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM by PID (a graceful worker stop), SIGKILL after 30 s; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def wait_registered(client: RedisCluster, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while client.llen("pq:{bench}:service:ids") < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not register")
        time.sleep(0.01)


# -- serve again after a SIGKILL -----------------------------------------------------------


class PacedProducer(threading.Thread):
    """Enqueues one job every 1/rate s (skipping the slots it missed while blocked),
    each re-sent with the same id until answered; stops when told or after budget_s."""

    def __init__(self, queue: Queue, prefix: str, rate: float, budget_s: float = 60, limit: int | None = None) -> None:
        super().__init__(daemon=True)
        self.queue, self.prefix, self.interval = queue, prefix, 1 / rate if rate > 0 else 0.0
        self.limit = limit
        self.deadline = time.monotonic() + budget_s
        self.halt = threading.Event()
        self.answered: list[str] = []
        self.answered_at: list[float] = []  # monotonic
        self.failures = 0

    def run(self) -> None:
        n, next_at = 0, time.monotonic()
        while not self.halt.is_set() and time.monotonic() < self.deadline and (self.limit is None or n < self.limit):
            if self.interval:
                pause = next_at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                next_at = max(next_at + self.interval, time.monotonic())
            job_id = f"{self.prefix}{n}"
            while not self.halt.is_set() and time.monotonic() < self.deadline:
                try:
                    self.queue.enqueue(b"x", job_id=job_id)
                except PyQueueError:
                    self.failures += 1
                    time.sleep(0.05)
                    continue
                self.answered.append(job_id)
                self.answered_at.append(time.monotonic())
                break
            n += 1

    def first_answer_after(self, moment: float) -> float | None:
        return next((t for t in list(self.answered_at) if t > moment), None)

    def answered_when(self) -> dict[str, float]:
        return dict(zip(list(self.answered), list(self.answered_at)))


def bench_serve_again(cluster: LoopbackCluster, sink: redis.Redis, sink_url: str, trials: int, rate: float,
                      log_dir: Path) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    for trial in range(trials):
        cluster.flushall()
        sink.flushall()
        victim = cluster.primaries()[trial % cluster.primary_count]
        name = queue_on(cluster, victim, prefix=f"s{trial}x")
        client = cluster.client()
        log_path = log_dir / f"serve_again_worker_{trial}.log"
        proc = spawn(cluster.url(avoid=[victim]), sink_url, "stamp", [name], "--concurrency", "4",
                     log_path=log_path)
        producer = PacedProducer(Queue(name, client), f"t{trial}-", rate)
        try:
            wait_registered(client)
            producer.start()
            deadline = time.monotonic() + 20
            while sink.llen("bench:{stamps}") < rate:  # about a second of steady state
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the worker did not serve before the kill; see {log_path}")
                time.sleep(0.01)
            killed_mono, killed_ns = cluster.kill(victim)
            # A job leased before the kill starts within milliseconds; a failover takes
            # over a second (node timeout 1000 ms): a start 100 ms after the kill or later
            # was served through the promoted replica.
            threshold_ns = killed_ns + 100_000_000
            served_ns = None
            deadline = time.monotonic() + 40
            while served_ns is None:
                item = sink.blpop(["bench:{stamps}"], timeout=0.05)
                if item is not None and int(item[1]) >= threshold_ns:
                    served_ns = int(item[1])
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not serve within 40 s of the kill; see {log_path}")
            time.sleep(1.0)
            producer.halt.set()
            producer.join(30)
            alive = proc.poll() is None
            code = stop_process(proc)
            writable = producer.first_answer_after(killed_mono + 0.1)  # not a reply already on its way
            results.append({
                "killed_port": victim,
                "serve_again_s": (served_ns - killed_ns) / 1e9,
                "slot_writable_again_s": None if writable is None else writable - killed_mono,
                "worker_alive_after": alive,
                "worker_exit_code": code,
            })
        finally:
            producer.halt.set()
            if proc.poll() is None:
                stop_process(proc)
            client.close()
        cluster.restart(victim)
    serve = [float(r["serve_again_s"]) for r in results]
    writable_again = [float(r["slot_writable_again_s"]) for r in results if r["slot_writable_again_s"] is not None]
    return {
        "trials": trials, "producer_rate_per_s": rate, "cluster_node_timeout_ms": NODE_TIMEOUT_MS,
        "serve_again_s": serve, "median_serve_again_s": statistics.median(serve), "max_serve_again_s": max(serve),
        "median_slot_writable_again_s": statistics.median(writable_again) if writable_again else None,
        "max_slot_writable_again_s": max(writable_again) if writable_again else None,
        "workers_survived": sum(1 for r in results if r["worker_alive_after"]),
        "rows": results,
    }


# -- lost / run twice / acked twice with an in-process Worker ------------------------------


class Tally:
    """Per job id: handler runs and OK ack answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: Counter[str] = Counter()
        self.oks: Counter[str] = Counter()
        self.ok_times: dict[str, list[float]] = {}  # job id -> monotonic times of its OK answers
        self.not_ok = 0

    def handler(self, job: Job) -> None:
        with self.lock:
            self.runs[job.id] += 1

    def answered(self, jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> None:
        now = time.monotonic()
        with self.lock:
            for job, outcome in zip(jobs, outcomes):
                if outcome is Outcome.OK:
                    self.oks[job.id] += 1
                    self.ok_times.setdefault(job.id, []).append(now)
                else:
                    self.not_ok += 1

    def handled(self) -> int:
        with self.lock:
            return sum(self.runs.values())


def instrument(worker: Worker, tally: Tally) -> None:
    """Wrap the worker's queue objects (instance attributes) to see every ack answer:
    ``ack`` and ``ack_and_lease`` go through ``ack_many`` and ``lease_call``."""
    for q in worker.queues:
        lease_call: Callable[..., Any] = q.lease_call
        ack_many: Callable[..., Any] = q.ack_many

        def counted_lease_call(*, ack: Sequence[Job] = (), _orig: Callable[..., Any] = lease_call, **kw: Any) -> Any:
            leased = _orig(ack=ack, **kw)
            tally.answered(list(ack), leased.acks)
            return leased

        def counted_ack_many(jobs: Any, _orig: Callable[..., Any] = ack_many, **kw: Any) -> Any:
            jobs = list(jobs)
            outcomes = _orig(jobs, **kw)
            tally.answered(jobs, outcomes)
            return outcomes

        q.lease_call = counted_lease_call  # type: ignore[method-assign]
        q.ack_many = counted_ack_many  # type: ignore[method-assign]


def load_run(cluster: LoopbackCluster, name: str, jobs: int, rate: float, fault: Callable[[], dict[str, Any]],
             lease_ms: int = 10_000) -> dict[str, Any]:
    """Preload half of ``jobs``, start a Worker thread (concurrency 4) and a paced
    producer of the other half; run ``fault`` once the worker drains; wait until the
    queue is empty; count per job id."""
    client, producer_client = cluster.client(), cluster.client()
    queue = Queue(name, client)
    preloaded = [f"j{i}" for i in range(jobs // 2)]
    for i in range(0, len(preloaded), 1000):
        queue.enqueue_many([NewJob(b"x", job_id=j) for j in preloaded[i : i + 1000]])
    to_produce = jobs - len(preloaded)
    tally = Tally()
    worker = Worker([name], tally.handler, redis=client, concurrency=4, block_ms=1_000, lease_ms=lease_ms,
                    renew_ms=1_000, expire_ms=10_000)
    instrument(worker, tally)
    exit_code: dict[str, int] = {}
    thread = threading.Thread(target=lambda: exit_code.setdefault("code", worker.run(install_signal_handlers=False)),
                              daemon=True)
    producer = PacedProducer(Queue(name, producer_client), "p", rate, budget_s=120, limit=to_produce)
    started = time.monotonic()
    try:
        thread.start()
        producer.start()
        deadline = time.monotonic() + 30
        while tally.handled() < 300:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not start draining")
            time.sleep(0.01)
        fault_report = fault()
        fault_at = fault_report.pop("at", None)
        producer.join(120)
        producer.halt.set()
        deadline = time.monotonic() + 120
        while True:
            s = queue.stats()
            if s.ready == 0 and s.scheduled == 0 and s.leased == 0:
                break
            if time.monotonic() > deadline or not thread.is_alive():
                break
            time.sleep(0.05)
        serving = thread.is_alive() and worker.exit_reason == ""
        exit_reason = worker.exit_reason
        worker.stop("bench finished")
        thread.join(30)
        ids = preloaded + producer.answered
        never_ran = [i for i in ids if tally.runs[i] == 0]
        still_in_redis = [i for i in never_ran if client.hexists(queue.spec.keys.jobs, i)]
        stats = queue.stats()
        answered_at = producer.answered_when()
        acked_twice = {i: t for i, t in tally.ok_times.items() if len(t) > 1}
        # A first OK answered by a killed primary (read within 0.5 s of the kill: no
        # failover is that fast) and the next ones after: that ack's write was lost in
        # the failover (asynchronous replication), and the job ran and was acked again.
        cutoff = None if fault_at is None else fault_at + 0.5
        straddling = [i for i, t in acked_twice.items()
                      if cutoff is not None and t[0] <= cutoff and all(x > cutoff for x in t[1:])]
        return {
            "queue": name, "slot": key_slot(name.encode()), "jobs_acknowledged": len(ids),
            "run_s": round(time.monotonic() - started, 1),
            "producer_still_running_after_fault": len(producer.answered) < to_produce,
            "lost": len(never_ran), "lost_but_still_in_redis": len(still_in_redis),
            "lost_ids_enqueue_answered_ms_from_fault": {
                i: (None if i not in answered_at or fault_at is None else round((answered_at[i] - fault_at) * 1000, 2))
                for i in never_ran[:20]
            },
            "ran_twice": sum(1 for n in tally.runs.values() if n > 1),
            "acked_ok_twice": len(acked_twice),
            "acked_ok_twice_first_ok_lost_in_failover": len(straddling),
            "ok_answers": sum(tally.oks.values()), "not_ok_answers": tally.not_ok,
            "unknown_ran": len(set(tally.runs) - set(ids)),
            "stats_enqueued": stats.enqueued, "stats_acked": stats.acked,
            "worker_serving_until_stopped": serving, "exit_reason_before_stop": exit_reason,
            "exit_code": exit_code.get("code"), "producer_failures": producer.failures,
            "fault": fault_report, "pyqueue_log": LOGS.take(),
        }
    finally:
        producer.halt.set()
        if thread.is_alive():
            worker.stop("bench finished")
            thread.join(30)
        client.close()
        producer_client.close()


def reshard(cluster: LoopbackCluster, source: int, target: int, slots: int) -> float:
    """``redis-cli --cluster reshard``: the first ``slots`` slots of ``source`` to
    ``target`` (retried while the nodes still settle the previous move)."""
    deadline = time.monotonic() + 120
    while True:
        started = time.monotonic()
        done = subprocess.run(
            ["redis-cli", "--cluster", "reshard", f"127.0.0.1:{source}", "--cluster-from", cluster.node_id(source),
             "--cluster-to", cluster.node_id(target), "--cluster-slots", str(slots), "--cluster-yes"],
            capture_output=True, timeout=120,
        )
        if done.returncode == 0:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis-cli --cluster reshard failed: {(done.stdout + done.stderr).decode()[-2000:]}")
        time.sleep(0.3)


def bench_reshard_run(cluster: LoopbackCluster, jobs: int, rate: float, slots: int, moves: int) -> dict[str, Any]:
    cluster.flushall()
    source = cluster.primary_of_slot(0)  # redis-cli moves a source's first slots: 0..slots-1
    target = next(p for p in cluster.primaries() if p != source)
    name = queue_on(cluster, source, prefix="r", slots=(0, slots - 1))

    def fault() -> dict[str, Any]:
        took = []
        for move in range(moves):
            there = move % 2 == 0
            took.append(reshard(cluster, source if there else target, target if there else source, slots))
            time.sleep(0.3)
        return {"slots_per_move": slots, "moves": moves, "seconds_per_move": [round(t, 2) for t in took]}

    report = load_run(cluster, name, jobs, rate, fault)
    cluster.wait_healthy()
    return report


def bench_failover_run(cluster: LoopbackCluster, jobs: int, rate: float) -> dict[str, Any]:
    cluster.flushall()
    victim = cluster.primaries()[0]
    name = queue_on(cluster, victim, prefix="f")

    def fault() -> dict[str, Any]:
        killed, _ = cluster.kill(victim)
        cluster.wait_failed_over(victim)
        return {"killed_port": victim, "failed_over_after_s": round(time.monotonic() - killed, 2), "at": killed}

    report = load_run(cluster, name, jobs, rate, fault)
    cluster.restart(victim)
    return report


# -- acknowledged enqueues lost over many failovers ----------------------------------------


def queue_options(wait_replicas: int | None) -> tuple[dict[str, Any], str]:
    """The ``Queue`` keyword arguments for ``--wait-replicas`` and what became of it.
    (``Queue.__new__`` may take ``**kwargs`` for ``__init__``: both signatures count.)"""
    available = any("wait_replicas" in inspect.signature(f).parameters for f in (Queue, Queue.__init__))
    if wait_replicas is None:
        return {}, "not requested" + ("" if available else " (not available in this pyqueue)")
    if not available:
        return {}, "not available (Queue has no wait_replicas parameter): ran without it"
    return {"wait_replicas": wait_replicas}, f"wait_replicas={wait_replicas}"


def bench_ack_loss(cluster: LoopbackCluster, failovers: int, before_kill_s: float,
                   wait_replicas: int | None) -> dict[str, Any]:
    options, note = queue_options(wait_replicas)
    rows: list[dict[str, Any]] = []
    for k in range(failovers):
        cluster.flushall()
        victim = cluster.primaries()[k % cluster.primary_count]
        name = queue_on(cluster, victim, prefix=f"a{k}x")
        client = cluster.client()
        producer = PacedProducer(Queue(name, client, **options), f"e{k}-", rate=0, budget_s=60)
        try:
            producer.start()
            time.sleep(before_kill_s)
            killed, _ = cluster.kill(victim)
            acknowledged_before = len(producer.answered)
            cluster.wait_failed_over(victim)
            # Enqueues go on to the promoted replica (with wait_replicas they fail until
            # the killed node is back as its replica: counted as producer failures).
            time.sleep(0.5)
            producer.halt.set()
            producer.join(40)
            writable = producer.first_answer_after(killed + 0.1)  # not a reply already on its way
            ids = list(producer.answered)
            jobs_key = Queue(name, client).spec.keys.jobs
            missing = []
            for i in range(0, len(ids), 1000):
                chunk = ids[i : i + 1000]
                missing += [j for j, record in zip(chunk, client.hmget(jobs_key, chunk)) if record is None]
            answered_at = producer.answered_when()
            rows.append({"killed_port": victim, "acknowledged": len(ids), "acknowledged_before_kill": acknowledged_before,
                         "lost": len(missing), "lost_ids": missing[:20],
                         "lost_answered_ms_before_kill": [round((killed - answered_at[j]) * 1000, 2)
                                                          for j in missing[:20]],
                         "acknowledged_per_s_before_kill": round(acknowledged_before / before_kill_s),
                         "slot_writable_again_s": None if writable is None else round(writable - killed, 2),
                         "producer_failures": producer.failures})
        finally:
            producer.halt.set()
            client.close()
        cluster.restart(victim)
    return {
        "failovers": failovers, "producer": "one thread, one enqueue per call, as fast as it can", "queue_options": note,
        "acknowledged": sum(r["acknowledged"] for r in rows), "lost": sum(r["lost"] for r in rows),
        "median_acknowledged_per_s_before_kill": statistics.median(r["acknowledged_per_s_before_kill"] for r in rows),
        "failovers_with_loss": sum(1 for r in rows if r["lost"]), "rows": rows, "pyqueue_log": LOGS.take(),
    }


# -- idle commands and wake latency: 3 queues on 3 primaries vs 1 queue --------------------


def on_distinct_primaries(cluster: LoopbackCluster, count: int) -> list[str]:
    return [queue_on(cluster, port, prefix="w") for port in cluster.primaries()[:count]]


def inside_lua_commands() -> set[str]:
    """Commands pyqueue's scripts run (counted in commandstats but not sent by a client)."""
    found: set[str] = set()
    for path in (_server.REPO_ROOT / "lua").glob("*.lua"):
        found |= {m.lower() for m in re.findall(r"(?:redis\.p?call|call_chunked)\(\s*'([A-Za-z]+)'", path.read_text())}
    return found


#: Commands counted on a primary that no worker sent: ours, and replication's.
NOT_THE_WORKERS = {"config", "info", "replconf", "psync", "sync"}


def bench_idle(cluster: LoopbackCluster, sink_url: str, names: Sequence[str], window_s: float,
               log_dir: Path) -> dict[str, Any]:
    cluster.flushall()
    client = cluster.client()
    proc = spawn(cluster.url(), sink_url, "noop", names, log_path=log_dir / f"idle_{len(names)}.log")  # defaults
    try:
        wait_registered(client)
        time.sleep(2)
        primaries = cluster.primaries()
        nodes = [cluster.node(port) for port in primaries]
        for node in nodes:
            node.ping()  # connected before the reset: our HELLO is not counted
        for node in nodes:
            node.config_resetstat()
        time.sleep(window_s)
        calls: Counter[str] = Counter()
        for node in nodes:
            for key, value in node.info("commandstats").items():
                calls[key[len("cmdstat_"):]] += int(value["calls"])
            node.close()
        alive = proc.poll() is None
    finally:
        stop_process(proc)
        client.close()
    lua = inside_lua_commands()
    calls = Counter({k: v for k, v in calls.items() if k.split("|")[0] not in NOT_THE_WORKERS})
    sent = {k: v for k, v in calls.items() if k not in lua or k.startswith("evalsha")}
    return {"queues": len(names), "window_s": window_s, "primaries_summed": len(primaries), "calls": dict(calls),
            "sent_per_s": sum(sent.values()) / window_s, "all_per_s": sum(calls.values()) / window_s,
            "worker_alive": alive}


def bench_latency(cluster: LoopbackCluster, sink: redis.Redis, sink_url: str, names: Sequence[str], samples: int,
                  log_dir: Path) -> dict[str, Any]:
    import random

    cluster.flushall()
    sink.flushall()
    client = cluster.client()
    q = Queue(names[-1], client)  # the job's queue comes last
    proc = spawn(cluster.url(), sink_url, "stamp", names, "--block-ms", "10000",
                 log_path=log_dir / f"latency_{len(names)}.log")
    try:
        wait_registered(client)
        time.sleep(0.5)
        latencies_us = []
        for i in range(samples):
            time.sleep(random.uniform(0.01, 0.03))  # idle: the worker is blocked again
            sent_ns = time.time_ns()
            q.enqueue(b"", job_id=f"l{i}")
            item = sink.blpop(["bench:{stamps}"], timeout=10)
            if item is None:
                raise RuntimeError("the handler did not start within 10 s")
            latencies_us.append((int(item[1]) - sent_ns) / 1000)
    finally:
        stop_process(proc)
        client.close()
    return {"queues": len(names), "samples": samples, "p50_us": percentile(latencies_us, 50),
            "p99_us": percentile(latencies_us, 99), "max_us": max(latencies_us),
            "mean_us": statistics.fmean(latencies_us)}


# -- report --------------------------------------------------------------------------------


def summary(report: dict[str, Any]) -> list[str]:
    lines = ["Redis Cluster (3 primaries + 3 replicas on loopback, cluster-node-timeout 1000 ms)"]
    s = report.get("serve_again")
    if s:
        lines.append(
            f"   SIGKILL of the queue's primary -> worker serves again: median {s['median_serve_again_s']:.2f} s, "
            f"max {s['max_serve_again_s']:.2f} s over {s['trials']} trials (slot writable again: median "
            f"{s['median_slot_writable_again_s'] or float('nan'):.2f} s, max "
            f"{s['max_slot_writable_again_s'] or float('nan'):.2f} s); "
            f"workers survived {s['workers_survived']}/{s['trials']}"
        )
    for key, label in (("reshard_run", "reshard run"), ("failover_run", "failover run")):
        r = report.get(key)
        if r:
            fault = ", ".join(f"{k} {v}" for k, v in r["fault"].items())
            lines.append(
                f"   {label}: {r['jobs_acknowledged']} jobs, lost {r['lost']} (still in Redis {r['lost_but_still_in_redis']}), "
                f"ran twice {r['ran_twice']}, acked OK twice {r['acked_ok_twice']} (first OK lost in a failover: "
                f"{r['acked_ok_twice_first_ok_lost_in_failover']}), not-OK ack answers "
                f"{r['not_ok_answers']}; worker serving until stopped: {r['worker_serving_until_stopped']} ({fault})"
            )
    a = report.get("ack_loss")
    if a:
        lines.append(
            f"   acknowledged enqueues lost over {a['failovers']} SIGKILL failovers: {a['lost']} of {a['acknowledged']} "
            f"({a['failovers_with_loss']} failovers lost any; {a['median_acknowledged_per_s_before_kill']:,.0f} "
            f"enqueues/s before each kill); Queue options: {a['queue_options']}"
        )
    idle, lat = report.get("idle"), report.get("latency")
    if idle and lat:
        for one_idle, one_lat in zip(idle, lat):
            lines.append(
                f"   worker serving {one_idle['queues']} queue(s): idle {one_idle['sent_per_s']:.3f} commands/s sent "
                f"({one_idle['all_per_s']:.3f}/s counting inside Lua) over {one_idle['window_s']:.0f} s; "
                f"enqueue -> handler p50 {one_lat['p50_us'] / 1000:.2f} ms, p99 {one_lat['p99_us'] / 1000:.2f} ms "
                f"({one_lat['samples']} jobs)"
            )
        if len(idle) == 2 and idle[1]["sent_per_s"]:
            lines.append(
                f"   ratios 3 queues / 1 queue: idle commands {idle[0]['sent_per_s'] / idle[1]['sent_per_s']:.2f}x, "
                f"latency p50 {lat[0]['p50_us'] / lat[1]['p50_us']:.2f}x, p99 {lat[0]['p99_us'] / lat[1]['p99_us']:.2f}x"
            )
    return lines


PHASES = ("serve", "reshard", "failover", "ackloss", "idle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-server", default=None, help="redis-server binary (default: from PATH)")
    parser.add_argument("--serve-trials", type=int, default=3, help="SIGKILLs for the serve-again figure")
    parser.add_argument("--serve-rate", type=float, default=100, help="jobs/s fed to the worker in those trials")
    parser.add_argument("--reshard-jobs", type=int, default=10_000, help="jobs in the reshard run")
    parser.add_argument("--reshard-slots", type=int, default=500, help="slots per redis-cli reshard")
    parser.add_argument("--reshard-moves", type=int, default=4, help="reshards (alternately there and back)")
    parser.add_argument("--failover-jobs", type=int, default=10_000, help="jobs in the failover run")
    parser.add_argument("--produce-rate", type=float, default=500, help="jobs/s of the producer in those runs")
    parser.add_argument("--ack-loss-failovers", type=int, default=10, help="SIGKILL failovers for the loss count")
    parser.add_argument("--before-kill-s", type=float, default=1.0, help="enqueueing before each of those kills")
    parser.add_argument("--wait-replicas", type=int, default=None,
                        help="pass wait_replicas=N to Queue in the loss count (when pyqueue has it)")
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--idle-s", type=float, default=30.0, help="idle measurement window per worker")
    parser.add_argument("--only", choices=PHASES, action="append", help="run only these phases (repeatable)")
    parser.add_argument("--json-out", help="write the results here")
    parser.add_argument("--log-dir", default=str(BENCH_DIR / "results" / "cluster_logs"),
                        help="where the worker processes' logs go (default: bench/results/cluster_logs, git-ignored)")
    args = parser.parse_args()
    phases = args.only or list(PHASES)
    logging.getLogger("pyqueue").addHandler(LOGS)
    logging.getLogger("pyqueue").setLevel(logging.INFO)

    started = time.monotonic()
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("*.log"):
        old.unlink()
    sink_server = _server.LoopbackRedis(args.redis_server).start()
    cluster = LoopbackCluster(args.redis_server)
    report: dict[str, Any] = {}
    try:
        cluster.start()
        sink = _server.client_for(sink_server.url)
        report["setup"] = {"redis_version": cluster.node(cluster.ports[0]).info("server")["redis_version"],
                           "redis_py": redis.__version__, "nodes": len(cluster.ports),
                           "cluster_node_timeout_ms": NODE_TIMEOUT_MS, "worker_logs": str(log_dir)}
        if "serve" in phases:
            report["serve_again"] = bench_serve_again(cluster, sink, sink_server.url, args.serve_trials,
                                                      args.serve_rate, log_dir)
        if "reshard" in phases:
            report["reshard_run"] = bench_reshard_run(cluster, args.reshard_jobs, args.produce_rate,
                                                      args.reshard_slots, args.reshard_moves)
        if "failover" in phases:
            report["failover_run"] = bench_failover_run(cluster, args.failover_jobs, args.produce_rate)
        if "ackloss" in phases:
            report["ack_loss"] = bench_ack_loss(cluster, args.ack_loss_failovers, args.before_kill_s,
                                                args.wait_replicas)
        if "idle" in phases:
            cluster.heal()
            three = on_distinct_primaries(cluster, 3)
            report["idle"] = [bench_idle(cluster, sink_server.url, names, args.idle_s, log_dir)
                              for names in (three, three[-1:])]
            report["latency"] = [bench_latency(cluster, sink, sink_server.url, names, args.latency_samples, log_dir)
                                 for names in (three, three[-1:])]
        report["elapsed_s"] = round(time.monotonic() - started, 1)
    finally:
        cluster.stop()
        sink_server.stop()
    text = json.dumps(report, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n", encoding="utf-8")
    print(text)
    print("\n".join(summary(report)))


if __name__ == "__main__":
    main()
