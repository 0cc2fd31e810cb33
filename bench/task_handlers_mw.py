"""The tasks of ``task_handlers.py`` with middleware, for bench_tasks.py's drain variants
``task_mw1`` (``tasks_mw1``: one middleware whose run hook does nothing but yield) and
``task_mw0`` (``tasks_mw0``: one middleware with a send hook only, so its workers have no
run hook: the same path as no middleware), and its profile step's in-process workers
(``tasks_metrics``: the per-task metrics middleware, ``pyqueue.tasks.telemetry.TaskMetrics``,
as ``pyqueue worker --metrics-port`` registers it). Same task names and queue as
``task_handlers.py``, so the same jobs serve every task variant.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from prometheus_client import CollectorRegistry

from pyqueue import Middleware, Tasks
from pyqueue.tasks.telemetry import TaskMetrics
from task_handlers import QUEUE


class Passing(Middleware):
    """Around each run: yields, nothing else (the chain's own cost)."""

    def around_run(self, run: Any) -> Generator[None, Any, None]:
        yield


class SendOnly(Middleware):
    """A send hook only: a worker of these tasks has no run hook."""

    def around_send(self, message: Any) -> None:
        pass


def _tasks(middleware: Middleware) -> Tasks:
    tasks = Tasks(default_queue=QUEUE)
    tasks.middleware(middleware)

    @tasks.task(name="bench.add")
    def add(a: int, b: int) -> int:
        return a + b

    @tasks.task(name="bench.noop")
    def noop(a: int, b: int) -> None:
        pass

    return tasks


tasks_mw1 = _tasks(Passing())
tasks_mw0 = _tasks(SendOnly())
tasks_metrics = _tasks(TaskMetrics(CollectorRegistry()))
