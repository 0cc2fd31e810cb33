"""Handlers for the worker processes of the crash harness (tests/crash_harness.py).

A worker process runs ``python -m pyqueue worker crash_handlers:record ...`` (or
``crash_handlers:tasks``, a Tasks object, see below) with
``PYTHONPATH`` including tests/. Everything a checker needs is written to Redis *before*
the step it describes can be lost, so it survives the SIGKILL of the process:

* every execution: ``RPUSH <runs key> "<id> <fence> <attempt> <pid>"`` as the handler's
  first act (a run that is logged may have been cut short; a run that is not logged
  never started the handler's work);
* every ``ok`` answer of an ack, as the driver returned it to the worker:
  ``RPUSH <acks key> "<id> <fence>"`` (observed by wrapping two :class:`Queue` methods,
  see :func:`observe_acks`). An ack whose reply the worker never read (crash point
  ``ack_sent``, or a kill between the reply and the log) is not listed: the list may
  miss acks, but any id in it twice was acknowledged twice.

The poison job (id starting with :data:`POISON_PREFIX`) SIGKILLs its own worker every
time it runs, after logging the run. A job whose payload is a decimal number sleeps that
many milliseconds (a slow job); any other sleeps 0..``PQ_CRASH_WORK_MS``.

Environment: ``PQ_CRASH_URL`` (the server), ``PQ_CRASH_RUNS`` / ``PQ_CRASH_ACKS`` (list
keys), optional ``PQ_CRASH_WORK_MS`` (most random work per job, default 2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from pyqueue.protocol.core import Plan
from pyqueue.protocol.plans import Bound, SingleQueue
from pyqueue.protocol.verbs import consume
from pyqueue import Job, Outcome, Queue, Tasks, connect, current_job
from pyqueue.protocol.models import Leased

POISON_PREFIX = "poison"
log = logging.getLogger("crash_handlers")

_lock = threading.Lock()
_client: redis.Redis | None = None


def client() -> redis.Redis:
    """One client per process (redis-py's pool is thread-safe), created on first use."""
    global _client
    with _lock:
        if _client is None:
            _client = connect(os.environ["PQ_CRASH_URL"])
        return _client


def record(job: Job) -> None:
    """Log this execution durably, do a little work, or kill the worker if poisoned."""
    run(job, int(job.payload) if job.payload.isdigit() else 0)


def run(job: Job, slow_ms: int) -> None:
    """``record``'s work: a slow job sleeps ``slow_ms``."""
    client().rpush(os.environ["PQ_CRASH_RUNS"], f"{job.id} {job.fence} {job.attempt} {os.getpid()}")
    if job.id.startswith(POISON_PREFIX):
        log.warning("poison job %s attempt %d: SIGKILL", job.id, job.attempt)
        os.kill(os.getpid(), signal.SIGKILL)
    if slow_ms:
        # A slow job: it runs longer than a third of its lease, so the heartbeat extends
        # it while it runs (and a worker configured with in_extend dies there).
        time.sleep(slow_ms / 1000)
    else:
        # A random pause (sleeping releases the GIL) so handler threads overlap and crash
        # points inside and around the handler meet jobs in every phase.
        time.sleep(random.uniform(0, float(os.environ.get("PQ_CRASH_WORK_MS", "2")) / 1000))


async def record_async(job: Job) -> None:
    """``record`` as an ``async def`` handler: ``pyqueue worker`` runs it on AsyncWorker,
    a task of the event loop per job (the recording and the pauses are the same, done
    in a thread so they block no other task)."""
    await asyncio.to_thread(record, job)


# Task jobs mixed in: the harness sends every third job as a task envelope naming
# TASK_NAME (its argument: the ms a slow job sleeps). Workers running `crash_handlers:tasks`
# (or `tasks_async`, on AsyncWorker) route them through the task layer's dispatcher and
# run the raw jobs with their raw handler; the raw-handler workers run task jobs as raw.
TASK_NAME = "crash.work"
tasks = Tasks()
tasks.raw_handler(record)
tasks_async = Tasks()
tasks_async.raw_handler(record_async)


@tasks.task(name=TASK_NAME)
def work(slow_ms: int) -> None:
    run(current_job().job, slow_ms)


@tasks_async.task(name=TASK_NAME)
async def work_async(slow_ms: int) -> None:
    await asyncio.to_thread(run, current_job().job, slow_ms)


def _log_acks(jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> None:
    ok = [f"{job.id} {job.fence}" for job, outcome in zip(jobs, outcomes) if outcome is Outcome.OK]
    if ok:
        client().rpush(os.environ["PQ_CRASH_ACKS"], *ok)


def observe_acks() -> None:
    """Wrap the plans of ``ack_many`` and ``lease_call`` (the two paths by which a
    worker acks, whichever driver runs them) so that every ``ok`` answer is logged.
    Idempotent."""
    if getattr(SingleQueue, "_crash_observed", False):
        return
    original_ack_many = consume.ack_many
    original_lease_call = consume.lease_call

    def ack_many(spec: Any, memory: Any, jobs: Any, **kwargs: Any) -> Plan[list[Outcome]]:
        jobs = list(jobs)
        outcomes = yield from original_ack_many(spec, memory, jobs, **kwargs)
        _log_acks(jobs, outcomes)
        return outcomes

    def lease_call(spec: Any, memory: Any, **kwargs: Any) -> Plan[Leased]:
        leased = yield from original_lease_call(spec, memory, **kwargs)
        _log_acks(list(kwargs.get("ack", ())), leased.acks)
        return leased

    # The plan functions (which ack and ack_and_lease call) and a single queue's plans
    # (which a façade and a partitioned queue's partitions call).
    consume.ack_many, consume.lease_call = ack_many, lease_call  # type: ignore[assignment]
    SingleQueue.ack_many = Bound(ack_many)  # type: ignore[assignment]
    SingleQueue.lease_call = Bound(lease_call)  # type: ignore[assignment]
    SingleQueue._crash_observed = True  # type: ignore[attr-defined]


if os.environ.get("PQ_CRASH_ACKS"):
    observe_acks()
