"""The task of the rate-limit process test (tests/test_rate_limits.py): every run appends
``<key> <leased_ms> <pid>`` to the file named by $RATE_LOG, in one O_APPEND write (whole
even when processes race); leased_ms is when its lease was made, on the server's clock."""

from __future__ import annotations

import os
import time

from pyqueue import Tasks, current_job

tasks = Tasks()  # PYQUEUE_URL's server

QUEUE = "rated"
#: The workers' --lease-ms: a job's lease time is its deadline less this.
LEASE_MS = 60_000
#: Each key's limit: 10 a second, evenly spaced (100 ms apart).
SPACING_MS = 100


@tasks.task(name="call", queue=QUEUE, rate_limit="10/s", rate_key=lambda key, **_: key, max_attempts=100)
def call(key: str, n: int) -> None:
    line = f"{key} {current_job().job.deadline_ms - LEASE_MS} {os.getpid()}\n"
    fd = os.open(os.environ["RATE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    time.sleep(0.01)
