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
from collections.abc import Mapping, Sequence
from typing import cast

import redis as redis_lib

from pyqueue.drivers.clients import Client, bytes_client, check_server, client_url, default_client
from pyqueue.worker.commit import CommitLoop
from pyqueue.protocol.core import DEFAULT_MAX_RESULTS
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.drivers.queue import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_PREFIX,
    Queue,
    check_int,
    physical_queue,
)
from pyqueue.worker.batch import BatchHandler, BatchRunner
from pyqueue.worker.crash import CRASH_POINTS, Crasher
from pyqueue.worker.endings import Endings, Fail, Retry, error_text, seconds_to_ms
from pyqueue.worker.executor import (
    PARTITION_STREAK,
    ExecutorHooks,
    Handler,
    ThreadExecutor,
    check_sync_handler,
    handler_functions,
    is_async_handler,
)
from pyqueue.worker.fetch import SERVER_TIMER_SLACK_MS, FetchLoop
from pyqueue.worker.flows import FlowChecks
from pyqueue.worker.handler import spec_of
from pyqueue.protocol.verbs.flows import DEFAULT_FLOW_CHECK_MS
from pyqueue.worker.heartbeat import TICK_S, Heartbeat
from pyqueue.worker.lifecycle import (
    AUTH_GRACE_S,
    EXIT_MISCONFIGURED,
    EXIT_OK,
    EXIT_REGISTRATION_LOST,
    Control,
    StoppedDuringStartUp,
    shutdown,
)
from pyqueue.worker.registration import Registration
from pyqueue.worker.retries import MAX_BACKOFF_S, Retrying
from pyqueue.worker.running import Running
from pyqueue.worker.supervised import SupervisorLink
from pyqueue.ops.schedules import Schedule, Scheduler, check_schedules
from pyqueue.ops.service import DEFAULT_EXPIRE_MS, DEFAULT_NAMESPACE, Service, Services

# The names this module had before the runtime was split into pyqueue.worker stay
# importable from here.
__all__ = [
    "AUTH_GRACE_S", "CRASH_POINTS", "EXIT_MISCONFIGURED", "EXIT_OK", "EXIT_REGISTRATION_LOST", "MAX_BACKOFF_S",
    "PARTITION_STREAK", "SERVER_TIMER_SLACK_MS", "TICK_S", "Fail", "Handler", "Retry", "Worker",
    "check_sync_handler", "check_worker_client", "error_text", "handler_functions", "is_async_handler",
    "seconds_to_ms",
]

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


def named_queues(
    names: Sequence[str], redis: Client, prefix: str, keep_done_ms: int, partitions: Mapping[str, int] | None,
    wait_replicas: int,
) -> list[Queue]:
    """A worker's queues as named, in priority order (a partitioned one as one queue).

    Raises:
        InvalidArgument: a partition count for a queue not in ``names``, or a bad name.
    """
    partitions = dict(partitions or {})
    unknown = sorted(set(partitions) - set(names))
    if unknown:
        raise InvalidArgument(f"partitions given for queues this worker does not serve: {unknown}")
    return [
        Queue(name, redis, prefix=prefix, keep_done_ms=keep_done_ms, partitions=partitions.get(name, 1),
              wait_replicas=wait_replicas)
        for name in names
    ]


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
        prefetch: jobs held leased ahead of the handler threads (0..1000, default 0):
            up to ``concurrency + prefetch`` are leased, so busy threads never wait for a
            lease's round trip; a prefetched job waits for a free thread, and its time
            limit counts from its lease (README, "Prefetch, for short jobs").
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
        prefix: str = DEFAULT_PREFIX,
        namespace: str = DEFAULT_NAMESPACE,
        concurrency: int = 1,
        prefetch: int = 0,
        lease_ms: int = DEFAULT_LEASE_MS,
        block_ms: int = 10_000,
        renew_ms: int = 15_000,
        expire_ms: int = DEFAULT_EXPIRE_MS,
        grace_ms: int = 30_000,
        backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS,
        backoff_cap_ms: int = DEFAULT_BACKOFF_CAP_MS,
        keep_done_ms: int = DEFAULT_KEEP_DONE_MS,
        partitions: Mapping[str, int] | None = None,
        wait_replicas: int = 0,
        schedules: Sequence[Schedule] = (),
        keep_results_ms: int | None = None,
        max_results: int = DEFAULT_MAX_RESULTS,
        supervisor_link: SupervisorLink | None = None,
        batch: int | None = None,
        batch_wait_ms: int | None = None,
        flow_check_ms: int = DEFAULT_FLOW_CHECK_MS,
    ) -> None:
        if not queues or len(set(queues)) != len(queues):
            raise InvalidArgument("a worker serves one or more distinct queues")
        self.concurrency = check_int(concurrency, "concurrency", 1, 1000)
        self.prefetch = check_int(prefetch, "prefetch", 0, 1000)
        self.lease_ms = check_int(lease_ms, "lease_ms", 100, 604_800_000)
        self.block_ms = check_int(block_ms, "block_ms", 10, 600_000)
        self.renew_ms = check_int(renew_ms, "renew_ms", 100, 86_400_000)
        self.expire_ms = check_int(expire_ms, "expire_ms", 1_000, 86_400_000)
        if self.renew_ms * 2 > self.expire_ms:
            raise InvalidArgument("renew_ms must be at most half of expire_ms")
        self.grace_ms = check_int(grace_ms, "grace_ms", 0, 86_400_000)
        self.backoff_base_ms, self.backoff_cap_ms = backoff_base_ms, backoff_cap_ms
        self.check_handler(handler)
        #: What the handler declares beyond being callable (pyqueue.worker.handler).
        self.handler_spec = spec_of(handler)
        #: The task names this worker runs, advertised in its service registration.
        self.task_names = self.handler_spec.task_names
        self.prefix = prefix
        self.redis = bytes_client(check_worker_client(redis) if redis is not None else default_client())
        # Renewals wait for the replicas too (see Services), on the worker's own server.
        self.services = Services(
            service_redis if service_redis is not None else self.redis, namespace=namespace, prefix=prefix,
            wait_replicas=wait_replicas if service_redis is None else 0,
        )
        self.queue_names = list(queues)
        # Validates the names now; owners are set once the service id is known.
        self.keep_done_ms = check_int(keep_done_ms, "keep_done_ms", 0, 2**40)
        self.keep_results_ms = None if keep_results_ms is None else check_int(
            keep_results_ms, "keep_results_ms", 1, 2**40
        )
        self.max_results = check_int(max_results, "max_results", 1, 10_000_000)
        #: The queues as named, in priority order (a partitioned one as one queue).
        self.logical = named_queues(self.queue_names, self.redis, prefix, keep_done_ms, partitions, wait_replicas)
        #: Periodic jobs this worker enqueues (its Scheduler runs while it is registered).
        self.schedules = check_schedules(schedules, self.queue_names, self.keep_done_ms)
        self._scheduler: Scheduler | None = None
        #: Per logical queue, the queues a lease call goes to: its partitions, or itself.
        self.groups: list[list[Queue]] = [getattr(q, "parts", [q]) for q in self.logical]
        #: Every queue leased from, in priority order (partitions in partition order).
        self.queues = [q for group in self.groups for q in group]
        self._by_name = {q.name: q for q in self.queues}

        # The parts (pyqueue.worker), wired once: each gets what it uses, nothing more.
        # A slot per job held: one per handler thread, and one per prefetched job.
        self.running = Running(self.concurrency + self.prefetch)
        self.control = Control(self.running, supervisor_link.parent_gone if supervisor_link is not None else None)
        self._crash = Crasher()
        retrying = Retrying(self.control.hard_stop)
        self.commit_loop = CommitLoop.for_worker(
            self.queues, lease_ms=self.lease_ms, retrying=retrying, running=self.running, killed=self.control.killed
        )
        self.registration = Registration(
            self.services, self.control, queue_names=[q.name for q in self.queues], by_name=self._by_name,
            redis=self.redis, prefix=prefix, expire_ms=self.expire_ms, task_names=self.task_names,
        )
        # Each renewal reports what runs (the dashboard's running jobs: elapsed, time limit).
        self.registration.report = lambda: self.running.report(self.lease_ms)
        self.endings = Endings(
            by_name=self._by_name, first_group=self.groups[0], commit_loop=self.commit_loop, running=self.running,
            control=self.control, registration=self.registration, crash=self._crash, retrying=retrying,
            keep_results_ms=self.keep_results_ms, max_results=self.max_results,
            backoff_base_ms=self.backoff_base_ms, backoff_cap_ms=self.backoff_cap_ms,
            on_ended=self.handler_spec.job_ended, reports_end=self.handler_spec.reports_end,
        )
        self.executor = self.executor_class(
            # (With batch=, every queue is served in batches: the executor's one-job calls are never made.)
            cast(Handler, handler), concurrency=self.concurrency, lease_ms=self.lease_ms, slot_owner=self, running=self.running,
            endings=self.endings, crash=self._crash, partitioned_first=len(self.groups[0]) > 1,
        )
        self.heartbeat = Heartbeat(
            queues=self.queues, by_name=self._by_name, running=self.running, registration=self.registration,
            executor=self.executor, control=self.control, crash=self._crash, wake_fetch_loop=self._wake_fetch_loop,
            lease_ms=self.lease_ms, renew_ms=self.renew_ms, expire_ms=self.expire_ms,
            backoff_base_ms=self.backoff_base_ms, backoff_cap_ms=self.backoff_cap_ms,
            supervisor_link=supervisor_link,
            flows=FlowChecks(
                self.queues, lambda name: physical_queue(name, self.redis, prefix=prefix),
                check_int(flow_check_ms, "flow_check_ms", 1, 86_400_000),
            ),
        )
        self.supervisor_link = supervisor_link
        if supervisor_link is not None and supervisor_link.max_jobs:
            # Recycling by jobs: stop leasing as the last job ends (the heartbeat then asks
            # the supervisor for the replacement).
            self.running.limit_jobs(supervisor_link.max_jobs, self.control.leasing_paused)
        #: Runs the queues served in batches (pyqueue.worker.batch); None: none is.
        self.batches = BatchRunner.for_worker(self, handler, batch, batch_wait_ms, retrying, self._crash)
        self.fetch = FetchLoop(
            redis=self.redis, groups=self.groups, running=self.running, registration=self.registration,
            executor=self.executor, control=self.control, crash=self._crash, renew=self.heartbeat.renew_now,
            lease_ms=self.lease_ms, block_ms=self.block_ms, private_wake_shared=self.services.redis is self.redis,
            batches=self.batches,
        )

    #: The executor this worker runs handlers with (an AsyncWorker's runs asyncio tasks).
    executor_class: type[ThreadExecutor] = ThreadExecutor

    # -- state, as before the split ----------------------------------------------------

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
        for q in self.logical:
            q.check_partitions()

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
        self._crash.at("after_register")
        check_server(self.redis)
        for q in self.logical + self.queues:
            q.owner = service.owner
        log.info(
            "service %s started: queues %s, concurrency %d, host %s pid %d",
            service.owner, ",".join(self.queue_names), self.concurrency, os.uname().nodename, os.getpid(),
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
                self.schedules, {q.name: q for q in self.logical}, self.keep_done_ms, control.stopping
            )
            self._scheduler.start()
        self.executor.start()  # and its commit loop
        try:
            self.fetch.run(burst)
        finally:
            if not control.killed.is_set():
                shutdown(
                    control=control, running=self.running, queues=self.queues, services=self.services,
                    service=service, grace_ms=self.grace_ms, close_executor=self.executor.shutdown,
                )
            else:
                self.executor.shutdown()
            control.hard_stop.set()
            self.heartbeat.join(5)
            if self._scheduler is not None:
                self._scheduler.join(5)
            control.restore_signal_handlers(previous)
        return self.exit_code
