"""Service lifecycle (register, renew, stop, deregister, id GC, fencing by registration)
and scrub."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from conftest import all_keys
from helpers import T0, dump_all

from pyqueue.protocol.core import service_register_call, service_renew_call
from pyqueue import InvalidArgument, NewJob, Outcome, Queue, ServiceExists, ServiceLost
from pyqueue.ops.service import MAX_RUNNING_BYTES, Renewed, RunningJob, Services, encode_running

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True


@pytest.fixture
def services(r: redis.Redis) -> Services:
    return Services(r, namespace="ns")


def test_register_allocates_increasing_ids_and_writes_the_service_key(services: Services, r: redis.Redis) -> None:
    a = services.register(["q1", "q2"], host="h", pid=42, registration="r1", now_ms=T0)
    b = services.register(["q1"], now_ms=T0)
    assert (a.id, b.id, a.owner) == (1, 2, "ns.1.r1")
    assert len(b.registration) == 8 and b.owner == f"ns.2.{b.registration}"
    fields = r.hgetall("pq:{ns}:service:1")
    assert (fields[b"host"], fields[b"pid"], fields[b"started"], fields[b"queues"], fields[b"registration"]) == (
        b"h", b"42", str(T0).encode(), b"q1,q2", b"r1"
    )
    assert r.hget("pq:{ns}:service:queues", "1") == b"r1 q1,q2"
    assert 59_000 < r.pttl("pq:{ns}:service:1") <= 60_000
    assert r.lrange("pq:{ns}:service:ids", 0, -1) == [b"2", b"1"]
    assert r.zscore("pq:{ns}:service:expiry", "1") == T0 + 60_000


def test_register_refuses_when_the_new_ids_key_exists(services: Services, r: redis.Redis) -> None:
    r.hset("pq:{ns}:service:1", "planted", "1")
    before = dump_all(r)
    with pytest.raises(ServiceExists):
        services.register(["q"])
    assert dump_all(r) == before


def test_register_retries_when_another_service_took_the_expected_id(services: Services, r: redis.Redis) -> None:
    stale = services.keys.of(1)
    services.register(["q"], now_ms=T0)
    reply = services.scripts.call(service_register_call(stale, T0, "h", 1, "q", 60_000, 100, 10, "tok", "reg"))
    assert reply == [b"retry", 2]


def test_ids_list_is_trimmed_to_capacity(services: Services, r: redis.Redis) -> None:
    for _ in range(5):
        services.register(["q"], capacity=3, now_ms=T0)
    assert r.lrange("pq:{ns}:service:ids", 0, -1) == [b"5", b"4", b"3"]


def test_register_garbage_collects_listed_ids_whose_service_expired(services: Services, r: redis.Redis) -> None:
    services.register(["q"], expire_ms=1_000, now_ms=T0)
    services.register(["q"], expire_ms=60_000, now_ms=T0)
    services.register(["q"], now_ms=T0 + 5_000)
    assert r.lrange("pq:{ns}:service:ids", 0, -1) == [b"3", b"2"]
    assert r.zscore("pq:{ns}:service:expiry", "1") is not None  # kept until scrubbed


def test_renew_extends_the_key_and_rotates_the_token(services: Services, r: redis.Redis) -> None:
    s = services.register(["q"], expire_ms=10_000, now_ms=T0)
    first = s.renewal
    assert services.renew(s, expire_ms=10_000, now_ms=T0 + 5_000) == Renewed(stop=False, dead=[])
    assert s.renewal != first
    assert r.hget("pq:{ns}:service:1", "renewed") == str(T0 + 5_000).encode()
    assert r.zscore("pq:{ns}:service:expiry", "1") == T0 + 15_000


def test_a_renewal_reports_what_the_service_runs_and_list_reads_it_back(services: Services, r: redis.Redis) -> None:
    svc = services.register(["q"], now_ms=T0)
    running = [RunningJob("q", "b", T0 + 5, T0 + 30_005), RunningJob("q#1", "a\u00e9", T0 + 2)]
    services.renew(svc, now_ms=T0 + 10, running=running)
    (info,) = services.list(now_ms=T0 + 10)
    # The longest-running first; a job without a time limit has none.
    assert info.running == (RunningJob("q#1", "a\u00e9", T0 + 2, None), RunningJob("q", "b", T0 + 5, T0 + 30_005))
    services.renew(svc, now_ms=T0 + 20)  # no report: the last one stays
    assert services.list(now_ms=T0 + 20)[0].running == info.running
    services.renew(svc, now_ms=T0 + 30, running=[])  # nothing runs: the field goes
    assert services.list(now_ms=T0 + 30)[0].running == ()
    assert b"running" not in r.hgetall(svc.keys.role("service"))
    # A report longer than the script takes is cut to whole lines, the longest-running kept.
    many = [RunningJob("q", f"job-{i:05d}", T0 + i) for i in range(5000)]
    services.renew(svc, now_ms=T0 + 40, running=many)
    kept = services.list(now_ms=T0 + 40)[0].running
    assert 0 < len(kept) < 5000 and kept == tuple(many[: len(kept)])
    assert len(encode_running(many).encode()) <= MAX_RUNNING_BYTES


def test_a_lost_renewal_writes_no_report(services: Services, r: redis.Redis) -> None:
    svc = services.register(["q"], now_ms=T0)
    r.delete(svc.keys.role("service"))
    before = dump_all(r)
    with pytest.raises(ServiceLost):
        services.renew(svc, now_ms=T0 + 10, running=[RunningJob("q", "a", T0)])
    assert dump_all(r) == before


def test_renew_after_the_token_changed_is_lost(services: Services, r: redis.Redis) -> None:
    s = services.register(["q"], now_ms=T0)
    r.hset("pq:{ns}:service:1", "renewal", "someone-else")
    with pytest.raises(ServiceLost):
        services.renew(s, now_ms=T0 + 1)


def test_a_deleted_key_makes_renewal_lost_and_writes_nothing(services: Services, r: redis.Redis) -> None:
    s = services.register(["q"], now_ms=T0)
    r.delete("pq:{ns}:service:1")
    assert services.check(s) == "lost"
    before = dump_all(r)
    with pytest.raises(ServiceLost):
        services.renew(s, now_ms=T0 + 1)
    assert dump_all(r) == before


def test_a_check_whose_read_runs_after_renewals_it_did_not_wait_for_finds_the_key_its_own(
    services: Services, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetch loop checks the key while the heartbeat thread renews it. A renewal
    sent after check() began, and run by the server before check's read, writes a new
    token: check() once compared it with the tokens it had seen before its read, called
    the registration lost, and the worker stopped with exit 75 (a CI run under load)."""
    s = services.register(["q"], now_ms=T0)
    real = services.redis

    class RenewsBeforeEachRead:
        def __init__(self, renewals: int) -> None:
            self.renewals = renewals

        def hmget(self, *args: Any, **kwargs: Any) -> Any:
            for i in range(self.renewals):  # what the heartbeat thread sent meanwhile
                services.renew(s, now_ms=T0 + 1 + i)
            return real.hmget(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    for renewals in (1, 3, 15):
        monkeypatch.setattr(services, "redis", RenewsBeforeEachRead(renewals))
        assert services.check(s) == "ok", renewals
    monkeypatch.setattr(services, "redis", real)
    r.hset("pq:{ns}:service:1", "renewal", "someone-else")  # another registration's token
    assert services.check(s) == "lost"


def test_remote_stop_marks_the_key_wakes_the_service_and_renewal_answers_stop(
    services: Services, r: redis.Redis
) -> None:
    s = services.register(["q"], registration="r1", now_ms=T0)
    assert services.check(s) == "ok"
    assert services.stop(s.id, now_ms=T0 + 5)
    assert services.stop(s.id, now_ms=T0 + 6)  # idempotent: the first stop's time stands
    assert r.hget("pq:{ns}:service:1", "stop") == str(T0 + 5).encode()
    assert r.zrange("pq:{ns}:service:1:wake", 0, -1) == [b"stop"]
    # The marker dies with the registration: its TTL is the key's remaining TTL.
    assert abs(r.pttl("pq:{ns}:service:1:wake") - r.pttl("pq:{ns}:service:1")) < 1_000
    assert services.check(s) == "stop"
    # The stopping service still renews (its running jobs stay its own) until it deregisters.
    renewed = services.renew(s, now_ms=T0 + 10)
    assert renewed.stop and r.zscore("pq:{ns}:service:expiry", "1") == T0 + 10 + 60_000
    assert [(i.alive, i.stopping) for i in services.list(now_ms=T0 + 10)] == [(True, True)]
    assert services.deregister(s) == (1, 1)
    assert all_keys(r, "pq:{ns}:service:1*") == []


def test_remote_stop_of_no_live_service_writes_nothing(services: Services, r: redis.Redis) -> None:
    s = services.register(["q"], registration="r1", now_ms=T0)
    before = dump_all(r)
    assert not services.stop(7)
    assert not services.stop(s.id, "other")  # names another registration of this id
    assert dump_all(r) == before
    assert services.stop(s.id, "r1")


def test_renew_replayed_with_the_same_token_is_still_ok(services: Services) -> None:
    s = services.register(["q"], now_ms=T0)
    args = (s.keys, T0 + 1, s.renewal, "next-token", 60_000, 10)
    assert services.scripts.call(service_renew_call(*args))[0] == b"ok"
    assert services.scripts.call(service_renew_call(*args))[0] == b"ok"


def test_renew_reports_expired_services_with_their_queues(services: Services) -> None:
    dead = services.register(["a", "b"], expire_ms=1_000, now_ms=T0)
    live = services.register(["a"], expire_ms=60_000, now_ms=T0)
    found = services.renew(live, now_ms=T0 + 2_000).dead
    assert [(d.id, d.owner, d.queues) for d in found] == [(dead.id, dead.owner, ["a", "b"])]


def test_deregister_deletes_the_key_and_the_listed_id(services: Services, r: redis.Redis) -> None:
    s = services.register(["q"], now_ms=T0)
    assert services.deregister(s) == (1, 1)
    assert all_keys(r, "pq:{ns}:service:1*") == [] and r.llen("pq:{ns}:service:ids") == 0
    assert r.zcard("pq:{ns}:service:expiry") == 0 and r.hlen("pq:{ns}:service:queues") == 0
    assert services.deregister(s) == (0, 0)


def test_forget_dead_does_nothing_to_a_live_service(services: Services, r: redis.Redis) -> None:
    s = services.register(["q"], now_ms=T0)
    before = dump_all(r)
    assert not services.forget_dead(s.id, s.registration, now_ms=T0 + 1)
    assert dump_all(r) == before
    r.delete("pq:{ns}:service:1")
    assert not services.forget_dead(s.id, "other", now_ms=T0 + 60_000)  # another registration's
    assert dump_all(r) != before and r.zcard("pq:{ns}:service:expiry") == 1
    assert services.forget_dead(s.id, s.registration, now_ms=T0 + 60_000)
    assert r.zcard("pq:{ns}:service:expiry") == 0


def test_list_shows_live_and_dead_services(services: Services) -> None:
    services.register(["q"], host="h1", pid=7)
    infos = services.list()
    assert [(i.id, i.alive, i.host, i.pid, i.queues) for i in infos] == [(1, True, "h1", 7, ["q"])]


def test_a_service_advertises_the_tasks_it_runs_and_list_shows_them(services: Services, r: redis.Redis) -> None:
    names = ["emails.send", "reports:<monthly>", "a-b_c.d", "x" * 200]
    a = services.register(["q1", "q2"], tasks=names, now_ms=T0)
    b = services.register(["q1"], now_ms=T0)  # names none: no field
    assert r.hget(a.keys.role("service"), "tasks") == ",".join(names).encode()
    assert not r.hexists(b.keys.role("service"), "tasks")
    infos = {i.id: i for i in services.list(now_ms=T0)}
    assert (infos[a.id].tasks, infos[a.id].queues) == (tuple(names), ["q1", "q2"])
    assert infos[b.id].tasks == ()
    # Which task names the live workers of q1 serve, as a caller computes it.
    assert {t for i in services.list(now_ms=T0) if i.alive and "q1" in i.queues for t in i.tasks} == set(names)
    # Renewal keeps them; an expired service shows none (its key is gone).
    services.renew(a, now_ms=T0 + 1)
    assert r.hget(a.keys.role("service"), "tasks") == ",".join(names).encode()
    r.delete(a.keys.role("service"))
    assert {i.id: i.tasks for i in services.list(now_ms=T0 + 1)}[a.id] == ()


@pytest.mark.parametrize(
    "tasks",
    [["ok", ""], ["a,b"], ["sp ace"], ["x" * 201], ["é"], [5], "one-string", b"bytes", ["t" * 200] * 327],
    ids=repr,
)
def test_bad_task_names_are_refused_before_anything_is_sent(services: Services, r: redis.Redis, tasks: Any) -> None:
    before = dump_all(r)
    with pytest.raises(InvalidArgument):
        services.register(["q"], tasks=tasks)
    assert dump_all(r) == before


@pytest.mark.parametrize(
    "tasks", ["a,", ",a", "a,,b", ",", "sp ace", "a\nb", "x" * 201, "\u00e9", "a;b", ",".join(["t" * 200] * 327)]
)
def test_the_script_refuses_bad_task_names_with_pq_badarg_and_writes_nothing(
    services: Services, r: redis.Redis, tasks: str
) -> None:
    services.register(["q"], now_ms=T0)
    before = dump_all(r)
    keys = services.keys.of(2)
    with pytest.raises(redis.ResponseError, match=r"^PQ_BADARG "):
        services.scripts.run("service_register", keys, ["", 2, "h", 1, "q", 60_000, 100, 10, "tok", "reg", tasks])
    assert dump_all(r) == before


def test_an_old_style_ten_argument_register_still_works(services: Services, r: redis.Redis) -> None:
    # Clients written before ARGV 11 (the Node example among them) send 10 values.
    reply = services.scripts.run(
        "service_register", services.keys.of(1), [T0, 1, "h", 1, "q", 60_000, 100, 10, "tok", "reg"]
    )
    assert reply == [b"ok", 1, T0]
    assert not r.hexists("pq:{ns}:service:1", "tasks")
    (info,) = services.list(now_ms=T0)
    assert (info.id, info.alive, info.queues, info.tasks) == (1, True, ["q"], ())
    # An 11th value of '' is the same; more than 11 is refused (a count the contract,
    # lua/README.md section 10, does not allow).
    assert services.scripts.run(
        "service_register", services.keys.of(2), [T0, 2, "h", 1, "q", 60_000, 100, 10, "tok", "reg", ""]
    )[:2] == [b"ok", 2]
    assert not r.hexists("pq:{ns}:service:2", "tasks")
    with pytest.raises(redis.ResponseError, match=r"^PQ_CONTRACT service_register expects 10\.\.11 arguments "):
        services.scripts.run(
            "service_register", services.keys.of(3), [T0, 3, "h", 1, "q", 60_000, 100, 10, "tok", "reg", "", "x"]
        )


def test_scrub_returns_a_dead_owners_leases_to_the_head_at_once(r: redis.Redis) -> None:
    dead = Queue("q", r, owner="ns.1")
    alive = Queue("q", r, owner="ns.2")
    dead.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(4)], now_ms=T0)
    lost = dead.lease(lease_ms=600_000, count=2, now_ms=T0)
    (kept,) = alive.lease(lease_ms=600_000, now_ms=T0)
    result = alive.scrub("ns.1", now_ms=T0 + 1)
    assert (result.scrubbed, result.dead, result.more) == (2, 0, False)
    again = alive.lease(count=3, now_ms=T0 + 1)
    assert [(j.id, j.attempt) for j in again] == [("j0", 2), ("j1", 2), ("j3", 1)]
    assert [dead.ack(j) for j in lost] == [Outcome.STALE, Outcome.STALE]
    assert alive.ack(kept) is Outcome.OK
    assert alive.stats(now_ms=T0 + 1).scrubbed == 2


def test_scrub_twice_and_of_an_owner_with_no_leases_changes_nothing(r: redis.Redis) -> None:
    q = Queue("q", r, owner="ns.1")
    q.enqueue(b"", now_ms=T0)
    q.lease(now_ms=T0)
    assert q.scrub("ns.1", now_ms=T0).scrubbed == 1
    before = dump_all(r)
    assert q.scrub("ns.1", now_ms=T0).scrubbed == 0
    assert q.scrub("ns.10", now_ms=T0).scrubbed == 0
    assert dump_all(r) == before


def test_scrub_does_not_touch_an_owner_whose_name_extends_the_dead_one(r: redis.Redis) -> None:
    q1, q10 = Queue("q", r, owner="ns.1"), Queue("q", r, owner="ns.10")
    q1.enqueue_many([b"", b""], now_ms=T0)
    q1.lease(now_ms=T0)
    q10.lease(now_ms=T0)
    assert q1.scrub("ns.1", now_ms=T0).scrubbed == 1
    assert q1.stats(now_ms=T0).leased == 1


def test_scrub_sends_a_job_at_max_attempts_to_dead_poison_pill(r: redis.Redis) -> None:
    q = Queue("q", r, owner="ns.1")
    q.enqueue(b"", job_id="poison", max_attempts=1, now_ms=T0)
    q.lease(now_ms=T0)
    assert q.scrub("ns.1", now_ms=T0).dead == 1
    (dead,) = q.dead_list().jobs
    assert dead.error == "worker ns.1 died on attempt 1 of 1"


def test_scrub_is_bounded_by_limit(r: redis.Redis) -> None:
    q = Queue("q", r, owner="ns.1")
    q.enqueue_many([b""] * 5, now_ms=T0)
    q.lease(count=5, now_ms=T0)
    assert (q.scrub("ns.1", limit=3, now_ms=T0).more, q.scrub("ns.1", limit=3, now_ms=T0).scrubbed) == (True, 2)


SERVICE_KEY_TYPES = {"seq": "string", "ids": "list", "expiry": "zset", "queues": "hash"}


@pytest.mark.parametrize(
    ("role", "planted"),
    [(role, t) for role, kind in SERVICE_KEY_TYPES.items() for t in ("string", "list", "set", "zset") if t != kind],
)
def test_service_register_with_a_wrong_key_type_writes_nothing(
    services: Services, r: redis.Redis, role: str, planted: str
) -> None:
    services.register(["q"], expire_ms=1_000, now_ms=T0)
    key = services.keys.role(role)
    r.delete(key)
    {"string": lambda: r.set(key, "x"), "list": lambda: r.rpush(key, "x"), "set": lambda: r.sadd(key, "x"),
     "zset": lambda: r.zadd(key, {"x": 1})}[planted]()
    before = dump_all(r)
    with pytest.raises(Exception, match="WRONGTYPE"):
        services.scripts.call(service_register_call(services.keys.of(2 if role != "seq" else 1), T0 + 5_000, "h", 1,
                                                    "q", 60_000, 100, 10, "tok", "reg"))
    assert dump_all(r) == before


def test_after_redis_lost_its_data_an_old_service_cannot_touch_the_new_holder_of_its_id(
    services: Services, r: redis.Redis
) -> None:
    # Redis restarted empty: the id counter starts again, and a new service gets id 1.
    old = services.register(["q"], registration="old", now_ms=T0)
    q = Queue("q", r, owner=old.owner)
    q.enqueue(b"", job_id="held-by-old", now_ms=T0)
    q.lease(now_ms=T0)
    r.flushall()
    new = services.register(["q"], registration="new", now_ms=T0 + 1)
    assert (old.id, new.id) == (1, 1) and old.owner != new.owner
    mine = Queue("q", r, owner=new.owner)
    mine.enqueue(b"", job_id="held-by-new", now_ms=T0 + 1)
    mine.lease(now_ms=T0 + 1)
    before = dump_all(r)
    # The old service's renewal is lost, its stop and deregistration change nothing...
    assert services.check(old) == "lost"
    with pytest.raises(ServiceLost):
        services.renew(old, now_ms=T0 + 2)
    assert not services.stop(old.id, old.registration)
    assert services.deregister(old) == (-1, 0)
    assert not services.forget_dead(old.id, old.registration, now_ms=T0 + 120_000)
    # ...and scrubbing the old owner does not touch the new one's leases.
    assert Queue("q", r).scrub(old.owner, now_ms=T0 + 2).scrubbed == 0
    assert dump_all(r) == before
    assert services.check(new) == "ok"
