"""The heartbeat: one thread that keeps what the worker holds its own.

Every tick (:data:`TICK_S`) it ends the jobs past their time limit (a fenced nack, then
the executor stops the work: :mod:`pyqueue.worker.slots`); every third of ``lease_ms`` it
extends the leases of running jobs (one batched call per queue), and tells the executor
about a job whose lease ended without this worker (cancelled, or lost); every
``renew_ms`` it renews the service registration and scrubs the leases of the dead
services renewal reports, and runs the flow checks (:mod:`pyqueue.worker.flows`). It also wakes the fetch loop when a stop was asked (a signal
handler only sets the stop), and stops the worker with exit 75 when no renewal got
through for ``expire_ms``.

Each duty fails on its own (:meth:`Heartbeat.duty`): a failed extension must not skip
the renewal, or the service would be lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis as redis_lib

from pyqueue.protocol.errors import PyQueueError, ServiceLost
from pyqueue.worker.executor import Executor
from pyqueue.worker.flows import FlowChecks
from pyqueue.worker.lifecycle import EXIT_REGISTRATION_LOST, EXIT_STUCK
from pyqueue.worker.settings import Served, WorkerSettings
from pyqueue.worker.shared import Shared
from pyqueue.worker.supervised import SupervisorLink
from pyqueue.worker.slots import SUPERVISED_WRITE_OFF_S, WRITE_OFF_S, Slot

log = logging.getLogger("pyqueue.worker")

#: The heartbeat thread's tick: how quickly a stop request reaches the fetch loop.
TICK_S = 0.05


class Heartbeat:
    """The heartbeat of one worker (see the module docstring).

    Args:
        settings: the worker's; read: ``lease_ms``, ``renew_ms``, ``expire_ms``, ``concurrency``.
        served: the worker's queues (whose leases it extends).
        shared: the parts' shared state (:class:`~pyqueue.worker.shared.Shared`).
        executor: runs the handlers (told to interrupt a job at its time limit).
        wake_fetch_loop: ends the fetch loop's blocking wait, locally (nothing is
            written to Redis).
        supervisor_link: a supervised child's line to its supervisor.
        flows: the checks of flow steps waiting for others (None: none).
    """

    def __init__(
        self, settings: WorkerSettings, served: Served, shared: Shared, executor: Executor, *,
        wake_fetch_loop: Callable[[], None], supervisor_link: SupervisorLink | None = None,
        flows: FlowChecks | None = None,
    ) -> None:
        #: The checks of jobs waiting for others, on the renewal tick (None: none).
        self.flows = flows
        self.queues = list(served.queues)
        self.by_name = served.by_name
        self.running = shared.running
        self.registration = shared.registration
        self.executor = executor
        self.control = shared.control
        self.crash = shared.crash
        self._wake = wake_fetch_loop
        self.lease_ms, self.renew_ms, self.expire_ms = settings.lease_ms, settings.renew_ms, settings.expire_ms
        self.link = supervisor_link
        #: How long an interrupted thread may take to stop before its slot is written off.
        self.write_off_s = WRITE_OFF_S if supervisor_link is None else SUPERVISED_WRITE_OFF_S
        #: Handler threads: when every one is written off, the worker exits (EXIT_STUCK).
        self.threads = settings.concurrency
        self.woken_for_stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.loop, name="pyqueue-heartbeat", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def loop(self) -> None:
        service = self.registration.service
        assert service is not None
        extend_every = self.lease_ms / 3000
        next_extend = time.monotonic() + extend_every
        next_renew = time.monotonic() + self.renew_ms / 1000  # run() renewed at start-up
        while not self.control.hard_stop.wait(TICK_S):
            now = time.monotonic()
            # Each duty fails on its own: a failed extension must not skip the renewal
            # (or the service would be lost), and a failed call waits for its next turn
            # rather than being retried every tick.
            if self.control.stopping.is_set() and not self.woken_for_stop:
                self.wake_fetch_loop()
            if self.running.slots_running:
                self.duty("time limits", self.enforce_limits)
            if self.link is not None:
                self.duty("supervisor", self.check_supervisor)
            if now >= next_extend:
                next_extend = now + extend_every
                self.duty("extend", self.extend_running)
            # Renewal goes on while the worker drains after a stop: its running jobs stay
            # its own (nobody scrubs them) until it deregisters.
            if now >= next_renew:
                next_renew = now + self.renew_ms / 1000
                self.renew_now()
            # No renewal got through for all of expire_ms (Redis unreachable, a node that
            # never came back): the registration has expired, and live workers may scrub
            # our leases. Exit 75 so that a supervisor restarts the worker, rather than
            # retrying behind a server it cannot reach for ever (the fetch loop's and the
            # heartbeat's warnings said why meanwhile, at least every 5 s).
            if now - self.registration.renewed_at > self.expire_ms / 1000 and not self.control.stopping.is_set():
                self.control.stop(
                    f"service {service.owner}: no renewal got through for expire_ms ({self.expire_ms} ms), "
                    "so its registration has expired",
                    EXIT_REGISTRATION_LOST,
                )
                self.wake_fetch_loop()

    def duty(self, name: str, duty: Callable[[], None]) -> None:
        try:
            duty()
        except ServiceLost as exc:
            self.control.stop(str(exc), EXIT_REGISTRATION_LOST)
            self.wake_fetch_loop()
        except (redis_lib.RedisError, PyQueueError) as exc:
            log.warning("heartbeat %s: %s", name, exc)
        except Exception:
            # A bug, not the weather: logged loudly, but the heartbeat goes on, since the
            # renewals that keep this worker's leases its own are in the same thread.
            log.exception("heartbeat %s failed", name)

    def wake_fetch_loop(self) -> None:
        """End the fetch loop's wait now that the worker stops. Locally: nothing is
        written to Redis (after a lost registration, the service's id and wake key may
        belong to another service by now)."""
        self.woken_for_stop = True
        self._wake()

    # -- registration --------------------------------------------------------------

    def renew_now(self) -> None:
        """Renew and scrub now, as a duty (also from the fetch loop, and at start-up)."""
        self.duty("renew", self.renew_and_scrub)

    def renew_and_scrub(self) -> None:
        service = self.registration.service
        assert service is not None
        renewed = self.registration.renew()
        if renewed.stop and not self.control.stopping.is_set():
            self.control.stop(f"service {service.owner}: remote stop requested")
            self.wake_fetch_loop()
        self.registration.scrub(renewed.dead)
        if self.flows is not None:
            self.duty("flow checks", self.check_flows)

    def check_flows(self) -> None:
        assert self.flows is not None
        self.flows.check()

    def check_supervisor(self) -> None:
        """A supervised child (:mod:`pyqueue.worker.supervised`): stop when the
        supervisor is gone; ask for a replacement past a recycling limit."""
        assert self.link is not None
        if self.link.parent_gone() and not self.control.stopping.is_set():
            self.control.stop(f"its supervisor (pid {self.link.supervisor_pid}) is gone")
            self.wake_fetch_loop()
        if self.link.check_limits(self.running.ended):
            self.control.leasing_paused.set()

    # -- leases --------------------------------------------------------------------

    def extend_running(self) -> None:
        running = self.running.snapshot()
        for q in self.queues:
            jobs = [j for j in running if j.queue == q.name]
            for i in range(0, len(jobs), 1000):
                self.crash.at("in_extend")
                for job, extended in zip(jobs[i : i + 1000], q.extend(jobs[i : i + 1000], self.lease_ms)):
                    # A job acked meanwhile answers GONE: only a running job lost its lease.
                    if not extended.outcome and self.running.is_tracked(job):
                        self.executor.lease_ended(job, extended.outcome)

    # -- time limits ---------------------------------------------------------------

    def enforce_limits(self) -> None:
        """Interrupt the jobs at their time limit; at their hard limit, end them for good
        and interrupt them again; write off the slots whose thread does not stop then
        (see :mod:`pyqueue.worker.slots`)."""
        now = time.monotonic()
        for slot in self.running.past_limit(now):
            assert slot.limit_at is not None
            if not slot.reached:
                slot.reached = True
                log.warning("%s reached its time limit of %gs: interrupting it (its lease is held %gs more for it to "
                            "end)", self.executor.describe(slot), slot.limit_s, slot.grace_s)
                self.executor.interrupt(slot)
            elif not slot.limited:
                if now >= slot.limit_at + slot.grace_s and self.running.mark_limited(slot):
                    log.warning("%s still runs %gs after its time limit: interrupting it again; it ends as "
                                "TimeLimitExceeded", self.executor.describe(slot), slot.grace_s)
                    self.executor.interrupt(slot)
            elif slot.in_user_code and slot.interrupted_at is not None and now - slot.interrupted_at >= self.write_off_s:
                self.write_off(slot)
                self.executor.interrupt(slot)  # again: it caught it and went on, or is in C code

    def write_off(self, slot: Slot) -> None:
        """``slot``'s thread did not stop at its hard limit: the first time, write the slot
        off. Its job stays leased by this worker, renewed, until the thread returns (then
        it ends as TimeLimitExceeded), so no other attempt of it starts meanwhile."""
        if slot.write_off(self.running.write_off) is None:
            return  # written off already, or its thread left the handler just now
        label = self.executor.describe(slot)
        threads_left = self.threads - self.running.written_off
        log.error(
            "%s did not stop at its hard time limit (stuck outside Python code?): its job stays leased here until its "
            "thread returns, so no other attempt starts; its slot is written off: %d of %d left",
            label, threads_left, self.threads,
        )
        if self.link is not None:
            # Only the end of this process stops that thread: the supervisor starts a
            # replacement, then stops this child (its other jobs drain).
            self.link.retire(f"{label} did not stop at its time limit")
        elif threads_left <= 0:
            self.control.stop("every handler slot is written off (threads stuck past their time limit): exiting "
                              "for a supervisor to start a fresh worker", EXIT_STUCK)
            self.wake_fetch_loop()
