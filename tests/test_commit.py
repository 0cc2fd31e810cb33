"""Group commit (pyqueue/worker/commit.py): its invariants, on fakeredis and a real server.

* handlers that finish while a call is in flight share the next call, and each gets its
  own outcome and at most one job of its own;
* a lone handler is not held back: its call goes out at once;
* a batch whose reply is lost is sent again with the same token and has one effect;
* a stale receipt in a batch answers STALE and stops none of the others.

The commit loop (the worker's sender of group commits):

* a handler that posts its ack goes on at once, while the loop's call is in flight, and
  the acks posted meanwhile go together in the loop's next call;
* a slot is given back only once its job's ack answered; a job leased in its place is
  handed out in that slot, its streak counted on;
* a lone handler sends its own call, from its own thread;
* a poster that waits (a flow step's) gets its outcome and its replacement itself;
* a killed worker sends nothing more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pyqueue import Job, Leased, NewJob, Outcome, OutcomeUnknown, Queue
from pyqueue.worker.commit import CommitLoop, GroupCommit

T = TypeVar("T")
T0 = 1_000_000


def retry_forever(call: Callable[[], T]) -> T:
    """The worker's policy, without the backoff: send the same call again."""
    while True:
        try:
            return call()
        except OutcomeUnknown:
            continue


def test_a_lone_handler_is_committed_at_once_with_its_replacement(q: Queue) -> None:
    q.enqueue_many([b"a", b"b"])
    (job,) = q.lease()
    tracked: list[Job] = []
    commit = GroupCommit(q, 30_000, retry_forever, tracked.extend)
    outcome, next_job = commit.commit(job, wants_job=True)
    assert outcome is Outcome.OK and next_job is not None and next_job.payload == b"b"
    assert tracked == [next_job] and commit.calls == 1


def test_handlers_that_finish_during_a_call_share_the_next_one(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(16)])
    first = q.lease(count=8)
    gate = threading.Event()
    slow = SlowFirstCall(q, gate)
    commit = GroupCommit(slow, 30_000, retry_forever, lambda jobs: None)  # type: ignore[arg-type]
    answers: dict[str, tuple[Outcome, Job | None]] = {}

    def finish(job: Job) -> None:
        answers[job.id] = commit.commit(job, wants_job=True)

    threads = [threading.Thread(target=finish, args=(job,)) for job in first]
    threads[0].start()
    assert slow.entered.wait(5)  # the first call is in flight ...
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 5
    while len(commit._batcher.state.waiting) < 7 and time.monotonic() < deadline:  # ... while the rest finish
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(5)
    assert commit.calls == 2 and commit.acked == 8  # one call for the first, one for the seven
    assert all(outcome is Outcome.OK for outcome, _ in answers.values())
    replacements = [j.id for _, j in answers.values() if j is not None]
    assert len(replacements) == len(set(replacements)) == 8  # one job each, none twice
    assert q.stats().acked == 8 and q.stats().leased == 8


def test_a_batch_whose_reply_is_lost_is_sent_again_and_has_one_effect(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(6)])
    jobs = q.lease(count=3)
    lossy = LoseFirstReply(q)
    commit = GroupCommit(lossy, 30_000, retry_forever, lambda leased: None)  # type: ignore[arg-type]
    answers = commit.send([(job, True) for job in jobs])
    assert lossy.sent == 2  # sent, reply lost, sent again with the same token
    stats = q.stats()
    assert stats.acked == 3 and stats.leased_total == 6 and stats.leased == 3 and stats.ready == 0
    # The replay hands back the first run's jobs: the ones the server holds leased.
    assert sorted(j.id for _, j in answers if j) == sorted(j.id for j in lossy.first_jobs)


def test_a_stale_receipt_in_a_batch_does_not_stop_the_others(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="late")], now_ms=T0)
    (late,) = q.lease(lease_ms=10, now_ms=T0)
    q.lease(now_ms=T0 + 100)  # another lease reclaims 'late' after its deadline
    q.enqueue_many([NewJob(b"", job_id=f"ok{i}") for i in range(3)], now_ms=T0 + 100)
    fresh = q.lease(count=3, now_ms=T0 + 100)
    commit = GroupCommit(q, 30_000, retry_forever, lambda leased: None)
    answers = commit.send([(job, True) for job in [late, *fresh]])
    assert [outcome for outcome, _ in answers] == [Outcome.STALE, Outcome.OK, Outcome.OK, Outcome.OK]


class SlowFirstCall:
    """A queue whose first lease call waits for ``gate`` once it has been sent."""

    def __init__(self, q: Queue, gate: threading.Event) -> None:
        self.q, self.gate, self.entered, self.calls = q, gate, threading.Event(), 0

    def lease_call(self, **kwargs: Any) -> Leased:
        self.calls += 1
        leased = self.q.lease_call(**kwargs)
        if self.calls == 1:
            self.entered.set()
            self.gate.wait(5)
        return leased


class LoseFirstReply:
    """A queue whose first lease call runs on the server but whose reply is lost."""

    def __init__(self, q: Queue) -> None:
        self.q, self.sent, self.first_jobs = q, 0, []  # type: ignore[var-annotated]

    def lease_call(self, **kwargs: Any) -> Leased:
        self.sent += 1
        leased = self.q.lease_call(**kwargs)
        if self.sent == 1:
            self.first_jobs = leased.jobs
            raise OutcomeUnknown("reply lost (simulated)")
        return leased


class Gated:
    """A queue whose calls wait for ``gate`` once sent (each sets ``entered``), and that
    records the thread each call was sent from."""

    def __init__(self, q: Queue) -> None:
        self.q, self.gate, self.entered = q, threading.Event(), threading.Event()
        self.name = q.name
        self.threads: list[int] = []

    def _sent(self) -> None:
        self.threads.append(threading.get_ident())
        self.entered.set()
        assert self.gate.wait(5)

    def lease_call(self, **kwargs: Any) -> Leased:
        leased = self.q.lease_call(**kwargs)
        self._sent()
        return leased

    def ack_many(self, jobs: list[Job]) -> list[Outcome]:
        outcomes = self.q.ack_many(jobs)
        self._sent()
        return outcomes


class LoopHarness:
    """A CommitLoop over one gated queue, recording what it gives back and hands out."""

    def __init__(self, q: Queue, *, lone: bool = False, open_gate: bool = False, killed: bool = False) -> None:
        self.gated = Gated(q)
        if open_gate:
            self.gated.gate.set()
        self.commit = GroupCommit(self.gated, 30_000, retry_forever, lambda jobs: None)  # type: ignore[arg-type]
        self.killed = threading.Event()
        if killed:
            self.killed.set()
        self.freed = 0
        self.handed: list[tuple[Job, int]] = []
        self.changed = threading.Condition()
        self.loop = CommitLoop({q.name: self.commit}, give_back=self.give_back, lone=lambda: lone, killed=self.killed)
        self.loop.hand_out = self.hand_out

    def __enter__(self) -> LoopHarness:
        self.loop.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.close()

    def give_back(self, count: int) -> None:
        with self.changed:
            self.freed += count
            self.changed.notify_all()

    def hand_out(self, job: Job, streak: int) -> None:
        with self.changed:
            self.handed.append((job, streak))
            self.changed.notify_all()

    def wait_for(self, done: Callable[[], bool]) -> None:
        with self.changed:
            assert self.changed.wait_for(done, 5)


def test_a_posting_handler_goes_on_while_the_loops_call_is_in_flight(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(16)])
    first = q.lease(count=8)
    with LoopHarness(q) as h:
        h.loop.post(first[0], "first", wants=True, streak=1)  # returns at once: the loop sends it
        assert h.gated.entered.wait(5)
        for job in first[1:]:
            h.loop.post(job, job.id, wants=True, streak=3)  # while the first call waits at the gate
        assert h.handed == [] and h.freed == 0  # no slot moved before its ack answered
        h.gated.gate.set()
        h.wait_for(lambda: len(h.handed) == 8)
    assert h.commit.calls == 2 and h.commit.acked == 8  # one call for the first, one for the seven
    assert sorted(streak for _, streak in h.handed) == [2] + [4] * 7
    assert len({job.id for job, _ in h.handed}) == 8 and h.freed == 0
    assert h.gated.threads[0] != threading.get_ident()  # sent by the loop's thread
    assert q.stats().acked == 8 and q.stats().leased == 8


def test_a_slot_whose_ack_gets_no_job_is_given_back_once_the_ack_answered(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(2)])
    jobs = q.lease(count=2)
    with LoopHarness(q) as h:
        h.loop.post(jobs[0], "a", wants=False, streak=1)
        assert h.gated.entered.wait(5)
        h.loop.post(jobs[1], "b", wants=True, streak=1)  # wants one, none is ready
        time.sleep(0.05)
        assert h.freed == 0  # the acks are in flight: the slots stay taken
        h.gated.gate.set()
        h.wait_for(lambda: h.freed == 2)
    assert h.handed == [] and q.stats().acked == 2


def test_a_lone_handler_sends_its_own_call_from_its_own_thread(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(2)])
    (job,) = q.lease()
    with LoopHarness(q, lone=True, open_gate=True) as h:
        time.sleep(0.05)  # the loop's thread is asleep: nothing was posted
        h.loop.post(job, "lone", wants=True, streak=1)
        # Returned only after its call answered, sent from this thread.
        assert h.gated.threads == [threading.get_ident()] and [j.id for j, _ in h.handed] == ["j1"]
    assert q.stats().acked == 1


def test_a_poster_that_waits_gets_its_outcome_and_its_replacement(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(2)])
    (job,) = q.lease()
    with LoopHarness(q, open_gate=True) as h:
        posted = h.loop.post(job, "waits", wants=True, streak=1, wait=True)
    assert posted.outcome is Outcome.OK and posted.next_job is not None and posted.next_job.id == "j1"
    assert h.handed == [] and h.freed == 0  # the replacement and the slot are the poster's


def test_a_killed_worker_sends_no_ack_and_frees_its_slots(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="j0")])
    (job,) = q.lease()
    with LoopHarness(q, open_gate=True, killed=True) as h:
        h.loop.post(job, "killed", wants=True, streak=1)
        h.wait_for(lambda: h.freed == 1)
    assert h.gated.threads == [] and q.stats().acked == 0 and q.stats().leased == 1
