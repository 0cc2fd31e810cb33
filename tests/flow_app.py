"""The tasks of the flow crash harness (tests/flow_crash.py). Every run appends one line
``<kind> <job id> <attempt> <value>`` to the file named by $FLOW_LOG, in one O_APPEND
write (whole even when processes race), before it returns: a run killed before its
write leaves no line, a run killed after it leaves a line and runs again."""

from __future__ import annotations

import os
import random
import time

from pyqueue import Tasks, current_job

tasks = Tasks()  # PYQUEUE_URL's server

#: Kills may cost a step several attempts: enough that none goes dead by them.
ATTEMPTS = 50


def log(kind: str, value: int) -> None:
    run = current_job()
    fd = os.open(os.environ["FLOW_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{kind} {run.id} {run.attempt} {value}\n".encode())
    finally:
        os.close(fd)


@tasks.task(name="member", queue="members", max_attempts=ATTEMPTS)
def member(x: int) -> int:
    time.sleep(random.uniform(0, 0.02))
    log("member", x)
    return x


@tasks.task(name="callback", queue="callbacks", max_attempts=ATTEMPTS)
def callback(xs: list[int]) -> int:
    time.sleep(random.uniform(0, 0.01))
    log("callback", sum(xs))
    return sum(xs)


@tasks.task(name="step", queue="members", max_attempts=ATTEMPTS)
def step(x: int) -> int:
    time.sleep(random.uniform(0, 0.01))
    log("step", x)
    return x + 1
