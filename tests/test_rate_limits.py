"""Keyed rate limits (lua/README.md section 2.7), decided by lease.lua: each rate key has
a GCRA with cost, checked at every lease; a job whose permits are not due is not leased
but scheduled at its slot (the key's waiting jobs spread over its permits), and other
keys' jobs are leased meanwhile. A limit can be set per key at run time
(set_rate_limit.lua), a running job can hold its key (defer_key.lua), and the scripts
that end a job delete its rate entry. On both drivers, fakeredis, a real redis-server
and a Redis Cluster."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import dump_all

from pyqueue import InvalidArgument, NewJob, Outcome, Queue, RateLimit
from pyqueue.protocol.errors import WrongTypeError

ASYNC_TOO = True
ON_CLUSTER = True
T0 = 1_000_000
LEASE = 60_000


def lease_ids(q: Queue, now: int, count: int = 20) -> list[str]:
    return [j.id for j in q.lease(count=count, lease_ms=LEASE, now_ms=now)]


def send(q: Queue, job_id: str, key: str = "acct", rate: Any = "2/s", now: int = T0, **more: Any) -> None:
    assert q.enqueue(job_id.encode(), job_id=job_id, rate_key=key, rate_limit=rate, now_ms=now, **more).added


def test_a_keys_jobs_are_leased_no_faster_than_its_limit_and_wait_scheduled(q: Queue) -> None:
    for i in range(5):
        send(q, f"a{i}")
    assert lease_ids(q, T0) == ["a0"]
    # The others were deferred to their slots, 500 ms apart.
    st = q.stats(now_ms=T0)
    assert (st.deferred, st.scheduled, st.ready) == (4, 4, 0)
    assert [q.get(f"a{i}", now_ms=T0).due_ms for i in range(1, 5)] == [T0 + 500, T0 + 1000, T0 + 1500, T0 + 2000]
    assert lease_ids(q, T0 + 499) == []
    for i in range(1, 5):
        assert lease_ids(q, T0 + 500 * i) == [f"a{i}"]
    # Each, checked again at its slot, found its permit due: nothing more was deferred.
    assert q.stats(now_ms=T0 + 2000).deferred == 4


def test_a_limited_key_does_not_hold_back_other_keys_or_plain_jobs(q: Queue) -> None:
    for i in range(3):
        send(q, f"a{i}", rate="1/s")
    send(q, "b0", key="other", rate="1/s")
    q.enqueue(b"p", job_id="plain", now_ms=T0)
    assert lease_ids(q, T0) == ["a0", "b0", "plain"]
    send(q, "b1", key="other", rate="1/s", now=T0 + 1)
    # b1 comes after a1 and a2 were deferred, and its own permit is due before theirs run out.
    assert lease_ids(q, T0 + 1) == []
    assert lease_ids(q, T0 + 1000) == ["a1", "b1"]
    assert lease_ids(q, T0 + 2000) == ["a2"]


def test_a_burst_lets_that_many_through_at_once_then_spaces_them(q: Queue) -> None:
    for i in range(6):
        send(q, f"a{i}", rate=RateLimit(2, 1000, burst=3))
    assert lease_ids(q, T0) == ["a0", "a1", "a2"]
    assert lease_ids(q, T0 + 499) == []
    assert lease_ids(q, T0 + 500) == ["a3"]
    assert lease_ids(q, T0 + 1000) == ["a4"]
    assert lease_ids(q, T0 + 1500) == ["a5"]


def test_a_job_takes_as_many_permits_as_its_cost(q: Queue) -> None:
    q.enqueue(b"big", job_id="big", rate_key="k", rate_limit=RateLimit(10, 1000, burst=10), cost=8, now_ms=T0)
    q.enqueue(b"small", job_id="small", rate_key="k", rate_limit=RateLimit(10, 1000, burst=10), cost=3, now_ms=T0)
    assert lease_ids(q, T0) == ["big"]
    # 8 of 10 taken: 3 more are due once one permit is back, 100 ms later.
    assert q.get("small", now_ms=T0).due_ms == T0 + 100
    assert lease_ids(q, T0 + 100) == ["small"]
    with pytest.raises(InvalidArgument, match="at most the burst"):
        q.enqueue(b"x", rate_key="k", rate_limit=RateLimit(10, 1000, burst=10), cost=11)


def test_a_retry_takes_a_permit_again_and_a_reclaimed_lease_too(q: Queue) -> None:
    send(q, "a", rate="1/s", max_attempts=5)
    (job,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0)
    q.nack(job, "boom", delay_ms=0, now_ms=T0 + 10)
    # Its retry is due now, but the key's next permit is at T0 + 1000: deferred to it.
    assert lease_ids(q, T0 + 10) == []
    assert q.get("a", now_ms=T0 + 10).due_ms == T0 + 1000
    (again,) = q.lease(count=1, lease_ms=100, now_ms=T0 + 1000)
    assert again.attempt == 2
    # Its lease expires unacked: the reclaimed job is checked again (its third attempt).
    assert lease_ids(q, T0 + 1101) == []
    assert q.get("a", now_ms=T0 + 1101).due_ms == T0 + 2000
    (third,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0 + 2000)
    assert third.attempt == 3
    assert q.ack(third, now_ms=T0 + 2001) is Outcome.OK


def test_a_limit_set_at_run_time_wins_and_can_be_lifted_or_dropped(q: Queue) -> None:
    for i in range(4):
        send(q, f"a{i}", rate="1/s")
    assert q.set_rate_limit("acct", "10/s") is True
    assert q.set_rate_limit("acct", RateLimit(10, 1000)) is False  # the same limit: no change
    assert lease_ids(q, T0) == ["a0"]
    # Deferred at the run-time limit's spacing, 100 ms.
    assert [q.get(f"a{i}", now_ms=T0).due_ms for i in range(1, 4)] == [T0 + 100, T0 + 200, T0 + 300]
    assert q.set_rate_limit("acct", "off") is True  # count 0: the key's jobs pass unchecked
    for i in range(4, 8):
        send(q, f"a{i}", rate="1/s", now=T0 + 1)
    assert lease_ids(q, T0 + 1) == ["a4", "a5", "a6", "a7"]
    assert q.set_rate_limit("acct", None) is True  # back to the jobs' own 1/s
    assert q.set_rate_limit("acct", None) is False
    with pytest.raises(InvalidArgument):
        q.set_rate_limit("", "1/s")
    with pytest.raises(InvalidArgument):
        q.set_rate_limit("acct", "fast")


def test_a_running_job_can_hold_its_key_for_a_while(q: Queue) -> None:
    send(q, "a", rate="10/s")
    send(q, "b", rate="10/s")
    (job,) = q.lease(count=2, lease_ms=LEASE, now_ms=T0)
    assert job.id == "a"
    assert q.defer_key(job, 5000, now_ms=T0 + 10) == T0 + 5010
    # b was deferred at T0 to T0 + 100: checked again then, it waits on to the key's time.
    assert lease_ids(q, T0 + 100) == []
    assert q.get("b", now_ms=T0 + 100).due_ms == T0 + 5010
    send(q, "c", rate="10/s", now=T0 + 200)
    assert lease_ids(q, T0 + 200) == []
    assert q.get("c", now_ms=T0 + 200).due_ms == T0 + 5110  # the slot after b's
    assert lease_ids(q, T0 + 5010) == ["b"]
    assert lease_ids(q, T0 + 5110) == ["c"]
    assert q.ack(job, now_ms=T0 + 300) is Outcome.OK
    assert q.defer_key(job, 1000, now_ms=T0 + 301) is None  # its lease has ended: nothing
    q.enqueue(b"plain", job_id="plain", now_ms=T0)
    (plain,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0 + 400)
    with pytest.raises(InvalidArgument, match="has no rate key"):
        q.defer_key(plain, 1000, now_ms=T0 + 400)


def test_an_expiry_still_counts_while_a_job_is_deferred(q: Queue) -> None:
    send(q, "a", rate="1/s")
    send(q, "b", rate="1/s", expires_ms=500)
    send(q, "c", rate="1/s", expires_ms=5000)
    assert lease_ids(q, T0) == ["a"]
    assert lease_ids(q, T0 + 1000) == []  # b's deadline passed while it waited for its permit
    assert q.get("b", now_ms=T0 + 1000).state == "expired"
    assert lease_ids(q, T0 + 2000) == ["c"]


def test_ending_a_job_deletes_its_rate_entry_and_a_dead_one_keeps_it(q: Queue, r: redis.Redis) -> None:
    keyed = q.spec.keys.keyed
    for name in ("acked", "cancelled", "dead", "purged"):
        send(q, name, rate=RateLimit(100, 1000, burst=10), max_attempts=1)
    jobs = {j.id: j for j in q.lease(count=10, lease_ms=LEASE, now_ms=T0 + 1000)}
    assert set(jobs) == {"acked", "cancelled", "dead", "purged"}
    assert q.ack(jobs["acked"], now_ms=T0 + 1001) is Outcome.OK
    assert q.cancel("cancelled", now_ms=T0 + 1001).state == "leased"
    q.nack(jobs["dead"], "boom", now_ms=T0 + 1001)
    q.nack(jobs["purged"], "boom", now_ms=T0 + 1001)
    assert q.dead_purge(["purged"]) == 1
    entries = {f.decode() for f in r.hkeys(keyed) if f.startswith(b"r:")}
    assert entries == {"r:dead"}
    # Replayed, the dead job is limited again.
    assert q.dead_replay(["dead"], now_ms=T0 + 2000) == 1


def test_a_rated_job_of_a_sequence_or_debounce_keeps_both_rules(q: Queue, r: redis.Redis) -> None:
    for i in range(3):
        q.enqueue(f"s{i}".encode(), job_id=f"s{i}", sequence="order", rate_key="acct", rate_limit="1/s", now_ms=T0)
    assert lease_ids(q, T0) == ["s0"]
    assert q.get("s1", now_ms=T0).state == "sequenced"
    # A debounced send carries the last send's rate, or none.
    first = q.enqueue(b"d1", debounce_ms=100, key="k", rate_key="acct2", rate_limit="1/s", now_ms=T0)
    q.enqueue(b"d2", debounce_ms=100, key="k", now_ms=T0 + 10)
    assert r.hget(q.spec.keys.keyed, f"r:{first.id}") is None


def test_an_ack_in_a_sequence_hands_on_and_the_next_is_rate_checked(q: Queue) -> None:
    for i in range(2):
        q.enqueue(f"s{i}".encode(), job_id=f"s{i}", sequence="order", rate_key="acct", rate_limit="1/s", now_ms=T0)
    (job,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0)
    assert q.ack(job, now_ms=T0 + 10) is Outcome.OK
    assert lease_ids(q, T0 + 10) == []  # handed on, but its key's next permit is at T0 + 1000
    assert lease_ids(q, T0 + 1000) == ["s1"]


def test_a_fair_queue_checks_its_picks_and_gives_a_deferred_jobs_slot_back(q: Queue) -> None:
    q.set_group_limit(1)
    for i in range(2):
        q.enqueue(f"g{i}".encode(), job_id=f"g{i}", group="tenant", rate_key="t", rate_limit="1/s", now_ms=T0)
    q.enqueue(b"h", job_id="h", group="other", priority=2, now_ms=T0)
    jobs = {j.id: j for j in q.lease(count=5, lease_ms=LEASE, now_ms=T0)}
    assert sorted(jobs) == ["g0", "h"]
    assert q.stats(now_ms=T0).deferred == 0  # g1 was not picked: its group is at its cap
    assert q.ack(jobs["g0"], now_ms=T0 + 1) is Outcome.OK
    # Picked now, g1 is over its key's limit: deferred, and its group's slot goes back.
    assert lease_ids(q, T0 + 1) == []
    st = q.stats(now_ms=T0 + 1)
    assert (st.deferred, st.groups_at_cap) == (1, 0)
    q.enqueue(b"g2", job_id="g2", group="tenant", now_ms=T0 + 2)
    assert lease_ids(q, T0 + 2) == ["g2"]


def test_a_fair_pick_defers_an_over_limit_job_and_its_group_keeps_going(q: Queue) -> None:
    for i in range(3):
        q.enqueue(f"g{i}".encode(), job_id=f"g{i}", group="tenant", rate_key="t", rate_limit="1/s", now_ms=T0)
    q.enqueue(b"h", job_id="h", group="other", now_ms=T0)
    assert sorted(lease_ids(q, T0)) == ["g0", "h"]
    st = q.stats(now_ms=T0)
    assert (st.deferred, st.scheduled) == (2, 2)
    assert lease_ids(q, T0 + 1000) == ["g1"]
    assert lease_ids(q, T0 + 2000) == ["g2"]


def test_a_queue_without_rate_keys_writes_none_of_their_state(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="a", now_ms=T0)
    q.ack(q.lease(count=1, lease_ms=LEASE, now_ms=T0)[0], now_ms=T0)
    keys = q.spec.keys
    assert not any(r.exists(k) for k in (keys.keyed, keys.windows))
    assert r.hget(keys.counters, "rates") is None


def test_stale_key_state_is_trimmed_by_later_rated_sends(q: Queue, r: redis.Redis) -> None:
    for i in range(3):
        send(q, f"a{i}", key=f"k{i}", rate="1/s")
    lease_ids(q, T0)
    keyed = q.spec.keys.keyed
    assert {f"k:k{i}".encode() for i in range(3)} <= set(r.hkeys(keyed))
    send(q, "later", key="k9", rate="1/s", now=T0 + 5000)
    assert not {f"k:k{i}".encode() for i in range(3)} & set(r.hkeys(keyed))


@pytest.mark.parametrize(("options", "message"), [
    ({"rate_key": "k"}, "rate_key needs a rate_limit"),
    ({"rate_limit": "1/s"}, "rate_limit needs a rate_key"),
    ({"cost": 2}, "cost is a rate limit's"),
    ({"rate_key": "k", "rate_limit": "1/s", "cost": 2}, "at most the burst"),
    ({"rate_key": "k", "rate_limit": "1/s", "cost": 0}, "at most the burst"),
    ({"rate_key": "k", "rate_limit": "0/s"}, "COUNT/PERIOD"),
    ({"rate_key": "k", "rate_limit": "1/week"}, "COUNT/PERIOD"),
    ({"rate_key": "k", "rate_limit": RateLimit(1, 0)}, "period_ms"),
    ({"rate_key": "k", "rate_limit": RateLimit(1, 1000, burst=0)}, "burst"),
    ({"rate_key": "", "rate_limit": "1/s"}, "rate_key must be 1..256 bytes"),
    ({"rate_key": "a\nb", "rate_limit": "1/s"}, "rate_key must be 1..256 bytes"),
    ({"rate_key": 7, "rate_limit": "1/s"}, "rate_key must be a str"),
    ({"rate_key": "k", "rate_limit": 5}, "RateLimit or its text"),
])
def test_a_mistaken_rate_option_is_refused_before_anything_is_sent(q: Queue, r: redis.Redis, options: dict[str, Any],
                                                                   message: str) -> None:
    before = dump_all(r)
    with pytest.raises(InvalidArgument, match=message):
        q.enqueue(b"x", **options)
    assert dump_all(r) == before


@pytest.mark.parametrize("role", ["keyed", "windows"])
def test_a_rate_key_of_the_wrong_type_is_an_error_and_changes_nothing(q: Queue, r: redis.Redis, role: str) -> None:
    send(q, "a", rate="1/s")
    send(q, "b", rate="1/s")
    r.set(q.spec.keys.role(role), "planted")
    before = dump_all(r)
    with pytest.raises(WrongTypeError):
        q.lease(count=5, lease_ms=LEASE, now_ms=T0)
    assert dump_all(r) == before


def test_on_a_partitioned_queue_the_rate_key_picks_the_partition(r: redis.Redis) -> None:
    from pyqueue.protocol.core import partition_of

    q = Queue("parted", r, partitions=4)
    sent = [q.enqueue(b"x", rate_key="tenant-3", rate_limit="1/s", now_ms=T0) for _ in range(3)]
    assert {partition_of(s.id, 4) for s in sent} == {partition_of("tenant-3", 4)}
    assert len(q.lease(count=10, lease_ms=LEASE, now_ms=T0)) == 1
    assert q.stats(now_ms=T0).deferred == 2
    assert q.set_rate_limit("tenant-3", "100/s") is True
    other = next(f"s{i}" for i in range(100) if partition_of(f"s{i}", 4) != partition_of("tenant-3", 4))
    with pytest.raises(InvalidArgument, match="lives in its key's partition"):
        q.enqueue(b"y", sequence=other, rate_key="tenant-3", rate_limit="1/s")


def test_many_jobs_of_many_keys_keep_each_keys_spacing(q: Queue) -> None:
    jobs = [NewJob(f"{k}-{i}".encode(), job_id=f"{k}-{i}", rate_key=k, rate_limit="4/s")
            for i in range(6) for k in ("a", "b", "c")]
    q.enqueue_many(jobs, now_ms=T0)
    starts: dict[str, list[int]] = {}
    for t in range(T0, T0 + 2000, 50):
        for job in q.lease(count=50, lease_ms=LEASE, now_ms=t):
            starts.setdefault(job.id.split("-")[0], []).append(t)
            q.ack(job, now_ms=t)
    for k in ("a", "b", "c"):
        assert len(starts[k]) == 6
        assert all(b - a >= 250 for a, b in zip(starts[k], starts[k][1:])), starts[k]


def test_worker_processes_keep_each_keys_limit_between_them(redis_server: Any, tmp_path: Any) -> None:
    # Two worker processes, four slots each, serve 4 keys x 12 jobs: each key's leases
    # keep its spacing across both processes, and the keys run beside one another.
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import rate_app

    log = tmp_path / "runs.log"
    env = {**os.environ, "PYQUEUE_URL": redis_server.url(), "RATE_LOG": str(log)}
    here = Path(__file__).resolve().parent
    rate_app.tasks.bind(redis_server.client())
    for n in range(12):
        for key in ("a", "b", "c", "d"):
            rate_app.call.send(key, n)
    workers = [subprocess.Popen([sys.executable, "-m", "pyqueue", "worker", "rate_app:tasks", "--concurrency", "4",
                                 "--lease-ms", str(rate_app.LEASE_MS)], cwd=here, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 48):
            time.sleep(0.1)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    runs = [line.split() for line in log.read_text().splitlines()]
    assert len(runs) == 48, runs
    for key in ("a", "b", "c", "d"):
        leased = sorted(int(ms) for k, ms, _ in runs if k == key)
        assert len(leased) == 12
        assert all(ms - leased[0] >= rate_app.SPACING_MS * i for i, ms in enumerate(leased)), (key, leased)
    assert len({pid for _, _, pid in runs}) == 2  # both processes took jobs


def test_a_replayed_job_queues_behind_the_keys_line(q: Queue) -> None:
    # a1 waits once, then runs and dies; replayed while b1 and b2 wait, it goes behind them.
    send(q, "a0", rate="1/s")
    send(q, "a1", rate="1/s", max_attempts=1)
    assert lease_ids(q, T0) == ["a0"]
    (a1,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0 + 1000)
    q.nack(a1, "boom", now_ms=T0 + 1001)
    for name in ("b0", "b1", "b2"):
        send(q, name, rate="1/s", now=T0 + 2000)
    assert lease_ids(q, T0 + 2000) == ["b0"]
    assert q.dead_replay(["a1"], now_ms=T0 + 2001) == 1
    assert lease_ids(q, T0 + 2001) == []
    assert [q.get(i, now_ms=T0 + 2001).due_ms for i in ("b1", "b2", "a1")] == [T0 + 3000, T0 + 4000, T0 + 5000]


def test_a_shorter_defer_does_not_cut_a_longer_one(q: Queue) -> None:
    send(q, "a", rate="10/s")
    send(q, "b", rate="10/s")
    jobs = {j.id: j for j in q.lease(count=1, lease_ms=LEASE, now_ms=T0)}
    assert q.defer_key(jobs["a"], 5000, now_ms=T0) == T0 + 5000
    assert q.defer_key(jobs["a"], 1000, now_ms=T0 + 10) == T0 + 5000
    assert lease_ids(q, T0 + 1010) == []
    assert q.get("b", now_ms=T0 + 1010).due_ms == T0 + 5000

