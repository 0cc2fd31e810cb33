"""Group commit: handlers that finish together are acked, and their replacements leased,
in one ``lease`` call (DESIGN §10).

The worker's **commit loop** (:class:`CommitLoop`, one thread) sends them. A handler
thread whose job succeeded posts it (:meth:`CommitLoop.post`) and goes on at once to the
next job waiting in its executor, without waiting for the ack's answer; the loop takes
every job posted meanwhile, sends one call per queue (lua/lease.lua acks many receipts
and leases many jobs per call; lua/ack.lua when no slot wants a job in its place), and
hands each job a call leased to the executor, in the slot of the job it replaces. So a
busy worker sends one call per round trip whatever its concurrency, and its handler
threads never wait on Redis for an ack. A post that finds the loop asleep, nothing else
waiting, and no other handler running a job (concurrency 1, or a worker that is not
saturated) is sent by the posting thread itself: two hand-offs between threads would
cost more than the call. A slot stays taken until its job's ack has answered: the
worker's shutdown (which waits for its slots) and a burst run's end wait for every ack.

:class:`GroupCommit` is one queue's half of it, and also serves a caller that waits
for its answer (:meth:`GroupCommit.commit`: the task layer's test drain, which runs
jobs in its own thread with no loop running). If no commit call of the queue is in
flight, it sends one at once with every job that is waiting (a lone caller is never
delayed waiting for company); if one is in flight, it waits, and the jobs that gathered
meanwhile go together in the next call, sent by the first of them.

What a batch promises is what each of its calls promises: every receipt gets its own
outcome (a stale receipt answers STALE and stops nothing else); a call re-sent after a
lost reply carries the same call token, so it has one effect and hands back the jobs
the first run leased. Delivery stays at least once: a job is acked only after its
handler returned, and a worker that dies with acks not yet sent leaves those jobs
leased, to be reclaimed and run again.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from pyqueue.drivers.coalescing import ThreadBatcher
from pyqueue.protocol.core import MAX_BATCH
from pyqueue.protocol.models import Job, Outcome
from pyqueue.drivers.queue import Queue
from pyqueue.worker.shared import Shared

log = logging.getLogger("pyqueue.worker")

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
        #: Calls sent so far, and the jobs they acked (any outcome): the mean batch is
        #: acked / calls.
        self.calls = 0
        self.acked = 0

    def commit(self, job: Job, *, wants_job: bool) -> Answer:
        """Ack ``job`` (its handler succeeded) and, if ``wants_job``, lease one job in
        its place, together with whatever other callers of the queue finish meanwhile;
        wait for the answer. Returns the ack's outcome and the job leased for this
        caller, if any.

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
        self.calls += 1  # (read for figures only; a lost increment between threads is harmless)
        self.acked += len(jobs)
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


class Posted:
    """A finished job posted to the commit loop: its slot (how logs name it), whether
    the slot wants a job in its place, the slot's streak (how many jobs in a row it
    leased for itself), and, for a poster that waits, what the call answered it."""

    __slots__ = ("job", "label", "wants", "streak", "woken", "outcome", "next_job")

    def __init__(self, job: Job, label: object, wants: bool, streak: int, wait: bool) -> None:
        self.job, self.label, self.wants, self.streak = job, label, wants, streak
        #: A lock made held, released once the call answered (None: nobody waits).
        self.woken: threading.Lock | None = None
        if wait:
            self.woken = threading.Lock()
            self.woken.acquire()
        self.outcome: Outcome | None = None  # None: never sent (killed), or the call failed
        self.next_job: Job | None = None


class CommitLoop:
    """The worker's commit loop (see the module docstring): one thread sends the acks of
    the jobs its handler threads post, one call per queue per round.

    Args:
        commits: the group commit of each queue, by name.
        give_back: gives ``n`` handler slots back (those whose jobs' acks answered and
            that got no job in their place).
        lone: whether the posting handler is the only one running a job.
        killed: once set, nothing more is sent (a killed process acks nothing).

    ``hand_out(job, streak)`` must be set before :meth:`start`: it runs ``job`` in the
    slot of the one it replaces (the executor that runs the loop sets its ``resume``).
    """

    def __init__(
        self, commits: Mapping[str, GroupCommit], *, give_back: Callable[[int], None], lone: Callable[[], bool],
        killed: threading.Event,
    ) -> None:
        self.commits = commits
        self.give_back = give_back
        self.lone = lone
        self.killed = killed
        self.hand_out: Callable[[Job, int], None] | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, list[Posted]] = {}
        # The loop sleeps on a lock made held, released once by whoever posts to an idle
        # loop (cheaper than a Condition, whose every wait makes a lock of its own).
        self._wake = threading.Lock()
        self._wake.acquire()
        self._idle = False  # the loop's thread sleeps (no call of its own in flight)
        self._inline = False  # a poster's own call is in flight
        self._closed = False
        self._thread: threading.Thread | None = None

    @classmethod
    def for_worker(cls, queues: Sequence[Queue], lease_ms: int, shared: Shared) -> CommitLoop:
        """The commit loop of a worker leasing from ``queues``: a group commit per queue,
        tracking the jobs it leases, and the worker's slots (``shared.running``)."""
        running = shared.running
        commits = {q.name: GroupCommit(q, lease_ms, shared.retrying, running.track_all) for q in queues}
        return cls(commits, give_back=running.give_back, lone=running.lone, killed=shared.control.killed)

    @property
    def running(self) -> bool:
        """Whether the loop's thread has started (and not been closed)."""
        return self._thread is not None and not self._closed

    def start(self) -> None:
        assert self.hand_out is not None, "CommitLoop.hand_out is set when the executor is made"
        self._thread = threading.Thread(target=self._run, name="pyqueue-commit", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Send what was posted, then end the thread (the worker is done with it). Acks
        that come later are sent by their own threads (:class:`Endings` asks
        :attr:`running`)."""
        with self._lock:
            self._closed = True
            self._wake_if_idle()

    def post(self, job: Job, label: object, *, wants: bool, streak: int, wait: bool = False) -> Posted:
        """Ack ``job`` in the next call to its queue and, if ``wants``, lease a job in its
        place (handed out with ``streak + 1``). The slot passes to the loop: it gives it
        back, or hands it the new job. Returns at once, unless ``wait``: then once the
        call answered, with ``outcome`` and ``next_job`` set and the slot left to the
        caller (``next_job`` is the caller's to run or hand out)."""
        posted = Posted(job, label, wants, streak, wait)
        with self._lock:
            # A lone handler (no other slot runs a job), with nobody sending and nothing
            # waiting: the call goes from this thread, as two hand-offs between threads
            # would cost more than the call saves. With other handlers running, the
            # loop's call takes theirs too, and this thread goes on.
            inline = self._closed or (
                self._idle and not self._inline and not self._pending and self.lone()
            )
            if inline:
                self._inline = True
            else:
                pending = self._pending.get(job.queue)
                if pending is None:
                    self._pending[job.queue] = [posted]
                else:
                    pending.append(posted)
                self._wake_if_idle()
        if inline:
            try:
                self._send(self.commits[job.queue], [posted])
            finally:
                with self._lock:
                    self._inline = False
                    if self._pending:
                        self._wake_if_idle()
        if posted.woken is not None:
            posted.woken.acquire()
        return posted

    def _wake_if_idle(self) -> None:  # under _lock
        if self._idle:
            self._idle = False
            self._wake.release()

    def _run(self) -> None:
        while True:
            with self._lock:
                batches, self._pending = self._pending, {}
                if not batches:
                    if self._closed:
                        return
                    self._idle = True
            if not batches:
                self._wake.acquire()  # until a post (or the close) releases it
                continue
            for name, posted in batches.items():
                for start in range(0, len(posted), MAX_BATCH):
                    self._send(self.commits[name], posted[start : start + MAX_BATCH])

    def _send(self, commit: GroupCommit, batch: list[Posted]) -> None:
        answers: list[Answer] = []
        if not self.killed.is_set():
            try:
                answers = commit.send([(p.job, p.wants) for p in batch])
            except Exception:
                # The retry policy gave up (the worker is past its grace period) or a bug:
                # the jobs stay leased until their leases expire, and run again elsewhere.
                log.exception("%d acks of %s were not sent: those jobs may run again", len(batch), commit.queue.name)
        assert self.hand_out is not None
        freed = 0
        for i, posted in enumerate(batch):
            outcome, next_job = answers[i] if answers else (None, None)
            if outcome is not None and not outcome:
                log.warning("%s finished but its lease was lost (%s): it may run again", posted.label, outcome.value)
            if posted.woken is not None:
                posted.outcome, posted.next_job = outcome, next_job
                posted.woken.release()
            elif next_job is not None:
                self.hand_out(next_job, posted.streak + 1)
            else:
                freed += 1
        if freed:
            self.give_back(freed)
