"""Per-task Prometheus metrics of a worker: a run middleware (:mod:`pyqueue.tasks.middleware`).

``pyqueue worker app:tasks --metrics-port 9100`` registers one :class:`TaskMetrics` and
serves its metrics on ``http://127.0.0.1:9100/metrics`` (``--metrics-host`` to bind
elsewhere); with ``--processes N`` the supervisor serves them summed over its children
(:mod:`pyqueue.worker.supervisor`). In a process of your own::

    from pyqueue.tasks.telemetry import TaskMetrics
    tasks.middleware(TaskMetrics())          # into prometheus_client's default REGISTRY

Needs the ``metrics`` extra (``pip install "pyqueue-redis[metrics]"``). A worker without it
registers no middleware, so it enters no hook chain and pays nothing (the task layer's
rule: no run hook, no call).

What it exports, labelled ``task`` (the registered name) and ``queue`` (the queue the
job was leased from; a partition ``name#p`` of a partitioned queue as its logical
queue ``name``):

* ``pyqueue_task_run_seconds`` (histogram, :data:`RUN_BUCKETS`): how long each run
  took in this worker, from entering this middleware's hook to leaving it (the task's
  function, and the hooks inside this one: the CLI registers it outermost). A job of
  a batch task observes its batch's call.
* ``pyqueue_task_queue_wait_seconds`` (histogram, :data:`WAIT_BUCKETS`): on a job's
  **first attempt** only, how long it waited between being due and starting to run,
  both on the Redis server's clock: the start is the worker's lease time plus the time
  its slot has run since (:meth:`~pyqueue.worker.slots.Slot.server_now_ms`); due is the
  envelope's ``meta.enqueued_ms`` plus ``meta.delay_ms`` (a ``send_in`` or ``send_at``
  job waits from its due time). A negative wait (``enqueued_ms`` is the producer's
  estimate of the server clock) counts as 0. A later attempt is not observed: its due
  time (the end of a backoff, or a lease that expired) is not in the envelope. Not
  observed either without ``enqueued_ms`` (a producer that did not write it) or outside
  a worker's slot.
* ``pyqueue_task_runs_total{outcome}`` (counter): every run that ended, once, by
  :func:`outcome_of` its :attr:`~pyqueue.tasks.HookOutcome.ending`:

  - ``ok``: it returned; acked;
  - ``retried``: it failed and runs again after a backoff (an exception that its
    policy retries, :class:`~pyqueue.Retry`, a middleware's error);
  - ``failed``: it went to the dead letters with attempts left: a failure that is not
    retried (:class:`~pyqueue.Fail`, a ``fail_on`` or non-``retry_on`` exception,
    arguments that do not fit, a result that cannot be stored);
  - ``dead``: it went to the dead letters on its last attempt (attempt equals
    ``max_attempts``: its retries are used up; a failure that is never retried, on the
    last attempt, counts here too);
  - ``time_limited``: it reached its time limit (acked if it caught it and returned; else
    retried or dead by its policy, which the queue's ``pyqueue_dead_total`` shows);
  - ``cancelled``: its end was decided without it (cancelled, or its lease lost).

  ``failed + dead`` are the runs that sent their job to the dead letters. A run whose
  thread is stuck in C code past its time limit is counted when the thread returns;
  in a child of ``--processes N`` (which is replaced instead) it is not counted.
  All six series of a task and queue exist (at 0) from its first run on.

The histograms count runs (every attempt) and first attempts; the counter's sum over
``outcome`` equals the run histogram's ``_count`` once no run is in progress.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from pyqueue.worker.slots import current_slot
from pyqueue.tasks.middleware import HookOutcome, Middleware

if TYPE_CHECKING:
    from pyqueue.tasks.run import TaskRun

#: Upper bounds (seconds) of pyqueue_task_run_seconds: 1 ms to an hour (+Inf).
RUN_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)
#: Upper bounds (seconds) of pyqueue_task_queue_wait_seconds: 1 ms to a day (+Inf): a
#: backlog can hold jobs far longer than any run.
WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    21600.0, 86400.0,
)
#: The values of the ``outcome`` label (see the module docstring), in this order.
OUTCOMES = ("ok", "retried", "failed", "dead", "time_limited", "cancelled")
#: Run endings other than ``dead`` -> their outcome.
_OUTCOME_OF_ENDING = {"ok": "ok", "retry": "retried", "time_limit": "time_limited", "cancelled": "cancelled"}


def outcome_of(ending: str, attempt: int, max_attempts: int) -> str:
    """The ``outcome`` label of a run that ended as ``ending`` (a
    :attr:`HookOutcome.ending <pyqueue.tasks.HookOutcome>` of a run: ok, retry, dead,
    time_limit, cancelled) on attempt ``attempt`` of ``max_attempts``.

    Raises:
        KeyError: ``ending`` is not one of a run's endings.
    """
    if ending == "dead":
        return "dead" if attempt >= max_attempts else "failed"
    return _OUTCOME_OF_ENDING[ending]


def logical_queue(name: str) -> str:
    """The ``queue`` label of a job leased from queue ``name``: ``<name>#<p>`` (a
    partition) as ``<name>``, so a partitioned queue is one label value, as in the
    queue exporter (:mod:`pyqueue.ops.metrics`)."""
    base, sep, index = name.rpartition("#")
    return base if sep and index.isdigit() else name


class _Series:
    """The labelled children of one (task, queue), looked up once: ``labels()`` takes a
    lock and builds a key on every call, which a per-job hook should not pay."""

    __slots__ = ("run", "wait", "outcomes")

    def __init__(self, metrics: TaskMetrics, task: str, queue: str) -> None:
        self.run: Histogram = metrics.run_seconds.labels(task, queue)
        self.wait: Histogram = metrics.wait_seconds.labels(task, queue)
        self.outcomes: dict[str, Counter] = {o: metrics.runs.labels(task, queue, o) for o in OUTCOMES}


class TaskMetrics(Middleware):
    """Counts and times every run of a worker's tasks (see the module docstring).

    Args:
        registry: where the three metrics are registered (default prometheus_client's
            ``REGISTRY``; None: none, as prometheus_client's own metrics take it). Under
            prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set
            before it is imported) the values go to that directory's files whatever
            the registry.
        run_buckets / wait_buckets: the histograms' upper bounds, in seconds.

    Raises:
        ValueError: the metrics are registered in ``registry`` already (by another
            TaskMetrics).
    """

    def __init__(
        self, registry: CollectorRegistry | None = REGISTRY, *, run_buckets: Sequence[float] = RUN_BUCKETS,
        wait_buckets: Sequence[float] = WAIT_BUCKETS,
    ) -> None:
        labels = ("task", "queue")
        self.run_seconds = Histogram(
            "pyqueue_task_run_seconds", "how long a run of the task took in the worker, in seconds (every attempt)",
            labels, buckets=run_buckets, registry=registry,
        )
        self.wait_seconds = Histogram(
            "pyqueue_task_queue_wait_seconds", "how long a job waited from due (enqueued, plus its delay) to its "
            "first run's start, in seconds, on the Redis server's clock (first attempts only)",
            labels, buckets=wait_buckets, registry=registry,
        )
        self.runs = Counter(
            "pyqueue_task_runs", "runs of the task by outcome: ok, retried, failed (dead letters with attempts "
            "left), dead (dead letters on the last attempt), time_limited, cancelled",
            (*labels, "outcome"), registry=registry,
        )
        self._series: dict[tuple[str, str], _Series] = {}

    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        started = time.perf_counter()
        job = run.job
        key = (run.task, job.queue)
        series = self._series.get(key)
        if series is None:
            # Two threads may both build it: labels() returns the same children, so the
            # second assignment changes nothing.
            series = self._series[key] = _Series(self, run.task, logical_queue(job.queue))
        if job.attempt == 1 and run.enqueued_ms is not None:
            slot = current_slot()
            if slot is not None:
                delay_ms = run.meta.get("delay_ms")
                due_ms = run.enqueued_ms + (delay_ms if type(delay_ms) is int and delay_ms > 0 else 0)
                series.wait.observe(max(0, slot.server_now_ms() - due_ms) / 1000)
        outcome = yield
        series.run.observe(time.perf_counter() - started)
        series.outcomes[outcome_of(outcome.ending, job.attempt, job.max_attempts)].inc()

    def __repr__(self) -> str:
        return f"<TaskMetrics of {len(self._series)} task/queue pairs>"
