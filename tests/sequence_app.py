"""The task of the sequence crash harness (tests/sequence_crash.py). Every run appends one
line to the file named by $SEQUENCE_LOG, in one O_APPEND write (whole even when
processes race): ``run <key> <n> <job id> <pid>`` when a run starts, and ``done <key>
<n> <job id> <pid>`` when it returns. Its producers append ``try <key> <n>`` before each
send and ``sent <key> <n> <job id>`` once it has answered."""

from __future__ import annotations

import os
import random
import time

from pyqueue import Tasks, current_job

tasks = Tasks()  # PYQUEUE_URL's server

#: Kills may cost a job several attempts: enough that none goes dead by them.
ATTEMPTS = 100
QUEUE = "ordered"


def log(line: str) -> None:
    fd = os.open(os.environ["SEQUENCE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@tasks.task(name="apply", queue=QUEUE, max_attempts=ATTEMPTS, sequence=lambda key, **_: key)
def apply(key: str, n: int) -> None:
    """Apply change ``n`` (its send's time, ns) to ``key``: one at a time per key, in send order."""
    job_id = current_job().id
    log(f"run {key} {n} {job_id} {os.getpid()}")
    time.sleep(random.uniform(0.01, 0.08))  # long enough that kills land mid-run
    log(f"done {key} {n} {job_id} {os.getpid()}")


def produce(keys: list[str], until: float, seed: int) -> None:
    """Send changes for ``keys`` until the monotonic time ``until`` (a producer process of
    the harness: it is SIGKILLed now and then, mid-call too)."""
    rng = random.Random(seed)
    while time.monotonic() < until:
        key = rng.choice(keys)
        for _ in range(rng.randint(1, 4)):
            n = time.time_ns()
            log(f"try {key} {n}")  # before the call: a kill may come before its answer
            sent = apply.send(key, n)
            log(f"sent {key} {n} {sent.id}")
            time.sleep(rng.uniform(0, 0.02))
        time.sleep(rng.uniform(0, 0.1))
