"""Byte budgets (lua/set_budget.lua, lua/README.md section 2.7): with a budget, enqueue
keeps each job's payload size and refuses, with QueueFull and nothing written, a call
that would take the queue past it; the scripts that end a job take its size off. On
both drivers, fakeredis, a real redis-server and a Redis Cluster; and a Hypothesis
machine that keeps the count exact under random sends and endings."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
import redis
from conftest import RedisServer, dump_all
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from model import Backend, FakeBackend, RealBackend

from pyqueue import InvalidArgument, NewJob, Outcome, OutcomeUnknown, Queue, QueueFull

ASYNC_TOO = True
ON_CLUSTER = True
T0 = 1_000_000
LEASE = 60_000


def test_an_enqueue_past_the_budget_is_refused_and_writes_nothing(q: Queue, r: redis.Redis) -> None:
    assert q.set_budget(100) is True
    assert q.set_budget(100) is False  # the same budget: no change
    q.enqueue(b"x" * 60, job_id="a", now_ms=T0)
    before = dump_all(r)
    with pytest.raises(QueueFull, match="60 of 100 bytes in use, this call adds 50") as info:
        q.enqueue(b"x" * 50, job_id="b", now_ms=T0)
    assert not isinstance(info.value, OutcomeUnknown)
    assert dump_all(r) == before
    # A batch is refused whole: its first job alone would fit.
    with pytest.raises(QueueFull):
        q.enqueue_many([NewJob(b"x" * 30), NewJob(b"x" * 30)], now_ms=T0)
    assert dump_all(r) == before
    q.enqueue(b"x" * 40, job_id="fits", now_ms=T0)  # exactly at the budget
    st = q.stats(now_ms=T0)
    assert (st.bytes, st.budget_bytes, st.enqueued) == (100, 100, 2)


def test_each_ending_takes_its_jobs_size_off_and_a_dead_job_still_counts(q: Queue) -> None:
    q.set_budget(10_000)
    for name in ("acked", "result", "cancelled", "dead", "expired"):
        q.enqueue(name.encode() * 10, job_id=name, max_attempts=1,
                  expires_ms=1000 if name == "expired" else None, now_ms=T0)
    size = {name: len(name) * 10 for name in ("acked", "result", "cancelled", "dead", "expired")}
    assert q.stats(now_ms=T0).bytes == sum(size.values())
    jobs = {j.id: j for j in q.lease(count=4, lease_ms=LEASE, now_ms=T0)}
    assert q.ack(jobs["acked"], now_ms=T0) is Outcome.OK
    q.ack_result(jobs["result"], b"42", now_ms=T0)
    assert q.cancel("cancelled", now_ms=T0).state == "leased"
    q.nack(jobs["dead"], "boom", now_ms=T0)
    assert q.stats(now_ms=T0).bytes == size["dead"] + size["expired"]
    assert q.lease(count=1, lease_ms=LEASE, now_ms=T0 + 1000) == []  # expired: its size goes
    assert q.stats(now_ms=T0 + 1000).bytes == size["dead"]
    assert q.dead_replay(["dead"], now_ms=T0 + 1000) == 1  # replayed: still the same job
    assert q.stats(now_ms=T0 + 1000).bytes == size["dead"]
    (again,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0 + 1000)
    q.nack(again, "boom", now_ms=T0 + 1000)
    assert q.dead_purge(["dead"]) == 1
    assert q.stats(now_ms=T0 + 1000).bytes == 0


def test_a_debounce_merge_counts_the_last_sends_size(q: Queue) -> None:
    q.set_budget(1000)
    first = q.enqueue(b"x" * 100, debounce_ms=1000, key="k", now_ms=T0)
    q.enqueue(b"x" * 300, debounce_ms=1000, key="k", now_ms=T0 + 1)
    assert q.stats(now_ms=T0 + 1).bytes == 300
    q.enqueue(b"x" * 50, debounce_ms=1000, key="k", now_ms=T0 + 2)
    assert q.stats(now_ms=T0 + 2).bytes == 50
    (job,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0 + 1002)
    assert job.id == first.id
    q.ack(job, now_ms=T0 + 1002)
    assert q.stats(now_ms=T0 + 1002).bytes == 0


def test_a_job_that_waits_for_others_is_sized_and_refused_past_the_budget(q: Queue, r: redis.Redis) -> None:
    """flow_wait.lua (a flow's continuation) sizes its job as enqueue does: a flow cannot
    take a queue past its budget by its waiting steps."""
    q.set_budget(100)
    q.enqueue(b"x" * 60, job_id="first", now_ms=T0)
    assert q.flow_wait(NewJob(b"x" * 30, job_id="then"), [(q.name, "first")], now_ms=T0) == "ok"
    assert q.stats(now_ms=T0).bytes == 90
    before = dump_all(r)
    with pytest.raises(QueueFull, match="90 of 100 bytes in use, this call adds 20"):
        q.flow_wait(NewJob(b"x" * 20, job_id="later"), [(q.name, "first")], now_ms=T0)
    assert dump_all(r) == before
    # A re-sent arm finds it armed: no byte added, never refused for it.
    assert q.flow_wait(NewJob(b"x" * 30, job_id="then"), [(q.name, "first")], now_ms=T0) == "armed"
    (first,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0)
    q.ack(first, now_ms=T0)
    assert q.flow_done("then", [(q.name, "first", "ok")], now_ms=T0).state == "released"
    assert q.stats(now_ms=T0).bytes == 30  # released, not yet ended: still held
    (then,) = q.lease(count=1, lease_ms=LEASE, now_ms=T0)
    assert then.id == "then"
    q.ack(then, now_ms=T0)
    assert q.stats(now_ms=T0).bytes == 0


def test_a_waiting_job_cancelled_takes_its_size_off(q: Queue) -> None:
    q.set_budget(100)
    q.flow_wait(NewJob(b"x" * 30, job_id="then"), [(q.name, "never")], now_ms=T0)
    assert q.cancel("then", now_ms=T0).state == "scheduled"
    assert q.stats(now_ms=T0).bytes == 0


def test_jobs_sent_without_a_budget_are_not_counted_and_lifting_it_stops_the_sizing(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x" * 500, job_id="before", now_ms=T0)
    assert not r.exists(q.spec.keys.keyed)  # a queue without a budget keeps no sizes
    assert r.hget(q.spec.keys.counters, "sized") is None
    q.set_budget(100)
    q.enqueue(b"x" * 80, job_id="sized", now_ms=T0)
    assert q.stats(now_ms=T0).bytes == 80
    assert q.set_budget(None) is True
    q.enqueue(b"x" * 5000, job_id="after", now_ms=T0)  # no budget: no refusal, no size
    assert q.stats(now_ms=T0).bytes == 80
    for job in q.lease(count=3, lease_ms=LEASE, now_ms=T0):
        q.ack(job, now_ms=T0)
    st = q.stats(now_ms=T0)
    assert (st.bytes, st.budget_bytes) == (0, 0)
    assert not r.exists(q.spec.keys.keyed)


def test_a_bad_budget_is_refused_before_anything_is_sent(q: Queue, r: redis.Redis) -> None:
    before = dump_all(r)
    for bad in (-1, 2**50 + 1, 1.5, "1MiB", True):
        with pytest.raises(InvalidArgument):
            q.set_budget(bad)  # type: ignore[arg-type]
    assert dump_all(r) == before


def test_a_flow_refused_by_the_budget_leaves_no_step_behind(r: redis.Redis) -> None:
    """A flow's steps are sent by several calls; the one a budget refuses raises
    QueueFull, and the steps the earlier calls added are cancelled: no part of the flow
    runs, and the budget's bytes are back where they were."""
    from pyqueue.tasks import Tasks

    q = Queue("flows", r)
    q.set_budget(1000)
    tasks = Tasks(client=r, default_queue="flows")

    @tasks.task(name="fetch")
    def fetch(blob: str) -> str: ...

    @tasks.task(name="store")
    def store(blob: str, note: str) -> None: ...

    with pytest.raises(QueueFull):  # the waiting step is armed, then the first refused
        (fetch.s("x" * 1000) | store.s("small")).send()
    st_ = q.stats()
    assert (st_.bytes, st_.ready, st_.scheduled) == (0, 0, 0)
    assert q.lease(count=10) == []
    with pytest.raises(QueueFull):  # the waiting step itself is refused
        (fetch.s("small") | store.s("x" * 1000)).send()
    assert (q.stats().bytes, q.stats().ready, q.stats().scheduled) == (0, 0, 0)
    handle = (fetch.s("small") | store.s("small")).send()  # within the budget: sent whole
    assert q.stats().ready == 1 and q.stats().scheduled == 1 and handle.id


def test_on_a_partitioned_queue_each_partition_holds_its_share(r: redis.Redis) -> None:
    from pyqueue.protocol.core import partition_of

    q = Queue("parted", r, partitions=4)
    assert q.set_budget(400) is True
    ids = [f"j{i}" for i in range(200) if partition_of(f"j{i}", 4) == 0][:3]
    q.enqueue(b"x" * 60, job_id=ids[0], now_ms=T0)
    with pytest.raises(QueueFull):
        q.enqueue(b"x" * 60, job_id=ids[1], now_ms=T0)  # partition 0 holds at most 100
    other = next(f"k{i}" for i in range(200) if partition_of(f"k{i}", 4) == 1)
    q.enqueue(b"x" * 60, job_id=other, now_ms=T0)  # another partition has room
    assert q.stats(now_ms=T0).bytes == 120


# -- the count stays exact (Hypothesis) ------------------------------------------------


class BudgetMachine(RuleBasedStateMachine):
    """Random sends (some merged by debounce, some waiting for other jobs), acks, retries, dead letters, replays,
    purges, cancels and budget changes: `bytes` is always the sum of the sizes of the
    jobs sent under a budget that have not ended, and a refused send changed nothing."""

    backend: Backend

    def __init__(self) -> None:
        super().__init__()
        self.client = self.backend.fresh()
        self.q = Queue("budget", self.client)
        self.q.set_budget(2000)
        self.budget: int | None = 2000
        self.now = T0
        self.sized: dict[str, int] = {}  # job id -> its size, for jobs sent under a budget
        self.leased: dict[str, Any] = {}
        self.waiting: set[str] = set()
        self.n = 0

    def teardown(self) -> None:
        self.backend.done(self.client)

    @rule(size=st.sampled_from([0, 1, 100, 700]), debounced=st.booleans())
    def send(self, size: int, debounced: bool) -> None:
        self.n += 1
        options: dict[str, Any] = {"debounce_ms": 10_000, "key": "d"} if debounced else {}
        try:
            sent = self.q.enqueue(b"x" * size, job_id=f"j{self.n}", max_attempts=2, now_ms=self.now, **options)
        except QueueFull:
            assert self.budget is not None
            return
        # Sized under a budget (a merge: the job takes this send's size); without one a
        # merge leaves the job's size as it was.
        if self.budget is not None:
            self.sized[sent.job_id] = size

    @rule(size=st.sampled_from([0, 1, 100, 700]))
    def wait(self, size: int) -> None:
        """A flow's continuation (flow_wait.lua), waiting for a job never sent: it ends
        by a release (release_waiting) or a cancel."""
        self.n += 1
        try:
            assert self.q.flow_wait(NewJob(b"x" * size, job_id=f"w{self.n}", max_attempts=2),
                                    [("budget", "never")], now_ms=self.now) == "ok"
        except QueueFull:
            assert self.budget is not None
            return
        self.waiting.add(f"w{self.n}")
        if self.budget is not None:
            self.sized[f"w{self.n}"] = size

    @rule(data=st.data(), cancel=st.booleans())
    def release_waiting(self, data: st.DataObject, cancel: bool) -> None:
        if not self.waiting:
            return
        job_id = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(job_id)
        if cancel:
            assert self.q.cancel(job_id, now_ms=self.now).state == "scheduled"
            self.sized.pop(job_id, None)
        else:  # due now: leased, run and ended as any job
            assert self.q.flow_done(job_id, [("budget", "never", "ok")], now_ms=self.now).state == "released"

    @rule(count=st.sampled_from([1, 3]))
    def lease(self, count: int) -> None:
        self.now += 10_001  # debounced jobs come due
        for job in self.q.lease(count=count, lease_ms=LEASE, now_ms=self.now):
            self.leased[job.id] = job

    @rule(data=st.data(), how=st.sampled_from(["ack", "ack", "retry", "dead", "cancel"]))
    def end(self, data: st.DataObject, how: str) -> None:
        if not self.leased:
            return
        job_id = data.draw(st.sampled_from(sorted(self.leased)))
        job = self.leased.pop(job_id)
        if how == "ack":
            if self.q.ack(job, now_ms=self.now) is Outcome.OK:
                self.sized.pop(job_id, None)
        elif how == "cancel":
            if self.q.cancel(job_id, now_ms=self.now).state not in ("done", "unknown"):
                self.sized.pop(job_id, None)
        else:
            self.q.nack(job, "boom", final=how == "dead", now_ms=self.now)

    @rule(data=st.data(), purge=st.booleans())
    def dead_letter(self, data: st.DataObject, purge: bool) -> None:
        dead = sorted(d.id for d in self.q.dead_list().jobs)
        if not dead:
            return
        job_id = data.draw(st.sampled_from(dead))
        if purge:
            assert self.q.dead_purge([job_id]) == 1
            self.sized.pop(job_id, None)
        else:
            assert self.q.dead_replay([job_id], now_ms=self.now) == 1

    @rule(budget=st.sampled_from([None, 500, 2000, 5000]))
    def set_budget(self, budget: int | None) -> None:
        self.q.set_budget(budget)
        self.budget = budget

    @invariant()
    def bytes_are_the_sizes_of_the_jobs_alive(self) -> None:
        st_ = self.q.stats(now_ms=self.now)
        assert st_.bytes == sum(self.sized.values()), (st_.bytes, self.sized)


BUDGET_SETTINGS = settings(max_examples=60, stateful_step_count=50, deadline=None,
                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def run_machine(backend: Backend) -> None:
    machine = type("Budget", (BudgetMachine,), {"backend": backend})
    run_state_machine_as_test(machine, settings=BUDGET_SETTINGS)


def test_the_count_stays_exact_on_fakeredis() -> None:
    run_machine(FakeBackend())


def test_the_count_stays_exact_on_a_real_redis_server(redis_server: RedisServer) -> None:
    client: redis.Redis = redis_server.client()
    try:
        run_machine(RealBackend(client))
    finally:
        client.close()
