"""Model-based test of a partitioned queue (Hypothesis state machine): the logical queue
over K partitions, driven through its public verbs, against a plain-Python model of one
queue; after every step every job is in exactly one state, in its own partition only,
and the summed stats, the ack answers and the dead letters agree with the model.

The byte-level model of one partition is tests/model.py (a partition is a queue); this
test is about what partitioning adds: routing by id, leases from every partition, acks
routed by the lease, aggregation. Lease times are long and delays zero, so the server
clock does not matter.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import fakeredis
import pytest
from conftest import IN_CI, RedisServer
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from pyqueue import Job, NewJob, Outcome, Queue
from pyqueue.drivers.partitioned import PartitionedQueue
from pyqueue.drivers.queue import plans_of
from pyqueue.drivers.queue import partition_of
from helpers import queue_parts


K = 3
IDS = tuple(f"j{i}" for i in range(12)) + ("a|b", "{x} y", "ü")
EXAMPLES = int(os.environ.get("PYQUEUE_PARTITION_MODEL_EXAMPLES", "60" if IN_CI else "30"))


class PartitionedMachine(RuleBasedStateMachine):
    client_factory: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.r = type(self).client_factory()
        self.q = Queue("pq", self.r, partitions=K)
        assert isinstance(plans_of(self.q), PartitionedQueue)
        self.state: dict[str, str] = {}  # id -> ready | leased | dead | done
        self.max_attempts: dict[str, int] = {}
        self.attempts: dict[str, int] = {}  # failed attempts of the job's current life
        self.leases: dict[str, Job] = {}  # receipt -> job, current leases only
        self.old: list[Job] = []  # stale leases, reused on purpose
        self.ok_acks: Counter[tuple[str, int]] = Counter()
        self.lives: Counter[str] = Counter()

    def teardown(self) -> None:
        self.r.flushall()
        self.r.close()

    # -- producing --------------------------------------------------------------------

    @rule(ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=6), max_attempts=st.sampled_from([1, 2, 5]))
    def enqueue_many(self, ids: list[str], max_attempts: int) -> None:
        answers = self.q.enqueue_many([NewJob(i.encode(), job_id=i, max_attempts=max_attempts) for i in ids])
        seen: set[str] = set()
        for job_id, answer in zip(ids, answers):
            fresh = job_id not in self.state and job_id not in seen
            assert answer.job_id == job_id and answer.added == fresh, (job_id, answer)
            seen.add(job_id)
            if fresh:
                self.state[job_id] = "ready"
                self.max_attempts[job_id], self.attempts[job_id] = max_attempts, 0
                self.lives[job_id] += 1

    # -- consuming --------------------------------------------------------------------

    @rule(count=st.integers(1, 5))
    def lease(self, count: int) -> None:
        ready_before = sum(1 for s in self.state.values() if s == "ready")
        jobs = self.q.lease(count=count, lease_ms=600_000)
        assert len({j.queue for j in jobs}) <= 1, "one lease call leases from one partition"
        if ready_before:
            assert jobs, "a lease found nothing while jobs were ready"
        for job in jobs:
            assert self.state.get(job.id) == "ready", (job.id, self.state.get(job.id))
            assert job.queue == f"pq#{partition_of(job.id, K)}"
            assert job.payload == job.id.encode() and job.attempt == self.attempts[job.id] + 1
            self.state[job.id] = "leased"
            self.leases[job.receipt] = job

    def _pick(self, data: st.DataObject, label: str) -> Job:
        pool = list(self.leases.values()) + self.old
        return data.draw(st.sampled_from(pool), label=label)

    @precondition(lambda self: self.leases or self.old)
    @rule(data=st.data(), how_many=st.integers(1, 4))
    def ack(self, data: st.DataObject, how_many: int) -> None:
        jobs = [self._pick(data, "job") for _ in range(how_many)]
        answers = self.q.ack_many(jobs)
        acked_now: set[str] = set()
        for job, answer in zip(jobs, answers):
            current = job.receipt in self.leases and job.receipt not in acked_now
            expected = Outcome.OK if current else (Outcome.GONE if self.state.get(job.id, "done") == "done" or
                                                   job.receipt in acked_now else Outcome.STALE)
            assert answer == expected, (job.receipt, answer, expected)
            if answer is Outcome.OK:
                acked_now.add(job.receipt)
                life = (job.id, self.lives[job.id])
                self.ok_acks[life] += 1
                assert self.ok_acks[life] == 1, "ack answered OK twice in one life"
        for receipt in acked_now:
            job = self.leases.pop(receipt)
            self.state[job.id] = "done"
            self.old.append(job)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(list(self.leases.values())), label="job")
        answer = self.q.nack(job, "boom", delay_ms=0)
        assert answer.outcome is Outcome.OK
        del self.leases[job.receipt]
        self.old.append(job)
        self.attempts[job.id] = job.attempt
        if job.attempt >= self.max_attempts[job.id]:
            assert answer.state == "dead"
            self.state[job.id] = "dead"
        else:
            assert answer.state == "scheduled"
            self.state[job.id] = "ready"  # due at once: the next lease promotes it

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(list(self.leases.values())), label="job")
        assert self.q.release([job]) == [Outcome.OK]
        del self.leases[job.receipt]
        self.old.append(job)
        self.state[job.id] = "ready"

    # -- dead letters -------------------------------------------------------------------

    @rule(data=st.data(), purge=st.booleans())
    def dead_letters(self, data: st.DataObject, purge: bool) -> None:
        dead = sorted(i for i, s in self.state.items() if s == "dead")
        page = self.q.dead_list(0, 100)
        assert page.total == len(dead) and sorted(d.id for d in page.jobs) == dead
        if not dead:
            return
        chosen = data.draw(st.lists(st.sampled_from(dead + ["never"]), min_size=1, max_size=4, unique=True))
        hits = [i for i in chosen if i in dead]
        if purge:
            assert self.q.dead_purge(chosen) == len(hits)
            for job_id in hits:
                del self.state[job_id]
        else:
            assert self.q.dead_replay(chosen) == len(hits)
            for job_id in hits:
                self.state[job_id], self.attempts[job_id] = "ready", 0

    # -- after every step -------------------------------------------------------------

    @invariant()
    def every_job_is_in_one_state_in_its_own_partition(self) -> None:
        found: dict[str, list[tuple[int, str]]] = {}
        for p, part in enumerate(queue_parts(self.q)):
            keys = part.spec.keys
            for job_id in self.r.lrange(keys.ready, 0, -1):
                found.setdefault(job_id.decode(), []).append((p, "ready"))
            for job_id in self.r.zrange(keys.scheduled, 0, -1):
                found.setdefault(job_id.decode(), []).append((p, "ready"))  # due at once
            for receipt in self.r.zrange(keys.leased, 0, -1):
                found.setdefault(receipt.decode().split("|", 4)[4], []).append((p, "leased"))
            for job_id in self.r.zrange(keys.dead, 0, -1):
                found.setdefault(job_id.decode(), []).append((p, "dead"))
        live = {i: s for i, s in self.state.items() if s != "done"}
        assert {i: [s for _, s in where] for i, where in found.items()} == {i: [s] for i, s in live.items()}
        for job_id, where in found.items():
            assert where[0][0] == partition_of(job_id, K), f"{job_id!r} is in partition {where[0][0]}"

    @invariant()
    def stats_sum_over_partitions(self) -> None:
        stats = self.q.stats()
        counts = Counter(self.state.values())
        assert stats.ready + stats.scheduled == counts["ready"]
        assert (stats.leased, stats.dead) == (counts["leased"], counts["dead"])
        assert stats.acked == sum(self.ok_acks.values())
        assert stats.acked == sum(p.acked for p in self.q.partition_stats())


def clients(where: str, request: pytest.FixtureRequest) -> Any:
    if where == "fake":
        return lambda: fakeredis.FakeRedis(server=fakeredis.FakeServer())
    if where == "cluster":
        processes = request.getfixturevalue("redis_cluster")

        def fresh_cluster() -> Any:
            processes.flushall()
            return processes.client()

        return fresh_cluster
    server: RedisServer = request.getfixturevalue("redis_server")

    def fresh() -> Any:
        client = server.client()
        client.flushall()
        return client

    return fresh


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", ["fake", "real", "cluster"])
def test_a_partitioned_queue_behaves_like_one_queue(where: str, request: pytest.FixtureRequest) -> None:
    factory = staticmethod(clients(where, request))
    machine = type(f"PartitionedMachine_{where}", (PartitionedMachine,), {"client_factory": factory})
    run_state_machine_as_test(
        machine, settings=settings(max_examples=EXAMPLES, stateful_step_count=30, deadline=None, database=None)
    )
