"""How a job's run ends, once its handler returned or raised: the transition it becomes.

* it returned: ``ack`` by group commit (:mod:`pyqueue.worker.commit`): posted to the worker's
  commit loop, which acks it in one call with the jobs of other handlers that finish
  meanwhile and, for the first queue, leases their replacements; the handler thread goes
  on at once. ``ack_result`` when a result is kept (a :class:`~pyqueue.Result`, or any
  value with ``keep_results_ms``), sent from the handler thread;
* it raised :class:`Retry`: ``nack`` after its delay (or the backoff), the attempt counted;
  :class:`Fail`: ``nack`` to the dead letters now; anything else: ``nack`` with the
  backoff, dead at max attempts;
* it returned an awaitable (an ``async def`` handler in a sync worker): ``release``,
  unrun, and the worker stops with exit 78;
* it raised :class:`~pyqueue.worker.slots.Parked` (it parked its job: a durable sleep
  or wait, whose script ended the lease): nothing is sent;
* its end was decided without it (cancelled, lease lost, time limit, released at
  shutdown, or the process was killed): nothing is sent.

Delivery: at least once. If an ack's answer is not OK the lease was lost (expired and
reclaimed, or scrubbed) and the job may run, or have run, again elsewhere.

Runs in the handler thread that ran the job (both for sync and asyncio handlers: the
asyncio executor waits for its task in a handler thread); only a plain ack leaves it,
for the commit loop. :class:`Retry`, :class:`Fail`, :func:`error_text` and
:func:`seconds_to_ms` do no I/O and are shared by every driver and by the task layer.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import traceback
from datetime import timedelta

from pyqueue.worker.commit import CommitLoop
from pyqueue.protocol.core import DEFAULT_RESULT_TTL_MS
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job, Outcome, Result
from pyqueue.drivers.queue import Queue, check_int
from pyqueue.worker.crash import send_and_die
from pyqueue.worker.handler import HandlerSpec
from pyqueue.worker.lifecycle import EXIT_MISCONFIGURED
from pyqueue.worker.settings import Served, WorkerSettings
from pyqueue.worker.shared import Shared
from pyqueue.worker.slots import Parked, Slot, TimeLimitExceeded

log = logging.getLogger("pyqueue.worker")


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


def nack_terms(error: BaseException, slot: Slot | None = None, job: Job | None = None) -> tuple[str, int | None, bool]:
    """How a handler's exception is nacked: (error text, delay_ms, final). :class:`Retry`
    after its delay (None: the backoff), :class:`Fail` to the dead letters now,
    :class:`TimeLimitExceeded` by the policy ``slot``'s limit was set with for ``job``
    (when it was), anything else with the backoff."""
    if isinstance(error, TimeLimitExceeded) and slot is not None and job is not None:
        at_limit = slot.ending_for(job)
        if at_limit is not None:
            return at_limit.error, at_limit.delay_ms, at_limit.final
    if isinstance(error, _Ending):
        return error.error_text(), error.delay_ms if isinstance(error, Retry) else None, isinstance(error, Fail)
    return error_text(error), None, False


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


class Endings:
    """Turns how a handler's run ended into its transition (see the module docstring).

    Args:
        settings: the worker's; read: ``keep_results_ms``, ``max_results``, the backoff.
        served: the worker's queues. A job is ended on the queue of its name; group
            commit leases replacements only from the first queue's (``first_group``),
            so a lower-priority job never overtakes a ready higher-priority one.
        shared: the parts' shared state (:class:`~pyqueue.worker.shared.Shared`).
        commit_loop: sends the acks (and leases the replacements) of the jobs whose
            handlers returned.
        handler_spec: what the handler declares. Its ``job_ended(job, how)``, if any, is
            called once this worker's ack ('ok') or nack ('dead') of a job answered OK,
            so what waits for the job hears of it at once (the task layer's flows; a
            flow check covers a worker that dies first); its errors are logged, never
            the job's. Its ``reports_end(job)``, if any, says whether ``job_ended`` wants
            to hear of ``job`` (without it, of every job): the handler thread of such a
            job waits for its ack's answer to call the hook; the others go on at once.
    """

    def __init__(
        self, settings: WorkerSettings, served: Served, shared: Shared, commit_loop: CommitLoop,
        handler_spec: HandlerSpec = HandlerSpec(),
    ) -> None:
        self.by_name = served.by_name
        self.on_ended = handler_spec.job_ended
        self.reports_end = handler_spec.reports_end
        self.first_group = list(served.first_group)
        self.commit_loop = commit_loop
        self.running = shared.running
        self.control = control = shared.control
        self.registration = shared.registration
        self.crash = shared.crash
        self.retrying = shared.retrying
        self.keep_results_ms = settings.keep_results_ms
        self.max_results = settings.max_results
        self.backoff_base_ms, self.backoff_cap_ms = settings.backoff_base_ms, settings.backoff_cap_ms
        self._killed: threading.Event = control.killed
        self._stopping: threading.Event = control.stopping
        self._paused: threading.Event = control.leasing_paused

    def end(
        self, job: Job, slot: Slot, result: object, error: BaseException | None, *, may_lease: bool, streak: int = 1
    ) -> bool:
        """End the run of ``job``: its handler returned ``result`` or raised ``error``.
        Returns whether the slot passed on to the commit loop (its job's ack was
        posted, or a job leased in its place was handed out): then the caller must not
        give it back. ``may_lease``: the slot wants a job in its place; ``streak``: how
        many jobs in a row it ran so."""
        if self._killed.is_set():
            return False  # a killed process acks nothing
        queue = self.by_name[job.queue]
        label = slot  # logged as str(slot): built only if a line is logged
        # Untracked here, under the lock the heartbeat marks a slot past its hard limit
        # with: a mark that came first is seen below.
        tracked = self.running.untrack(job)
        if slot.written_off:
            log.warning("%s: its thread returned %.1fs after its time limit; the slot serves again", label,
                        time.monotonic() - (slot.limit_at or slot.started))
            self.running.written_back()
        if error is None and (inspect.isawaitable(result) or inspect.isasyncgen(result)):
            self.refuse_awaitable(queue, job, result, tracked)
            return False
        if not tracked:
            # The shutdown released this job after the grace period (or, past its hard
            # limit, nacked it): its receipt is stale, and another worker may run it.
            log.warning("%s finished after its lease was released at shutdown", label)
            return False
        if isinstance(error, Parked):
            # It parked its job (a durable sleep or wait): the lease ended in that call.
            log.info("%s parked until %d (%s): its slot is free", label, error.until_ms, error.name)
            return False
        if job.cancelled.is_set():
            # Cancelled (or its lease lost): its end is decided already; an ack or nack
            # would answer GONE or STALE and change nothing.
            log.info("%s ended as cancelled (its handler %s)", label, "failed" if error else "returned")
            return False
        if slot.limited:
            # Past its hard limit: it ends as TimeLimitExceeded, whatever the handler did.
            log.info("%s ended past its time limit's grace (it %s)", label,
                     "raised " + type(error).__name__ if error else "returned")
            result, error = None, TimeLimitExceeded()
        self.running.pace.ran(time.monotonic() - slot.started)
        keep = self.result_to_keep(result) if error is None else None
        if keep is not None:
            value, ttl_ms = keep
            self.crash.at("before_ack")
            try:
                outcome = self.retrying(
                    lambda: queue.ack_result(job, value, result_ttl_ms=ttl_ms, max_results=self.max_results)
                )
            except InvalidArgument as exc:
                # Refused before anything was sent (not bytes, str or JSON-able, too
                # large, a bad ttl): a result that cannot be stored fails the job, loudly
                # and at once. A retry would run the handler's side effects again only to
                # produce the same unstorable result.
                error = Fail(f"the result cannot be stored: {exc}")
            else:
                log_ack(label, outcome)
                if outcome and self.on_ended is not None:
                    self.ended(job, "ok")
                return False
        if error is None:
            self.crash.at("before_ack")
            if self.crash.armed("ack_sent"):
                send_and_die(queue, job, self.crash)
            # Group commit: acked together with the jobs of other handlers that finish
            # meanwhile, in one call that also leases their replacements.
            loop = self.commit_loop
            wants_job = (
                queue in self.first_group and may_lease and not self._stopping.is_set()
                and not self._paused.is_set() and self.registration.confirmed() and not self.running.shrinking()
            )
            if not loop.running:
                # No loop sends this worker's acks (the task layer's test drain runs jobs
                # in its own thread; a handler that ends as the worker closes): the ack
                # is sent and answered here.
                outcome, _ = loop.commits[queue.name].commit(job, wants_job=False)
                log_ack(label, outcome)
                if outcome and self.on_ended is not None and self.wants_report(job):
                    self.ended(job, "ok")
                return False
            if self.on_ended is None or not self.wants_report(job):
                loop.post(job, label, wants=wants_job, streak=streak)
                return True
            # Its hook is told once the ack answered OK: wait for that here.
            posted = loop.post(job, label, wants=wants_job, streak=streak, wait=True)
            if posted.outcome:
                self.ended(job, "ok")
            if posted.next_job is None:
                return False
            assert loop.hand_out is not None
            loop.hand_out(posted.next_job, streak + 1)
            return True
        self.fail(queue, job, error, slot)
        return False

    def fail(self, queue: Queue, job: Job, error: BaseException, slot: Slot) -> None:
        """Nack a job whose handler raised, on the terms :func:`nack_terms` gives."""
        text, delay_ms, final = nack_terms(error, slot, job)
        if not final:
            log.info("%s attempt %d/%d failed: %s", slot, job.attempt, job.max_attempts, text)
        nacked = self.retrying(
            lambda: queue.nack(
                job, text, delay_ms=delay_ms, final=final,
                backoff_base_ms=self.backoff_base_ms, backoff_cap_ms=self.backoff_cap_ms,
            )
        )
        if nacked.state == "dead":
            log.warning("%s is dead after %d attempts: %s", slot, job.attempt, text)
            if self.on_ended is not None:
                self.ended(job, "dead")
        elif not nacked.outcome:
            log.warning("%s: nack found the lease %s", slot, nacked.outcome.value)
        elif nacked.state == "scheduled":
            self.running.note_retry(nacked.at_ms)

    def wants_report(self, job: Job) -> bool:
        """Whether the handler's ``job_ended`` hook wants to hear of ``job``."""
        return self.reports_end is None or self.reports_end(job)

    def ended(self, job: Job, how: str) -> None:
        """Tell the handler that ``job`` ended ``how`` (``on_ended``)."""
        assert self.on_ended is not None
        self.crash.at("before_report")
        try:
            self.on_ended(job, how)
        except Exception:  # the job's ending is written: the handler's hook is the one that failed
            log.exception("job %s: the handler's job_ended hook failed (a flow check will report it)", job.id)

    def result_to_keep(self, returned: object) -> tuple[object, int] | None:
        """(value, ttl_ms) to store with the ack: a :class:`Result` always, any other
        return value when the worker keeps results; None to ack without one."""
        if isinstance(returned, Result):
            return returned.value, returned.ttl_ms or self.keep_results_ms or DEFAULT_RESULT_TTL_MS
        if self.keep_results_ms is not None:
            return returned, self.keep_results_ms
        return None

    def refuse_awaitable(self, queue: Queue, job: Job, result: object, tracked: bool) -> None:
        """The handler returned a coroutine (or another awaitable) instead of doing the
        work: the job did not run. Give it back unrun (no attempt counted) and stop the
        worker loudly rather than ack work that never happened."""
        close = getattr(result, "close", None)
        if callable(close):
            close()  # no "coroutine was never awaited" warning: we say it louder below
        if tracked:
            self.retrying(lambda: queue.release([job]))
        self.control.stop(
            f"the handler returned {type(result).__name__} for job {job.id}: it is async, and this sync Worker "
            "cannot await it; the job was released unrun. Give the Worker a plain function.",
            EXIT_MISCONFIGURED,
        )


def log_ack(label: object, outcome: Outcome) -> None:
    if not outcome:
        log.warning("%s finished but its lease was lost (%s): it may run again", label, outcome.value)
