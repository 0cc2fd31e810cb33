"""How a batch's run ends, job by job: the transitions its handler's answer becomes.

The handler returned a list of one result per job, in order. Each job's result is its
outcome, as :mod:`pyqueue.worker.endings` turns a single handler's return or raise
into one: a value acks the job (with its result when kept: a :class:`~pyqueue.Result`,
or any value with ``keep_results_ms``); an exception instance nacks it (:class:`Retry`
after its delay, :class:`Fail` to the dead letters now, anything else with the backoff,
dead at max attempts). The handler raising, or answering anything but a list or tuple
of as many results as jobs (:class:`BatchError`), fails every job with that error.

A job whose end was decided without the handler is neither acked nor nacked: cancelled
or its lease lost (``job.cancelled``), released at shutdown, or ended at the time limit
(then every job of the batch still running was, by the heartbeat).

The calls, fewest first: the kept results in one ``ack_result`` call per result time to
live (one in practice); the failures in one pipelined round trip of ``nack`` calls
(:mod:`pyqueue.worker.nacks`); the other successes in one ``lease`` call that also
leases the slot's next batch (a slot of the first queue, while the worker leases), else
one ``ack`` call.

Delivery: at least once, per job. An ack not answered OK means that job's lease was
lost (it may run again elsewhere); the other jobs of its batch are not affected.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

from pyqueue.protocol.core import encode_result
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job, Outcome
from pyqueue.drivers.queue import Queue
from pyqueue.worker.endings import Endings, Fail, nack_terms
from pyqueue.worker.nacks import NackTerms, nack_all
from pyqueue.worker.slots import Slot, TimeLimitExceeded

log = logging.getLogger("pyqueue.worker")

#: Kept results go in ack_result calls of at most this many bytes (a value may be 512 KiB).
RESULT_CALL_BYTES = 8 * 1024 * 1024


class BatchError(Exception):
    """A batch handler answered with something other than one result per job: every
    job of the batch fails with this error (nacked per its policy, as if the handler
    had raised it)."""


def outcomes_of(returned: object, error: BaseException | None, count: int) -> list[object]:
    """Each job's outcome, in order: the handler's results, or its error (raised, or a
    :class:`BatchError` for an answer of the wrong shape) for every job."""
    if error is None:
        if not isinstance(returned, (list, tuple)):
            error = BatchError(
                f"a batch handler returns a list of one result per job, in order; it returned "
                f"{type(returned).__name__} for {count} jobs"
            )
        elif len(returned) != count:
            error = BatchError(
                f"the batch handler returned {len(returned)} results for {count} jobs: it must return one per job, "
                "in order"
            )
        else:
            return list(returned)
    return [error] * count


class BatchEndings:
    """Ends the jobs of a batch (see the module docstring).

    Args:
        endings: the worker's endings of single jobs: its backoff, its results policy,
            its shared state, and its first logical queue (``first_group``): only a
            batch of those leases its successor with its acks, so a lower-priority batch
            never overtakes ready higher-priority jobs.
        lease_ms: the worker's lease length.
    """

    def __init__(self, endings: Endings, lease_ms: int) -> None:
        self.endings = endings
        self.first_group = endings.first_group
        self.running = endings.running
        self.control = endings.control
        self.registration = endings.registration
        self.crash = endings.crash
        self.retrying = endings.retrying
        self.lease_ms = lease_ms
        self.max_results = endings.max_results

    def end(
        self, queue: Queue, slot: Slot, returned: object, error: BaseException | None, *, size: int, may_lease: bool
    ) -> list[Job]:
        """End the jobs of ``slot`` (leased from ``queue``): its handler returned
        ``returned`` or raised ``error``. Returns the next batch (at most ``size`` jobs,
        tracked) leased in the same call as the acks, when ``may_lease`` and the worker
        leases; else []."""
        if self.control.killed.is_set():
            return []  # a killed process acks nothing
        batch = list(slot.jobs)
        # Under the lock the heartbeat marks a slot past its hard limit with: a mark that
        # came first is seen below.
        tracked = self.running.untrack_all(batch)
        if slot.written_off:
            log.warning("%s: its thread returned after its time limit; the slot serves again", slot)
            self.running.written_back()
        if slot.limited:
            # Past its hard limit: every job ends as TimeLimitExceeded, whatever the handler did.
            log.info("%s ended past its time limit's grace (it %s)", slot,
                     "raised " + type(error).__name__ if error else "returned")
            returned, error = None, TimeLimitExceeded()
        acks: list[Job] = []
        kept: list[tuple[Job, object, int]] = []
        nacks: list[NackTerms] = []
        released = cancelled = 0
        for job, is_tracked, outcome in zip(batch, tracked, outcomes_of(returned, error, len(batch))):
            if not is_tracked:
                released += 1  # released at shutdown after the grace period: another worker may run it
            elif job.cancelled.is_set():
                cancelled += 1  # its end is decided already: an ack or nack would change nothing
            elif isinstance(outcome, BaseException):
                nacks.append(self.terms(slot, job, outcome))
            else:
                keep = self.endings.result_to_keep(outcome)
                if keep is None:
                    acks.append(job)
                else:
                    kept.append((job, *keep))
        if released:
            log.warning("%s: %d jobs finished after their leases were released at shutdown", slot, released)
        if cancelled:
            log.info("%s: %d cancelled jobs (or whose lease was lost) neither acked nor nacked", slot, cancelled)
        self.crash.at("before_ack")
        if kept:
            nacks += self.ack_results(queue, slot, kept)
        if nacks:
            self.nack(queue, slot, nacks)
        return self.ack(queue, slot, acks, size, may_lease)

    def terms(self, slot: Slot, job: Job, error: BaseException) -> NackTerms:
        text, delay_ms, final = nack_terms(error, slot, job)
        if not final:
            log.info("%s: job %s attempt %d/%d failed: %s", slot, job.id, job.attempt, job.max_attempts, text)
        return NackTerms(job, text, delay_ms, final)

    def nack(self, queue: Queue, slot: Slot, nacks: list[NackTerms]) -> None:
        base, cap = self.endings.backoff_base_ms, self.endings.backoff_cap_ms
        answers = self.retrying(lambda: nack_all(queue, nacks, backoff_base_ms=base, backoff_cap_ms=cap))
        for terms, nacked in zip(nacks, answers):
            if nacked.state == "dead":
                log.warning("%s: job %s is dead after %d attempts: %s", slot, terms.job.id, terms.job.attempt, terms.error)
            elif not nacked.outcome:
                log.warning("%s: the nack of job %s found the lease %s", slot, terms.job.id, nacked.outcome.value)
            elif nacked.state == "scheduled":
                self.running.note_retry(nacked.at_ms)

    def ack_results(self, queue: Queue, slot: Slot, kept: list[tuple[Job, object, int]]) -> list[NackTerms]:
        """Ack the jobs whose results are kept, with their results; the nacks of those
        whose result cannot be stored (as for one job: it fails, dead at once, since a
        retry would only make the same result again)."""
        calls: dict[int, list[list[tuple[Job, object]]]] = {}  # ttl -> calls of (job, value)
        sizes: dict[int, int] = {}
        unstorable: list[NackTerms] = []
        for job, value, ttl_ms in kept:
            try:
                size = len(encode_result(value))
            except InvalidArgument as exc:
                unstorable.append(self.terms(slot, job, Fail(f"the result cannot be stored: {exc}")))
                continue
            chunks = calls.setdefault(ttl_ms, [[]])
            if chunks[-1] and sizes.get(ttl_ms, 0) + size > RESULT_CALL_BYTES:
                chunks.append([])
                sizes[ttl_ms] = 0
            chunks[-1].append((job, value))
            sizes[ttl_ms] = sizes.get(ttl_ms, 0) + size
        for ttl_ms, chunks in calls.items():
            for chunk in chunks:
                self.ack_result_call(queue, slot, chunk, ttl_ms)
        return unstorable

    def ack_result_call(self, queue: Queue, slot: Slot, chunk: list[tuple[Job, object]], ttl_ms: int) -> None:
        jobs, values = [job for job, _ in chunk], [value for _, value in chunk]
        outcomes = self.retrying(
            lambda: queue.ack_result_many(jobs, values, result_ttl_ms=ttl_ms, max_results=self.max_results)
        )
        log_acks(slot, jobs, outcomes)

    def ack(self, queue: Queue, slot: Slot, acks: list[Job], size: int, may_lease: bool) -> list[Job]:
        """Ack ``acks`` in one call; for a slot of the first queue, the same ``lease``
        call leases its next batch. The jobs leased (tracked), if any."""
        wants = (
            may_lease and queue in self.first_group and not self.control.stopping.is_set()
            and not self.control.leasing_paused.is_set() and self.registration.confirmed()
        )
        if wants:
            call = secrets.token_hex(8)  # the same token on every retry: one effect
            leased = self.retrying(lambda: queue.lease_call(ack=acks, count=size, lease_ms=self.lease_ms, call=call))
            log_acks(slot, acks, leased.acks)
            if leased.jobs:
                self.running.track_all(leased.jobs)
            return leased.jobs
        if acks:
            log_acks(slot, acks, self.retrying(lambda: queue.ack_many(acks)))
        return []


def log_acks(slot: Slot, jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> None:
    for job, outcome in zip(jobs, outcomes):
        if not outcome:
            log.warning("%s: job %s finished but its lease was lost (%s): it may run again", slot, job.id,
                        outcome.value)
