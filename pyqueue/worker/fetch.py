"""The fetch loop: leases jobs for a worker's free handler slots.

It runs in the thread that calls ``Worker.run``. For free slots it leases, always from
the first queue with ready jobs (a lease round, :meth:`FetchLoop.lease_round`), and
hands each job to the executor. When nothing is ready it blocks with ``BZPOPMIN`` on the
queues' wake markers (raised by enqueue, nack, release, promote, scrub) and on the
service's private wake key, for at most the time to the next due job or lease
deadline. It owns the *blocking* connection (:class:`~pyqueue.drivers.waiting.Waiter`), whose
socket timeout exceeds the longest block.

Handler slots that finish lease their own replacements by group commit; the fetch loop
only fills the slots that come back empty. It leases only while the registration is
confirmed (:mod:`pyqueue.worker.registration`).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Callable

from pyqueue.drivers.clients import Client
from pyqueue.protocol.errors import OutcomeUnknown
from pyqueue.drivers.queue import peek_many
from pyqueue.worker.batch import BatchRunner
from pyqueue.worker.executor import Executor
from pyqueue.worker.retries import MAX_BACKOFF_S, RETRY_ON, retryable
from pyqueue.worker.settings import Served, WorkerSettings
from pyqueue.worker.shared import Shared
from pyqueue.drivers.waiting import Waiter

log = logging.getLogger("pyqueue.worker")

#: Redis fires blocking-command timeouts from its timer, every 1/hz (100 ms at the
#: default hz 10), so a BZPOPMIN timed to a due time may return that much late. The
#: worker blocks on the server only until this long before a due time and waits the
#: rest locally (a wake signal in that short window waits for it).
SERVER_TIMER_SLACK_MS = 110


class FetchLoop:
    """The fetch loop of one worker (see the module docstring).

    Args:
        settings: the worker's; read: ``lease_ms``, ``block_ms``.
        served: the worker's queues; per logical queue, in priority order, the queues a
            lease call goes to (its partitions, or itself).
        shared: the parts' shared state (:class:`~pyqueue.worker.shared.Shared`).
        executor: runs the handlers of the jobs it leases.
        redis: the queues' server (the blocking wait gets a connection of its own).
        renew: renews the registration now (a heartbeat duty), when the fetch loop
            finds it unconfirmed.
        batches: for the queues served in batches, how many jobs a lease round asks
            for (a batch per free slot) and where they go (:mod:`pyqueue.worker.batch`).
        private_wake_shared: the service namespace is on the queues' server, so one
            ``BZPOPMIN`` waits on the service's private wake key too.
    """

    def __init__(
        self, settings: WorkerSettings, served: Served, shared: Shared, executor: Executor, *, redis: Client,
        renew: Callable[[], None], private_wake_shared: bool, batches: BatchRunner | None = None,
    ) -> None:
        self.redis = redis
        self.groups = [list(g) for g in served.groups]
        self.queues = [q for group in self.groups for q in group]
        self.running = shared.running
        self.registration = shared.registration
        self.executor = executor
        self.control = shared.control
        self.crash = shared.crash
        self.renew = renew
        self.lease_ms, self.block_ms = settings.lease_ms, settings.block_ms
        self.private_wake_shared = private_wake_shared
        #: Runs the queues served in batches (None: every job is its own handler call).
        self.batches = batches
        self.by_wake = {q.spec.keys.wake: q for q in self.queues}
        #: Queues found without work at the last round -> their next_due_ms then (-1: none).
        self.known_empty: dict[str, int] = {}
        self.rotations = [itertools.count() for _ in self.groups]
        self.pending_calls: dict[str, str] = {}  # queue -> call token of an unanswered lease
        self.waiter: Waiter | None = None  # while the loop runs

    def wake(self) -> None:
        """End the blocking wait now (from any thread; nothing is written to Redis)."""
        if self.waiter is not None:
            self.waiter.interrupt()

    def run(self, burst: bool) -> None:
        service = self.registration.service
        assert service is not None
        wake_keys = [q.spec.keys.wake for q in self.queues]
        private_wake = service.keys.role("wake")
        if self.private_wake_shared:
            # A remote stop wakes us. On a cluster this key is in the namespace's slot,
            # not the queues': the Waiter waits on it separately.
            wake_keys.append(private_wake)
        waiter = self.waiter = Waiter(self.redis, wake_keys, self.block_ms / 1000 + 10)
        try:
            self._loop(burst, waiter, private_wake)
        finally:
            waiter.close()

    def _loop(self, burst: bool, waiter: Waiter, private_wake: str) -> None:
        stopping, running, registration = self.control.stopping, self.running, self.registration
        must_lease, delay = True, 0.1
        next_due_ms, now_ms, observed = -1, 0, 0.0
        woken: str | None = None  # the wake key whose marker ended the last wait
        while not stopping.is_set():
            if self.control.leasing_paused.is_set():
                stopping.wait(0.1)  # recycled: the supervisor stops this child once its replacement serves
                continue
            free = running.wait_for_free(stopping)
            if stopping.is_set():
                break
            try:
                if must_lease:
                    if not registration.confirmed():
                        # Paused or cut off for most of expire_ms (SIGSTOP, a VM stall, a
                        # partition): the registration may have expired and our leases
                        # been scrubbed. Renew before leasing; a lost one stops us.
                        self.renew()
                        if stopping.is_set():
                            break
                        if not registration.confirmed():
                            raise OutcomeUnknown("the service renewal did not get through; not leasing")
                    leased_any, next_due_ms, now_ms = self.lease_round(free, woken)
                    woken = None
                    observed = time.monotonic()
                    if leased_any:
                        continue
                if burst:
                    idle = running.idle_or_wait(0.1)
                    # Drained: nothing ready, nothing running, nothing due within a block
                    # period (a retry with a short backoff is waited for).
                    due_soon = 0 <= next_due_ms - now_ms <= self.block_ms if next_due_ms >= 0 else False
                    # ... nor a retry this worker scheduled, however far off.
                    due_soon = due_soon or running.retry_due_ms >= now_ms
                    if idle and not due_soon:
                        self.control.stop("burst: every queue is drained")
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
                        stopping.wait(max(0.0, remaining_ms) / 1000)
                        must_lease = True
                        continue
                    # At least 1 ms: a BZPOPMIN timeout of 0 blocks until a wake-up, forever.
                    timeout_ms = max(1, int(min(self.block_ms, remaining_ms - SERVER_TIMER_SLACK_MS)))
                if time.monotonic() - registration.checked_at > self.block_ms / 1000 and registration.stopped_by_key():
                    break
                popped = woken = waiter.wait(timeout_ms)
                # Every wait ends in a lease round, also one that ran the full block period
                # with nothing due: the round's peek finds leases that expired meanwhile in
                # a queue nobody leased from (deadlines set after this worker went to
                # sleep). One peek per queue per block period, in one round trip.
                must_lease = True
                if popped == private_wake:
                    # A remote stop (or our own stop request): read the key before leasing.
                    if not stopping.is_set() and registration.stopped_by_key():
                        break
                delay = 0.1
            except RETRY_ON as exc:
                if stopping.is_set():
                    break  # the stop itself may have cut the blocking connection (interrupt)
                if not retryable(exc):
                    raise
                log.warning("fetch loop: %s; retrying in %.1fs", exc, delay)
                stopping.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                must_lease = True

    def lease_round(self, free: int, woken: str | None = None) -> tuple[bool, int, int]:
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
            for group, rotation in zip(self.groups, self.rotations):
                start = next(rotation) % len(group)
                order += group[start:] + group[:start]
        candidates = order
        marked = self.by_wake.get(woken) if woken is not None else None
        if len(order) > 1 and marked is not None and not self.pending_calls and all(
            q.name in self.known_empty for q in order if q is not marked
        ):
            candidates = [marked]
            for due in (self.known_empty[q.name] for q in order if q is not marked):
                if due >= 0 and (next_due_ms < 0 or due < next_due_ms):
                    next_due_ms = due
        elif len(order) > 1:
            candidates = []
            for q, peeked in zip(order, peek_many(order)):
                now_ms = peeked.now_ms
                # A queue whose last lease call went unanswered is asked again with the
                # same token: that call may have leased jobs it must hand back.
                if peeked.has_work or q.name in self.pending_calls:
                    candidates.append(q)
                    self.known_empty.pop(q.name, None)
                else:
                    self.known_empty[q.name] = peeked.next_due_ms
                    if peeked.next_due_ms >= 0 and (next_due_ms < 0 or peeked.next_due_ms < next_due_ms):
                        next_due_ms = peeked.next_due_ms
        for q in candidates:
            # A call that raised (OutcomeUnknown) is sent again with the same token, so
            # the leases it may have made are handed back instead of left to expire.
            call = self.pending_calls.setdefault(q.name, secrets.token_hex(8))
            batched = self.batches.lease_count(q, free) if self.batches is not None else None
            leased = q.lease_call(count=free if batched is None else batched, lease_ms=self.lease_ms, call=call)
            del self.pending_calls[q.name]
            if leased.jobs or leased.next_due_ms == leased.now_ms:  # work left (a limit hit)
                self.known_empty.pop(q.name, None)
            else:
                self.known_empty[q.name] = leased.next_due_ms
            if leased.jobs:
                self.crash.at("after_lease")
                if batched is not None:
                    assert self.batches is not None
                    self.batches.hand_out(q, leased.jobs)  # a batch per slot
                    return True, -1, leased.now_ms
                self.running.take(len(leased.jobs))
                for job in leased.jobs:
                    self.running.track_all([job])
                    self.executor.submit(job)
                return True, -1, leased.now_ms
            now_ms = leased.now_ms
            if leased.next_due_ms >= 0 and (next_due_ms < 0 or leased.next_due_ms < next_due_ms):
                next_due_ms = leased.next_due_ms
        return False, next_due_ms, now_ms
