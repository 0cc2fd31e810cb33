"""The worker: a registered service that leases jobs from an ordered list of queues and
runs a handler on each, in a thread pool.

Threads and connections:

* the **fetch loop** (the thread that calls :meth:`Worker.run`) leases jobs for free
  handler slots, always from the first queue with ready jobs, and when nothing is ready
  blocks with ``BZPOPMIN`` on the queues' wake markers (raised by enqueue, nack,
  release, promote, scrub) and on the service's private wake key, for at most the time
  to the next due job or lease deadline. It owns the *blocking* connection, whose
  socket timeout exceeds the longest block.
* **handler threads** (``concurrency`` of them) run the handler. On success the job is
  acked by group commit (:mod:`pyqueue.commit`): in one call with the jobs of the other
  handlers that finish meanwhile, a call that for the first queue also leases their
  replacements, so a busy worker needs at most one round trip per job, and fewer the
  more handlers finish together. On an exception the job is nacked.
* the **heartbeat thread** extends the leases of running jobs (one batched call per
  queue, every third of ``lease_ms``), renews the service every ``renew_ms``, scrubs
  the leases of dead services that renewal reports, and wakes the fetch loop when a
  stop is requested.

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

import inspect
import itertools
import logging
import os
import random
import secrets
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar

import redis as redis_lib

from pyqueue.commit import GroupCommit
from pyqueue.clients import Client, bytes_client, check_server, default_client, node_for_key
from pyqueue.errors import AuthenticationFailed, InvalidArgument, OutcomeUnknown, OutOfMemory, PyQueueError, ServiceLost
from pyqueue.core import DEFAULT_MAX_RESULTS, DEFAULT_RESULT_TTL_MS
from pyqueue.models import Job, Outcome, Result
from pyqueue.queue import (
    DEFAULT_BACKOFF_BASE_MS,
    DEFAULT_BACKOFF_CAP_MS,
    DEFAULT_KEEP_DONE_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_PREFIX,
    Queue,
    check_int,
    peek_many,
    physical_queue,
)
from pyqueue.slots import WRITE_OFF_S, Slot, TimeLimitExceeded, enter_slot
from pyqueue.schedules import Schedule, Scheduler, check_schedules
from pyqueue.scripts import lua_source
from pyqueue.scripts import CLUSTER_WEATHER
from pyqueue.service import DEFAULT_EXPIRE_MS, DEFAULT_NAMESPACE, Service, Services
from pyqueue.waiting import Waiter

log = logging.getLogger("pyqueue.worker")

Handler = Callable[[Job], object]
T = TypeVar("T")

#: A handler thread acks and leases in the same partition of a partitioned first queue
#: at most this many times in a row (then a lease round moves on to the next partition).
PARTITION_STREAK = 16

#: Exit codes of Worker.run and `pyqueue worker` (sysexits.h numbers).
EXIT_OK = 0
#: EX_TEMPFAIL: the registration expired or was overwritten (a pause past expire_ms, or
#: Redis lost its data). Transient: a supervisor should start the worker again.
EXIT_REGISTRATION_LOST = 75
#: EX_CONFIG: the handler cannot run in this worker (it returned an awaitable).
EXIT_MISCONFIGURED = 78

#: The heartbeat thread's tick: how quickly a stop request reaches the fetch loop.
TICK_S = 0.05
#: Cap of the backoff after connection errors.
MAX_BACKOFF_S = 5.0
#: How long a starting worker waits out credentials Redis refuses before it gives up
#: (AuthenticationFailed; ``pyqueue worker`` exits 2): long enough for a password being
#: rotated, short enough that a wrong one is reported rather than retried for ever.
AUTH_GRACE_S = 10.0
#: Redis fires blocking-command timeouts from its timer, every 1/hz (100 ms at the
#: default hz 10), so a BZPOPMIN timed to a due time may return that much late. The
#: worker blocks on the server only until this long before a due time and waits the
#: rest locally (a wake signal in that short window waits for it).
SERVER_TIMER_SLACK_MS = 110

#: Named crash points for fault-injection tests. With PYQUEUE_CRASH_POINT=<name> (or
#: several, comma-separated) and PYQUEUE_CRASH_PROBABILITY=<p> (default 1), the worker
#: SIGKILLs itself at that point with probability p. Unset in production: one dict
#: lookup per point.
CRASH_POINTS = (
    "after_register",  # right after registration
    "after_lease",  # after a lease reply arrived, before any handler ran
    "in_handler",  # while the handler runs
    "before_ack",  # after the handler returned, before the ack is sent
    "ack_sent",  # after the ack was sent, before its reply was read
    "in_extend",  # during a lease extension
)


class _Ending(Exception):
    """A handler's own word on how its job ends (:class:`Retry`, :class:`Fail`)."""

    def __init__(self, reason: str | None, default: str) -> None:
        super().__init__(reason or default)
        self.reason = reason

    def error_text(self) -> str:
        """The job's error: ``reason``, else the exception this one was raised from."""
        if self.reason:
            return self.reason
        cause = self.__cause__ or self.__context__
        return error_text(cause) if cause is not None else str(self)


class Retry(_Ending):
    """Raise from a handler to run the job again later. The attempt counts; at max
    attempts the job goes to DEAD.

    Args:
        delay_ms: retry after this many milliseconds; None (and no ``delay``): the
            worker's exponential backoff with jitter.
        reason: the job's error text (kept if it dies). By default the text of the
            exception this one was raised from (``raise Retry(delay=5) from exc``, or
            raised while handling it), so a job that dies after its last retry keeps
            the real error; else "retry requested by the handler".
        delay: as ``delay_ms``, in seconds (int or float) or a ``timedelta``.
    """

    def __init__(
        self, delay_ms: int | None = None, reason: str | None = None, *, delay: float | timedelta | None = None
    ) -> None:
        super().__init__(reason, "retry requested by the handler")
        if delay is not None:
            if delay_ms is not None:
                raise InvalidArgument("give Retry delay_ms or delay, not both")
            delay_ms = seconds_to_ms(delay, "delay")
        self.delay_ms = None if delay_ms is None else check_int(delay_ms, "delay_ms", 0, 2**40)


class Fail(_Ending):
    """Raise from a handler to send its job to the dead letters now, whatever its
    attempt count, with ``reason`` as its error (default: the exception this one was
    raised from, as for :class:`Retry`)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason, "failed by the handler")


def error_text(error: BaseException) -> str:
    """An exception as a job's error text: ``Type: message``, at most 4,000 characters."""
    return "".join(traceback.format_exception_only(type(error), error)).strip()[:4000]


def seconds_to_ms(value: float | timedelta, name: str) -> int:
    """A duration in seconds (int or float) or a ``timedelta``, in whole milliseconds.

    Raises:
        InvalidArgument: not a number or timedelta, negative, NaN or beyond 2^40 ms.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidArgument(f"{name} must be seconds (int or float) or a timedelta, got {type(value).__name__}")
    if not (0 <= seconds <= 2**40 / 1000):  # also refuses NaN
        raise InvalidArgument(f"{name} must be between 0 and 2^40 ms, got {value!r}")
    return round(seconds * 1000)


def check_sync_handler(handler: object) -> None:
    """Refuse a handler this thread-pool worker cannot run: an ``async def`` function
    (or a callable whose ``__call__`` is one, or a partial of one) would return a
    coroutine that nobody awaits, and the job would be acked without having run.

    Raises:
        InvalidArgument: not callable, a coroutine or async generator function, or a
            handler that says it runs coroutines (``needs_event_loop``: the task
            layer's dispatcher of ``async def`` tasks).
    """
    if getattr(handler, "needs_event_loop", False) is True:
        raise InvalidArgument(
            f"handler {handler!r} runs async def tasks: this sync Worker has no event loop to run them on. Run it "
            "with pyqueue.aio_worker.AsyncWorker (Tasks.worker() and pyqueue worker pick that one by themselves)."
        )
    if is_async_handler(handler):
        raise InvalidArgument(
            f"handler {getattr(handler, '__qualname__', handler)!r} is an async function: this sync Worker "
            "would never await it, so its jobs would be acked without running. Give it a plain function, or "
            "run it with pyqueue.aio_worker.AsyncWorker (pyqueue worker picks that one by itself)."
        )


def is_async_handler(handler: object) -> bool:
    """Whether ``handler`` is an ``async def`` function (or a callable whose ``__call__``
    is one, or a partial of one), or an async generator function.

    Raises:
        InvalidArgument: not callable.
    """
    return any(inspect.iscoroutinefunction(c) or inspect.isasyncgenfunction(c) for c in handler_functions(handler))


def handler_functions(handler: object) -> tuple[object, object]:
    """``handler`` and its class's ``__call__`` (what an instance handler runs): the two
    places an ``async def`` may hide.

    Raises:
        InvalidArgument: not callable.
    """
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, got {type(handler).__name__}")
    return handler, getattr(type(handler), "__call__", None)


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


class _Crasher:
    """Kills this process at named points when the environment asks for it (tests)."""

    def __init__(self) -> None:
        self.points = {p for p in os.environ.get("PYQUEUE_CRASH_POINT", "").split(",") if p}
        unknown = self.points - set(CRASH_POINTS)
        if unknown:
            raise InvalidArgument(f"unknown crash points {sorted(unknown)}; known: {CRASH_POINTS}")
        self.probability = float(os.environ.get("PYQUEUE_CRASH_PROBABILITY", "1"))
        self.rng = random.Random()

    def armed(self, point: str) -> bool:
        return point in self.points and self.rng.random() < self.probability

    def at(self, point: str) -> None:
        if self.armed(point):
            self.die(point)

    def die(self, point: str) -> None:
        log.warning("crash point %s: SIGKILL", point)
        os.kill(os.getpid(), signal.SIGKILL)


def _send_and_die(queue: Queue, job: Job, crasher: _Crasher) -> None:
    """Send lua/ack.lua for ``job`` and die before reading the reply (crash point
    ``ack_sent``): the server may run it, the worker never learns the answer."""
    client = node_for_key(queue.redis, queue.keys.jobs)
    sha = queue.scripts.sha("ack")
    client.script_load(lua_source("ack"))  # EVALSHA must not fail with NOSCRIPT
    connection: Any = client.connection_pool.get_connection()
    keys = [queue.keys.jobs, queue.keys.leased, queue.keys.owners]
    connection.send_command("EVALSHA", sha, len(keys), *keys, job.receipt)
    crasher.die("ack_sent")


class Worker:
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
            (:func:`pyqueue.clients.default_client`).
        service_redis: the server of the service namespace (default: ``redis``).
        concurrency: handler threads.
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
            :class:`~pyqueue.partitioned.PartitionedQueue`); others have one. Checked
            against the count recorded in Redis at start: a mismatch is refused
            (InvalidArgument) before the worker registers.
        wait_replicas: every ack, nack and lease waits for this many replicas (see
            :class:`~pyqueue.Queue`); a call they do not confirm in time is re-sent.
        keep_results_ms: keep what each handler returns as its job's result for this
            long (``Queue.ack_result``: stored atomically with the ack; read with
            ``Queue.result`` / ``wait_result``). None (default): results are kept only
            for handlers that return :class:`~pyqueue.Result` (per job).
        max_results: most results kept per queue (the oldest-expiring go first).
        schedules: periodic jobs (:class:`~pyqueue.schedules.Schedule`, each of one of
            ``queues``) this worker enqueues, one job ``<name>:<tick>`` per tick, from a
            scheduler thread that runs while the worker is registered. Any number of
            workers may carry the same schedules: each tick is enqueued once (see
            :mod:`pyqueue.schedules`; refused with ``keep_done_ms=0``).

    Partitioned queues keep their place in the priority order; within one, each lease
    round starts at the next partition (round robin), and a handler thread acks and
    leases in the same partition at most :data:`PARTITION_STREAK` times in a row before
    it hands its slot back to a lease round, so no partition with work waits long.
    """

    def __init__(
        self,
        queues: Sequence[str],
        handler: Handler,
        *,
        redis: Client | None = None,
        service_redis: Client | None = None,
        prefix: str = DEFAULT_PREFIX,
        namespace: str = DEFAULT_NAMESPACE,
        concurrency: int = 1,
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
    ) -> None:
        if not queues or len(set(queues)) != len(queues):
            raise InvalidArgument("a worker serves one or more distinct queues")
        self.concurrency = check_int(concurrency, "concurrency", 1, 1000)
        self.lease_ms = check_int(lease_ms, "lease_ms", 100, 604_800_000)
        self.block_ms = check_int(block_ms, "block_ms", 10, 600_000)
        self.renew_ms = check_int(renew_ms, "renew_ms", 100, 86_400_000)
        self.expire_ms = check_int(expire_ms, "expire_ms", 1_000, 86_400_000)
        if self.renew_ms * 2 > self.expire_ms:
            raise InvalidArgument("renew_ms must be at most half of expire_ms")
        self.grace_ms = check_int(grace_ms, "grace_ms", 0, 86_400_000)
        self.backoff_base_ms, self.backoff_cap_ms = backoff_base_ms, backoff_cap_ms
        self.check_handler(handler)
        self.handler = handler
        #: The task names this worker runs, advertised in its service registration: what
        #: the handler says it serves (its ``task_names``; a task-layer dispatcher has them).
        self.task_names: tuple[str, ...] = tuple(getattr(handler, "task_names", ()))
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
        partitions = dict(partitions or {})
        unknown = sorted(set(partitions) - set(self.queue_names))
        if unknown:
            raise InvalidArgument(f"partitions given for queues this worker does not serve: {unknown}")
        #: The queues as named, in priority order (a partitioned one as one queue).
        self.logical = [
            Queue(
                name, self.redis, prefix=prefix, keep_done_ms=keep_done_ms, partitions=partitions.get(name, 1),
                wait_replicas=wait_replicas,
            )
            for name in queues
        ]
        #: Periodic jobs this worker enqueues (its Scheduler runs while it is registered).
        self.schedules = check_schedules(schedules, self.queue_names, self.keep_done_ms)
        self._scheduler: Scheduler | None = None
        #: Per logical queue, the queues a lease call goes to: its partitions, or itself.
        self.groups: list[list[Queue]] = [getattr(q, "parts", [q]) for q in self.logical]
        #: Every queue leased from, in priority order (partitions in partition order).
        self.queues = [q for group in self.groups for q in group]
        self._by_name = {q.name: q for q in self.queues}
        self._commits = {
            q.name: GroupCommit(q, self.lease_ms, self._with_retries, self._track_all) for q in self.queues
        }
        self._by_wake = {q.keys.wake: q for q in self.queues}
        # Queues found without work at the last round -> their next_due_ms then (-1: none).
        self._known_empty: dict[str, int] = {}
        self._rotations = [itertools.count() for _ in self.groups]
        self.service: Service | None = None
        self.exit_reason = ""
        #: What run() returns: EXIT_OK unless the stop was caused by a failure.
        self.exit_code = EXIT_OK

        self._stop = threading.Event()
        self._hard_stop = threading.Event()
        self._killed = threading.Event()
        self._slots = threading.Condition()
        self._free = self.concurrency
        self._running: dict[str, Job] = {}  # receipt -> job, for the heartbeat's extend
        self._slots_running: dict[str, Slot] = {}  # receipt -> its slot, for time limits
        #: Handler slots written off: their thread did not stop at a job's time limit.
        self.slots_written_off = 0
        self.slots_written_off_total = 0
        # The latest due time of a retry this worker scheduled (a burst run waits for it).
        self._retry_due_ms = -1
        self._running_lock = threading.Lock()
        self._woken_for_stop = False
        self._waiter: Waiter | None = None  # the fetch loop's, while it runs
        self._crash = _Crasher()
        self._pending_calls: dict[str, str] = {}  # queue -> call token of an unanswered lease
        self._checked_at = 0.0  # monotonic time the service key was last read or renewed
        # Monotonic time the last successful renewal was *sent*: the key expires no
        # earlier than expire_ms after that. Leasing needs it to be recent.
        self._renewed_at = 0.0
        self._renew_lock = threading.Lock()  # the heartbeat and the fetch loop both renew
        self._signals = 0

    def check_handler(self, handler: object) -> None:
        """Refuse a handler this worker cannot run (:func:`check_sync_handler`)."""
        check_sync_handler(handler)

    def call_handler(self, job: Job) -> object:
        """Run the handler on ``job`` in this handler thread; what it returns."""
        return self.handler(job)

    # -- control ---------------------------------------------------------------------

    def stop(self, reason: str = "stop requested", exit_code: int = EXIT_OK) -> None:
        """Ask the worker to stop gracefully (thread-safe, idempotent): stop leasing,
        let running jobs finish within ``grace_ms``, release the rest, deregister.
        The first stop's reason and exit code stand."""
        if not self._stop.is_set():
            self.exit_reason, self.exit_code = reason, exit_code
            log.log(logging.INFO if exit_code == EXIT_OK else logging.ERROR, "stopping: %s", reason)
        self._stop.set()
        with self._slots:
            self._slots.notify_all()

    def kill(self) -> None:
        """Simulate SIGKILL, for tests and the in-process demo: stop at once. Nothing is
        acked, released or deregistered; running handlers' results are dropped. The
        service key expires and live workers scrub the abandoned leases."""
        self._killed.set()
        self._hard_stop.set()
        self.stop("killed")

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Count signals, not stops: a worker already stopping on its own (burst drained,
        # a remote stop, a lost registration) drains gracefully on the first signal too.
        self._signals += 1
        if self._signals > 1:
            # Second signal: leave now. Leases expire and other workers reclaim them.
            log.warning("second %s: exiting at once", signal.Signals(signum).name)
            os._exit(1)
        self.stop(f"received {signal.Signals(signum).name}")

    # -- main loop -------------------------------------------------------------------

    def run(self, *, burst: bool = False, install_signal_handlers: bool = True) -> int:
        """Register, serve until stopped, then shut down cleanly. Returns the exit code:
        :data:`EXIT_OK`, :data:`EXIT_REGISTRATION_LOST` or :data:`EXIT_MISCONFIGURED`
        (see the module docstring); :attr:`exit_reason` says why it stopped.

        With ``burst``, return once no job is ready, no handler runs and nothing is due
        within ``block_ms`` (for tests and batch jobs)."""
        # Signals first: a SIGTERM that lands just after registration must drain and
        # deregister, not kill the process and leave the registration to expire.
        previous: dict[int, Any] = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self._start_up(self._check_partitions, "start-up check")
            self.service = self._start_up(self._register, "registration")
        except BaseException as exc:
            for signum, old_handler in previous.items():
                signal.signal(signum, old_handler)
            if isinstance(exc, _StoppedDuringStartUp):
                return self.exit_code
            raise
        self._crash.at("after_register")
        check_server(self.redis)
        for q in self.logical + self.queues:
            q.owner = self.service.owner
        log.info(
            "service %s started: queues %s, concurrency %d, host %s pid %d",
            self.service.owner, ",".join(self.queue_names), self.concurrency, os.uname().nodename, os.getpid(),
        )
        # Start-up garbage collection (the seed's): scrub dead services before leasing, so
        # even a short burst run recovers what they held.
        self._heartbeat_duty("renew", self._renew_and_scrub)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="pyqueue-heartbeat", daemon=True)
        heartbeat.start()
        if self.schedules:
            # Stopped by the worker's stop event: on stop, drain, kill or a lost registration.
            self._scheduler = Scheduler(self.schedules, {q.name: q for q in self.logical}, self.keep_done_ms, self._stop)
            self._scheduler.start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="pyqueue-handler")
        try:
            self._fetch_loop(pool, burst)
        finally:
            if not self._killed.is_set():
                self._shutdown(pool)
            else:
                pool.shutdown(wait=False)
            self._hard_stop.set()
            heartbeat.join(5)
            if self._scheduler is not None:
                self._scheduler.join(5)
            for signum, old_handler in previous.items():
                signal.signal(signum, old_handler)
        return self.exit_code

    def _register(self) -> Service:
        sent_at = time.monotonic()
        # The names leased from: a reaper scrubs each of them (partitions too).
        service = self.services.register([q.name for q in self.queues], expire_ms=self.expire_ms, tasks=self.task_names)
        self._renewed_at = self._checked_at = sent_at
        return service

    def _start_up(self, call: Callable[[], T], what: str) -> T:
        """``call()`` (replay-safe) until it answers, as the worker starts. It waits out,
        with backoff, what a running worker waits out (the connection, a cluster in
        motion, a server at its memory limit), and refused credentials for
        :data:`AUTH_GRACE_S` (a password being rotated) before raising
        :class:`AuthenticationFailed`. A stop (SIGTERM, SIGINT, :meth:`stop`) ends it at
        once, also in the middle of a wait: it raises :class:`_StoppedDuringStartUp`,
        and :meth:`run` returns the stop's exit code."""
        delay, refused_since = 0.1, None
        while not self._stop.is_set():
            try:
                return call()
            except _RETRY_ON as exc:
                if isinstance(exc, AuthenticationFailed):
                    refused_since = refused_since if refused_since is not None else time.monotonic()
                    if time.monotonic() - refused_since >= AUTH_GRACE_S:
                        raise
                elif not _retryable(exc):
                    raise
                if self._stop.is_set():
                    break
                log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        raise _StoppedDuringStartUp

    def _fetch_loop(self, pool: ThreadPoolExecutor, burst: bool) -> None:
        assert self.service is not None
        wake_keys = [q.keys.wake for q in self.queues]
        private_wake = self.service.keys.role("wake")
        if self.services.redis is self.redis:
            # A remote stop wakes us. On a cluster this key is in the namespace's slot,
            # not the queues': the Waiter waits on it separately.
            wake_keys.append(private_wake)
        waiter = self._waiter = Waiter(self.redis, wake_keys, self.block_ms / 1000 + 10)
        try:
            self._fetch(pool, burst, waiter, private_wake)
        finally:
            waiter.close()

    def _fetch(
        self, pool: ThreadPoolExecutor, burst: bool, waiter: Waiter, private_wake: str
    ) -> None:
        must_lease, delay = True, 0.1
        next_due_ms, now_ms, observed = -1, 0, 0.0
        woken: str | None = None  # the wake key whose marker ended the last wait
        while not self._stop.is_set():
            with self._slots:
                while self._free == 0 and not self._stop.is_set():
                    self._slots.wait(1.0)
                free = self._free
            if self._stop.is_set():
                break
            try:
                if must_lease:
                    if not self._registration_confirmed():
                        # Paused or cut off for most of expire_ms (SIGSTOP, a VM stall, a
                        # partition): the registration may have expired and our leases
                        # been scrubbed. Renew before leasing; a lost one stops us.
                        self._heartbeat_duty("renew", self._renew_and_scrub)
                        if self._stop.is_set():
                            break
                        if not self._registration_confirmed():
                            raise OutcomeUnknown("the service renewal did not get through; not leasing")
                    leased_any, next_due_ms, now_ms = self._lease_round(pool, free, woken)
                    woken = None
                    observed = time.monotonic()
                    if leased_any:
                        continue
                if burst:
                    with self._slots:
                        idle = self._free == self.concurrency
                        if not idle:
                            self._slots.wait(0.1)
                    # Drained: nothing ready, nothing running, nothing due within a block
                    # period (a retry with a short backoff is waited for).
                    due_soon = 0 <= next_due_ms - now_ms <= self.block_ms if next_due_ms >= 0 else False
                    # ... nor a retry this worker scheduled, however far off.
                    due_soon = due_soon or self._retry_due_ms >= now_ms
                    if idle and not due_soon:
                        self.stop("burst: every queue is drained")
                        break
                    if not idle:
                        must_lease = True
                        continue
                timeout_ms = self.block_ms
                if next_due_ms >= 0:
                    # The due time is on the server clock; only the elapsed time since
                    # the lease reply is measured here.
                    remaining_ms = next_due_ms - now_ms - (time.monotonic() - observed) * 1000
                    if remaining_ms <= SERVER_TIMER_SLACK_MS:
                        self._stop.wait(max(0.0, remaining_ms) / 1000)
                        must_lease = True
                        continue
                    # At least 1 ms: a BZPOPMIN timeout of 0 blocks until a wake-up, forever.
                    timeout_ms = max(1, int(min(self.block_ms, remaining_ms - SERVER_TIMER_SLACK_MS)))
                if time.monotonic() - self._checked_at > self.block_ms / 1000 and self._stopped_by_key():
                    break
                popped = woken = waiter.wait(timeout_ms)
                # Every wait ends in a lease round, also one that ran the full block period
                # with nothing due: the round's peek finds leases that expired meanwhile in
                # a queue nobody leased from (deadlines set after this worker went to
                # sleep). One peek per queue per block period, in one round trip.
                must_lease = True
                if popped == private_wake:
                    # A remote stop (or our own stop request): read the key before leasing.
                    if not self._stop.is_set() and self._stopped_by_key():
                        break
                delay = 0.1
            except _RETRY_ON as exc:
                if self._stop.is_set():
                    break  # the stop itself may have cut the blocking connection (interrupt)
                if not _retryable(exc):
                    raise
                log.warning("fetch loop: %s; retrying in %.1fs", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                must_lease = True

    def _registration_confirmed(self) -> bool:
        """Whether the last renewal that got through was sent recently enough that the
        registration cannot have expired: less than 3/4 of expire_ms ago (renewals come
        every renew_ms <= expire_ms / 2; the rest is margin for the lease call itself)."""
        return time.monotonic() - self._renewed_at < self.expire_ms * 0.75 / 1000

    def _stopped_by_key(self) -> bool:
        """Read the service key (never write it): stop if a remote stop was asked (exit
        0) or the registration was lost (exit 75). Returns whether the worker stops."""
        assert self.service is not None
        state = self.services.check(self.service)
        self._checked_at = time.monotonic()
        if state == "stop":
            self.stop(f"service {self.service.owner}: remote stop requested")
        elif state == "lost":
            self.stop(
                f"service {self.service.owner} lost its registration (its key expired or holds another registration)",
                EXIT_REGISTRATION_LOST,
            )
        return state != "ok"

    def _lease_round(self, pool: ThreadPoolExecutor, free: int, woken: str | None = None) -> tuple[bool, int, int]:
        """Lease up to ``free`` jobs from the first queue that has any. Returns whether
        any was leased, and (when none was) the earliest next_due_ms with the clock.

        With one queue this is one lease call. With several, one pipelined round trip
        peeks at all of them (lua/peek.lua) and lease calls go only to queues that have
        work, in priority order: a job in the 50th queue starts after two round trips,
        not fifty. After a wake-up by one queue's marker (``woken``, its wake key) while
        every other queue was empty at the last round, the peek is skipped: work that
        arrives in a queue raises its marker (enqueue, nack, release, promote, a lease
        that leaves work behind), and whoever pops a marker serves it; what raises none
        (a lease that expired) is found by the full round after every block period."""
        next_due_ms, now_ms = -1, 0
        order = self.queues
        if len(order) > 1:
            # Partitions of one queue: each round starts at the next one (round robin).
            order = []
            for group, rotation in zip(self.groups, self._rotations):
                start = next(rotation) % len(group)
                order += group[start:] + group[:start]
        candidates = order
        marked = self._by_wake.get(woken) if woken is not None else None
        if len(order) > 1 and marked is not None and not self._pending_calls and all(
            q.name in self._known_empty for q in order if q is not marked
        ):
            candidates = [marked]
            for due in (self._known_empty[q.name] for q in order if q is not marked):
                if due >= 0 and (next_due_ms < 0 or due < next_due_ms):
                    next_due_ms = due
        elif len(order) > 1:
            candidates = []
            for q, peeked in zip(order, peek_many(order)):
                now_ms = peeked.now_ms
                # A queue whose last lease call went unanswered is asked again with the
                # same token: that call may have leased jobs it must hand back.
                if peeked.has_work or q.name in self._pending_calls:
                    candidates.append(q)
                    self._known_empty.pop(q.name, None)
                else:
                    self._known_empty[q.name] = peeked.next_due_ms
                    if peeked.next_due_ms >= 0 and (next_due_ms < 0 or peeked.next_due_ms < next_due_ms):
                        next_due_ms = peeked.next_due_ms
        for q in candidates:
            # A call that raised (OutcomeUnknown) is sent again with the same token, so
            # the leases it may have made are handed back instead of left to expire.
            call = self._pending_calls.setdefault(q.name, secrets.token_hex(8))
            leased = q.lease_call(count=free, lease_ms=self.lease_ms, call=call)
            del self._pending_calls[q.name]
            if leased.jobs or leased.next_due_ms == leased.now_ms:  # work left (a limit hit)
                self._known_empty.pop(q.name, None)
            else:
                self._known_empty[q.name] = leased.next_due_ms
            if leased.jobs:
                self._crash.at("after_lease")
                with self._slots:
                    self._free -= len(leased.jobs)
                for job in leased.jobs:
                    self._track(job)
                    pool.submit(self._serve, job)
                return True, -1, leased.now_ms
            now_ms = leased.now_ms
            if leased.next_due_ms >= 0 and (next_due_ms < 0 or leased.next_due_ms < next_due_ms):
                next_due_ms = leased.next_due_ms
        return False, next_due_ms, now_ms

    # -- handler threads -------------------------------------------------------------

    def _track(self, job: Job) -> None:
        self._track_all([job])

    def _track_all(self, jobs: list[Job]) -> None:
        with self._running_lock:
            for job in jobs:
                self._running[job.receipt] = job

    def _untrack(self, job: Job) -> bool:
        with self._running_lock:
            return self._running.pop(job.receipt, None) is not None

    def _check_partitions(self) -> None:
        for q in self.logical:
            q.check_partitions()

    def _serve(self, first: Job) -> None:
        """Run jobs in this slot: ``first``, then whatever ack-and-lease hands back (in
        a partitioned queue at most PARTITION_STREAK jobs in a row: then the slot goes
        back to a lease round, which moves on to the next partition)."""
        job: Job | None = first
        streak = 0
        try:
            while job is not None:
                streak += 1
                job = self._run_one(job, may_lease=len(self.groups[0]) == 1 or streak < PARTITION_STREAK)
        finally:
            with self._slots:
                self._free += 1
                self._slots.notify_all()

    def _run_one(self, job: Job, *, may_lease: bool = True) -> Job | None:
        queue = self._by_name[job.queue]
        error: BaseException | None = None
        result: object = None
        slot = Slot(self, job)
        with self._running_lock:
            self._slots_running[job.receipt] = slot
        enter_slot(slot)
        try:
            try:
                self._crash.at("in_handler")
                result = slot.call(self.call_handler, job)
            # The handler's failure is the job's outcome. SystemExit too (sys.exit() in a
            # handler thread ends only that call): let through, it would leave the job
            # leased, extended and never ended.
            except (Exception, SystemExit, TimeLimitExceeded) as exc:
                error = exc
        finally:
            enter_slot(None)
            with self._running_lock:
                self._slots_running.pop(job.receipt, None)
        if self._killed.is_set():
            return None  # a killed process acks nothing
        label = slot  # logged as str(slot): built only if a line is logged
        # Untracked here, or by the heartbeat at the time limit (then `limited` is set
        # under the same lock): exactly one of them decides how the job ends.
        tracked = self._untrack(job)
        if slot.limited:
            # The heartbeat ended this lease at the time limit (a fenced nack): the job
            # follows its retry policy already; what the handler did after is ignored.
            if slot.written_off:
                log.warning("%s: its thread stopped %.1fs after the time limit; the slot serves again", label,
                            time.monotonic() - (slot.interrupted_at or slot.started))
                with self._slots:
                    self.slots_written_off -= 1
            log.info("%s stopped at its time limit (%s)", label, "raised " + type(error).__name__ if error else "returned")
            return None
        if error is None and (inspect.isawaitable(result) or inspect.isasyncgen(result)):
            self._refuse_awaitable(queue, job, result, tracked)
            return None
        if not tracked:
            # The shutdown released this job after the grace period: its receipt is
            # stale, and another worker may be running it.
            log.warning("%s finished after its lease was released at shutdown", label)
            return None
        if job.cancelled.is_set():
            # Cancelled (or its lease lost): its end is decided already; an ack or nack
            # would answer GONE or STALE and change nothing.
            log.info("%s ended as cancelled (its handler %s)", label, "failed" if error else "returned")
            return None
        keep = self._result_to_keep(result) if error is None else None
        if keep is not None:
            value, ttl_ms = keep
            self._crash.at("before_ack")
            try:
                outcome = self._with_retries(
                    lambda: queue.ack_result(job, value, result_ttl_ms=ttl_ms, max_results=self.max_results)
                )
            except InvalidArgument as exc:
                # Refused before anything was sent (not bytes, str or JSON-able, too
                # large, a bad ttl): a result that cannot be stored fails the job, loudly
                # and at once. A retry would run the handler's side effects again only to
                # produce the same unstorable result.
                error = Fail(f"the result cannot be stored: {exc}")
            else:
                self._log_ack(label, outcome)
                return None
        if error is None:
            self._crash.at("before_ack")
            if self._crash.armed("ack_sent"):
                _send_and_die(queue, job, self._crash)
            # Group commit: acked together with the jobs of other handlers that finish
            # meanwhile, in one call that also leases their replacements.
            wants_job = (
                queue in self.groups[0] and may_lease and not self._stop.is_set() and self._registration_confirmed()
            )
            outcome, next_job = self._commits[queue.name].commit(job, wants_job=wants_job)
            self._log_ack(label, outcome)
            return next_job
        self._fail(queue, job, error, label)
        return None

    def _fail(self, queue: Queue, job: Job, error: BaseException, label: object) -> None:
        """Nack a job whose handler raised: :class:`Retry` after its delay (or the
        backoff), :class:`Fail` to the dead letters now, anything else with the backoff."""
        final, delay_ms = False, None
        if isinstance(error, _Ending):
            text = error.error_text()
            final = isinstance(error, Fail)
            delay_ms = error.delay_ms if isinstance(error, Retry) else None
        else:
            text = error_text(error)
        if not final:
            log.info("%s attempt %d/%d failed: %s", label, job.attempt, job.max_attempts, text)
        nacked = self._with_retries(
            lambda: queue.nack(
                job, text, delay_ms=delay_ms, final=final,
                backoff_base_ms=self.backoff_base_ms, backoff_cap_ms=self.backoff_cap_ms,
            )
        )
        if nacked.state == "dead":
            log.warning("%s is dead after %d attempts: %s", label, job.attempt, text)
        elif not nacked.outcome:
            log.warning("%s: nack found the lease %s", label, nacked.outcome.value)
        elif nacked.state == "scheduled":
            self._note_retry(nacked.at_ms)

    def _note_retry(self, at_ms: int) -> None:
        """A job this worker nacked is due again at ``at_ms``: a burst run waits for it."""
        with self._slots:
            self._retry_due_ms = max(self._retry_due_ms, at_ms)

    def describe(self, slot: Slot) -> str:
        """How logs name a running job: its id, and its task when the handler named one."""
        return str(slot)

    def run_awaitable(self, slot: Slot, awaitable: Any) -> Any:
        """Run a coroutine for the job in ``slot`` (see :meth:`Slot.run_awaitable`): this
        sync worker has no event loop, so it refuses, loudly."""
        close = getattr(awaitable, "close", None)
        if callable(close):
            close()
        raise InvalidArgument(
            f"{self.describe(slot)} needs an event loop (an async def task) and this sync Worker has none: "
            "run it with pyqueue.aio_worker.AsyncWorker (pyqueue worker picks that one by itself)"
        )

    def interrupt(self, slot: Slot) -> None:
        """Stop the work of ``slot`` at its time limit (threads: an asynchronous
        :class:`TimeLimitExceeded`)."""
        slot.interrupt()

    def _result_to_keep(self, returned: object) -> tuple[object, int] | None:
        """(value, ttl_ms) to store with the ack: a :class:`Result` always, any other
        return value when the worker keeps results; None to ack without one."""
        if isinstance(returned, Result):
            return returned.value, returned.ttl_ms or self.keep_results_ms or DEFAULT_RESULT_TTL_MS
        if self.keep_results_ms is not None:
            return returned, self.keep_results_ms
        return None

    def _refuse_awaitable(self, queue: Queue, job: Job, result: object, tracked: bool) -> None:
        """The handler returned a coroutine (or another awaitable) instead of doing the
        work: the job did not run. Give it back unrun (no attempt counted) and stop the
        worker loudly rather than ack work that never happened."""
        close = getattr(result, "close", None)
        if callable(close):
            close()  # no "coroutine was never awaited" warning: we say it louder below
        if tracked:
            self._with_retries(lambda: queue.release([job]))
        self.stop(
            f"the handler returned {type(result).__name__} for job {job.id}: it is async, and this sync Worker "
            "cannot await it; the job was released unrun. Give the Worker a plain function.",
            EXIT_MISCONFIGURED,
        )

    def _log_ack(self, label: object, outcome: Outcome) -> None:
        if not outcome:
            log.warning("%s finished but its lease was lost (%s): it may run again", label, outcome.value)

    def _with_retries(self, call: Callable[[], T]) -> T:
        """Run a replay-safe call until it answers, backing off on connection errors
        (the call is sent again with the same arguments: one effect)."""
        delay = 0.05
        while True:
            try:
                return call()
            except _RETRY_ON as exc:
                if not _retryable(exc) or self._hard_stop.is_set():
                    raise
                log.warning("call failed (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)

    # -- heartbeat -------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        assert self.service is not None
        extend_every = self.lease_ms / 3000
        next_extend = time.monotonic() + extend_every
        next_renew = time.monotonic() + self.renew_ms / 1000  # run() renewed at start-up
        while not self._hard_stop.wait(TICK_S):
            now = time.monotonic()
            # Each duty fails on its own: a failed extension must not skip the renewal
            # (or the service would be lost), and a failed call waits for its next turn
            # rather than being retried every tick.
            if self._stop.is_set() and not self._woken_for_stop:
                self._wake_fetch_loop()
            if self._slots_running:
                self._heartbeat_duty("time limits", self._enforce_limits)
            if now >= next_extend:
                next_extend = now + extend_every
                self._heartbeat_duty("extend", self._extend_running)
            # Renewal goes on while the worker drains after a stop: its running jobs stay
            # its own (nobody scrubs them) until it deregisters.
            if now >= next_renew:
                next_renew = now + self.renew_ms / 1000
                self._heartbeat_duty("renew", self._renew_and_scrub)
            # No renewal got through for all of expire_ms (Redis unreachable, a node that
            # never came back): the registration has expired, and live workers may scrub
            # our leases. Exit 75 so that a supervisor restarts the worker, rather than
            # retrying behind a server it cannot reach for ever (the fetch loop's and the
            # heartbeat's warnings said why meanwhile, at least every 5 s).
            if now - self._renewed_at > self.expire_ms / 1000 and not self._stop.is_set():
                self.stop(
                    f"service {self.service.owner}: no renewal got through for expire_ms ({self.expire_ms} ms), "
                    "so its registration has expired",
                    EXIT_REGISTRATION_LOST,
                )
                self._wake_fetch_loop()

    def _heartbeat_duty(self, name: str, duty: Callable[[], None]) -> None:
        try:
            duty()
        except ServiceLost as exc:
            self.stop(str(exc), EXIT_REGISTRATION_LOST)
            self._wake_fetch_loop()
        except (redis_lib.RedisError, PyQueueError) as exc:
            log.warning("heartbeat %s: %s", name, exc)
        except Exception:
            # A bug, not the weather: logged loudly, but the heartbeat goes on, since the
            # renewals that keep this worker's leases its own are in the same thread.
            log.exception("heartbeat %s failed", name)

    def _enforce_limits(self) -> None:
        """End the jobs past their time limit, and write off the slots whose thread did
        not stop (see :mod:`pyqueue.slots`)."""
        now = time.monotonic()
        with self._running_lock:
            slots = [s for s in self._slots_running.values() if s.limit_at is not None and now >= s.limit_at]
        for slot in slots:
            if not slot.limited:
                self._end_at_limit(slot)
            elif slot.in_user_code and slot.interrupted_at is not None and now - slot.interrupted_at >= WRITE_OFF_S:
                # Still running a while after the interruption: interrupt it again (it may
                # have caught the exception and gone on, or swallowed a cancellation),
                # and write its slot off the first time.
                self.interrupt(slot)
                if slot.written_off:
                    continue
                slot.written_off = True
                with self._slots:
                    self.slots_written_off += 1
                    self.slots_written_off_total += 1
                    left = self.concurrency - self.slots_written_off
                log.error(
                    "%s did not stop %.1fs after its time limit (stuck outside Python code?): its slot is written "
                    "off until the thread returns; %d of %d slots left", self.describe(slot), WRITE_OFF_S, left,
                    self.concurrency,
                )

    def _end_at_limit(self, slot: Slot) -> None:
        """The job of ``slot`` reached its time limit: end its lease now with a fenced nack
        (so a late ack is refused), then stop the work."""
        job, ending = slot.job, slot.ending
        assert ending is not None
        with self._running_lock:
            if self._running.pop(job.receipt, None) is None:
                return  # it finished (or was released) just now: its own ending stands
            slot.limited = True
        label = self.describe(slot)
        log.warning("%s reached its time limit of %gs: ending its lease and stopping it", label, slot.limit_s)
        queue = self._by_name[job.queue]
        try:
            nacked = queue.nack(
                job, ending.error, delay_ms=ending.delay_ms, final=ending.final,
                backoff_base_ms=self.backoff_base_ms, backoff_cap_ms=self.backoff_cap_ms,
            )
        except _NACK_AT_LIMIT_ERRORS as exc:
            # No longer renewed: the lease expires (a lease length at most) and is reclaimed.
            log.warning("%s: the nack at its time limit failed (%s); its lease is left to expire", label, exc)
        else:
            if nacked.state == "dead":
                log.warning("%s is dead after %d attempts: %s", label, job.attempt, ending.error)
            elif nacked.state == "scheduled":
                self._note_retry(nacked.at_ms)
        finally:
            # Whatever the nack did, the work stops: the job is no longer this worker's.
            job.cancelled.set()  # wakes a handler that waits on it
            self.interrupt(slot)

    def _wake_fetch_loop(self) -> None:
        """End the fetch loop's wait now that the worker stops. Locally: nothing is
        written to Redis (after a lost registration, the service's id and wake key may
        belong to another service by now)."""
        self._woken_for_stop = True
        if self._waiter is not None:
            self._waiter.interrupt()

    def _extend_running(self) -> None:
        with self._running_lock:
            running = list(self._running.values())
        for q in self.queues:
            jobs = [j for j in running if j.queue == q.name]
            for i in range(0, len(jobs), 1000):
                self._crash.at("in_extend")
                for job, extended in zip(jobs[i : i + 1000], q.extend(jobs[i : i + 1000], self.lease_ms)):
                    with self._running_lock:
                        still_running = job.receipt in self._running
                    # A job acked meanwhile answers GONE: only a running job lost its lease.
                    if not extended.outcome and still_running:
                        self.lease_ended(job, extended.outcome)

    def lease_ended(self, job: Job, outcome: Outcome) -> None:
        """A running job's lease ended without this worker (extend answered ``outcome``):
        GONE, the job was cancelled (or removed); STALE, the lease was lost and another
        worker may hold the job. Tell the handler (``job.cancelled``); its result will be
        neither acked nor nacked."""
        if outcome is Outcome.GONE:
            log.info("job %s was cancelled while running: telling its handler", job.id)
        else:
            log.warning("job %s lost its lease (%s) while running: telling its handler", job.id, outcome.value)
        job.cancelled.set()

    def _renew_and_scrub(self) -> None:
        assert self.service is not None
        with self._renew_lock:
            sent_at = time.monotonic()
            renewed = self.services.renew(self.service, expire_ms=self.expire_ms)
            self._renewed_at = self._checked_at = sent_at
        if renewed.stop and not self._stop.is_set():
            self.stop(f"service {self.service.owner}: remote stop requested")
            self._wake_fetch_loop()
        for service in renewed.dead:
            total = 0
            for name in service.queues:
                q = self._by_name.get(name) or physical_queue(name, self.redis, prefix=self.prefix)
                while True:
                    scrubbed = q.scrub(service.owner)
                    total += scrubbed.scrubbed
                    if not scrubbed.more:
                        break
            if self.services.forget_dead(service.id, service.registration):
                log.info("scrubbed dead service %s: %d leases back to ready", service.owner, total)

    # -- shutdown --------------------------------------------------------------------

    def _shutdown(self, pool: ThreadPoolExecutor) -> None:
        assert self.service is not None
        self._stop.set()
        deadline = time.monotonic() + self.grace_ms / 1000
        with self._slots:
            while self._free < self.concurrency and time.monotonic() < deadline:
                self._slots.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        with self._running_lock:
            leftover = list(self._running.values())
            self._running.clear()
        # Releasing and deregistering are courtesies: if Redis cannot be reached (the
        # reason this worker may be stopping), the leases expire and the service key
        # expires by themselves, and live workers scrub what it held. So a failure is
        # logged and the worker ends with its own exit code.
        try:
            for q in self.queues:
                jobs = [j for j in leftover if j.queue == q.name]
                if jobs:
                    outcomes = q.release(jobs)
                    log.warning("grace period over: released %d running jobs of %s (%s)", len(jobs), q.name,
                                ",".join(o.value for o in outcomes))
            pool.shutdown(wait=False)
            deleted, removed = self.services.deregister(self.service)
        except _RETRY_ON as exc:
            if not _retryable(exc):
                raise
            pool.shutdown(wait=False)
            log.warning("service %s ended: %s; could not release or deregister (%s): its leases and key expire "
                        "by themselves", self.service.owner, self.exit_reason or "stopped", exc)
            return
        if deleted < 0:
            log.warning("service %s ended: %s; its id now belongs to another registration, left untouched",
                        self.service.owner, self.exit_reason or "stopped")
        else:
            log.info("service %s ended: %s {del: %d, lrem: %d}", self.service.owner, self.exit_reason or "stopped",
                     deleted, removed)


#: What the worker's loops catch and test with _retryable (anything else is a bug).
_RETRY_ON: tuple[type[BaseException], ...] = (*CLUSTER_WEATHER, PyQueueError)
#: What a failed nack at a time limit may raise (logged; the work is stopped anyway).
_NACK_AT_LIMIT_ERRORS: tuple[type[BaseException], ...] = (*_RETRY_ON, redis_lib.RedisError)


class _StoppedDuringStartUp(Exception):
    """A stop was requested while the worker was still starting (Worker._start_up)."""


def _retryable(exc: BaseException) -> bool:
    """Errors a worker waits out with backoff: the connection, and a server at its memory
    limit (acks still run there and free memory)."""
    return isinstance(exc, (*CLUSTER_WEATHER, OutcomeUnknown, OutOfMemory))
