"""A bulk replay racing live workers and another operator's bulk replay: every dead job
is replayed and run exactly once, none is replayed after its ack (the scripts check
each job's state again as they act: pyqueue.ops.find). Worker threads on fakeredis and
a real redis-server; worker processes on a real redis-server."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
from tasks_support import Serving, wait_for

from pyqueue import Queue
from pyqueue.ops.find import BulkResult, JobFilter, act_matching
from pyqueue.tasks import Tasks

N = 300


def kill_all(q: Queue, n: int) -> None:
    """Every job of ``q`` leased and failed for good: ``n`` dead letters."""
    dead = 0
    while dead < n:
        jobs = q.lease(count=100)
        for job in jobs:
            q.nack(job, "TimeoutError: the API took 30 s", final=True)
        dead += len(jobs)
    assert q.stats().dead == n


def race(q: Queue, operators: int = 2) -> list[BulkResult]:
    """``operators`` bulk replays of the same filter at once."""
    results: list[BulkResult] = []
    start = threading.Barrier(operators)

    def operator() -> None:
        start.wait()
        results.append(act_matching(q, "replay", JobFilter(task="work", error="TimeoutError")))

    threads = [threading.Thread(target=operator) for _ in range(operators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == operators
    return results


def test_a_bulk_replay_racing_worker_threads_runs_each_job_once(r: redis.Redis) -> None:
    tasks = Tasks(client=r, default_queue="replays")
    runs: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()

    @tasks.task(name="work", max_attempts=1)
    def work(n: int) -> None:
        with lock:
            runs[n] += 1

    q = tasks.queue("replays")
    q.set_indexes(True)
    for n in range(N):
        work.send(n)
    kill_all(q, N)
    workers = [Serving(tasks, concurrency=4) for _ in range(2)]
    try:
        results = race(q)
        wait_for(lambda: sum(runs.values()) >= N and q.stats().ready == 0 and q.stats().leased == 0, 60,
                 "every replayed job to run")
        late = act_matching(q, "replay", JobFilter(task="work"))  # after the acks: nothing to replay
    finally:
        for w in workers:
            w.stop()
    assert runs == collections.Counter(range(N))  # each job ran once
    assert sum(res.done for res in results) == N and q.stats().replayed == N
    assert all(res.found <= N for res in results) and (late.found, late.done) == (0, 0)
    st = q.stats()
    assert (st.dead, st.ready, st.scheduled) == (0, 0, 0)


def test_a_bulk_replay_racing_worker_processes_runs_each_job_once(redis_server: Any, tmp_path: Path) -> None:
    import replay_app

    log = tmp_path / "runs.log"
    env = {**os.environ, "PYQUEUE_URL": redis_server.url(), "RUN_LOG": str(log)}
    here = Path(__file__).resolve().parent
    client = redis_server.client()
    client.flushall()
    replay_app.tasks.bind(client)
    q = replay_app.tasks.queue(replay_app.QUEUE)
    q.set_indexes(True)
    for n in range(N):
        replay_app.work.send(n)
    kill_all(q, N)
    workers = [subprocess.Popen([sys.executable, "-m", "pyqueue", "worker", "replay_app:tasks", "--concurrency", "4"],
                                cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(2)]
    try:
        results = race(q, operators=3)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < N):
            time.sleep(0.1)
        wait_for(lambda: q.stats().ready + q.stats().leased == 0, 30, "the queue to drain")
        late = act_matching(q, "replay", JobFilter(task="work"))
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    runs = [line.split() for line in log.read_text().splitlines()]
    assert collections.Counter(int(n) for n, _, _ in runs) == collections.Counter(range(N))
    assert {attempt for _, attempt, _ in runs} == {"1"}  # a replay resets the attempts; none ran twice
    assert sum(res.done for res in results) == N and q.stats().replayed == N
    assert (late.found, late.done) == (0, 0) and q.stats().dead == 0
