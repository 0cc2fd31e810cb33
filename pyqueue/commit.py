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
from collections.abc import Callable
from typing import Protocol, TypeVar

from pyqueue.batching import ThreadBatcher
from pyqueue.models import Job, Outcome
from pyqueue.queue import Queue

T = TypeVar("T")

#: One finished job, and whether its handler slot wants a job in its place.
Finished = tuple[Job, bool]
#: What the batch answers it: the ack's outcome, and the job leased for it, if any.
Answer = tuple[Outcome, "Job | None"]


class Retrying(Protocol):
    """Runs a replay-safe call until it answers (the worker's retry policy)."""

    def __call__(self, call: Callable[[], T]) -> T: ...


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
        self._batcher: ThreadBatcher[Finished, Answer] = ThreadBatcher(self.send)

    @property
    def calls(self) -> int:
        """Calls sent so far."""
        return self._batcher.state.calls

    @property
    def acked(self) -> int:
        """Jobs those calls acked (any outcome): their mean batch is acked / calls."""
        return self._batcher.state.items

    def commit(self, job: Job, *, wants_job: bool) -> Answer:
        """Ack ``job`` (its handler succeeded) and, if ``wants_job``, lease one job in
        its place, together with whatever other handlers of the queue finish meanwhile.
        Returns the ack's outcome and the job leased for this caller, if any.

        Raises:
            what the call raised after the retry policy gave up (every member of the
            batch gets the same error).
        """
        return self._batcher.submit((job, wants_job))

    def send(self, batch: list[Finished]) -> list[Answer]:
        """One call for ``batch``: lease.lua acking them all and leasing one job for
        each that wants one (as many as are ready), or ack.lua when none does."""
        jobs = [job for job, _ in batch]
        wanted = sum(1 for _, wants in batch if wants)
        if not wanted:
            return [(outcome, None) for outcome in self._retrying(lambda: self.queue.ack_many(jobs))]
        call = secrets.token_hex(8)  # the same token on every retry: one effect
        leased = self._retrying(
            lambda: self.queue.lease_call(ack=jobs, count=wanted, lease_ms=self.lease_ms, call=call)
        )
        if leased.jobs:
            self._on_leased(leased.jobs)
        handed = iter(leased.jobs)
        return [(outcome, next(handed, None) if wants else None) for outcome, (_, wants) in zip(leased.acks, batch)]
