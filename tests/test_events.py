"""A queue's event stream (lua/README.md section 2.5, pyqueue/protocol/verbs/events.py): a queue
opts in with set_events, and every script that changes a job's state appends its events
in the same call; readers read on from the number of the last event they saw, so nothing
is skipped, and learn how many events the bound trimmed before they read them. A queue
that has not opted in writes nothing. On both drivers, fakeredis, a real redis-server
and a Redis Cluster."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import all_keys, dump_all

from pyqueue import Event, EventsSetting, InvalidArgument, NewJob, Outcome, Queue
from helpers import queue_parts


ASYNC_TOO = True
ON_CLUSTER = True
T0 = 1_000_000


def brief(events: list[Event]) -> list[tuple[Any, ...]]:
    """(type, job id, attempt, the other fields) of each event."""
    return [(e.type, e.job_id, e.attempt, dict(e.fields)) for e in events]


def test_a_queue_that_has_not_opted_in_writes_no_event(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("ev")
    q.enqueue_many([NewJob(b"a", job_id="a"), NewJob(b"b", job_id="b", max_attempts=1)])
    a, b = q.lease(count=2)
    q.progress(a, "half")
    q.ack(a)
    q.nack(b, "boom")
    q.enqueue(b"c", job_id="c")
    q.cancel("c")
    assert not [k for k in all_keys(r) if k.endswith(b":events")]
    page = q.events()
    assert (page.events, page.last, page.missed) == ([], 0, 0)


def test_every_transition_writes_its_events_in_the_call_that_makes_it(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("ev")
    assert q.set_events(100) == EventsSetting(previous=0, length=0)
    q.enqueue_many([NewJob(b"a", job_id="a", max_attempts=2), NewJob(b"b", job_id="b"),
                    NewJob(b"c", job_id="c", delay_ms=500)], now_ms=T0)
    q.enqueue(b"a", job_id="a", now_ms=T0)  # a duplicate: no event
    a, b = q.lease(count=2, lease_ms=100, now_ms=T0 + 1)
    assert q.progress(a, '{"n": 1}', now_ms=T0 + 2) is Outcome.OK
    assert q.progress(a, '{"n": 1}', now_ms=T0 + 3) is Outcome.OK  # the same value again: no event
    q.nack(a, "boom", delay_ms=10, now_ms=T0 + 4)
    assert q.release([b], now_ms=T0 + 5) == [Outcome.OK]
    (b,) = q.lease(lease_ms=100, now_ms=T0 + 6)
    assert q.ack(b, now_ms=T0 + 7) is Outcome.OK
    assert q.ack(b, now_ms=T0 + 8) is Outcome.GONE  # fenced: no second event
    (a,) = q.lease(lease_ms=100, now_ms=T0 + 20)  # promoted first (no event), then leased
    q.nack(a, "boom again", now_ms=T0 + 21)  # attempt 2 of 2: dead
    assert q.dead_replay(["a"], now_ms=T0 + 22) == 1
    (a,) = q.lease(lease_ms=100, now_ms=T0 + 23)
    q.promote(now_ms=T0 + 200)  # a's lease expired: reclaimed
    assert q.cancel("c", now_ms=T0 + 201).state == "scheduled"
    page = q.events(since=0)
    assert (page.missed, page.last) == (0, len(page.events))
    assert [e.seq for e in page.events] == list(range(1, len(page.events) + 1))
    leased = {"owner": q.spec.owner}
    assert brief(page.events) == [
        ("enqueued", "a", None, {}),
        ("enqueued", "b", None, {}),
        ("enqueued", "c", None, {"due_ms": str(T0 + 500)}),
        ("leased", "a", 1, {**leased, "deadline_ms": str(T0 + 101)}),
        ("leased", "b", 1, {**leased, "deadline_ms": str(T0 + 101)}),
        ("progress", "a", 1, {"value": '{"n": 1}'}),
        ("retried", "a", 1, {"due_ms": str(T0 + 14), "error": "boom"}),
        ("released", "b", 1, {}),
        ("leased", "b", 1, {**leased, "deadline_ms": str(T0 + 106)}),
        ("acked", "b", 1, {}),
        ("leased", "a", 2, {**leased, "deadline_ms": str(T0 + 120)}),
        ("dead", "a", 2, {"error": "boom again"}),
        ("enqueued", "a", None, {"replayed": "1"}),
        ("leased", "a", 1, {**leased, "deadline_ms": str(T0 + 123)}),
        ("retried", "a", 1, {"due_ms": str(T0 + 200), "error": "lease expired on attempt 1 of 2"}),
        ("cancelled", "c", None, {"state": "scheduled"}),
    ]
    assert [e.at_ms for e in page.events] == [T0, T0, T0, T0 + 1, T0 + 1, T0 + 2, T0 + 4, T0 + 5, T0 + 6, T0 + 7,
                                              T0 + 20, T0 + 21, T0 + 22, T0 + 23, T0 + 200, T0 + 201]


def test_a_lease_that_acks_writes_the_acks_then_the_reclaims_then_the_leases(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("ev")
    q.set_events(100)
    q.enqueue_many([NewJob(b"", job_id=i, max_attempts=1) for i in ("x", "y", "z")], now_ms=T0)
    x, y = q.lease(count=2, lease_ms=10, now_ms=T0)
    since = q.events(since="now").last
    # x is acked by the call; y's lease expired (its only attempt: dead); z is leased.
    leased = q.lease_call(ack=[x], count=1, lease_ms=10, now_ms=T0 + 5).jobs
    assert [j.id for j in leased] == ["z"]
    q.promote(now_ms=T0 + 20)  # reclaims y and z: dead at their only attempt
    assert brief(q.events(since=since).events) == [
        ("acked", "x", 1, {}),
        ("leased", "z", 1, {"owner": q.spec.owner, "deadline_ms": str(T0 + 15)}),
        ("dead", "y", 1, {"error": "lease expired on attempt 1 of 1"}),
        ("dead", "z", 1, {"error": "lease expired on attempt 1 of 1"}),
    ]


def test_the_bound_keeps_the_newest_events_and_a_reader_counts_what_it_missed(
    make_queue: Callable[..., Queue], r: Any
) -> None:
    q = make_queue("ev")
    q.set_events(5)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(12)])
    assert r.xlen(q.spec.keys.events) == 5
    page = q.events(since=3)  # a reader that had read up to event 3
    assert ([e.seq for e in page.events], page.missed, page.last) == ([8, 9, 10, 11, 12], 4, 12)
    oldest = q.events()  # from the oldest kept: nothing is counted as missed
    assert ([e.seq for e in oldest.events], oldest.missed) == ([8, 9, 10, 11, 12], 0)
    # A smaller bound trims now; a larger one keeps more from then on; 0 opts out and
    # keeps the stream for its readers; opting in again continues the numbering.
    assert q.set_events(2) == EventsSetting(previous=5, length=2)
    assert q.set_events(2) == EventsSetting(previous=2, length=2)
    assert q.set_events(0) == EventsSetting(previous=2, length=2)
    q.enqueue(b"", job_id="quiet")
    assert [e.seq for e in q.events().events] == [11, 12]
    assert q.set_events(10) == EventsSetting(previous=0, length=2)
    q.enqueue(b"", job_id="loud")
    assert [(e.seq, e.job_id) for e in q.events(since=12).events] == [(13, "loud")]


def test_pages_read_on_from_their_last_event_miss_nothing(make_queue: Callable[..., Queue]) -> None:
    q = make_queue("ev")
    q.set_events(1000)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(40)])
    seen: list[int] = []
    page = q.events(count=7)
    while page.events:
        seen += [e.seq for e in page.events]
        page = q.events(since=page.last, count=7)
    assert seen == list(range(1, 41)) and page.last == 40
    now = q.events(since="now")
    assert (now.events, now.last) == ([], 40)
    tail = q.recent_events(3)  # the newest, oldest first, to read on from
    assert ([e.seq for e in tail.events], tail.last, tail.missed) == ([38, 39, 40], 40, 0)


def test_a_blocking_read_wakes_for_the_next_event(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("ev")
    q.set_events(100)
    writer = Queue("ev", r)  # another client, as another process would be
    timer = threading.Timer(0.3, lambda: writer.enqueue(b"", job_id="late"))
    timer.start()
    try:
        start = time.monotonic()
        page = q.events(since="now", block_ms=10_000)
        assert [(e.type, e.job_id) for e in page.events] == [("enqueued", "late")]
        assert time.monotonic() - start < 5
    finally:
        timer.cancel()
    start = time.monotonic()
    empty = q.events(since=page.last, block_ms=200)  # nothing comes: an empty page after the wait
    assert empty.events == [] and empty.last == page.last and time.monotonic() - start >= 0.15


def test_bad_input_is_refused_and_changes_nothing(make_queue: Callable[..., Queue], r: Any) -> None:
    q = make_queue("ev")
    q.enqueue(b"", job_id="a")
    before = dump_all(r)
    for bound in (-1, 10_000_001, 1.5, "10", True):
        with pytest.raises(InvalidArgument):
            q.set_events(bound)
    for kwargs in ({"since": -1}, {"since": "later"}, {"since": 1.0}, {"count": 0}, {"count": 1001},
                   {"block_ms": -1}):
        with pytest.raises(InvalidArgument):
            q.events(**kwargs)
    assert dump_all(r) == before


def test_a_partitioned_queue_opts_in_every_partition_and_refuses_one_number_for_all(r: Any) -> None:
    q = Queue("pe", r, partitions=3)
    assert q.set_events(10) == EventsSetting(previous=0, length=0)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(12)])
    per_part = [Queue(name, r).events().events for name in (p.name for p in queue_parts(q))]
    assert sorted(e.job_id for events in per_part for e in events) == sorted(f"j{i}" for i in range(12))
    with pytest.raises(InvalidArgument, match="partitions"):
        q.events()
    with pytest.raises(InvalidArgument, match="partitions"):
        q.recent_events()


#: What a job's event says about where it is: its state as `get` reports it, with READY
#: and SCHEDULED one ("waiting": promotion writes no event).
EVENT_STATE = {"enqueued": "waiting", "retried": "waiting", "released": "waiting", "leased": "leased",
               "acked": "done", "dead": "dead", "cancelled": "done"}
GET_STATE = {"ready": "waiting", "scheduled": "waiting", "leased": "leased", "dead": "dead", "done": "done"}


@pytest.mark.parametrize("seed", range(6))
def test_the_events_of_random_work_tell_each_jobs_state_and_attempts(
    make_queue: Callable[..., Queue], seed: int
) -> None:
    """Fold each job's events: the state they end in is the state `get` reports, every
    lease's attempt is one more than the attempts its job had used, and an ack or a
    progress only ever follows a lease of the same attempt."""
    rng = random.Random(seed)
    q = make_queue("ev")
    q.set_events(100_000)
    now, held, n = T0, [], 0
    for _ in range(120):
        now += rng.randint(0, 30)
        op = rng.choice(["enqueue", "enqueue", "lease", "lease", "ack", "nack", "release", "progress", "cancel",
                         "promote", "replay"])
        if op == "enqueue":
            q.enqueue_many([NewJob(b"", job_id=f"j{n + i}", max_attempts=rng.randint(1, 3),
                                   delay_ms=rng.choice([0, 0, 20])) for i in range(rng.randint(1, 3))], now_ms=now)
            n += 3
        elif op == "lease":
            held += q.lease(count=rng.randint(1, 3), lease_ms=rng.choice([15, 1000]), now_ms=now)
        elif op == "promote":
            q.promote(now_ms=now)
        elif op == "cancel" and n:
            q.cancel(f"j{rng.randrange(n)}", now_ms=now)
        elif op == "replay":
            q.dead_replay(now_ms=now)
        elif held:
            job = held.pop(rng.randrange(len(held)))
            if op == "ack":
                q.ack(job, now_ms=now)
            elif op == "nack":
                q.nack(job, "no", delay_ms=rng.choice([0, 10]), final=rng.random() < 0.2, now_ms=now)
            elif op == "release":
                q.release([job], now_ms=now)
            else:
                q.progress(job, str(now), now_ms=now)
                held.append(job)
    page = q.events(count=1000)
    events = page.events
    while page.events:
        page = q.events(since=page.last, count=1000)
        events += page.events
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    state: dict[str, str] = {}
    used: dict[str, int] = {}  # attempts used up, as the job's record counts them
    running: dict[str, int] = {}  # the attempt of the job's current lease
    for e in events:
        if e.type == "enqueued":
            assert e.job_id not in state or state[e.job_id] in ("dead", "done")
            used[e.job_id] = 0
        elif e.type == "leased":
            assert state[e.job_id] == "waiting" and e.attempt == used[e.job_id] + 1
            running[e.job_id] = e.attempt
        elif e.type in ("acked", "progress", "released"):
            assert state[e.job_id] == "leased" and running[e.job_id] == e.attempt
        elif e.type in ("retried", "dead") and state[e.job_id] == "leased":
            assert running[e.job_id] == e.attempt
            used[e.job_id] = e.attempt
        if e.type != "progress":
            state[e.job_id] = EVENT_STATE[e.type]
    assert state, "the random work wrote no event"
    for job_id, folded in state.items():
        got = q.get(job_id, now_ms=now)
        assert GET_STATE.get(got.state, "done") == folded, (job_id, got.state, folded)
        if folded == "waiting":
            assert got.attempts == used[job_id]
