"""The tasks of tests/test_task_metrics.py's command-line tests, run by ``pyqueue worker
metrics_app:tasks --metrics-port PORT`` (``PYTHONPATH`` including tests/): one that
returns, one that fails its first attempt and then returns, one that fails at once;
and (for the dashboard's running jobs) a slow one with a time limit that reports progress."""

from __future__ import annotations

import time

from pyqueue import Fail, Tasks, current_job

tasks = Tasks()


@tasks.task(name="mx.ok", queue="mx")
def ok(n: int) -> int:
    return n


@tasks.task(name="mx.flaky", queue="mx", max_attempts=3, backoff=0.01)
def flaky(n: int) -> int:
    if current_job().attempt == 1:
        raise ValueError(f"first attempt of {n}")
    return n


@tasks.task(name="mx.boom", queue="mx", max_attempts=3)
def boom(n: int) -> None:
    raise Fail(f"boom {n}")


@tasks.task(name="mx.slow", queue="mx", time_limit=60)
def slow(seconds: float) -> None:
    current_job().progress({"step": 1})
    time.sleep(seconds)
