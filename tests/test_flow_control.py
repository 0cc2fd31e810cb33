"""Flow control at the edges of a job's life (lua/README.md section 2.7): debounce and
throttle keys decided by enqueue.lua, expiry decided by lease.lua. A debounced key runs
once after a quiet window with its last arguments, and has at most one pending job; a
throttled key adds one job per window; an expired job is never handed out. On both
drivers, fakeredis, a real redis-server and a Redis Cluster."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import dump_all

from pyqueue import InvalidArgument, NewJob, Outcome, Queue
from pyqueue.protocol.errors import WrongTypeError

ASYNC_TOO = True
ON_CLUSTER = True
T0 = 1_000_000
LEASE = 10_000


def lease_all(q: Queue, now: int, count: int = 10) -> list[Any]:
    return q.lease(count=count, lease_ms=LEASE, now_ms=now)


# -- debounce -------------------------------------------------------------------------


def test_a_debounced_key_runs_once_after_its_last_send_with_its_last_arguments(q: Queue) -> None:
    first = q.enqueue(b"v1", debounce_ms=5000, key="user-7", now_ms=T0)
    assert (first.added, first.by_key) == (True, None)
    second = q.enqueue(b"v2", debounce_ms=5000, key="user-7", now_ms=T0 + 3000)
    third = q.enqueue(b"v3", max_attempts=2, debounce_ms=5000, key="user-7", now_ms=T0 + 4000)
    for later in (second, third):
        assert (later.id, later.added, later.by_key) == (first.id, False, "debounced")
    info = q.get(first.id, with_payload=True, now_ms=T0 + 4000)
    assert (info.state, info.due_ms, info.payload, info.max_attempts) == ("scheduled", T0 + 9000, b"v3", 2)
    assert lease_all(q, T0 + 8999) == []
    (job,) = lease_all(q, T0 + 9000)
    assert (job.id, job.payload, job.attempt, job.max_attempts) == (first.id, b"v3", 1, 2)
    st = q.stats(now_ms=T0 + 9000)
    assert (st.enqueued, st.debounced, st.throttled, st.duplicates) == (1, 2, 0, 0)


def test_a_send_once_the_keys_job_is_due_or_running_adds_exactly_one_successor(q: Queue) -> None:
    first = q.enqueue(b"v1", debounce_ms=1000, key="k", now_ms=T0)
    # Due (its window has passed) but not yet leased: the window is closed, a new one opens.
    successor = q.enqueue(b"v2", debounce_ms=1000, key="k", now_ms=T0 + 1000)
    assert successor.added and successor.id != first.id
    (running,) = lease_all(q, T0 + 1000, count=1)
    assert running.id == first.id and running.payload == b"v1"
    # While the first runs, later sends join the one successor: at most one job waits.
    for i, at in enumerate((T0 + 1100, T0 + 1500)):
        joined = q.enqueue(f"v{3 + i}".encode(), debounce_ms=1000, key="k", now_ms=at)
        assert (joined.id, joined.by_key) == (successor.id, "debounced")
    assert q.ack(running, now_ms=T0 + 1600) is Outcome.OK  # its end changes nothing for the key
    assert q.get(successor.id, now_ms=T0 + 1600).due_ms == T0 + 2500
    (job,) = lease_all(q, T0 + 2500)
    assert (job.id, job.payload) == (successor.id, b"v4")
    assert q.stats(now_ms=T0 + 2500).enqueued == 2


def test_a_debounced_job_cancelled_or_retrying_no_longer_holds_its_key(q: Queue) -> None:
    first = q.enqueue(b"v1", debounce_ms=1000, key="k", max_attempts=3, now_ms=T0)
    assert q.cancel(first.id, now_ms=T0 + 10).state == "scheduled"
    again = q.enqueue(b"v2", debounce_ms=1000, key="k", now_ms=T0 + 20)
    assert again.added and again.id != first.id
    (job,) = lease_all(q, T0 + 1020)
    q.nack(job, "boom", delay_ms=5000, now_ms=T0 + 1030)  # retrying: scheduled, but its window is over
    fresh = q.enqueue(b"v3", debounce_ms=1000, key="k", now_ms=T0 + 1040)
    assert fresh.added and fresh.id not in (first.id, again.id)
    assert q.get(again.id, with_payload=True, now_ms=T0 + 1040).payload == b"v2"


def test_duplicates_are_decided_before_keys_but_the_keys_own_id_debounces(q: Queue) -> None:
    q.enqueue(b"other", job_id="other", now_ms=T0)
    pending = q.enqueue(b"v1", job_id="p", debounce_ms=1000, key="k", now_ms=T0)
    dup = q.enqueue(b"v2", job_id="other", debounce_ms=1000, key="k", now_ms=T0 + 1)
    assert (dup.id, dup.added, dup.by_key) == ("other", False, None)
    own = q.enqueue(b"v3", job_id="p", debounce_ms=1000, key="k", now_ms=T0 + 2)
    assert (own.id, own.by_key) == ("p", "debounced")
    assert q.get("p", with_payload=True, now_ms=T0 + 2).payload == b"v3"
    st = q.stats(now_ms=T0 + 2)
    assert (st.duplicates, st.debounced) == (1, 1)
    assert pending.added


def test_a_debounce_takes_the_last_sends_group_priority_and_expiry(q: Queue, r: redis.Redis) -> None:
    first = q.enqueue(b"v1", debounce_ms=1000, key="k", group="g", priority=3, expires_ms=60_000, now_ms=T0)
    keys = q.spec.keys
    assert r.hget(keys.meta, first.id) is not None and r.zscore(keys.expires, first.id) == T0 + 60_000
    q.enqueue(b"v2", debounce_ms=1000, key="k", now_ms=T0 + 500)
    assert r.hget(keys.meta, first.id) is None and r.zscore(keys.expires, first.id) is None
    q.enqueue(b"v3", debounce_ms=1000, key="k", priority=-2, expires_ms=5000, now_ms=T0 + 600)
    assert r.hget(keys.meta, first.id) == b"-2||" and r.zscore(keys.expires, first.id) == T0 + 5600
    (job,) = lease_all(q, T0 + 1600)
    assert (job.id, job.payload) == (first.id, b"v3")
    assert r.zcard(keys.expires) == 0


def test_one_call_debounces_its_own_sends_of_a_key_in_order(q: Queue) -> None:
    answers = q.enqueue_many([
        NewJob(b"a1", debounce_ms=1000, key="a"),
        NewJob(b"b1", debounce_ms=1000, key="b"),
        NewJob(b"a2", debounce_ms=3000, key="a"),
        NewJob(b"t1", throttle_ms=1000, key="a"),  # a throttle key of the same name is another key
        NewJob(b"t2", throttle_ms=1000, key="a"),
    ], now_ms=T0)
    a, b, a2, t1, t2 = answers
    assert (a.added, b.added, a2.id, a2.by_key, t1.added, t2.id, t2.by_key) == (
        True, True, a.id, "debounced", True, t1.id, "throttled")
    info = q.get(a.id, with_payload=True, now_ms=T0)
    assert (info.payload, info.due_ms) == (b"a2", T0 + 3000)
    st = q.stats(now_ms=T0)
    assert (st.enqueued, st.debounced, st.throttled) == (3, 1, 1)


# -- throttle -------------------------------------------------------------------------


def test_a_throttled_key_adds_one_job_per_window_and_names_it_to_the_dropped_sends(q: Queue) -> None:
    first = q.enqueue(b"1", throttle_ms=60_000, key="acct-1", now_ms=T0)
    other = q.enqueue(b"x", throttle_ms=60_000, key="acct-2", now_ms=T0 + 1)
    dropped = q.enqueue(b"2", throttle_ms=60_000, key="acct-1", now_ms=T0 + 59_999)
    assert first.added and other.added
    assert (dropped.id, dropped.added, dropped.by_key) == (first.id, False, "throttled")
    # The window is the send's, not the job's: the job's end does not open a new one.
    (job, _) = lease_all(q, T0 + 2)
    q.ack(job, now_ms=T0 + 3)
    assert q.enqueue(b"3", throttle_ms=60_000, key="acct-1", now_ms=T0 + 30_000).by_key == "throttled"
    later = q.enqueue(b"4", throttle_ms=60_000, key="acct-1", now_ms=T0 + 60_000)
    assert later.added and later.id != first.id
    st = q.stats(now_ms=T0 + 60_000)
    assert (st.enqueued, st.throttled) == (3, 2)
    # A throttled send is not a duplicate: its own id was never taken.
    assert q.enqueue(b"5", job_id="mine", throttle_ms=60_000, key="acct-1", now_ms=T0 + 60_001).id == later.id
    assert q.get("mine", now_ms=T0 + 60_001).state == "unknown"


def test_stale_key_fields_are_trimmed_by_later_keyed_sends(q: Queue, r: redis.Redis) -> None:
    for i in range(30):
        q.enqueue(b"x", throttle_ms=100, key=f"k{i}", now_ms=T0)
    keys = q.spec.keys
    assert (r.hlen(keys.keyed), r.zcard(keys.windows)) == (30, 30)
    for i in range(3):
        q.enqueue(b"x", throttle_ms=100, key="new", now_ms=T0 + 100 + i)
    # Three calls trimmed up to 10 stale fields each; the new key's field stays.
    assert (r.hlen(keys.keyed), r.zcard(keys.windows)) == (1, 1)


# -- expiry ---------------------------------------------------------------------------


def test_a_job_not_leased_before_its_deadline_expires_and_is_never_handed_out(q: Queue) -> None:
    q.set_events(100)
    q.enqueue(b"late", job_id="late", expires_ms=1000, now_ms=T0)
    q.enqueue(b"fine", job_id="fine", expires_ms=1000, now_ms=T0 + 500)
    q.enqueue(b"plain", job_id="plain", now_ms=T0 + 500)
    answer = q.lease_call(count=1, lease_ms=LEASE, now_ms=T0 + 1000)
    assert answer.jobs == [] and answer.next_due_ms == T0 + 1000  # ask again at once
    jobs = lease_all(q, T0 + 1001)
    assert [j.id for j in jobs] == ["fine", "plain"]
    info = q.get("late", now_ms=T0 + 1001)
    assert (info.state, info.due_ms, info.payload) == ("expired", T0 + 1000, None)
    # Its id is tombstoned like an acked one: a retried send does not bring it back.
    assert q.enqueue(b"late", job_id="late", expires_ms=1000, now_ms=T0 + 2000).added is False
    st = q.stats(now_ms=T0 + 2000)
    assert (st.expired_total, st.leased_total) == (1, 2)
    expired = [e for e in q.events().events if e.type == "expired"]
    assert [(e.job_id, e.at_ms, e.fields["reason"]) for e in expired] == [("late", T0 + 1000, "not started by its deadline")]


def test_only_the_first_lease_checks_the_deadline(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", expires_ms=1000, max_attempts=3, now_ms=T0)
    (job,) = lease_all(q, T0 + 10)
    assert r.zscore(q.spec.keys.expires, "a") is None
    q.nack(job, "boom", delay_ms=5000, now_ms=T0 + 20)
    (again,) = lease_all(q, T0 + 5020)  # long past its deadline: it started in time
    assert (again.id, again.attempt) == ("a", 2)


def test_a_delayed_job_expires_from_its_send_not_its_due_time(q: Queue) -> None:
    q.enqueue(b"x", job_id="a", delay_ms=500, expires_ms=1000, now_ms=T0)
    assert lease_all(q, T0 + 1000) == []
    assert q.get("a", now_ms=T0 + 1000).state == "expired"


def test_an_expired_job_gives_its_groups_slot_back_in_the_same_call(q: Queue) -> None:
    q.set_group_limit(1, group="t")
    q.enqueue(b"1", job_id="old", group="t", expires_ms=100, now_ms=T0)
    q.enqueue(b"2", job_id="new", group="t", now_ms=T0 + 50)
    q.enqueue(b"3", job_id="p", priority=2, expires_ms=100, now_ms=T0)
    assert lease_all(q, T0 + 200) == []
    assert {q.get(i, now_ms=T0 + 200).state for i in ("old", "p")} == {"expired"}
    (job,) = lease_all(q, T0 + 201)
    assert job.id == "new"
    assert q.stats(now_ms=T0 + 201).expired_total == 2
    assert q.ack(job) is Outcome.OK


def test_a_cancelled_job_leaves_the_expiry_list(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", expires_ms=1000, now_ms=T0)
    assert r.zcard(q.spec.keys.expires) == 1
    assert q.cancel("a", now_ms=T0 + 1).state == "ready"
    assert r.zcard(q.spec.keys.expires) == 0


def test_a_queue_without_flow_control_writes_none_of_its_keys(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", delay_ms=10, now_ms=T0)
    q.ack(lease_all(q, T0 + 10)[0])
    keys = q.spec.keys
    assert not any(r.exists(k) for k in (keys.keyed, keys.windows, keys.expires, keys.expired))
    assert r.hget(keys.counters, "expiry") is None


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"key": "k"}, "key needs debounce_ms or throttle_ms"),
    ({"debounce_ms": 10}, "debounce_ms needs a key"),
    ({"throttle_ms": 10, "debounce_ms": 10, "key": "k"}, "not both"),
    ({"debounce_ms": 0, "key": "k"}, "debounce_ms"),
    ({"debounce_ms": 10, "key": "k", "delay_ms": 5}, "give debounce_ms, not delay_ms"),
    ({"throttle_ms": 10, "key": ""}, "key must be 1..256 bytes"),
    ({"throttle_ms": 10, "key": "a\nb"}, "key must be 1..256 bytes"),
    ({"throttle_ms": 10, "key": 7}, "key must be a str"),
    ({"expires_ms": 0}, "expires_ms"),
    ({"expires_ms": 100, "delay_ms": 100}, "could never start"),
    ({"expires_ms": 100, "debounce_ms": 200, "key": "k"}, "could never start"),
])
def test_a_mistaken_option_is_refused_before_anything_is_sent(q: Queue, r: redis.Redis, options: dict[str, Any],
                                                              message: str) -> None:
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match=message):
        q.enqueue(b"x", **options)
    assert dump_all(r) == before


@pytest.mark.parametrize("role", ["keyed", "windows", "expires", "expired"])
def test_a_flow_control_key_of_the_wrong_type_is_an_error_and_changes_nothing(q: Queue, r: redis.Redis,
                                                                               role: str) -> None:
    q.enqueue(b"x", job_id="a", expires_ms=10, now_ms=T0)
    r.set(q.spec.keys.role(role), "planted")
    before = dump_all(r)
    with pytest.raises(WrongTypeError):
        if role == "expired":
            q.lease(now_ms=T0 + 10)
        elif role == "expires":
            q.enqueue(b"y", expires_ms=10, now_ms=T0)
        else:
            q.enqueue(b"y", throttle_ms=10, key="k", now_ms=T0)
    assert dump_all(r) == before

