"""Group commit (pyqueue/commit.py): its invariants, on fakeredis and a real server.

* handlers that finish while a call is in flight share the next call, and each gets its
  own outcome and at most one job of its own;
* a lone handler is not held back: its call goes out at once;
* a batch whose reply is lost is sent again with the same token and has one effect;
* a stale receipt in a batch answers STALE and stops none of the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pyqueue import Job, Leased, NewJob, Outcome, OutcomeUnknown, Queue
from pyqueue.commit import GroupCommit

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
