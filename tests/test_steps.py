"""Durable steps in the engine (lua/step.lua, park.lua, signal.lua, steps.lua): a step is
committed once, only under the job's current lease; a sleep or a wait ends the lease
without using an attempt; a signal is kept for its wait and wakes a job parked for it;
every ending of a job deletes its step data. On both drivers, fakeredis, a real
redis-server and a Redis Cluster."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import all_keys, dump_all

from pyqueue import InvalidArgument, NewJob, Outcome, Queue
from pyqueue.protocol.verbs.steps import MAX_STEP_ENTRIES, TIMED_OUT, Park

ASYNC_TOO = True
ON_CLUSTER = True
T0 = 1_000_000
LEASE = 10_000


def one(q: Queue, now: int, **kwargs: Any) -> Any:
    (job,) = q.lease(lease_ms=LEASE, now_ms=now, **kwargs)
    return job


def test_a_step_is_committed_once_under_the_current_lease_and_extends_it(q: Queue) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    job = one(q, T0)
    committed = q.step(job, "charge", b'j{"id": 7}', lease_ms=LEASE, now_ms=T0 + 5)
    assert (committed.status, committed.deadline_ms) == ("ok", T0 + 5 + LEASE)
    again = q.step(job, "charge", b"jsomething else", lease_ms=LEASE, now_ms=T0 + 6)
    assert (again.status, again.current) == ("exists", True)
    found = q.steps("a", now_ms=T0 + 7)
    assert (found.now_ms, found.results) == (T0 + 7, {"charge": b'j{"id": 7}'})
    # The lease runs out and the job is leased again: the zombie commits nothing, the
    # new run finds the step.
    assert q.get("a", now_ms=T0 + 6).deadline_ms == T0 + 6 + LEASE
    later = one(q, T0 + 6 + LEASE)
    assert later.attempt == 2
    zombie = q.step(job, "ship", b"jzombie", lease_ms=LEASE, now_ms=T0 + 7 + LEASE)
    assert (zombie.status, zombie.deadline_ms, zombie.current) == ("stale", -1, False)
    assert q.steps("a").results == {"charge": b'j{"id": 7}'}
    assert q.step(later, "ship", b"jtrack-1", lease_ms=LEASE, now_ms=T0 + 8 + LEASE).status == "ok"
    assert list(q.steps("a").results) == ["charge", "ship"]


def test_a_sleep_parks_the_job_without_using_an_attempt_and_returns_once_its_time_came(q: Queue) -> None:
    q.enqueue(b"x", job_id="a", max_attempts=2, now_ms=T0)
    job = one(q, T0)
    parked = q.park(job, "sleep", "cool_down", 60_000, lease_ms=LEASE, now_ms=T0 + 10)
    assert (parked.status, parked.at_ms) == ("parked", T0 + 60_010)
    st = q.stats(now_ms=T0 + 10)
    assert (st.leased, st.scheduled, st.parked, st.nacked, st.acked, st.waiting) == (0, 1, 1, 0, 0, 0)
    assert q.get("a", now_ms=T0 + 10).state == "scheduled"
    assert q.lease(now_ms=T0 + 60_009) == []
    woken = one(q, T0 + 60_010)
    assert (woken.id, woken.attempt) == ("a", 1)  # the sleep used no attempt
    assert q.park(job, "sleep", "cool_down", 60_000, lease_ms=LEASE, now_ms=T0 + 60_011).status == "stale"
    awake = q.park(woken, "sleep", "cool_down", 60_000, lease_ms=LEASE, now_ms=T0 + 60_011)
    assert (awake.status, awake.at_ms) == ("awake", T0 + 60_011 + LEASE)
    assert q.steps("a").parks == {"cool_down": Park("sleep", T0 + 60_010)}
    assert q.ack(woken) is Outcome.OK
    assert q.stats(now_ms=T0 + 60_012).acked == 1


def test_a_job_made_due_early_sleeps_again_for_what_is_left(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    q.park(one(q, T0), "sleep", "nap", 10_000, lease_ms=LEASE, now_ms=T0)
    r.zadd(q.spec.keys.scheduled, {"a": T0 + 100})  # made due early (as a "run now" would)
    early = one(q, T0 + 100)
    again = q.park(early, "sleep", "nap", 10_000, lease_ms=LEASE, now_ms=T0 + 100)
    assert (again.status, again.at_ms) == ("parked", T0 + 10_000)  # the first sleep's end, kept
    assert q.steps("a").parks == {"nap": Park("sleep", T0 + 10_000)}
    assert q.park(one(q, T0 + 10_000), "sleep", "nap", 10_000, lease_ms=LEASE, now_ms=T0 + 10_000).status == "awake"


def test_a_signal_sent_before_the_wait_is_taken_at_once_and_committed(q: Queue) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    assert q.signal("a", "approved", b'j{"by": "ops"}', now_ms=T0 + 1).status == "kept"
    job = one(q, T0 + 2)
    taken = q.park(job, "wait", "approved", 86_400_000, lease_ms=LEASE, now_ms=T0 + 3)
    assert (taken.status, taken.value, taken.at_ms) == ("signalled", b'j{"by": "ops"}', T0 + 3 + LEASE)
    found = q.steps("a")
    assert found.results == {"approved": b'j{"by": "ops"}'} and found.signals == {"approved": b'j{"by": "ops"}'}
    again = q.park(job, "wait", "approved", 5, lease_ms=LEASE, now_ms=T0 + 4)
    assert (again.status, again.value) == ("done", b'j{"by": "ops"}')
    assert q.signal("a", "approved", b"jagain").status == "duplicate"


def test_a_waiting_job_is_listed_and_a_signal_makes_it_due_at_once(q: Queue) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    job = one(q, T0)
    parked = q.park(job, "wait", "approved", 3_600_000, lease_ms=LEASE, now_ms=T0 + 5)
    assert (parked.status, parked.at_ms) == ("parked", T0 + 3_600_005)
    info = q.get("a", now_ms=T0 + 6)
    assert (info.state, info.due_ms, info.attempts_made) == ("waiting", T0 + 3_600_005, 0)
    st = q.stats(now_ms=T0 + 6)
    assert (st.waiting, st.scheduled, st.parked, st.leased) == (1, 1, 1, 0)
    assert q.steps("a").parks == {"approved": Park("wait", T0 + 3_600_005)}
    assert q.lease(now_ms=T0 + 7) == []
    assert q.signal("a", "other", b"jx", now_ms=T0 + 8).status == "kept"  # another name wakes nothing
    assert q.lease(now_ms=T0 + 9) == []
    assert q.signal("a", "approved", b"jyes", now_ms=T0 + 10).status == "woke"
    assert q.stats(now_ms=T0 + 10).waiting == 0
    again = one(q, T0 + 10)
    assert (again.id, again.attempt) == ("a", 1)
    taken = q.park(again, "wait", "approved", 3_600_000, lease_ms=LEASE, now_ms=T0 + 11)
    assert (taken.status, taken.value) == ("signalled", b"jyes")


def test_a_wait_that_times_out_is_committed_so_and_a_late_signal_is_refused(q: Queue) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    q.park(one(q, T0), "wait", "approved", 1_000, lease_ms=LEASE, now_ms=T0)
    assert q.stats(now_ms=T0 + 999).waiting == 1
    assert q.stats(now_ms=T0 + 1_000).waiting == 0  # its timeout has passed
    job = one(q, T0 + 1_000)
    timed_out = q.park(job, "wait", "approved", 1_000, lease_ms=LEASE, now_ms=T0 + 1_001)
    assert (timed_out.status, timed_out.value) == ("timeout", b"")
    assert q.steps("a").results == {"approved": TIMED_OUT}
    assert q.park(job, "wait", "approved", 1_000, lease_ms=LEASE, now_ms=T0 + 1_002).value == TIMED_OUT
    assert q.signal("a", "approved", b"jtoo late").status == "closed"


def test_signals_for_jobs_that_cannot_take_them_are_refused_and_write_nothing(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="dies", max_attempts=1, now_ms=T0)
    q.nack(one(q, T0), "boom", now_ms=T0)
    q.enqueue(b"x", job_id="done", now_ms=T0)
    q.ack(one(q, T0))
    before = dump_all(r)
    assert q.signal("never", "go", b"").status == "unknown"
    assert q.signal("done", "go", b"").status == "unknown"
    assert q.signal("dies", "go", b"").status == "dead"
    assert dump_all(r) == before


@pytest.mark.parametrize("ending", ["ack", "ack_result", "ack_and_lease", "cancel", "dead_purge"])
def test_every_ending_of_a_job_deletes_its_step_data(q: Queue, r: redis.Redis, ending: str) -> None:
    q.enqueue(b"plain", job_id="plain", now_ms=T0)
    q.ack(one(q, T0))
    baseline = set(all_keys(r))
    q.enqueue_many([NewJob(b"x", job_id="a", max_attempts=1), NewJob(b"y", job_id="next")], now_ms=T0)
    job = one(q, T0)
    q.step(job, "one", b"j1", lease_ms=LEASE, now_ms=T0)
    q.park(job, "wait", "approved", 10, lease_ms=LEASE, now_ms=T0)  # parked: waiting until T0 + 10
    q.signal("a", "unrelated", b"jz")
    assert q.stats(now_ms=T0 + 1).waiting == 1
    job = q.lease(lease_ms=LEASE, count=2, now_ms=T0 + 10)
    a = next(j for j in job if j.id == "a")
    other = next(j for j in job if j.id == "next")
    assert q.park(a, "wait", "approved", 10, lease_ms=LEASE, now_ms=T0 + 11).status == "timeout"
    if ending == "ack":
        assert q.ack(a) is Outcome.OK
    elif ending == "ack_result":
        assert q.ack_result(a, "done") is Outcome.OK
    elif ending == "ack_and_lease":
        assert q.ack_and_lease(a, count=0)[0] is Outcome.OK
    elif ending == "cancel":
        assert q.cancel("a").state == "leased"
    else:
        assert q.nack(a, "boom", final=True).state == "dead"
        assert q.steps("a").results  # a dead job keeps its steps, for a replay
        assert q.dead_purge(["a"]) == 1
    assert q.steps("a").results == {} and q.steps("a").signals == {}
    q.ack(other)
    left = {k for k in set(all_keys(r)) - baseline if not k.endswith((b":results", b":result_expiry", b":finished"))}
    # The steps hash and the waiting index are gone with the last job's data; the
    # counters keep the `steps` flag and `parked`.
    assert not any(k.endswith((b":steps", b":waiting")) for k in left), left


def test_a_job_keeps_at_most_its_entries_and_the_refusal_writes_nothing(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    job = one(q, T0)
    for i in range(MAX_STEP_ENTRIES):
        q.step(job, f"s{i}", b"", lease_ms=LEASE, now_ms=T0)
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match="1000 steps, parks and signals"):
        q.step(job, "one too many", b"", lease_ms=LEASE, now_ms=T0)
    with pytest.raises(InvalidArgument, match="1000 steps, parks and signals"):
        q.signal("a", "late", b"")
    with pytest.raises(InvalidArgument, match="1000 steps, parks and signals"):
        q.park(job, "sleep", "nap", 5, lease_ms=LEASE, now_ms=T0)
    assert dump_all(r) == before
    assert q.step(job, "s0", b"again", lease_ms=LEASE, now_ms=T0).status == "exists"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda q, job: q.step(job, "", b"", lease_ms=LEASE), "name"),
        (lambda q, job: q.step(job, "a\nb", b"", lease_ms=LEASE), "name"),
        (lambda q, job: q.step(job, "x" * 201, b"", lease_ms=LEASE), "name"),
        (lambda q, job: q.step(job, "ok", "text", lease_ms=LEASE), "bytes"),
        (lambda q, job: q.step(job, "ok", b"x" * 524_289, lease_ms=LEASE), "524288"),
        (lambda q, job: q.step(job, "ok", b"", lease_ms=0), "lease_ms"),
        (lambda q, job: q.step("not a job", "ok", b"", lease_ms=LEASE), "Job from lease"),
        (lambda q, job: q.park(job, "nap", "ok", 5, lease_ms=LEASE), "kind"),
        (lambda q, job: q.park(job, "sleep", "ok", -1, lease_ms=LEASE), "for_ms"),
        (lambda q, job: q.signal("", "ok", b""), "job id"),
        (lambda q, job: q.signal(job.id, "ok", b"x" * 524_289), "524288"),
    ],
)
def test_bad_input_is_refused_before_anything_is_sent(q: Queue, r: redis.Redis, call: Any, match: str) -> None:
    q.enqueue(b"x", job_id="a")
    job = one(q, T0)
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match=match):
        call(q, job)
    assert dump_all(r) == before


def test_a_name_slept_under_cannot_be_waited_for(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    q.park(one(q, T0), "sleep", "pause", 10, lease_ms=LEASE, now_ms=T0)
    job = one(q, T0 + 5 + 10)
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match="pause of job a is a sleep, not a wait"):
        q.park(job, "wait", "pause", 10, lease_ms=LEASE, now_ms=T0 + 20)
    assert dump_all(r) == before


def test_a_parked_job_of_a_group_gives_its_slot_back(q: Queue) -> None:
    q.set_group_limit(1)
    q.enqueue_many([NewJob(b"1", job_id="g1", group="t"), NewJob(b"2", job_id="g2", group="t")], now_ms=T0)
    first = one(q, T0)
    assert q.lease(now_ms=T0) == []  # the group is at its cap
    q.park(first, "sleep", "nap", 60_000, lease_ms=LEASE, now_ms=T0)
    second = one(q, T0)
    assert second.id == "g2"


@pytest.mark.parametrize("ending", ["ack", "ack_and_lease", "ack_result", "cancel", "dead_purge"])
@pytest.mark.parametrize("role", ["steps", "waiting"])
def test_on_a_queue_with_step_data_a_step_key_of_the_wrong_type_is_refused_before_any_write(
    q: Queue, r: redis.Redis, ending: str, role: str
) -> None:
    q.enqueue_many([NewJob(b"x", job_id="a", max_attempts=1), NewJob(b"y", job_id="b")], now_ms=T0)
    a = one(q, T0)
    q.step(a, "one", b"j1", lease_ms=LEASE, now_ms=T0)  # the queue's steps flag is set
    if ending == "dead_purge":
        q.nack(a, "boom", final=True, now_ms=T0)
    key = q.spec.keys.role(role)
    if role == "steps":
        r.delete(key)
    r.set(key, "planted")
    before = dump_all(r)
    with pytest.raises(Exception, match="WRONGTYPE"):
        if ending == "ack":
            q.ack(a)
        elif ending == "ack_and_lease":
            q.ack_and_lease(a)
        elif ending == "ack_result":
            q.ack_result(a, "v")
        elif ending == "cancel":
            q.cancel("a")
        else:
            q.dead_purge(["a"])
    assert dump_all(r) == before


def test_a_signal_payload_that_would_read_as_a_timeout_is_refused(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match="may not be b't'"):
        q.signal("a", "go", b"t")
    assert dump_all(r) == before
