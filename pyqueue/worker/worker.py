"""The worker: a registered service that leases jobs from an ordered list of queues and
runs a handler on each, in a thread pool. :class:`Worker` is the entry point; it composes
the parts of :mod:`pyqueue.worker`, each with one job.

Threads and connections:

* the **fetch loop** (:mod:`pyqueue.worker.fetch`; the thread that calls
  :meth:`Worker.run`) leases jobs for free handler slots, always from the first queue
  with ready jobs, and when nothing is ready blocks with ``BZPOPMIN`` on the queues'
  wake markers (raised by enqueue, nack, release, promote, scrub) and on the service's
  private wake key, for at most the time to the next due job or lease deadline. It owns
  the *blocking* connection, whose socket timeout exceeds the longest block.
* **handler threads** (``concurrency`` of them; the executor,
  :mod:`pyqueue.worker.executor`) run the handler. On success the job's ack is posted to
  the commit loop and the thread takes its next job at once; on an exception the job is
  nacked (:mod:`pyqueue.worker.endings`).
* the **commit loop** (:mod:`pyqueue.worker.commit`, one thread) acks by group commit: the jobs
  of every handler that finished since its last call in one call per queue, a call that
  for the first queue also leases their replacements, so a busy worker needs at most one
  round trip per job, and fewer the more handlers finish together.
* the **heartbeat thread** (:mod:`pyqueue.worker.heartbeat`) extends the leases of
  running jobs (one batched call per queue, every third of ``lease_ms``), renews the
  service every ``renew_ms``, scrubs the leases of dead services that renewal reports,
  ends jobs at their time limit, and wakes the fetch loop when a stop is requested.

All share one redis-py connection pool for script calls (thread-safe).

Registration: the worker leases only while its service registration is confirmed
(renewed less than three quarters of ``expire_ms`` ago, on this process's monotonic
clock): a process that was paused (SIGSTOP, a VM stall) renews before it leases again,
and stops if the registration was lost meanwhile. Exit codes of :meth:`Worker.run` (and
``pyqueue worker``): :data:`EXIT_OK` after a requested stop (signal, ``pyqueue stop``,
burst drained); :data:`EXIT_REGISTRATION_LOST` when the registration was lost (the key
expired or Redis lost its data: restart the worker); :data:`EXIT_MISCONFIGURED` when the
handler returned an awaitable (an ``async def`` handler given to this sync worker).

Delivery: at least once. A job whose handler returned is acked; if the ack answer is
not OK the job's lease was lost (expired and reclaimed, or scrubbed) and the job may
run, or have run, again elsewhere: handlers must be idempotent, or fence their side
effects with ``job.fence``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Unpack, cast

import redis as redis_lib

from pyqueue.drivers.clients import Client, bytes_client, check_server, client_url, default_client
from pyqueue.drivers.queue import Queue, check_partitions, physical_queue, plans_of
from pyqueue.ops.schedules import Schedule, Scheduler, check_schedules
from pyqueue.ops.service import Service, Services
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.worker.batch import BatchHandler, BatchRunner
from pyqueue.worker.commit import CommitLoop
from pyqueue.worker.crash import Crasher
from pyqueue.worker.endings import Endings
from pyqueue.worker.executor import ExecutorHooks, Handler, ThreadExecutor
from pyqueue.worker.fetch import FetchLoop
from pyqueue.worker.flows import FlowChecks
from pyqueue.worker.handler import spec_of
from pyqueue.worker.heartbeat import Heartbeat
from pyqueue.worker.lifecycle import AUTH_GRACE_S, EXIT_OK, Control, StoppedDuringStartUp, shutdown
from pyqueue.worker.registration import Registration
from pyqueue.worker.retries import Retrying
from pyqueue.worker.running import Running
from pyqueue.worker.settings import Served, WorkerOptions, WorkerSettings
from pyqueue.worker.shared import Shared
from pyqueue.worker.supervised import SupervisorLink

__all__ = ["Worker", "check_worker_client"]

log = logging.getLogger("pyqueue.worker")


def check_worker_client(client: object) -> Client:
    """The client a worker's machinery runs on: a blocking ``redis.Redis`` or
    ``redis.cluster.RedisCluster``, whichever worker it is (the AsyncWorker's machinery
    runs in threads too; only its handlers run on the event loop).

    Raises:
        InvalidArgument: an asyncio client, or something that is not a redis-py client.
    """
    if isinstance(client, (redis_lib.Redis, redis_lib.cluster.RedisCluster)):
        return client
    module = type(client).__module__
    if module.startswith("redis.asyncio"):
        raise InvalidArgument(
            f"a worker needs a blocking redis-py client (redis.Redis or redis.cluster.RedisCluster), got the asyncio "
            f"{type(client).__name__}: the worker's fetch loop and heartbeat run in threads (an AsyncWorker runs only "
            "its handlers on the event loop). Pass pyqueue.connect(url), or redis.Redis(...) with the same settings."
        )
    raise InvalidArgument(f"a worker needs a redis-py client (redis.Redis or RedisCluster), got {type(client).__name__}")


class Worker(ExecutorHooks):
    """Runs ``handler`` on jobs from ``queues``, in priority order.

    Args:
        queues: queue names, highest priority first.
        handler: a plain (not ``async def``) function called with each :class:`Job`
            in a handler thread. Returning acks the job; raising :class:`Retry`
            schedules it again after the given delay; any other exception nacks it with
            the error text (retry with backoff, DEAD at max attempts). An ``async def``
            handler is refused here (InvalidArgument); one that returns an awaitable
            anyway gets its job released unrun and stops the worker with
            :data:`EXIT_MISCONFIGURED`. A job cancelled while it runs (or whose lease
            was lost) has ``job.cancelled`` set at the next lease extension; whatever
            its handler then returns or raises is neither acked nor nacked.
        redis: the queues' server; ``None``: ``PYQUEUE_URL``'s, else the embedded fakeredis
            (:func:`pyqueue.drivers.clients.default_client`).
        service_redis: the server of the service namespace (default: ``redis``).
        concurrency: handler threads.
        prefetch: jobs held leased ahead of the handler threads, so busy threads never
            wait for a lease's round trip: up to ``concurrency + prefetch`` are leased,
            and a prefetched job waits for a free thread. 0..1000, or ``"auto"`` (the
            default): ``concurrency`` of them while the jobs run under 10 ms on average,
            none once they average over 50 ms (:class:`~pyqueue.worker.running.Pace`).
        lease_ms: lease length; running jobs are extended every third of it.
        block_ms: longest blocking wait when idle (the idle command rate's period).
        renew_ms / expire_ms: service heartbeat period and expiry (seed: 15 s / 60 s).
            Dead services are found at each renewal, so ``renew_ms`` is also the scrub
            interval.
        grace_ms: on stop, how long running handlers may take before their jobs are
            released to other workers.
        keep_done_ms: how long an acked job's id stays a duplicate for enqueue (see
            :class:`~pyqueue.Queue`); default 5 minutes, 0 for none.
        partitions: queue name -> partition count, for partitioned queues (see
            :class:`~pyqueue.drivers.partitioned.PartitionedQueue`); others have one. Checked
            against the count recorded in Redis at start: a mismatch is refused
            (InvalidArgument) before the worker registers.
        wait_replicas: every ack, nack and lease waits for this many replicas (see
            :class:`~pyqueue.Queue`); a call they do not confirm in time is re-sent.
        keep_results_ms: keep what each handler returns as its job's result for this
            long (``Queue.ack_result``: stored atomically with the ack; read with
            ``Queue.result`` / ``wait_result``). None (default): results are kept only
            for handlers that return :class:`~pyqueue.Result` (per job).
        max_results: most results kept per queue (the oldest-expiring go first).
        supervisor_link: set in a child of ``pyqueue worker --processes N``
            (:mod:`pyqueue.worker.supervised`): the worker tells its supervisor when it
            registered and when it wants to be replaced, and stops if the supervisor dies.
        batch: serve every queue in batches of at most this many jobs (1..1000):
            ``handler`` is then a batch handler, called with a ``list[Job]`` of one
            queue, returning one result per job in order (a value acks that job, an
            exception instance fails it as if raised); a batch occupies one of the
            ``concurrency`` slots (:mod:`pyqueue.worker.batch`).
        batch_wait_ms: with ``batch``, how long a batch that came back short waits
            for more jobs before it runs (default 0: what one lease call returned).
        schedules: periodic jobs (:class:`~pyqueue.ops.schedules.Schedule`, each of one of
            ``queues``) this worker enqueues, one job ``<name>:<tick>`` per tick, from a
            scheduler thread that runs while the worker is registered. Any number of
            workers may carry the same schedules: each tick is enqueued once (see
            :mod:`pyqueue.ops.schedules`; refused with ``keep_done_ms=0``).
        flow_check_ms: how long after a check of a waiting flow step of these queues
            the next is due (:mod:`pyqueue.worker.flows`; checks run every ``renew_ms``).

    Partitioned queues keep their place in the priority order; within one, each lease
    round starts at the next partition (round robin), and a handler thread acks and
    leases in the same partition at most :data:`PARTITION_STREAK` times in a row before
    it hands its slot back to a lease round, so no partition with work waits long.
    """

    def __init__(
        self,
        queues: Sequence[str],
        handler: Handler | BatchHandler,
        *,
        redis: Client | None = None,
        service_redis: Client | None = None,
        schedules: Sequence[Schedule] = (),
        supervisor_link: SupervisorLink | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        self.settings = settings = WorkerSettings(**options)
        self.check_handler(handler)
        #: What the handler declares beyond being callable (pyqueue.worker.handler).
        self.handler_spec = spec_of(handler)
        self.redis = bytes_client(check_worker_client(redis) if redis is not None else default_client())
        # Renewals wait for the replicas too (see Services), on the worker's own server.
        self.services = Services(
            service_redis if service_redis is not None else self.redis, namespace=settings.namespace,
            prefix=settings.prefix, wait_replicas=settings.wait_replicas if service_redis is None else 0,
        )
        #: The queues it leases from (owners are set once the service id is known).
        self.served = served = Served.open(queues, self.redis, settings)
        #: Periodic jobs this worker enqueues (its Scheduler runs while it is registered).
        self.schedules = check_schedules(schedules, list(served.names), settings.keep_done_ms)
        self.supervisor_link = supervisor_link
        self.shared = shared = self._shared(settings, served, supervisor_link)
        self.commit_loop = CommitLoop.for_worker(served.queues, settings.lease_ms, shared)
        self.endings = Endings(settings, served, shared, self.commit_loop, self.handler_spec)
        self.executor = self.executor_class(cast(Handler, handler), settings, served, self.endings)
        flows = FlowChecks(served.queues, self._physical_queue, settings.flow_check_ms)
        self.heartbeat = Heartbeat(settings, served, shared, self.executor, wake_fetch_loop=self._wake_fetch_loop,
                                   supervisor_link=supervisor_link, flows=flows)
        #: Runs the queues served in batches (pyqueue.worker.batch); None: none is.
        self.batches = BatchRunner.of(handler, settings, served, self.executor)
        self.fetch = FetchLoop(
            settings, served, shared, self.executor, redis=self.redis, renew=self.heartbeat.renew_now,
            private_wake_shared=self.services.redis is self.redis, batches=self.batches,
        )

    def _shared(self, settings: WorkerSettings, served: Served, link: SupervisorLink | None) -> Shared:
        """The state the parts share: what runs, the stop, the registration, the crash
        points, and the retries (which give up once a hard stop is asked)."""
        running = Running(settings.concurrency + settings.fixed_prefetch, settings.auto_prefetch)
        control = Control(running, link.parent_gone if link is not None else None)
        registration = Registration(
            self.services, control, queue_names=[q.name for q in served.queues], by_name=served.by_name,
            redis=self.redis, prefix=settings.prefix, expire_ms=settings.expire_ms,
            task_names=self.handler_spec.task_names,
        )
        # Each renewal reports what runs (the dashboard's running jobs: elapsed, time limit).
        registration.report = lambda: running.report(settings.lease_ms)
        if link is not None and link.max_jobs:
            # Recycling by jobs: stop leasing as the last job ends (the heartbeat then asks
            # the supervisor for the replacement).
            running.limit_jobs(link.max_jobs, control.leasing_paused)
        return Shared(running, control, registration, Crasher(), Retrying(control.hard_stop))

    def _physical_queue(self, name: str) -> Queue:
        """A queue of this worker's server by its physical name (a flow check's)."""
        return physical_queue(name, self.redis, prefix=self.settings.prefix)

    # -- what the parts hold, by their names --------------------------------------------

    @property
    def running(self) -> Running:
        return self.shared.running

    @property
    def control(self) -> Control:
        return self.shared.control

    @property
    def registration(self) -> Registration:
        return self.shared.registration

    @property
    def queues(self) -> tuple[Queue, ...]:
        """Every queue leased from, in priority order (partitions in partition order)."""
        return self.served.queues

    @property
    def task_names(self) -> tuple[str, ...]:
        """The task names this worker runs, advertised in its service registration."""
        return self.handler_spec.task_names

    @property
    def lease_ms(self) -> int:
        return self.settings.lease_ms

    #: The scheduler of its periodic jobs, while it runs (None: it has none).
    _scheduler: Scheduler | None = None

    #: The executor this worker runs handlers with (an AsyncWorker's runs asyncio tasks).
    executor_class: type[ThreadExecutor] = ThreadExecutor

    # -- what the worker reports ------------------------------------------------------

    @property
    def service(self) -> Service | None:
        """The registration, once :meth:`run` has registered."""
        return self.registration.service

    @property
    def exit_reason(self) -> str:
        return self.control.exit_reason

    @property
    def exit_code(self) -> int:
        """What run() returns: EXIT_OK unless the stop was caused by a failure."""
        return self.control.exit_code

    @property
    def slots_written_off(self) -> int:
        """Handler slots written off: their thread did not stop at a job's time limit."""
        return self.running.written_off

    @property
    def slots_written_off_total(self) -> int:
        return self.running.written_off_total

    # -- control ---------------------------------------------------------------------

    def stop(self, reason: str = "stop requested", exit_code: int = EXIT_OK) -> None:
        """Ask the worker to stop gracefully (thread-safe, idempotent): stop leasing,
        let running jobs finish within ``grace_ms``, release the rest, deregister.
        The first stop's reason and exit code stand."""
        self.control.stop(reason, exit_code)

    def kill(self) -> None:
        """Simulate SIGKILL, for tests and the in-process demo: stop at once. Nothing is
        acked, released or deregistered; running handlers' results are dropped. The
        service key expires and live workers scrub the abandoned leases."""
        self.control.kill()

    def _wake_fetch_loop(self) -> None:
        self.fetch.wake()

    def _check_partitions(self) -> None:
        for q in self.served.logical:
            check_partitions(q)

    # -- main loop -------------------------------------------------------------------

    def run(self, *, burst: bool = False, install_signal_handlers: bool = True) -> int:
        """Register, serve until stopped, then shut down cleanly. Returns the exit code:
        :data:`EXIT_OK`, :data:`EXIT_REGISTRATION_LOST` or :data:`EXIT_MISCONFIGURED`
        (see the module docstring); :attr:`exit_reason` says why it stopped.

        With ``burst``, return once no job is ready, no handler runs and nothing is due
        within ``block_ms`` (for tests and batch jobs)."""
        control = self.control
        # Signals first: a SIGTERM that lands just after registration must drain and
        # deregister, not kill the process and leave the registration to expire.
        previous = control.install_signal_handlers(install_signal_handlers)
        try:
            # (This module's AUTH_GRACE_S, read at each run: a test shortens it here.)
            control.start_up(self._check_partitions, "start-up check", AUTH_GRACE_S, server=client_url(self.redis))
            service = control.start_up(
                self.registration.register, "registration", AUTH_GRACE_S, server=client_url(self.services.redis)
            )
        except BaseException as exc:
            control.restore_signal_handlers(previous)
            if isinstance(exc, StoppedDuringStartUp):
                return self.exit_code
            raise
        self.shared.crash.at("after_register")
        check_server(self.redis)
        for q in self.served.logical + self.served.queues:
            plans_of(q).set_owner(service.owner)
        log.info(
            "service %s started: queues %s, concurrency %d, host %s pid %d",
            service.owner, ",".join(self.served.names), self.settings.concurrency, os.uname().nodename, os.getpid(),
        )
        if self.supervisor_link is not None:
            self.supervisor_link.ready(service.id, service.registration, [q.name for q in self.queues])
        # Start-up garbage collection (the seed's): scrub dead services before leasing, so
        # even a short burst run recovers what they held.
        self.heartbeat.renew_now()
        self.heartbeat.start()
        if self.schedules:
            # Stopped by the worker's stop event: on stop, drain, kill or a lost registration.
            self._scheduler = Scheduler(
                self.schedules, {q.name: q for q in self.served.logical}, self.settings.keep_done_ms, control.stopping
            )
            self._scheduler.start()
        self.executor.start()  # and its commit loop
        try:
            self.fetch.run(burst)
        finally:
            if not control.killed.is_set():
                shutdown(
                    control=control, running=self.running, queues=self.queues, services=self.services,
                    service=service, grace_ms=self.settings.grace_ms, lease_ms=self.settings.lease_ms,
                    close_executor=self.executor.shutdown,
                )
            else:
                self.executor.shutdown()
            control.hard_stop.set()
            self.heartbeat.join(5)
            if self._scheduler is not None:
                self._scheduler.join(5)
            control.restore_signal_handlers(previous)
        return self.exit_code
