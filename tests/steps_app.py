"""The tasks of the durable-steps crash harness (tests/steps_crash.py). Every run, and
every call of a step's function, appends one line to the file named by $STEPS_LOG, in
one O_APPEND write (whole even when processes race):

* ``run <job id> <attempt> <pid>`` when a run starts;
* ``step <job id> <step> <attempt> <pid>`` when a step's function is called (before its
  commit: a run killed between the two calls it again in a later run).
"""

from __future__ import annotations

import os
import random
import time

from pyqueue import SignalTimeout, Tasks, current_job

tasks = Tasks()  # PYQUEUE_URL's server

#: Kills may cost a job several attempts: enough that none goes dead by them.
ATTEMPTS = 100
STEPS = 5
#: What a signal adds to a job's total (the harness signals the even ones).
SIGNAL_VALUE = 100


def log(line: str) -> None:
    fd = os.open(os.environ["STEPS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def work(job_id: str, name: str, attempt: int, total: int, add: int) -> int:
    log(f"step {job_id} {name} {attempt} {os.getpid()}")
    time.sleep(random.uniform(0, 0.01))
    return total + add


@tasks.task(name="five", queue="steps", max_attempts=ATTEMPTS, keep_result=3600)
def five(n: int) -> int:
    """n + 1 + 2 + 3 + 4 + 5, one committed step each, with a durable sleep after the
    second and a wait for the signal ``go`` after the fourth: the harness signals the
    even jobs (their wait's timeout is an hour) and adds its data; the odd ones time
    out at 0.2 s and add nothing."""
    job = current_job()
    log(f"run {job.id} {job.attempt} {os.getpid()}")
    total = n
    for i in range(STEPS):
        total = job.step(f"s{i}", work, job.id, f"s{i}", job.attempt, total, i + 1)
        if i == 1:
            job.sleep("nap", 0.05)
        if i == 3:
            try:
                total += job.wait_signal("go", timeout=3600 if n % 2 == 0 else 0.2)
            except SignalTimeout:
                pass
    return total
