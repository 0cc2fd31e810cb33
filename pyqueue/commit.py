"""Group commit: handlers that finish together are acked, and their replacements leased,
in one ``lease`` call (DESIGN §10).

A handler thread whose job succeeded calls :meth:`GroupCommit.commit`. If no commit call
of the queue is in flight, it sends one at once with every job that is waiting (a lone
busy handler is never delayed waiting for company); if one is in flight, it waits, and
the jobs that gathered meanwhile go together in the next call, sent by the first of
them. Each call acks its batch and leases as many new jobs as its members asked for
(lua/lease.lua acks many receipts and leases many jobs per call), or, when none asked,
acks with lua/ack.lua. The more handlers finish per round trip, the fewer round trips
and Redis calls each job costs.

What a batch promises is what each of its calls promises: every receipt gets its own
outcome (a stale receipt answers STALE and stops nothing else); a call re-sent after a
lost reply carries the same call token, so it has one effect and hands back the jobs
the first run leased.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from pyqueue.core import MAX_BATCH
from pyqueue.models import Job, Outcome
from pyqueue.queue import Queue

T = TypeVar("T")


class Retrying(Protocol):
    """Runs a replay-safe call until it answers (the worker's retry policy)."""

    def __call__(self, call: Callable[[], T]) -> T: ...


@dataclass
class _Member:
    """One finished job waiting in a batch, and what its batch answers it."""

    job: Job
    wants_job: bool
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to send the next batch rather than with an answer
    outcome: Outcome | None = None
    next_job: Job | None = None
    error: BaseException | None = None


class GroupCommit:
    """The group commit of one (physical) queue of a worker. Thread-safe.

    Args:
        queue: the queue the jobs were leased from.
        lease_ms: the lease of the jobs leased in their place.
        retrying: runs a call until it answers (the worker's backoff on connection
            errors); the call is sent again with the same arguments and token.
        on_leased: called with the jobs a call leased before they are handed out (the
            worker tracks them for lease extension).
    """

    def __init__(
        self, queue: Queue, lease_ms: int, retrying: Retrying, on_leased: Callable[[list[Job]], None]
    ) -> None:
        self.queue = queue
        self.lease_ms = lease_ms
        self._retrying = retrying
        self._on_leased = on_leased
        self._lock = threading.Lock()
        self._waiting: list[_Member] = []
        self._in_flight = False
        #: Calls sent and jobs they acked: batch sizes are acked / calls.
        self.calls = 0
        self.acked = 0

    def commit(self, job: Job, *, wants_job: bool) -> tuple[Outcome, Job | None]:
        """Ack ``job`` (its handler succeeded) and, if ``wants_job``, lease one job in
        its place, together with whatever other handlers of the queue finish meanwhile.
        Returns the ack's outcome and the job leased for this caller, if any.

        Raises:
            what the call raised after the retry policy gave up (every member of the
            batch gets the same error).
        """
        me = _Member(job, wants_job)
        with self._lock:
            self._waiting.append(me)
            lead = not self._in_flight
            self._in_flight = True
        if not lead:
            me.done.wait()
        if lead or me.lead:
            self._send()
        if me.error is not None:
            raise me.error
        assert me.outcome is not None
        return me.outcome, me.next_job

    def _send(self) -> None:
        """Send one call with the waiting jobs (this thread's own among them), answer
        every member, and hand the lead to the first job that arrived meanwhile."""
        with self._lock:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
        try:
            self._call(batch)
        except BaseException as exc:  # every member learns it; the caller re-raises
            for member in batch:
                member.error = exc
        with self._lock:
            if self._waiting:
                self._waiting[0].lead = True
                self._waiting[0].done.set()
            else:
                self._in_flight = False
        for member in batch:
            member.done.set()

    def _call(self, batch: list[_Member]) -> None:
        jobs = [m.job for m in batch]
        wanted = [m for m in batch if m.wants_job]
        if wanted:
            call = secrets.token_hex(8)  # the same token on every retry: one effect

            leased = self._retrying(
                lambda: self.queue.lease_call(ack=jobs, count=len(wanted), lease_ms=self.lease_ms, call=call)
            )
            outcomes, new_jobs = leased.acks, leased.jobs
            if new_jobs:
                self._on_leased(new_jobs)
            for member, new_job in zip(wanted, new_jobs):
                member.next_job = new_job
        else:
            outcomes = self._retrying(lambda: self.queue.ack_many(jobs))
        for member, outcome in zip(batch, outcomes):
            member.outcome = outcome
        self.calls += 1
        self.acked += len(batch)
