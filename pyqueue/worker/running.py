"""What a worker holds right now: its handler slots (how many are free) and the jobs it
leased that have not ended. The one piece of state the parts of a worker share.

Who touches it, from which thread: the fetch loop takes free slots and tracks the jobs it
leased; the handler threads untrack jobs and give their slot back; the commit loop tracks
the jobs it leases in their place (or gives the slots back once their acks answered);
the heartbeat reads the jobs to extend their leases and the slots to enforce time
limits; the shutdown takes what is left.

Two locks, as before the split: ``slots`` (a Condition) guards the free count, the
written-off count and the latest retry due time, and is what the fetch loop and the
shutdown wait on; ``lock`` guards the two maps, and is taken on every job twice (track,
untrack), never while waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from pyqueue.protocol.models import Job
from pyqueue.ops.service import RunningJob
from pyqueue.worker.slots import LimitEnding, Slot


class Running:
    """The slots and jobs of one worker (see the module docstring). Thread-safe."""

    def __init__(self, capacity: int, auto_prefetch: int = 0) -> None:
        #: Slots now: one per handler thread, and one per job the worker prefetches (the
        #: fixed prefetch, plus ``auto_prefetch`` while the pace has it on).
        self.capacity = capacity
        self.slots = threading.Condition()
        #: Slots not holding a job; below 0 while the pace takes its prefetch back and
        #: more jobs are held than there are slots (an ending job then leases none).
        self.free = capacity
        self.pace = Pace(self, auto_prefetch)
        self.lock = threading.Lock()
        #: receipt -> job, for the heartbeat's extend and the shutdown's release.
        self.jobs: dict[str, Job] = {}
        #: receipt -> its slot, for time limits.
        self.slots_running: dict[str, Slot] = {}
        #: Handler slots written off: their thread did not stop at a job's time limit.
        self.written_off = 0
        self.written_off_total = 0
        #: The latest due time of a retry this worker scheduled (a burst run waits for it).
        self.retry_due_ms = -1
        #: Jobs this worker ended (acked, nacked, released or ended at their time limit):
        #: what a supervised child's ``--max-jobs-per-child`` counts.
        self.ended = 0
        #: Set when ``ended`` reaches ``max_jobs`` (0: never): see :meth:`limit_jobs`.
        self.max_jobs = 0
        self.max_jobs_reached: threading.Event | None = None

    # -- slots (under `slots`) ------------------------------------------------------

    def wait_for_free(self, stopping: threading.Event) -> int:
        """Wait until a slot is free (or a stop); how many are."""
        with self.slots:
            while self.free <= 0 and not stopping.is_set():
                self.slots.wait(1.0)
            return max(0, self.free)

    def take(self, count: int) -> None:
        with self.slots:
            self.free -= count

    def give_back(self, count: int = 1) -> None:
        """Handler slots are free again (their jobs ended; for those the commit loop
        acked, once the acks answered)."""
        with self.slots:
            self.free += count
            self.slots.notify_all()

    def lone(self) -> bool:
        """Whether at most one slot runs a job (asked by a handler about to end its own;
        read without the lock: a hint, never a decision of correctness)."""
        return self.free + self.written_off >= self.capacity - 1

    def shrinking(self) -> bool:
        """Whether more jobs are held than there are slots (the pace took its prefetch
        back): a job ending now leases none in its place. Read without the lock: a hint."""
        return self.free < 0

    def resize(self, delta: int) -> None:
        """Add ``delta`` slots (negative: take them back as the jobs in them end)."""
        with self.slots:
            self.capacity += delta
            self.free += delta
            self.slots.notify_all()

    def wake(self) -> None:
        """Wake whoever waits on the slots (a stop was asked)."""
        with self.slots:
            self.slots.notify_all()

    def idle_or_wait(self, timeout: float) -> bool:
        """Whether no handler runs; if one does, wait up to ``timeout`` for a change."""
        with self.slots:
            # A written-off slot's thread is stuck past its hard time limit: it runs
            # nothing this worker waits for (the shutdown ends its job): idle.
            idle = self.free + self.written_off >= self.capacity
            if not idle:
                self.slots.wait(timeout)
            return idle

    def wait_idle(self, deadline: float) -> None:
        """Wait until no handler runs, or the monotonic ``deadline``."""
        with self.slots:
            # Written-off slots are not waited for: their stuck threads end with the
            # process, and the shutdown ends their jobs (lifecycle.shutdown).
            while self.free + self.written_off < self.capacity and time.monotonic() < deadline:
                self.slots.wait(min(0.1, max(0.0, deadline - time.monotonic())))

    def note_retry(self, at_ms: int) -> None:
        """A job this worker nacked is due again at ``at_ms``: a burst run waits for it."""
        with self.slots:
            self.retry_due_ms = max(self.retry_due_ms, at_ms)

    def write_off(self) -> int:
        """Count a slot written off; how many are left."""
        with self.slots:
            self.written_off += 1
            self.written_off_total += 1
            return self.capacity - self.written_off

    def written_back(self) -> None:
        """A written-off slot's thread returned: the slot serves again."""
        with self.slots:
            self.written_off -= 1

    def limit_jobs(self, max_jobs: int, reached: threading.Event) -> None:
        """Set ``reached`` as the ``max_jobs``-th job ends here: checked as each job
        ends, before its handler slot may lease another, so a worker that stops leasing
        on it runs ``max_jobs`` jobs plus those it had leased, or was leasing (a lease
        call decided just before), when the ``max_jobs``-th ended."""
        self.max_jobs, self.max_jobs_reached = max_jobs, reached

    def _count_ended(self) -> None:  # under `lock`
        self.ended += 1
        if self.ended == self.max_jobs and self.max_jobs_reached is not None:
            self.max_jobs_reached.set()

    # -- jobs (under `lock`) --------------------------------------------------------

    def track_all(self, jobs: list[Job]) -> None:
        with self.lock:
            for job in jobs:
                self.jobs[job.receipt] = job

    def untrack(self, job: Job) -> bool:
        """Whether ``job`` was still this worker's to end (and now is no longer tracked)."""
        with self.lock:
            if self.jobs.pop(job.receipt, None) is None:
                return False
            self._count_ended()
            return True

    def untrack_all(self, jobs: Sequence[Job]) -> list[bool]:
        """:meth:`untrack` of each of a batch's jobs, under one hold of the lock (the one
        the heartbeat's :meth:`mark_limited` takes)."""
        with self.lock:
            out = []
            for job in jobs:
                tracked = self.jobs.pop(job.receipt, None) is not None
                if tracked:
                    self._count_ended()
                out.append(tracked)
            return out

    def report(self, lease_ms: int) -> list[RunningJob]:
        """What this worker runs, as its registration reports it at each renewal
        (``Services.renew(running=)``): each job's lease time and time limit on the
        server clock. A job whose handler has not started yet was leased at its
        deadline minus ``lease_ms`` (the lease's own length); its limit is not known yet."""
        with self.lock:
            jobs = list(self.jobs.items())
            slots = dict(self.slots_running)
        out = []
        for receipt, job in jobs:
            slot = slots.get(receipt)
            leased_ms = slot.leased_at_ms if slot is not None else job.deadline_ms - lease_ms
            limit_ms = None
            if slot is not None and slot.limit_at is not None:
                limit_ms = slot.leased_at_ms + round(slot.limit_s * 1000)
            out.append(RunningJob(job.queue, job.id, leased_ms, limit_ms))
        return out

    def is_tracked(self, job: Job) -> bool:
        with self.lock:
            return job.receipt in self.jobs

    def enter(self, slot: Slot) -> None:
        with self.lock:
            self.slots_running[slot.key] = slot

    def leave(self, slot: Slot) -> None:
        with self.lock:
            self.slots_running.pop(slot.key, None)

    def snapshot(self) -> list[Job]:
        with self.lock:
            return list(self.jobs.values())

    def past_limit(self, now: float) -> list[Slot]:
        """The running slots whose time limit is at or before ``now``."""
        with self.lock:
            return [s for s in self.slots_running.values() if s.limit_at is not None and now >= s.limit_at]

    def mark_limited(self, slot: Slot) -> bool:
        """Mark ``slot`` past its hard limit if a job of it is still tracked, under the
        lock the handler thread untracks with: so either the mark comes first and the
        ending sees it (the job ends as TimeLimitExceeded), or the job had ended, by
        itself. Whether it was marked."""
        with self.lock:
            if not any(job.receipt in self.jobs for job in slot.jobs):
                return False
            slot.limited = True
            return True

    def take_all(self) -> list[tuple[Job, LimitEnding | None]]:
        """Untrack every job (the shutdown ends them): each with the ending it has if its
        slot is past its hard limit (its thread still runs it), else None."""
        with self.lock:
            stuck = {job.receipt: slot for slot in self.slots_running.values() if slot.limited for job in slot.jobs}
            leftover = [(job, stuck[r].ending_for(job) if r in stuck else None) for r, job in self.jobs.items()]
            self.jobs.clear()
            return leftover


class Pace:
    """``prefetch="auto"``, a worker's default: ``extra`` jobs held leased ahead of the
    handler threads while the jobs are short, none while they are not.

    A thread that ends a short job then starts the next at once, from the jobs waiting
    in its executor, instead of waiting for the round trip that acks one job and leases
    the next; and the acks and leases go in fewer, larger calls. That halves the
    worker's CPU per job for jobs of a millisecond or less (bench/bench_tasks.py,
    ``task_prefetch``). For long jobs it would only hold jobs away from other workers,
    so it is off: the mean run time of the jobs ended here (an exponential moving
    average over about the last 16) turns it on under ``ON_BELOW_S`` and off over
    ``OFF_ABOVE_S``. Off, the slots come back as their jobs end, without stopping any.

    What it changes for delivery: how many jobs a kill runs twice. A prefetched job is
    leased and extended like a running one; one that never started is reclaimed and run
    once elsewhere. But a thread that ends a job goes on to the next while that job's
    ack is still on its way, so a worker killed then leaves ``concurrency + extra`` jobs
    that ran (or were running) unacked, to run again, where ``prefetch=0`` leaves at
    most ``concurrency``. That is the price of not waiting for the ack, and why the pace
    stops for jobs long enough that the wait costs them little.

    And for order: as the pace turns on, the fetch loop leases for the new slots while
    the commit loop leases in the place of ended jobs, and the jobs of the two calls may
    start in either order. A worker that must start one queue's jobs strictly in lease
    order runs at concurrency 1 with ``prefetch=0``.
    """

    #: Turned on while the mean run time is under this; off over OFF_ABOVE_S.
    ON_BELOW_S = 0.010
    OFF_ABOVE_S = 0.050
    #: The moving average's weight of the newest run (about the last 16 count).
    WEIGHT = 1 / 16

    def __init__(self, running: Running, extra: int) -> None:
        self.running = running
        self.extra = extra
        self.on = False
        self.mean_s: float | None = None
        self.lock = threading.Lock()

    def ran(self, seconds: float) -> None:
        """A job's handler ran ``seconds`` (the ending handler thread reports it)."""
        if not self.extra:
            return
        with self.lock:
            mean = seconds if self.mean_s is None else self.mean_s + self.WEIGHT * (seconds - self.mean_s)
            self.mean_s = mean
            turn = (not self.on and mean < self.ON_BELOW_S) or (self.on and mean > self.OFF_ABOVE_S)
            if turn:
                self.on = not self.on
        if turn:
            self.running.resize(self.extra if self.on else -self.extra)
