"""The task of the debounce crash harness (tests/debounce_crash.py). Every run appends
one line to the file named by $DEBOUNCE_LOG, in one O_APPEND write (whole even when
processes race): ``run <key> <stamp> <job id> <pid>`` when a run starts, and ``done
<key> <stamp> <job id> <pid>`` when it returns. Its producers append ``try <key>
<stamp>`` before each send and ``sent <key> <stamp> <job id> <outcome>`` once it has
answered."""

from __future__ import annotations

import os
import random
import time

from pyqueue import Tasks, current_job

tasks = Tasks()  # PYQUEUE_URL's server

#: Kills may cost a job several attempts: enough that none goes dead by them.
ATTEMPTS = 100
#: The debounce window (seconds): short, so that bursts and quiet spells both happen.
WINDOW_S = 0.15
QUEUE = "keyed"


def log(line: str) -> None:
    fd = os.open(os.environ["DEBOUNCE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@tasks.task(name="index", queue=QUEUE, max_attempts=ATTEMPTS, debounce=WINDOW_S, key=lambda key, **_: key)
def index(key: str, stamp: int) -> None:
    """Reindex ``key`` as of ``stamp`` (the send's time, ns): runs once per quiet window
    with the last send's arguments."""
    job_id = current_job().id
    log(f"run {key} {stamp} {job_id} {os.getpid()}")
    time.sleep(random.uniform(0, 0.03))
    log(f"done {key} {stamp} {job_id} {os.getpid()}")


def produce(keys: list[str], until: float, seed: int) -> None:
    """Send bursts for ``keys`` until the monotonic time ``until`` (a producer process of
    the harness: it is SIGKILLed now and then, mid-call too)."""
    rng = random.Random(seed)
    while time.monotonic() < until:
        key = rng.choice(keys)
        for _ in range(rng.randint(1, 6)):  # a burst: most of it is debounced
            stamp = time.time_ns()
            log(f"try {key} {stamp}")  # before the call: a kill may come before its answer
            sent = index.send(key, stamp)
            log(f"sent {key} {stamp} {sent.id} {sent.by_key or ('added' if sent.added else 'duplicate')}")
            time.sleep(rng.uniform(0, 0.03))
        time.sleep(rng.uniform(0, 0.3))
