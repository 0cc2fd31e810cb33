"""A worker's service registration, as its other parts consult it.

The worker leases only while its registration is confirmed: renewed less than three
quarters of ``expire_ms`` ago, on this process's monotonic clock. A process that was
paused (SIGSTOP, a VM stall) therefore renews before it leases again, and stops if the
registration was lost meanwhile (exit 75). Renewals are sent by the heartbeat thread,
and by the fetch loop when it finds the registration unconfirmed; the renew lock keeps
their clocks in order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from pyqueue.drivers.clients import Client
from pyqueue.drivers.queue import Queue, physical_queue
from pyqueue.worker.lifecycle import EXIT_REGISTRATION_LOST, Control
from pyqueue.ops.service import DeadService, Renewed, RunningJob, Service, Services

log = logging.getLogger("pyqueue.worker")


class Registration:
    """Registers, renews and checks one worker's service (see the module docstring).

    Args:
        services: the service namespace.
        queue_names: every queue leased from (partitions too): a reaper scrubs each.
        by_name: those queues by name (the scrub of a dead service's leases uses them).
    """

    def __init__(
        self, services: Services, control: Control, *, queue_names: Sequence[str], by_name: Mapping[str, Queue],
        redis: Client, prefix: str, expire_ms: int, task_names: Sequence[str],
    ) -> None:
        self.services = services
        self.control = control
        self.queue_names = list(queue_names)
        self.by_name = by_name
        self.redis = redis
        self.prefix = prefix
        self.expire_ms = expire_ms
        self.task_names = tuple(task_names)
        self.service: Service | None = None
        #: Monotonic time the service key was last read or renewed.
        self.checked_at = 0.0
        # Monotonic time the last successful renewal was *sent*: the key expires no
        # earlier than expire_ms after that. Leasing needs it to be recent.
        self.renewed_at = 0.0
        self._renew_lock = threading.Lock()  # the heartbeat and the fetch loop both renew
        #: What each renewal reports the worker runs (the worker sets it; None: nothing).
        self.report: Callable[[], Sequence[RunningJob]] | None = None

    def register(self) -> Service:
        sent_at = time.monotonic()
        service = self.services.register(self.queue_names, expire_ms=self.expire_ms, tasks=self.task_names)
        self.renewed_at = self.checked_at = sent_at
        self.service = service
        return service

    def confirmed(self) -> bool:
        """Whether the last renewal that got through was sent recently enough that the
        registration cannot have expired: less than 3/4 of expire_ms ago (renewals come
        every renew_ms <= expire_ms / 2; the rest is margin for the lease call itself)."""
        return time.monotonic() - self.renewed_at < self.expire_ms * 0.75 / 1000

    def stopped_by_key(self) -> bool:
        """Read the service key (never write it): stop if a remote stop was asked (exit
        0) or the registration was lost (exit 75). Returns whether the worker stops."""
        assert self.service is not None
        state = self.services.check(self.service)
        self.checked_at = time.monotonic()
        if state == "stop":
            self.control.stop(f"service {self.service.owner}: remote stop requested")
        elif state == "lost":
            self.control.stop(
                f"service {self.service.owner} lost its registration (its key expired or holds another registration)",
                EXIT_REGISTRATION_LOST,
            )
        return state != "ok"

    def renew(self) -> Renewed:
        """Renew the registration (raises ServiceLost if it was lost)."""
        assert self.service is not None
        with self._renew_lock:
            sent_at = time.monotonic()
            running = self.report() if self.report is not None else None
            renewed = self.services.renew(self.service, expire_ms=self.expire_ms, running=running)
            self.renewed_at = self.checked_at = sent_at
        return renewed

    def scrub(self, dead: Sequence[DeadService]) -> None:
        """Put the leases of dead services back to ready, then forget those services."""
        for service in dead:
            scrub_service(self.services, service, redis=self.redis, prefix=self.prefix, by_name=self.by_name)


def scrub_service(
    services: Services, dead: DeadService, *, redis: Client, prefix: str, by_name: Mapping[str, Queue] | None = None,
    expired: bool = True,
) -> int:
    """Put every lease of the dead service ``dead`` back at the head of READY (the scrub
    transition, in each queue it served), then forget the service; how many leases it
    held. ``expired``: it is dead because its key expired (a reaper forgets it only if
    it did not renew meanwhile); False: its supervisor saw its process end (forgotten at
    once). Replay-safe: a lease ends once, and the forgetting is fenced by the
    registration token."""
    total = 0
    for name in dead.queues:
        q = (by_name or {}).get(name) or physical_queue(name, redis, prefix=prefix)
        while True:
            scrubbed = q.scrub(dead.owner)
            total += scrubbed.scrubbed
            if not scrubbed.more:
                break
    if expired:
        forgotten = services.forget_dead(dead.id, dead.registration)
    else:
        forgotten = services.deregister_dead(dead.id, dead.registration)
    if forgotten:
        log.info("scrubbed dead service %s: %d leases back to ready", dead.owner, total)
    return total
