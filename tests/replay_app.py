"""The task of the bulk-replay race (tests/test_search_race.py): every run appends
``<n> <attempt> <pid>`` to the file named by $RUN_LOG, in one O_APPEND write (whole
even when processes race)."""

from __future__ import annotations

import os

from pyqueue import Tasks, current_job

tasks = Tasks()  # PYQUEUE_URL's server

QUEUE = "replays"


@tasks.task(name="work", queue=QUEUE, max_attempts=1)
def work(n: int) -> None:
    line = f"{n} {current_job().job.attempt} {os.getpid()}\n"
    fd = os.open(os.environ["RUN_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
