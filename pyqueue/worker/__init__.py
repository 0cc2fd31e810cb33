"""The worker runtime, in parts a newcomer can name (DESIGN §16). :class:`pyqueue.worker.Worker`
composes them and stays the entry point; each part is a screenful with one job:

* :mod:`~pyqueue.worker.fetch` — the **fetch loop** (:class:`FetchLoop`): leases jobs
  for free handler slots, from the first queue with ready jobs, and blocks on the wake
  markers when nothing is ready. Runs in the thread that calls ``Worker.run``.
* :mod:`~pyqueue.worker.executor` — the **executors**: where a handler runs. One
  interface (:class:`Executor`): run this job (``submit``), report how it ended (to the
  :class:`Endings`), stop it (``interrupt`` at its time limit, ``lease_ended`` when the
  lease ended without this worker, ``shutdown``). :class:`ThreadExecutor` runs handlers in
  a thread pool; :class:`~pyqueue.worker.aio_executor.AsyncioExecutor` runs ``async def``
  handlers as tasks of an event loop.
* :mod:`~pyqueue.worker.endings` — **how a run ends**: ack (by group commit,
  :mod:`pyqueue.worker.commit`), ack with a result, nack (retry, backoff, dead letters), or
  release unrun; and the handler's own words for it (:class:`Retry`, :class:`Fail`).
* :mod:`~pyqueue.worker.batch` — **batch handlers** (``Worker(..., batch=N)``, batch
  tasks): up to N jobs of one queue from one lease call, one handler call in one slot;
  :mod:`~pyqueue.worker.batch_endings` ends each job by its own result (the acks in
  one call that leases the next batch), :mod:`~pyqueue.worker.nacks` sends a batch's
  nacks in one pipelined round trip.
* :mod:`~pyqueue.worker.heartbeat` — the **heartbeat** thread: extends the leases of
  running jobs, renews the registration (scrubbing the dead services it reports), ends
  jobs at their time limit, and wakes the fetch loop when a stop is asked.
* :mod:`~pyqueue.worker.registration` — the service registration the other parts
  consult: registered, renewed, confirmed recently enough to lease, stopped remotely.
* :mod:`~pyqueue.worker.running` — what the worker holds now: its free handler slots
  and the jobs it leased that have not ended. The one piece of state the parts share.
* :mod:`~pyqueue.worker.lifecycle` — start-up retries, signals, the stop and its exit
  code, the graceful shutdown.
* :mod:`~pyqueue.worker.retries` and :mod:`~pyqueue.worker.crash` — what every part
  waits out (the connection, a full server), and the named crash points of the
  fault-injection tests.

* :mod:`~pyqueue.worker.supervisor` — the **supervisor** of ``pyqueue worker
  --processes N``, above all of this in a process of its own: it starts N worker
  processes (each one ``Worker`` made of the parts above), replaces a dead one and scrubs
  its leases at once, recycles them, restarts them one by one on SIGHUP and drains them
  on SIGTERM; :mod:`~pyqueue.worker.supervised` is a child's end of the line to it.
  The process is the unit a hard time limit kills: a thread stuck past its limit in C
  code gets its child replaced (:mod:`pyqueue.worker.slots`), so no per-job process executor
  is needed, and a child keeps group commit and its warm connections between jobs.

Sync and async share everything here: an :class:`~pyqueue.worker.aio.AsyncWorker`
differs from a :class:`~pyqueue.worker.Worker` only in its executor; the fetch loop,
heartbeat, endings and lifecycle run in threads for both.
"""

from pyqueue.worker.aio import AsyncBatchHandler, AsyncHandler, AsyncWorker
from pyqueue.worker.batch import BatchHandler
from pyqueue.worker.endings import Fail, Retry
from pyqueue.worker.executor import Handler
from pyqueue.worker.lifecycle import EXIT_MISCONFIGURED, EXIT_OK, EXIT_REGISTRATION_LOST, EXIT_STUCK
from pyqueue.worker.settings import WorkerSettings
from pyqueue.worker.slots import Parked, TimeLimitExceeded
from pyqueue.worker.worker import Worker

__all__ = [
    "EXIT_MISCONFIGURED", "EXIT_OK", "EXIT_REGISTRATION_LOST", "EXIT_STUCK", "AsyncBatchHandler", "AsyncHandler", "AsyncWorker",
    "BatchHandler", "Fail", "Handler", "Parked", "Retry", "TimeLimitExceeded", "Worker", "WorkerSettings",
]
