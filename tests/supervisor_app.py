"""The tasks of tests/test_supervisor.py, run by ``pyqueue worker supervisor_app:tasks
--processes N`` (``PYTHONPATH`` including tests/, ``PYQUEUE_URL`` the test's server).

Every run is logged in Redis *before* its work, so the log survives a SIGKILL:
``RPUSH <PQ_SV_RUNS> "<task> <n> <pid> <attempt>"``. A test reads it to find every job
that ran, which process ran it, and any job that ran twice.
"""

from __future__ import annotations

import os
import signal
import time

from pyqueue import Tasks, connect, current_job

tasks = Tasks()
_client = None


def log_run(task: str, n: int) -> None:
    global _client
    if _client is None:
        _client = connect(os.environ["PYQUEUE_URL"])
    job = current_job()
    _client.rpush(os.environ["PQ_SV_RUNS"], f"{task} {n} {os.getpid()} {job.attempt if job else 0}")


@tasks.task(queue="sv", max_attempts=5)
def record(n: int, sleep_s: float = 0.0) -> int:
    """Log the run, then sleep ``sleep_s`` (a job that holds its lease a while)."""
    log_run("record", n)
    if sleep_s:
        time.sleep(sleep_s)
    return n


@tasks.task(queue="sv", max_attempts=100)
def die(n: int) -> None:
    """Kill this worker process (a crash), every time it runs."""
    log_run("die", n)
    os.kill(os.getpid(), signal.SIGKILL)


@tasks.task(queue="sv", time_limit=1, time_limit_grace=0.5, max_attempts=2, backoff=0)
def sleep_forever(n: int) -> None:
    """Stuck in C code: only ending the process stops it. Each attempt first writes a
    ledger line ``<attempt> <pid> <whether the previous attempt's process is alive>`` to
    ``<PQ_SV_RUNS>:ledger``: a test reads there that no attempt started while the one
    before still ran."""
    log_run("sleep_forever", n)
    ledger = os.environ["PQ_SV_RUNS"] + ":ledger"
    assert _client is not None
    before = _client.lrange(ledger, -1, -1)
    alive = False
    if before:
        try:
            os.kill(int(before[0].split()[1]), 0)
            alive = True
        except ProcessLookupError:
            pass
    job = current_job()
    _client.rpush(ledger, f"{job.attempt if job else 0} {os.getpid()} {int(alive)}")
    time.sleep(3600)


@tasks.task(queue="sv", time_limit=1, time_limit_grace=0.5, max_attempts=2)
def spin_forever(n: int) -> None:
    """Busy in Python code: the asynchronous TimeLimitExceeded stops it."""
    log_run("spin_forever", n)
    while True:
        pass


_hoard: list[bytearray] = []


@tasks.task(queue="sv")
def hog(n: int, mib: int) -> None:
    """Grow this process's resident memory by ``mib`` MiB, kept until it exits."""
    log_run("hog", n)
    block = bytearray(mib * 2**20)
    for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
        block[i] = 1
    _hoard.append(block)
