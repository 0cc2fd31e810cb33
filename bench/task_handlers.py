"""Tasks for bench_tasks.py: ``pyqueue worker task_handlers:tasks`` serves them
(``PYTHONPATH=bench``, as for ``worker_handlers.py``).

``tasks`` is not connected here: the worker process serves and sends through its
``--url``; the benchmark process binds it to its own client (``tasks.bind``).
"""

from __future__ import annotations

from pyqueue import Tasks

#: The queue every benchmark task is sent to (and the raw jobs they are compared with).
QUEUE = "bench-tasks"

tasks = Tasks(default_queue=QUEUE)


@tasks.task(name="bench.add")
def add(a: int, b: int) -> int:
    """The enqueue figures' task: two int arguments."""
    return a + b


@tasks.task(name="bench.noop")
def noop(a: int, b: int) -> None:
    """The drain figures' task: the same two arguments, does nothing (the figures
    measure the task layer and the engine alone)."""
