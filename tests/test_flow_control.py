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



# -- sequences --------------------------------------------------------------------------


def ids_leased(q: Queue, now: int) -> list[str]:
    return [j.id for j in lease_all(q, now)]


def test_a_sequence_runs_its_jobs_one_at_a_time_in_send_order_and_other_keys_run_beside_it(q: Queue) -> None:
    for i in range(3):
        q.enqueue(f"a{i}".encode(), job_id=f"a{i}", sequence="order-1", now_ms=T0)
    q.enqueue(b"b0", job_id="b0", sequence="order-2", now_ms=T0)
    q.enqueue(b"free", job_id="free", now_ms=T0)
    assert [q.get(i, now_ms=T0).state for i in ("a0", "a1", "a2")] == ["ready", "sequenced", "sequenced"]
    assert q.stats(now_ms=T0).sequenced == 2
    running = {j.id: j for j in lease_all(q, T0)}
    assert set(running) == {"a0", "b0", "free"}  # one job of each key, and the jobs without one
    assert ids_leased(q, T0 + 1) == []
    assert q.ack(running["a0"], now_ms=T0 + 2) is Outcome.OK
    (a1,) = lease_all(q, T0 + 3)
    assert a1.id == "a1" and q.get("a2", now_ms=T0 + 3).state == "sequenced"
    q.ack_result(a1, b"done", now_ms=T0 + 4)  # ack_result hands the key on too
    outcome, (a2,) = q.ack_and_lease(running["b0"], now_ms=T0 + 5)
    assert outcome is Outcome.OK and a2.id == "a2"
    q.ack(a2, now_ms=T0 + 6)
    assert q.stats(now_ms=T0 + 6).sequenced == 0
    # The key is free: the next send is its head at once.
    q.enqueue(b"a3", job_id="a3", sequence="order-1", now_ms=T0 + 7)
    assert q.get("a3", now_ms=T0 + 7).state == "ready"


def test_order_holds_across_retries_and_lost_leases(q: Queue) -> None:
    for i in range(2):
        q.enqueue(f"{i}".encode(), job_id=f"j{i}", sequence="k", max_attempts=5, now_ms=T0)
    (j0,) = lease_all(q, T0)
    q.nack(j0, "boom", delay_ms=1000, now_ms=T0 + 1)  # retrying: still the head
    assert ids_leased(q, T0 + 500) == []
    (again,) = q.lease(lease_ms=100, now_ms=T0 + 1001)
    assert again.id == "j0"
    # Its lease runs out (a crashed worker): reclaimed, it is still the head.
    assert ids_leased(q, T0 + 1200) == ["j0"]
    (third,) = [j for j in q.lease(count=5, lease_ms=LEASE, now_ms=T0 + 1200 + LEASE)]
    assert third.id == "j0" and third.attempt == 4
    q.ack(third, now_ms=T0 + 1201 + LEASE)
    assert ids_leased(q, T0 + 1202 + LEASE) == ["j1"]


def test_a_dead_head_blocks_its_key_until_replayed_purged_or_skipped(q: Queue) -> None:
    for i in range(4):
        q.enqueue(f"{i}".encode(), job_id=f"j{i}", sequence="k", max_attempts=1, now_ms=T0)
    assert q.sequence_skip("k", now_ms=T0).status == "running"
    (j0,) = lease_all(q, T0)
    q.nack(j0, "boom", now_ms=T0 + 1)
    assert q.get("j0", now_ms=T0 + 1).state == "dead"
    assert ids_leased(q, T0 + 2) == []  # blocked
    # Replayed and acked: the key goes on.
    assert q.dead_replay(["j0"]) == 1
    (j0,) = lease_all(q, T0 + 3)
    q.ack(j0, now_ms=T0 + 4)
    (j1,) = lease_all(q, T0 + 5)
    assert j1.id == "j1"
    q.nack(j1, "boom", now_ms=T0 + 6)
    # Purged: the key goes on.
    assert q.dead_purge(["j1"]) == 1
    (j2,) = lease_all(q, T0 + 7)
    assert j2.id == "j2"
    q.nack(j2, "boom", now_ms=T0 + 8)
    # Skipped: the key goes on, the dead job stays a dead letter, out of the sequence.
    skipped = q.sequence_skip("k", now_ms=T0 + 9)
    assert (skipped.status, skipped.next_id) == ("skipped", "j3")
    assert q.get("j2", now_ms=T0 + 9).state == "dead"
    assert ids_leased(q, T0 + 10) == ["j3"]
    assert q.sequence_skip("k", now_ms=T0 + 11).status == "running"
    q.dead_replay(["j2"])  # a replay of a skipped job runs it alone, beside the sequence
    assert ids_leased(q, T0 + 12) == ["j2"]
    assert q.sequence_skip("nothing", now_ms=T0 + 13).status == "free"


def test_under_skip_a_head_that_goes_dead_hands_its_key_on_at_once(q: Queue, r: redis.Redis) -> None:
    for i in range(4):
        q.enqueue(f"{i}".encode(), job_id=f"j{i}", sequence="k", on_failure="skip", max_attempts=1, now_ms=T0)
    # nack: dead at its last attempt
    (j0,) = q.lease(lease_ms=100, now_ms=T0)
    q.nack(j0, "boom", now_ms=T0 + 1)
    assert (q.get("j0", now_ms=T0 + 1).state, q.get("j1", now_ms=T0 + 1).state) == ("dead", "scheduled")
    # a lost lease reclaimed by a lease call's maintenance
    (j1,) = q.lease(lease_ms=100, now_ms=T0 + 2)
    assert j1.id == "j1"
    assert ids_leased(q, T0 + 200) == []  # j1's lease expired: dead; j2 handed the key
    assert q.get("j1", now_ms=T0 + 200).state == "dead" and q.get("j2", now_ms=T0 + 200).state == "scheduled"
    # promote's reclaim
    (j2,) = q.lease(lease_ms=100, now_ms=T0 + 201)
    q.promote(now_ms=T0 + 400)
    assert q.get("j2", now_ms=T0 + 400).state == "dead" and q.get("j3", now_ms=T0 + 400).state == "scheduled"
    # the dead ones are out of the sequence: a replay runs them beside it
    assert q.sequence_skip("k", now_ms=T0 + 401).status == "running"
    q.dead_replay(["j0"], now_ms=T0 + 402)
    assert sorted(ids_leased(q, T0 + 403)) == ["j0", "j3"]
    assert not any(f.startswith(b"j:j0") for f in r.hkeys(q.spec.keys.keyed))


def test_under_skip_a_head_of_a_dead_worker_hands_its_key_on_when_scrubbed(q: Queue) -> None:
    q.enqueue(b"0", job_id="j0", sequence="k", on_failure="skip", max_attempts=1, now_ms=T0)
    q.enqueue(b"1", job_id="j1", sequence="k", on_failure="skip", now_ms=T0)
    (j0,) = q.lease(lease_ms=100_000, now_ms=T0)
    owner = j0.receipt.split("|", 1)[0]
    q.scrub(owner, now_ms=T0 + 1)
    assert (q.get("j0", now_ms=T0 + 1).state, q.get("j1", now_ms=T0 + 1).state) == ("dead", "scheduled")


def test_on_failure_without_a_sequence_or_of_another_name_is_refused(q: Queue) -> None:
    with pytest.raises(InvalidArgument, match="on_failure is a sequence's"):
        q.enqueue(b"x", on_failure="skip")
    with pytest.raises(InvalidArgument, match="on_failure must be 'block' or 'skip'"):
        q.enqueue(b"x", sequence="k", on_failure="retry")


def test_a_cancelled_or_expired_job_leaves_its_line(q: Queue) -> None:
    q.enqueue(b"0", job_id="j0", sequence="k", now_ms=T0)
    q.enqueue(b"1", job_id="j1", sequence="k", now_ms=T0)
    q.enqueue(b"2", job_id="j2", sequence="k", expires_ms=100, now_ms=T0)
    q.enqueue(b"3", job_id="j3", sequence="k", now_ms=T0)
    assert q.cancel("j1", now_ms=T0 + 1).state == "sequenced"  # out of line, the others keep their places
    assert q.cancel("j0", now_ms=T0 + 2).state == "ready"  # the head: hands the key on to j2
    assert q.get("j2", now_ms=T0 + 2).state == "scheduled"
    # j2 missed its deadline: it expires instead of running, and hands the key on.
    assert ids_leased(q, T0 + 200) == []
    assert q.get("j2", now_ms=T0 + 200).state == "expired"
    assert ids_leased(q, T0 + 201) == ["j3"]
    assert q.stats(now_ms=T0 + 201).sequenced == 0


def test_a_delayed_job_of_a_sequence_runs_at_its_due_time_once_its_turn_comes(q: Queue) -> None:
    answers = q.enqueue_many([NewJob(b"0", job_id="j0", sequence="k"), NewJob(b"1", job_id="j1", sequence="k", delay_ms=500),
                              NewJob(b"2", job_id="j2", sequence="k")], now_ms=T0)
    assert all(a.added for a in answers)
    (j0,) = lease_all(q, T0)
    q.ack(j0, now_ms=T0 + 10)
    info = q.get("j1", now_ms=T0 + 10)
    assert (info.state, info.due_ms) == ("scheduled", T0 + 500)  # its delay counts from its send
    assert ids_leased(q, T0 + 499) == []
    (j1,) = lease_all(q, T0 + 500)
    q.ack(j1, now_ms=T0 + 600)
    assert ids_leased(q, T0 + 600) == ["j2"]  # its due time passed long ago: at once


def test_a_sequence_with_another_key_is_refused(q: Queue, r: redis.Redis) -> None:
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match="one key per job"):
        q.enqueue(b"x", sequence="k", debounce_ms=10, key="k")
    with pytest.raises(InvalidArgument, match="sequence must be 1..256 bytes"):
        q.enqueue(b"x", sequence="")
    with pytest.raises(InvalidArgument, match="key must be 1..256 bytes"):
        q.sequence_skip("a\nb")
    assert dump_all(r) == before


def test_a_sequence_key_of_the_wrong_type_is_an_error_and_changes_nothing(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", sequence="k", now_ms=T0)
    (job,) = lease_all(q, T0)
    r.set(q.spec.keys.sequenced, "planted")
    before = dump_all(r)
    with pytest.raises(WrongTypeError):
        q.enqueue(b"y", sequence="k", now_ms=T0 + 1)  # behind `a`: it goes into `sequenced`
    with pytest.raises(WrongTypeError):
        q.ack(job, now_ms=T0 + 1)  # the head's ack hands the key on through `sequenced`
    assert dump_all(r) == before


# -- partitioned queues -------------------------------------------------------------------


def test_on_a_partitioned_queue_a_key_picks_the_partition_and_keeps_its_rules(r: redis.Redis) -> None:
    from pyqueue.protocol.core import partition_of

    q = Queue("parted", r, partitions=4)
    first = q.enqueue(b"v1", debounce_ms=60_000, key="user-7", now_ms=T0)
    again = q.enqueue(b"v2", debounce_ms=60_000, key="user-7", now_ms=T0 + 1)
    assert (again.job_id, again.by_key) == (first.job_id, "debounced")
    assert partition_of(first.job_id, 4) == partition_of("user-7", 4)
    a = q.enqueue(b"a", sequence="order-1", now_ms=T0)
    b = q.enqueue(b"b", sequence="order-1", now_ms=T0)
    assert partition_of(a.job_id, 4) == partition_of(b.job_id, 4) == partition_of("order-1", 4)
    assert (q.get(b.job_id, now_ms=T0).state, q.stats(now_ms=T0).sequenced) == ("sequenced", 1)
    with pytest.raises(InvalidArgument, match="lives in its key's partition"):
        q.enqueue(b"c", job_id=next(f"x{i}" for i in range(100) if partition_of(f"x{i}", 4) != partition_of("k", 4)),
                  sequence="k")
    assert q.sequence_skip("order-1", now_ms=T0).status == "running"


def test_a_sequence_of_grouped_and_prioritized_jobs_keeps_its_order_on_a_fair_queue(q: Queue) -> None:
    q.set_group_limit(1, group="t")
    for i in range(3):
        q.enqueue(f"{i}".encode(), job_id=f"s{i}", sequence="k", group="t", priority=i, now_ms=T0)
    q.enqueue(b"other", job_id="o", group="t", now_ms=T0)
    order = []
    now = T0
    while len(order) < 4:
        jobs = q.lease(count=3, lease_ms=LEASE, now_ms=now)
        assert len(jobs) <= 1  # the group's cap holds for the sequence's jobs too
        for job in jobs:
            order.append(job.id)
            q.ack(job, now_ms=now)
        now += 1
        assert now < T0 + 100
    assert [i for i in order if i.startswith("s")] == ["s0", "s1", "s2"]
    assert q.stats(now_ms=now).sequenced == 0
