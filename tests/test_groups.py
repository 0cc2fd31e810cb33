"""Fair scheduling (lua/README.md section 2.1): groups with per-group caps and priorities,
decided in lease.lua. Both drivers, fakeredis and a real redis-server, and a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from pyqueue import InvalidArgument, Job, NewJob, Outcome, Queue

ON_CLUSTER = True
ASYNC_TOO = True

T0 = 1_000_000


def ids(jobs: list[Any]) -> list[str]:
    return [job.id for job in jobs]


def running(q: Queue, r: Any, group: str) -> int:
    """The group's running count as the scripts keep it (r:<group> in `groups`)."""
    value = r.hget(q.spec.keys.groups, f"r:{group}")
    return int(value) if value is not None else 0


def test_lease_serves_groups_round_robin_and_a_backlog_delays_no_group_by_more_than_a_round(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"a{i}", group="A") for i in range(6)], now_ms=T0)
    q.enqueue_many([NewJob(b"", job_id=f"b{i}", group="B") for i in range(2)], now_ms=T0)
    q.enqueue(b"", job_id="c0", group="C", now_ms=T0)
    assert ids(q.lease(count=5, now_ms=T0)) == ["a0", "b0", "c0", "a1", "b1"]
    assert ids(q.lease(count=5, now_ms=T0)) == ["a2", "a3", "a4", "a5"]


def test_ungrouped_jobs_take_one_turn_of_the_round_as_one_group(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"a{i}", group="A") for i in range(3)], now_ms=T0)
    q.enqueue_many([NewJob(b"", job_id=f"u{i}") for i in range(3)], now_ms=T0)
    assert ids(q.lease(count=6, now_ms=T0)) == ["u0", "a0", "u1", "a1", "u2", "a2"]


def test_priorities_a_higher_level_first_fifo_within_a_level_with_and_without_groups(q: Queue) -> None:
    q.enqueue_many([NewJob(b"", job_id="p0"), NewJob(b"", job_id="lo", priority=-3), NewJob(b"", job_id="hi", priority=4),
                    NewJob(b"", job_id="p1"), NewJob(b"", job_id="hi2", priority=4)], now_ms=T0)
    assert ids(q.lease(count=5, now_ms=T0)) == ["hi", "hi2", "p0", "p1", "lo"]
    q.enqueue_many([NewJob(b"", job_id="g0", group="G"), NewJob(b"", job_id="g5", group="G", priority=5),
                    NewJob(b"", job_id="gm", group="G", priority=-5)], now_ms=T0)
    assert ids(q.lease(count=3, now_ms=T0)) == ["g5", "g0", "gm"]


def test_a_promoted_job_keeps_its_priority_and_its_group(q: Queue, r: Any) -> None:
    # Priority orders jobs within their group (between groups, the round decides).
    q.enqueue(b"", job_id="early", group="G", now_ms=T0)
    q.enqueue(b"", job_id="later", priority=2, group="G", delay_ms=10, now_ms=T0)
    assert ids(q.lease(count=2, now_ms=T0 + 20)) == ["later", "early"]
    assert running(q, r, "G") == 2


def test_a_group_at_its_cap_is_skipped_without_blocking_others_or_using_attempts(q: Queue, r: Any) -> None:
    assert q.set_group_limit(2) is True
    assert q.set_group_limit(2) is False  # the same cap again: unchanged
    q.enqueue_many([NewJob(b"", job_id=f"a{i}", group="A") for i in range(5)], now_ms=T0)
    q.enqueue_many([NewJob(b"", job_id=f"b{i}", group="B") for i in range(3)], now_ms=T0)
    first = q.lease(count=10, now_ms=T0)
    assert ids(first) == ["a0", "b0", "a1", "b1"]  # two of each: the rest of A and B waits
    assert q.lease(count=10, now_ms=T0) == []
    stats = q.stats(now_ms=T0)
    assert (stats.ready, stats.groups_at_cap, stats.groups_waiting) == (4, 2, 0)
    q.enqueue(b"", job_id="u", now_ms=T0)  # no head-of-line blocking: an ungrouped job passes
    assert ids(q.lease(count=10, now_ms=T0)) == ["u"]
    assert q.ack(first[0], now_ms=T0) is Outcome.OK  # A gets a slot back
    (a2,) = q.lease(count=10, now_ms=T0)
    assert a2.id == "a2" and a2.attempt == 1  # waiting used no attempt
    assert running(q, r, "A") == 2 and running(q, r, "B") == 2


@pytest.mark.parametrize("stale", [30, 150])
def test_a_pick_parks_many_groups_at_their_cap_and_serves_the_first_with_a_free_slot(
    q: Queue, r: Any, stale: int
) -> None:
    """A ring of many groups each at its cap (set after they came due): a lease of one
    job parks them, read from the ring a chunk at a time, within its budget of 100
    steps beyond its count, and serves the first group with a free slot; a pick cut
    short by that budget is taken up by the next lease."""
    q.enqueue_many([NewJob(b"", job_id=f"g{i}-{k}", group=f"g{i}") for i in range(stale) for k in range(2)],
                   now_ms=T0)
    assert sorted(ids(q.lease(count=stale, now_ms=T0))) == sorted(f"g{i}-0" for i in range(stale))
    q.set_group_limit(1)  # each group is at its cap now, its ring entry still due
    q.enqueue(b"", job_id="free-0", group="free", now_ms=T0)
    calls = [ids(q.lease(count=1, now_ms=T0))]
    while not calls[-1] and len(calls) < 3:
        calls.append(ids(q.lease(count=1, now_ms=T0)))
    assert calls == ([["free-0"]] if stale <= 100 else [[], ["free-0"]])
    assert r.zcount(q.spec.keys.ring, "-inf", "(0") == stale  # every group at its cap parked
    assert q.stats(now_ms=T0).groups_at_cap == stale


def test_a_ring_of_many_groups_is_served_as_the_model_serves_it(r: Any) -> None:
    """The model machine's examples hold a few groups, so every pick reads the ring in
    one chunk; here 40 groups, caps that change under them, acks and leases of several
    jobs make the pick read it a chunk at a time. Every lease answers what the model
    (tests/model.py) answers: the same jobs in the same order, and the same next_due_ms."""
    import random

    from model import QueueModel

    q, model = Queue("many", r, owner="w", keep_done_ms=1000), QueueModel("many")
    rng, now, held, n, acked, most = random.Random(20261129), T0, [], 0, 0, 0
    names = [f"g{i:02d}" for i in range(40)]
    assert q.set_group_limit(1) is True
    model.set_group_limit("", 1)
    for step in range(400):
        op = rng.random()
        if op < 0.35:
            batch = []
            for _ in range(rng.randint(1, 6)):
                n += 1
                batch.append((f"j{n}", b"", 0, 3, rng.choice([0, 0, 1, -1]), rng.choice([None, *names])))
            got = q.enqueue_many([NewJob(p, job_id=i, delay_ms=d, max_attempts=m, priority=pr, group=g)
                                  for i, p, d, m, pr, g in batch], now_ms=now)
            assert [e.added for e in got] == model.enqueue(batch, now)
        elif op < 0.45:
            # Lifting the default cap lets groups run several jobs; setting it again
            # leaves them in the ring at their cap, to be parked by the next picks.
            group, cap = rng.choice(["", "", "", "", *names[:3]]), rng.choice([None, None, 1, 2])
            q.set_group_limit(cap, group=group or None)
            model.set_group_limit(group, ("" if group else 0) if cap is None else cap)
        elif op < 0.75:
            count, call = rng.choice([1, 1, 2, 4]), f"k{step}"
            leased = q.lease_call(count=count, lease_ms=60_000, call=call, now_ms=now)
            expected = model.lease("w", call, count, 60_000, 100, [], now)
            assert leased.jobs == expected.jobs, (step, [j.id for j in leased.jobs], [j.id for j in expected.jobs])
            assert leased.next_due_ms == expected.next_due_ms, step
            held.extend(leased.jobs)
        elif held:
            job = held.pop(rng.randrange(len(held)))
            assert q.ack(job, now_ms=now).value == model.ack([job.receipt], now, 1000)[0]
            acked += 1
        now += rng.choice([0, 1, 7])
        most = max(most, sum(turn > 0 for turn in model.ring.values()))
    assert acked > 20 and most > 20, f"the walk did not fill the ring: {acked} acks, at most {most} groups due"


def test_a_group_cap_overrides_the_default_and_raising_a_cap_wakes_the_parked_group(q: Queue, r: Any) -> None:
    q.set_group_limit(1)
    q.set_group_limit(3, group="big")
    q.enqueue_many([NewJob(b"", job_id=f"s{i}", group="small") for i in range(3)], now_ms=T0)
    q.enqueue_many([NewJob(b"", job_id=f"g{i}", group="big") for i in range(5)], now_ms=T0)
    assert ids(q.lease(count=10, now_ms=T0)) == ["s0", "g0", "g1", "g2"]
    r.delete(q.spec.keys.wake)
    assert q.set_group_limit(2) is True  # small gets a second slot at once, and workers are woken
    assert r.zscore(q.spec.keys.wake, "wake") is not None
    assert ids(q.lease(count=10, now_ms=T0)) == ["s1"]
    assert q.set_group_limit(None, group="big") is True  # big falls back to the default, 2
    assert q.lease(count=10, now_ms=T0) == []


def test_every_ending_of_a_lease_gives_the_slot_back_once(q: Queue, r: Any) -> None:
    q.set_group_limit(1)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}", group="G", max_attempts=9) for i in range(8)], now_ms=T0)

    def one(at: int, lease_ms: int = 1000) -> Any:
        (job,) = q.lease(count=5, lease_ms=lease_ms, now_ms=at)
        assert running(q, r, "G") == 1 and q.lease(count=5, now_ms=at) == []  # at the cap
        return job

    job = one(T0)
    assert q.ack(job, now_ms=T0) is Outcome.OK
    assert q.ack(job, now_ms=T0) is Outcome.GONE  # a replayed ack gives nothing back again
    assert running(q, r, "G") == 0
    job = one(T0)
    q.nack(job, "boom", delay_ms=0, now_ms=T0)
    assert running(q, r, "G") == 0
    job = one(T0)
    q.release([job])
    assert running(q, r, "G") == 0
    job = one(T0)
    assert q.cancel(job.id, now_ms=T0).state == "leased"
    assert running(q, r, "G") == 0
    job = one(T0, lease_ms=10)
    promoted = q.promote(now_ms=T0 + 20)  # lease expiry: reclaimed
    assert promoted.reclaimed == 1 and running(q, r, "G") == 0
    job = one(T0 + 20, lease_ms=10)
    assert ids(q.lease(count=5, now_ms=T0 + 40)) != []  # lease's own reclaim frees the slot for itself
    assert running(q, r, "G") == 1


def test_a_scrubbed_lease_gives_its_slot_back(q: Queue, r: Any) -> None:
    q.set_group_limit(1)
    q.enqueue_many([NewJob(b"", job_id=f"j{i}", group="G") for i in range(2)], now_ms=T0)
    (job,) = q.lease(count=2, now_ms=T0)
    assert running(q, r, "G") == 1
    scrubbed = q.scrub(q.spec.owner, now_ms=T0)
    assert scrubbed.scrubbed == 1 and running(q, r, "G") == 0
    assert ids(q.lease(count=2, now_ms=T0)) == [job.id]  # back at the head of its group


def test_a_cancelled_ready_job_leaves_its_group_and_meta_goes_with_the_job(q: Queue, r: Any) -> None:
    q.enqueue_many([NewJob(b"", job_id="a", group="G"), NewJob(b"", job_id="b", group="G", priority=1)], now_ms=T0)
    assert q.cancel("a", now_ms=T0).state == "ready"
    (b,) = q.lease(count=5, now_ms=T0)
    assert q.ack(b, now_ms=T0) is Outcome.OK
    assert r.hlen(q.spec.keys.meta) == 0 and r.zcard(q.spec.keys.gready) == 0


def test_a_dead_job_keeps_its_group_and_a_replay_puts_it_back_in_its_group(q: Queue, r: Any) -> None:
    q.enqueue(b"", job_id="d", group="G", max_attempts=1, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    q.nack(job, "bad", now_ms=T0)
    assert running(q, r, "G") == 0 and q.dead_replay(["d"], now_ms=T0) == 1
    assert ids(q.lease(now_ms=T0)) == ["d"] and running(q, r, "G") == 1


def test_bad_groups_and_priorities_are_refused_before_anything_is_sent(q: Queue, r: Any) -> None:
    for bad in ({"group": "a|b"}, {"group": ""}, {"group": "x" * 129}, {"group": "a\nb"}, {"priority": 6},
                {"priority": -6}, {"priority": 1.5}):
        with pytest.raises(InvalidArgument):
            q.enqueue(b"", **bad)
    with pytest.raises(InvalidArgument):
        q.set_group_limit(-1)
    with pytest.raises(InvalidArgument):
        q.set_group_limit(1, group="a|b")
    assert r.dbsize() == 0


def test_a_queue_without_groups_or_priorities_writes_no_fair_scheduling_key(q: Queue, r: Any) -> None:
    q.enqueue_many([NewJob(b"", job_id=f"j{i}") for i in range(3)], now_ms=T0)
    jobs = q.lease(count=3, now_ms=T0)
    q.ack_many(jobs, now_ms=T0)
    for key in (q.spec.keys.meta, q.spec.keys.gready, q.spec.keys.ring, q.spec.keys.groups):
        assert r.exists(key) == 0
    assert r.hget(q.spec.keys.counters, "fair") is None


def test_tasks_carry_group_and_priority_from_the_task_or_the_send(r: Any) -> None:
    from pyqueue import Tasks

    tasks = Tasks(client=r)
    seen: list[str] = []

    @tasks.task(name="charge", group=lambda account, amount: f"acct-{account}")
    def charge(account: int, amount: int) -> None:
        seen.append(f"{account}:{amount}")

    q = tasks.queue("default")
    q.set_group_limit(1)
    for amount in range(3):
        charge.send(1, amount)
    charge.send(2, 0)
    charge.options(priority=5, group="vip").send(3, 0)
    jobs = q.lease(count=10)
    # One job of each account at once (cap 1), VIP's own group included.
    assert sorted(r.hget(q.spec.keys.meta, job.id).decode().split("|")[2] for job in jobs) == ["acct-1", "acct-2", "vip"]
    with pytest.raises(InvalidArgument):
        charge.options(group="a|b")
    with pytest.raises(InvalidArgument):
        charge.options(priority=9)


def test_a_group_function_gets_the_arguments_by_name_however_the_call_gave_them(r: Any) -> None:
    """README's example, ``group=lambda account_id, **_: ...`` on a task of two
    arguments sent by position: the function reads its argument by name (it was once
    called with the arguments by position, and raised TypeError)."""
    from pyqueue import Tasks

    tasks = Tasks(client=r)

    @tasks.task(name="deliver", group=lambda account_id, **_: f"acct-{account_id}")
    def deliver(account_id: int, url: str, retries: int = 3) -> None: ...

    @tasks.task(name="only_positional", group=lambda a, /, *rest, **_: f"g-{a}-{len(rest)}")
    def only_positional(a: int, /, *rest: int) -> None: ...

    sent = [deliver.send(7, "https://a"), deliver.send(account_id=8, url="https://b"), deliver.send(9, url="https://c"),
            only_positional.send(1, 2, 3)]
    q = tasks.queue("default")
    assert [r.hget(q.spec.keys.meta, s.id).decode().split("|")[2] for s in sent] == ["acct-7", "acct-8", "acct-9", "g-1-2"]


def test_the_cap_holds_in_the_handlers_own_log_with_8_threads_and_a_killed_worker(r: Any) -> None:
    """Two workers of 8 threads each, the first killed mid-drain (its leases scrubbed by
    the second): the handlers' own append-only log never shows more than the cap of one
    group running at once, and every job ran."""
    import threading
    import time
    from collections import Counter

    from pyqueue.worker import Worker

    q = Queue("capped", r)
    q.set_group_limit(2)
    groups = ["g0", "g1", "g2", "g3"]
    q.enqueue_many([NewJob(g.encode(), job_id=f"{g}-{i}", group=g) for i in range(40) for g in groups])
    log: list[tuple[str, str, int]] = []  # (group, job, +1 at its start / -1 at its end), append-only
    lock = threading.Lock()
    started = threading.Event()

    def handler(job: Job) -> None:
        with lock:
            log.append((job.payload.decode(), job.id, 1))
        started.set()
        time.sleep(0.003)
        with lock:
            log.append((job.payload.decode(), job.id, -1))

    def run(worker: Worker) -> threading.Thread:
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
        thread.start()
        return thread

    victim = Worker(["capped"], handler, redis=r, concurrency=8, lease_ms=60_000, renew_ms=200, expire_ms=1_000,
                    block_ms=1_000)
    run(victim)
    assert started.wait(10)
    time.sleep(0.05)
    victim.kill()  # as SIGKILL: its leases stay until a live worker scrubs them
    # The rescuer's own registration has room (10 s): on a loaded CI machine a 1 s one may
    # expire between two renewals, and the rescuer would then stop, as it must. (Its two
    # CI failures were another cause: Services.check's race with renewals, now fixed.)
    rescuer = Worker(["capped"], handler, redis=r, concurrency=8, renew_ms=200, expire_ms=10_000, block_ms=200)
    thread = run(rescuer)
    deadline = time.monotonic() + 30
    while q.stats().acked < 160:
        assert time.monotonic() < deadline, f"not drained: {q.stats()}"
        time.sleep(0.05)
    rescuer.stop("drained")
    thread.join(10)
    time.sleep(0.05)  # the killed worker's last handlers return (their results are dropped)
    running: Counter[str] = Counter()
    with lock:
        for group, _, step in log:
            running[group] += step
            assert running[group] <= 2, f"{group} had {running[group]} jobs running at once (cap 2)"
        ran = {job for _, job, step in log if step == 1}
    assert ran == {f"{g}-{i}" for g in groups for i in range(40)}
    assert all(r.hget(q.spec.keys.groups, f"r:{g}") in (None, b"0") for g in groups)
