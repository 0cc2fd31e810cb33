"""The batch task of bench_tasks.py's ``task_batch`` drain: ``pyqueue worker
batch_handlers:tasks`` serves it (``PYTHONPATH=bench``, as for ``task_handlers.py``).

A module of its own: ``task_handlers.py`` is also imported by the workers of older
checkouts (``--task-baseline``), which have no ``batch=``.
"""

from __future__ import annotations

from pyqueue import Tasks

#: The batch task's queue (a batch task's queue holds its jobs only).
QUEUE = "bench-tasks-batch"
#: Jobs per handler call.
BATCH = 100

tasks = Tasks(default_queue=QUEUE)


@tasks.task(name="bench.noop_batch", batch=BATCH)
def noop_batch(items: list[list[int]]) -> list[None]:
    """Does nothing with a batch of up to BATCH items (each the [1, 2] of noop(1, 2))."""
    return [None] * len(items)
