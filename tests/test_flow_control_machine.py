"""Sequences and debounce under random operations (Hypothesis's rule-based state
machines): sends, leases, acks, retries, dead letters, cancels, purges, replays, skips
and a moving clock, in any order, with the invariants checked after every step, on
fakeredis and on a real redis-server.

* **Sequences.** The test keeps each key's line: the jobs sent with the key, in send
  order, that have not ended (acked, cancelled, purged) nor been skipped. The line's
  first job is its head: ready, scheduled, leased or dead (key ``a``, policy block); a
  dead head leaves the line at once (key ``b``, policy skip); every other one is
  ``sequenced`` (in no other state), and only a head, or a job in no line, is ever
  leased.
* **Debounce.** At most one job of a key is scheduled and not yet due, and a send while
  one is answers with its id (``debounced``).
* **Rate keys.** Every lease of a key's jobs, retries included, takes its cost in
  permits: between any two leases of a key at t1 <= t2, the costs leased sum to at most
  burst + (t2 - t1) / spacing (the GCRA's bound), whatever the order of sends, leases,
  retries, lost leases, limit changes and defers; and no job is lost: once the clock
  has moved past every permit, every job not acked is leased.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import hypothesis.strategies as st
import redis
from conftest import RedisServer
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from model import Backend, FakeBackend, RealBackend

from pyqueue import Queue, RateLimit

T0 = 1_000_000
KEYS = ("a", "b")
#: Each key's failure policy (sequences).
POLICIES = {"a": "block", "b": "skip"}
SETTINGS = settings(max_examples=60, stateful_step_count=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


class Machine(RuleBasedStateMachine):
    """An empty Redis per example from ``backend``; the scripts of ``lua_directory``
    (tests/test_mutations.py plants bugs in a copy)."""

    backend: ClassVar[Backend]
    lua_directory: ClassVar[Path | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.client = self.backend.fresh()

    def queue(self, name: str) -> Queue:
        return Queue(name, self.client, lua_directory=self.lua_directory)

    def teardown(self) -> None:
        self.backend.done(self.client)


class SequenceMachine(Machine):
    def __init__(self) -> None:
        super().__init__()
        self.q = self.queue("seq")
        self.now = T0
        self.n = 0
        self.lines: dict[str, list[str]] = {k: [] for k in KEYS}
        self.leased: dict[str, Any] = {}  # job id -> its current Job

    def line_of(self, job_id: str) -> list[str] | None:
        return next((line for line in self.lines.values() if job_id in line), None)

    @rule(key=st.sampled_from(KEYS), delay=st.sampled_from([0, 0, 50]))
    def send(self, key: str, delay: int) -> None:
        self.n += 1
        job_id = f"{key}{self.n}"
        assert self.q.enqueue(b"x", job_id=job_id, sequence=key, on_failure=POLICIES[key], delay_ms=delay,
                              max_attempts=2, now_ms=self.now).added
        self.lines[key].append(job_id)

    @rule(count=st.sampled_from([1, 3]))
    def lease(self, count: int) -> None:
        for job in self.q.lease(count=count, lease_ms=1000, now_ms=self.now):
            line = self.line_of(job.id)
            assert line is None or line[0] == job.id, f"{job.id} leased behind its head: {line}"
            self.leased[job.id] = job

    @rule(data=st.data(), how=st.sampled_from(["ack", "ack", "retry", "dead", "dead"]))
    def end_lease(self, data: st.DataObject, how: str) -> None:
        if not self.leased:
            return
        job_id = data.draw(st.sampled_from(sorted(self.leased)))
        job = self.leased.pop(job_id)
        if how == "ack":
            if self.q.ack(job, now_ms=self.now).value == "ok":
                self.end(job_id)
        else:
            self.q.nack(job, "boom", delay_ms=20, final=how == "dead", now_ms=self.now)

    def end(self, job_id: str) -> None:
        line = self.line_of(job_id)
        if line is not None:
            line.remove(job_id)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        sent = [j for line in self.lines.values() for j in line]
        if sent:
            job_id = data.draw(st.sampled_from(sent))
            if self.q.cancel(job_id, now_ms=self.now).state not in ("done", "unknown"):
                self.end(job_id)
                self.leased.pop(job_id, None)

    @rule(data=st.data(), replay=st.booleans())
    def dead_letter(self, data: st.DataObject, replay: bool) -> None:
        dead = [d.id for d in self.q.dead_list().jobs]
        if not dead:
            return
        job_id = data.draw(st.sampled_from(sorted(dead)))
        if replay:
            assert self.q.dead_replay([job_id], now_ms=self.now) == 1
        else:
            assert self.q.dead_purge([job_id]) == 1
            self.end(job_id)

    @rule(key=st.sampled_from(KEYS))
    def skip(self, key: str) -> None:
        line = self.lines[key]
        answer = self.q.sequence_skip(key, now_ms=self.now)
        if not line:
            assert answer.status == "free"
        elif self.q.get(line[0], now_ms=self.now).state == "dead":
            assert answer.status == "skipped"
            line.pop(0)
            assert answer.next_id == (line[0] if line else "")
        else:
            assert (answer.status, answer.next_id) == ("running", line[0])

    @rule(ms=st.sampled_from([1, 30, 1500]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def lines_hold(self) -> None:
        for key, line in self.lines.items():
            # Under skip a head that went dead is out of its line (its key went on).
            while POLICIES[key] == "skip" and line and self.q.get(line[0], now_ms=self.now).state == "dead":
                line.pop(0)
            for i, job_id in enumerate(line):
                state = self.q.get(job_id, now_ms=self.now).state
                if i == 0:
                    assert state in ("ready", "scheduled", "leased", "dead"), f"head {job_id} of {key} is {state}"
                else:
                    assert state == "sequenced", f"{job_id}, behind {line[0]} in {key}, is {state}"
        assert self.q.stats(now_ms=self.now).sequenced == sum(max(0, len(line) - 1) for line in self.lines.values())


class DebounceMachine(Machine):
    def __init__(self) -> None:
        super().__init__()
        self.q = self.queue("deb")
        self.now = T0
        self.pending: dict[str, tuple[str, int]] = {}  # key -> (its job waiting, due) per the answers
        self.leased: list[Any] = []

    @rule(key=st.sampled_from(KEYS), window=st.sampled_from([10, 100]))
    def send(self, key: str, window: int) -> None:
        answer = self.q.enqueue(f"{key}@{self.now}".encode(), debounce_ms=window, key=key, now_ms=self.now)
        waiting = self.pending.get(key)
        if waiting and waiting[1] > self.now:
            assert (answer.job_id, answer.by_key) == (waiting[0], "debounced")
        else:
            assert answer.added
        self.pending[key] = (answer.job_id, self.now + window)

    @rule()
    def lease(self) -> None:
        self.leased += self.q.lease(count=5, lease_ms=1000, now_ms=self.now)

    @rule(ack=st.booleans())
    def end(self, ack: bool) -> None:
        if self.leased:
            job = self.leased.pop(0)
            if ack:
                self.q.ack(job, now_ms=self.now)
            else:
                self.q.nack(job, "boom", delay_ms=30, now_ms=self.now)

    @rule(ms=st.sampled_from([1, 20, 200]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def one_waiting_per_key(self) -> None:
        waiting: dict[str, int] = {}
        for job_id, due in self.client.zrangebyscore(self.q.spec.keys.scheduled, f"({self.now}", "+inf", withscores=True):
            info = self.q.get(job_id.decode(), with_payload=True, now_ms=self.now)
            if info.attempts == 0:  # a retry is not a debounced job waiting for its window
                key = info.payload.split(b"@")[0].decode()
                waiting[key] = waiting.get(key, 0) + 1
        assert all(n <= 1 for n in waiting.values()), waiting


#: The rate keys' limits: (count, period_ms, burst); spacing = period_ms / count.
RATES = {"a": (4, 1000, 3), "b": (10, 1000, 1)}


class RateMachine(Machine):
    def __init__(self) -> None:
        super().__init__()
        self.q = self.queue("rate")
        self.now = T0
        self.n = 0
        self.sent: dict[str, tuple[str, int]] = {}  # job id -> (key, cost), until acked
        self.leases: dict[str, list[tuple[int, int]]] = {k: [] for k in RATES}  # key -> (lease ms, cost)
        self.leased: dict[str, Any] = {}

    @rule(key=st.sampled_from(sorted(RATES)), cost=st.sampled_from([1, 1, 2, 3]))
    def send(self, key: str, cost: int) -> None:
        count, period, burst = RATES[key]
        cost = min(cost, burst)
        self.n += 1
        job_id = f"{key}{self.n}"
        assert self.q.enqueue(b"x", job_id=job_id, rate_key=key, rate_limit=RateLimit(count, period, burst),
                              cost=cost, max_attempts=1000, now_ms=self.now).added
        self.sent[job_id] = (key, cost)

    @rule(count=st.sampled_from([1, 4]))
    def lease(self, count: int) -> None:
        for job in self.q.lease(count=count, lease_ms=100, now_ms=self.now):
            key, cost = self.sent[job.id]
            self.leases[key].append((self.now, cost))
            self.leased[job.id] = job

    @rule(data=st.data(), how=st.sampled_from(["ack", "ack", "retry", "defer"]))
    def end_lease(self, data: st.DataObject, how: str) -> None:
        if not self.leased:
            return
        job_id = data.draw(st.sampled_from(sorted(self.leased)))
        job = self.leased.pop(job_id)
        if how == "ack":
            if self.q.ack(job, now_ms=self.now).value == "ok":
                del self.sent[job_id]
        elif how == "retry":
            self.q.nack(job, "boom", delay_ms=0, now_ms=self.now)
        else:
            # Held for 700 ms (stricter: the bound below still holds), then retried at once.
            until = self.q.defer_key(job, 700, now_ms=self.now)
            assert until is None or until >= self.now + 700
            self.q.nack(job, "boom", delay_ms=0, now_ms=self.now)

    @rule(key=st.sampled_from(sorted(RATES)), strict=st.booleans())
    def set_limit(self, key: str, strict: bool) -> None:
        # Half the jobs' own rate (the same burst), or back to theirs: the bound of their
        # own holds throughout.
        count, period, burst = RATES[key]
        self.q.set_rate_limit(key, RateLimit(count, 2 * period, burst) if strict else None)

    @rule(ms=st.sampled_from([1, 50, 300, 2000]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def each_key_keeps_its_bound(self) -> None:
        for key, leases in self.leases.items():
            count, period, burst = RATES[key]
            spacing = period / count
            for i in range(len(leases)):
                total = 0
                for j in range(i, len(leases)):
                    total += leases[j][1]
                    span = leases[j][0] - leases[i][0]
                    assert total <= burst + span / spacing + 1e-6, (key, leases[i:j + 1])

    def teardown(self) -> None:
        # Nothing is lost: past every permit, every job not acked is leased.
        try:
            pending = set(self.sent) - set(self.leased)
            for _ in range(200):
                if not pending:
                    break
                self.now += 5000
                for job in self.q.lease(count=100, lease_ms=10**8, now_ms=self.now):
                    pending.discard(job.id)
            assert not pending, f"jobs never leased again: {sorted(pending)[:5]}"
        finally:
            super().teardown()


#: The machines by name (tests/test_mutations.py runs them against planted bugs).
MACHINES: dict[str, type[Machine]] = {"sequences": SequenceMachine, "debounce": DebounceMachine, "rates": RateMachine}


def run(name: str, backend: Backend, lua_directory: Path | None = None, options: settings = SETTINGS) -> None:
    """Run machine ``name`` on ``backend`` (with the scripts of ``lua_directory``)."""
    machine = type(f"{name}Machine", (MACHINES[name],), {"backend": backend, "lua_directory": lua_directory})
    run_state_machine_as_test(machine, settings=options)


def on_real_server(redis_server: RedisServer, name: str) -> None:
    client: redis.Redis = redis_server.client()
    try:
        run(name, RealBackend(client))
    finally:
        client.close()


def test_sequences_hold_their_lines_on_fakeredis() -> None:
    run("sequences", FakeBackend())


def test_sequences_hold_their_lines_on_a_real_redis_server(redis_server: RedisServer) -> None:
    on_real_server(redis_server, "sequences")


def test_debounce_keeps_one_waiting_job_per_key_on_fakeredis() -> None:
    run("debounce", FakeBackend())


def test_debounce_keeps_one_waiting_job_per_key_on_a_real_redis_server(redis_server: RedisServer) -> None:
    on_real_server(redis_server, "debounce")


def test_rate_keys_keep_their_bound_and_lose_no_job_on_fakeredis() -> None:
    run("rates", FakeBackend())


def test_rate_keys_keep_their_bound_and_lose_no_job_on_a_real_redis_server(redis_server: RedisServer) -> None:
    on_real_server(redis_server, "rates")
