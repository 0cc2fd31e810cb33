"""Redis Cluster faults under load: a slot resharded with ``redis-cli --cluster reshard``,
a primary SIGKILLed (its replica promoted), and a graceful ``CLUSTER FAILOVER``, each
while a Worker (a thread, concurrency 4) drains a few thousand jobs and a producer
thread keeps enqueueing jobs with its own ids.

The tests run on a private 3+3 cluster of this module (``faulty``), so nodes can be
killed without disturbing the session's cluster; after every test it is healed (a
killed node restarted as a replica, state ok, each primary with a replica in sync).

What is counted, per job id: handler runs, and ``ack`` answers OK (the worker's queue
objects are wrapped to see every ack answer it receives). What is asserted is what
pyqueue promises: at most one OK ack per job; the worker survives; with slots moving
or a coordinated failover, nothing is lost and nothing runs twice. A SIGKILL failover
may lose acknowledged writes (replication is asynchronous, see README): an enqueue, or
an ack -- whose job then runs again and gets a second OK once its lease expires on the
promoted replica. That test prints how many of each were lost, asserts that no job got
two OK answers otherwise, and that everything that survived in Redis gets done.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisClusterProcesses, require_redis_server
from redis.crc import key_slot

from pyqueue import Job, NewJob, Outcome, Queue
from pyqueue.drivers.clients import connect, is_cluster
from pyqueue.protocol.errors import PyQueueError
from pyqueue.worker import EXIT_OK, Worker

PRELOADED = 1000  # jobs in the queue before the worker starts
PRODUCED = 2000  # jobs the producer enqueues while the fault happens
PRODUCER_RATE = 400  # jobs/s: the producer runs for about 5 s


@pytest.fixture(scope="module")
def faulty_cluster() -> Iterator[RedisClusterProcesses]:
    """A private 3+3 cluster for this module: its nodes may be killed."""
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pyqueue-faults-") as tmp:
        processes = RedisClusterProcesses(Path(tmp))
        try:
            processes.wait_healthy()
            yield processes
        finally:
            processes.stop()


@pytest.fixture
def faulty(faulty_cluster: RedisClusterProcesses) -> Iterator[RedisClusterProcesses]:
    """The module's cluster, healthy and empty; healed again after the test."""
    faulty_cluster.heal()
    faulty_cluster.flushall()
    try:
        yield faulty_cluster
    finally:
        faulty_cluster.heal()


class Tally:
    """Per job id: handler runs and OK ack answers (with their times); per lease: when
    its lease call started and ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: Counter[str] = Counter()
        self.oks: Counter[str] = Counter()
        self.ok_times: dict[str, list[float]] = {}  # job id -> monotonic times of its OK answers
        self.not_ok: Counter[str] = Counter()
        self.lease_calls: dict[str, tuple[float, float]] = {}  # receipt -> monotonic start, end of its lease call
        self.starts: list[tuple[float, str]] = []  # (monotonic handler start, receipt)

    def handler(self, job: Job) -> None:
        started = time.monotonic()
        with self.lock:
            self.runs[job.id] += 1
            self.starts.append((started, job.receipt))

    def leased(self, started: float, jobs: Sequence[Job]) -> None:
        ended = time.monotonic()
        with self.lock:
            for job in jobs:
                self.lease_calls[job.receipt] = (started, ended)

    def answered(self, jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> None:
        now = time.monotonic()
        with self.lock:
            for job, outcome in zip(jobs, outcomes):
                (self.oks if outcome is Outcome.OK else self.not_ok)[job.id] += 1
                if outcome is Outcome.OK:
                    self.ok_times.setdefault(job.id, []).append(now)

    def handled(self) -> int:
        with self.lock:
            return sum(self.runs.values())

    def all_answered(self) -> bool:
        """Whether every job that ran has had an ack answer (OK or not)."""
        with self.lock:
            return set(self.runs) <= set(self.oks) | set(self.not_ok)

    def longest_pause(self, start: float, end: float) -> float:
        """The longest time between two handler starts (or ``start``/``end``) within
        [start, end]: how long the worker stopped serving."""
        with self.lock:
            times = sorted(t for t, _ in self.starts if start <= t <= end)
        edges = [start, *times, end]
        return max(b - a for a, b in zip(edges, edges[1:]))

    def first_served_after(self, moment: float, answered_after: float | None = None) -> float | None:
        """When the first handler started for a job leased from the cluster as it was
        after ``moment``: its lease call started after ``moment``, or (a call re-sent
        through the fault by the driver) its answer came after ``answered_after``."""
        late = float("inf") if answered_after is None else answered_after
        with self.lock:
            after = [
                t for t, receipt in self.starts
                if receipt in self.lease_calls and (self.lease_calls[receipt][0] > moment or self.lease_calls[receipt][1] > late)
            ]
        return min(after) if after else None


def instrument(worker: Worker, tally: Tally) -> None:
    """Wrap the worker's queue objects (instance attributes, nothing in pyqueue changes)
    so the tally sees every lease call and every ack answer: ``ack`` and
    ``ack_and_lease`` go through ``ack_many`` and ``lease_call``."""
    for q in worker.queues:
        lease_call: Callable[..., Any] = q.lease_call
        ack_many: Callable[..., Any] = q.ack_many

        def counted_lease_call(*, ack: Sequence[Job] = (), _orig: Callable[..., Any] = lease_call, **kw: Any) -> Any:
            started = time.monotonic()
            leased = _orig(ack=ack, **kw)
            tally.leased(started, leased.jobs)
            tally.answered(list(ack), leased.acks)
            return leased

        def counted_ack_many(jobs: Any, _orig: Callable[..., Any] = ack_many, **kw: Any) -> Any:
            jobs = list(jobs)
            outcomes = _orig(jobs, **kw)
            tally.answered(jobs, outcomes)
            return outcomes

        q.lease_call = counted_lease_call  # type: ignore[method-assign]
        q.ack_many = counted_ack_many  # type: ignore[method-assign]


class Producer(threading.Thread):
    """Enqueues ``count`` jobs with ids ``<prefix><n>`` at ``rate`` per second, each
    re-sent with the same id until it is answered (an enqueue is idempotent by id).
    ``answered`` holds the ids whose enqueue was acknowledged."""

    def __init__(self, queue: Queue, prefix: str, count: int, rate: float, budget_s: float = 60) -> None:
        super().__init__(daemon=True, name=f"producer-{prefix}")
        self.queue, self.prefix, self.count, self.rate = queue, prefix, count, rate
        self.deadline = time.monotonic() + budget_s
        self.answered: list[str] = []
        self.failures: list[str] = []
        self.slowest_s = 0.0

    def run(self) -> None:
        started = time.monotonic()
        for n in range(self.count):
            pause = started + n / self.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            job_id = f"{self.prefix}{n}"
            sent = time.monotonic()
            while True:
                try:
                    self.queue.enqueue(b"x", job_id=job_id)
                except PyQueueError as exc:  # OutcomeUnknown after the driver's 30 s budget
                    self.failures.append(f"{job_id}: {exc}")
                    if time.monotonic() > self.deadline:
                        return
                    time.sleep(0.1)
                    continue
                self.answered.append(job_id)
                self.slowest_s = max(self.slowest_s, time.monotonic() - sent)
                break
            if time.monotonic() > self.deadline:
                self.failures.append("out of time")
                return


class Run:
    """One load: a queue preloaded with PRELOADED jobs, a Worker thread (concurrency 4)
    with instrumented queues, and a Producer of PRODUCED more; ``finish`` waits until
    all is done, ``stop`` stops the worker (exit 0 expected), ``close`` cleans up."""

    def __init__(self, processes: RedisClusterProcesses, name: str, *, lease_ms: int = 30_000) -> None:
        self.client = processes.client()
        self.producer_client = processes.client()
        self.queue = Queue(name, self.client)
        self.preloaded = [f"j{i}" for i in range(PRELOADED)]
        for i in range(0, PRELOADED, 500):
            self.queue.enqueue_many([NewJob(b"x", job_id=j) for j in self.preloaded[i : i + 500]])
        self.tally = Tally()
        self.worker = Worker([name], self.tally.handler, redis=self.client, concurrency=4, block_ms=1_000,
                             lease_ms=lease_ms, renew_ms=1_000, expire_ms=10_000)
        instrument(self.worker, self.tally)
        self.exit: dict[str, int] = {}
        self.thread = threading.Thread(target=self._run_worker, daemon=True, name="worker")
        self.producer = Producer(Queue(name, self.producer_client), "p", PRODUCED, PRODUCER_RATE)

    def _run_worker(self) -> None:
        self.exit["code"] = self.worker.run(install_signal_handlers=False)

    def start(self) -> None:
        self.thread.start()
        self.producer.start()
        wait_until(lambda: self.tally.handled() >= 300, 30, "the worker did not start draining")

    def assert_serving(self) -> None:
        assert self.thread.is_alive(), f"the worker stopped: {self.worker.exit_reason!r}, exit {self.exit}"
        assert self.worker.exit_reason == "", self.worker.exit_reason

    def finish(self, drain_timeout_s: float = 40) -> None:
        """Wait for the producer, then until the queue is empty (nothing ready, scheduled
        or leased) and the worker has had the answer of every job's ack (an ack's script
        has run before its answer reaches the worker: the queue is empty a moment before
        the tally knows it), while the worker keeps serving."""
        self.producer.join(60)
        assert not self.producer.is_alive(), "the producer did not finish"

        def drained() -> bool:
            s = self.queue.stats()
            return s.ready == 0 and s.scheduled == 0 and s.leased == 0 and self.tally.all_answered()

        wait_until(drained, drain_timeout_s, "the queue was not drained")
        self.assert_serving()

    def stop(self) -> None:
        self.worker.stop("test finished")
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"
        assert self.exit.get("code") == EXIT_OK, (self.exit, self.worker.exit_reason)

    def close(self) -> None:
        if self.thread.is_alive():
            self.worker.stop("test finished")
            self.thread.join(30)
        self.client.close()
        self.producer_client.close()


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def queue_on(processes: RedisClusterProcesses, port: int, slots: tuple[int, int] | None = None) -> str:
    """A queue name whose slot is served by the primary at ``port`` (and within
    ``slots``, inclusive, if given)."""
    ranges = processes.topology()[port]["slots"]
    for i in range(100_000):
        name = f"busy{i}"
        slot = key_slot(f"pq:{{{name}}}:jobs".encode())
        if any(a <= slot <= b for a, b in ranges) and (slots is None or slots[0] <= slot <= slots[1]):
            return name
    raise AssertionError("no queue name fits")


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    """Print past pytest's capture: these figures are the point of the test."""
    with capsys.disabled():
        print(f"\n[cluster faults] {text}")


def check_exactly_once(run: Run) -> int:
    """Nothing lost, nothing run or acked twice, the counters agree. Returns how many
    ack answers were lost: a call whose reply was lost in the fault (under load, even a
    graceful failover's client pause can outlast a reply) is re-sent, replay-safe, and
    the re-send answers GONE where the lost reply said OK (lua/ack.lua, "Replay"). Each
    such job must be done, acked once all the same (the counters)."""
    ids = run.preloaded + run.producer.answered
    assert len(run.producer.answered) == PRODUCED and not run.producer.failures, run.producer.failures[:5]
    assert sorted(run.tally.runs) == sorted(ids), "a job was lost or an unknown job ran"
    twice = {i: n for i, n in run.tally.runs.items() if n != 1}
    assert not twice, f"jobs that ran more than once: {dict(list(twice.items())[:10])}"
    acked_twice = {i: n for i, n in run.tally.oks.items() if n > 1}
    assert not acked_twice, f"jobs acked OK more than once: {acked_twice}"
    unanswered = set(ids) - set(run.tally.oks)
    assert unanswered <= set(run.tally.not_ok), f"jobs never acked: {sorted(unanswered - set(run.tally.not_ok))[:5]}"
    assert all(run.queue.get(i).state == "done" for i in unanswered), "a job without an OK ack is not done"
    stats = run.queue.stats()
    assert (stats.enqueued, stats.acked) == (len(ids), len(ids)), stats
    return len(unanswered)


def reshard(processes: RedisClusterProcesses, source: int, target: int, slots: int) -> float:
    """``redis-cli --cluster reshard``: move the first ``slots`` slots of ``source`` to
    ``target``; returns how long it took. Retried while the nodes still settle the
    previous move (redis-cli refuses to start then)."""
    deadline = time.monotonic() + 60
    while True:
        started = time.monotonic()
        done = subprocess.run(
            ["redis-cli", "--cluster", "reshard", f"127.0.0.1:{source}",
             "--cluster-from", processes.node_id(source), "--cluster-to", processes.node_id(target),
             "--cluster-slots", str(slots), "--cluster-yes"],
            capture_output=True, timeout=60,
        )
        output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
        if done.returncode == 0:
            return time.monotonic() - started
        assert time.monotonic() < deadline, f"redis-cli --cluster reshard failed:\n{output[-3000:]}"
        time.sleep(0.3)


def test_resharding_a_busy_queue_back_and_forth_loses_nothing_and_runs_nothing_twice(
    faulty: RedisClusterProcesses, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = 200  # redis-cli moves the source's first slots: the owner of slot 0 gives 0..199
    source = faulty.primary_of_slot(0)
    target = next(p for p, n in faulty.topology().items() if "master" in n["flags"] and n["slots"] and p != source)
    name = queue_on(faulty, source, (0, moved - 1))
    slot = key_slot(f"pq:{{{name}}}:jobs".encode())
    run = Run(faulty, name)
    try:
        run.start()
        there_s = reshard(faulty, source, target, moved)
        assert faulty.primary_of_slot(slot) == target
        handled_between = run.tally.handled()
        time.sleep(0.5)
        back_s = reshard(faulty, target, source, moved)  # the target's first slots are 0..199 now
        assert faulty.primary_of_slot(slot) == source
        assert run.producer.is_alive(), "the producer finished before the slot moved back: load too short"
        run.assert_serving()
        run.finish()
        lost_answers = check_exactly_once(run)
        report(capsys, f"reshard of {moved} slots incl. queue slot {slot}: there {there_s:.2f} s, back {back_s:.2f} s, "
               f"{len(run.tally.runs)} jobs (handled {handled_between} by the end of the first move), 0 lost, "
               f"0 run twice, 0 acked twice, {lost_answers} ack answers lost (acked once all the same); "
               f"slowest enqueue {run.producer.slowest_s * 1000:.0f} ms")
        run.stop()
    finally:
        run.close()
    faulty.wait_healthy()


def test_a_worker_follows_a_sigkilled_primarys_promoted_replica_and_everything_that_survived_gets_done(
    faulty: RedisClusterProcesses, capsys: pytest.CaptureFixture[str]
) -> None:
    source = faulty.primary_of_slot(key_slot(b"{busy0}"))
    assert faulty.replicas_of(source), "the primary has no replica"
    name = queue_on(faulty, source)
    # Leases longer than a failover (about 3 s here), so that no lease expires while its
    # ack waits for the promotion, and short enough that a lease the failover lost is
    # reclaimed within the test.
    run = Run(faulty, name, lease_ms=10_000)
    try:
        run.start()
        handled_before = run.tally.handled()
        killed_at = faulty.kill_node(source)
        # A lease call started after the kill, or answered 0.5 s after it (no failover
        # completes that soon with cluster-node-timeout 1000 ms), was served by the
        # promoted replica.
        wait_until(lambda: run.tally.first_served_after(killed_at, killed_at + 0.5) is not None, 30,
                   "the worker did not serve a job leased after the kill within 30 s")
        served_after_s = (run.tally.first_served_after(killed_at, killed_at + 0.5) or 0.0) - killed_at
        faulty.wait_failed_over(source)
        run.assert_serving()
        run.finish()
        run.assert_serving()
        # What an asynchronous failover may lose: acknowledged enqueues (and acks) that
        # had not reached the replica. Count, do not hide.
        ids = run.preloaded + run.producer.answered
        never_ran = [i for i in ids if run.tally.runs[i] == 0]
        still_there = [i for i in never_ran if run.client.hexists(run.queue.spec.keys.jobs, i)]
        ran_twice = sorted(i for i, n in run.tally.runs.items() if n > 1)
        acked_twice = {i: run.tally.ok_times[i] for i, n in run.tally.oks.items() if n > 1}
        # An OK answered by the killed primary whose write never reached the replica is an
        # acknowledged write lost (README: a failover can lose them): the job is still
        # leased on the promoted replica, and runs and is acked OK again once that lease
        # expires. Counted and printed; two OK answers from the same side of the kill
        # would be pyqueue's own fault.
        # (An answer read up to 0.5 s after the kill came from the killed primary: no
        # failover completes that soon.)
        cutoff = killed_at + 0.5
        lost_acks = {i: t for i, t in acked_twice.items() if t[0] <= cutoff and all(x > cutoff for x in t[1:])}
        stats = run.queue.stats()
        report(capsys, f"SIGKILL of primary {source} (queue slot {key_slot(name.encode())}): first job leased after "
               f"the kill started {served_after_s:.2f} s after it; {len(ids)} acknowledged enqueues, "
               f"{len(never_ran)} lost in the failover, {len(ran_twice)} ran twice, {len(acked_twice)} acked OK "
               f"twice ({len(lost_acks)} of them an OK of the killed primary lost in the failover"
               f"{', OK answers at ' if lost_acks else ''}"
               f"{'; '.join(', '.join(f'{x - killed_at:+.2f} s' for x in t) for t in lost_acks.values())}); "
               f"{sum(run.tally.not_ok.values())} ack answers not OK; handled {handled_before} before the "
               f"kill; producer failures {len(run.producer.failures)}, slowest enqueue "
               f"{run.producer.slowest_s:.2f} s; stats enqueued {stats.enqueued} acked {stats.acked}")
        # What pyqueue promises through a failover:
        assert not set(acked_twice) - set(lost_acks), f"jobs acked OK more than once: {acked_twice}"
        # On the history that survived, every job was acked exactly once (the promoted
        # replica's counters; nothing is left ready, scheduled or leased).
        assert stats.acked == stats.enqueued and stats.dead == 0, stats
        assert not still_there, f"jobs still in Redis were never run: {still_there[:10]}"
        assert not set(run.tally.runs) - set(ids), "an unknown job ran"
        assert len(run.producer.answered) == PRODUCED, run.producer.failures[:5]
        assert served_after_s < 15, f"the worker took {served_after_s:.1f} s to serve again"
        run.stop()
    finally:
        run.close()
    faulty.restart_node(source)  # back as a replica of its promoted replica
    assert faulty.topology()[source]["master"] is not None


def test_a_graceful_cluster_failover_under_load_loses_nothing_and_runs_nothing_twice(
    faulty: RedisClusterProcesses, capsys: pytest.CaptureFixture[str]
) -> None:
    source = faulty.primary_of_slot(key_slot(b"{busy0}"))
    (replica,) = faulty.replicas_of(source)[:1]
    name = queue_on(faulty, source)
    run = Run(faulty, name)
    try:
        run.start()
        sent_at = faulty.failover(replica)  # returns once the cluster is healthy again
        done_at = time.monotonic()
        assert faulty.primary_of_slot(key_slot(name.encode())) == replica
        wait_until(lambda: run.tally.first_served_after(done_at) is not None, 30,
                   "the worker did not serve a job from the new primary")
        pause_s = run.tally.longest_pause(sent_at, done_at + 0.5)
        run.assert_serving()
        run.finish()
        lost_answers = check_exactly_once(run)
        report(capsys, f"CLUSTER FAILOVER {source} -> {replica}: healthy again {done_at - sent_at:.2f} s after the "
               f"command; longest pause between two handler starts around it {pause_s * 1000:.0f} ms; "
               f"{len(run.tally.runs)} jobs, 0 lost, 0 run twice, 0 acked twice, {lost_answers} ack answers lost "
               f"(acked once all the same); slowest enqueue "
               f"{run.producer.slowest_s * 1000:.0f} ms")
        run.stop()
    finally:
        run.close()
    faulty.failover(source)  # the original roles again


def test_a_worker_given_one_nodes_url_follows_when_that_node_is_killed(
    faulty: RedisClusterProcesses, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #19: a worker whose --url named one primary (a plain redis:// URL, as users
    copy it from their provider) served none of the jobs enqueued after that primary was
    killed and its replica promoted, and logged nothing. It must follow the failover as a
    worker given the seed URL does."""
    caplog.set_level(logging.WARNING, logger="pyqueue")
    source = faulty.primary_of_slot(key_slot(b"{busy0}"))
    name = queue_on(faulty, source)
    client = connect(f"redis://127.0.0.1:{source}/0")
    assert is_cluster(client)
    ran: list[str] = []
    worker = Worker([name], lambda job: ran.append(job.id), redis=client, block_ms=1_000, lease_ms=5_000)
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    runner.start()
    try:
        seed = faulty.client()
        q = Queue(name, seed)
        q.enqueue(b"", job_id="before")
        wait_until(lambda: "before" in ran, 10, "the worker did not serve before the kill")
        faulty.kill_node(source)
        faulty.wait_failed_over(source)
        after = [f"after{i}" for i in range(100)]
        q.enqueue_many([NewJob(b"", job_id=i) for i in after])
        wait_until(lambda: set(after) <= set(ran), 30, f"the worker served {len(set(after) & set(ran))} of 100 "
                   "jobs enqueued after its node was killed")
    finally:
        worker.stop()
        runner.join(30)
