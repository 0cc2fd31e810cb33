"""enqueue: one or many jobs, duplicates are reported no-ops, delays go to SCHEDULED."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from helpers import dump_all

from pyqueue import InvalidArgument, NewJob, Outcome, PayloadTooLarge, Queue
from pyqueue.protocol import core
from pyqueue.protocol.core import DEFAULT_MAX_PAYLOAD_BYTES, MAX_CALL_PAYLOAD_BYTES
from pyqueue.protocol.keys import QueueKeys

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True
#: And on the async driver too (conftest.Blocking).
ASYNC_TOO = True

T0 = 1_000_000


def test_enqueue_adds_a_ready_job_with_a_random_id(q: Queue) -> None:
    added = q.enqueue(b"hello", now_ms=T0)
    assert added.added and len(added.job_id) == 32
    assert q.stats(now_ms=T0).ready == 1
    (job,) = q.lease(now_ms=T0)
    assert (job.id, job.payload, job.attempt, job.max_attempts) == (added.job_id, b"hello", 1, 5)


def test_enqueue_of_an_existing_id_is_a_duplicate_and_changes_nothing(q: Queue) -> None:
    assert q.enqueue(b"first", job_id="j", now_ms=T0).added
    assert not q.enqueue(b"second", job_id="j", now_ms=T0).added
    (job,) = q.lease(now_ms=T0)
    assert job.payload == b"first"
    assert not q.enqueue(b"third", job_id="j", now_ms=T0).added  # leased is a state too
    stats = q.stats(now_ms=T0)
    assert (stats.enqueued, stats.duplicates) == (1, 2)


def test_enqueue_of_a_dead_id_is_a_duplicate(q: Queue) -> None:
    q.enqueue(b"x", job_id="j", max_attempts=1, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.nack(job, "boom", now_ms=T0).state == "dead"
    assert not q.enqueue(b"y", job_id="j", now_ms=T0).added


def test_enqueue_of_an_id_acked_within_keep_done_ms_is_a_duplicate(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", job_id="j", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.ack(job, now_ms=T0) is Outcome.OK
    keep = q.spec.keep_done_ms
    assert r.zscore(q.spec.keys.done, "j") == T0 + keep
    # The producer's re-send of a lost enqueue reply must not run the job again.
    assert not q.enqueue(b"again", job_id="j", now_ms=T0 + keep - 1).added
    assert q.stats(now_ms=T0 + keep - 1).done == 1
    # At T0 + keep the tombstone has expired: the id is free (acks trim the tombstone).
    assert q.enqueue(b"again", job_id="j", now_ms=T0 + keep).added
    assert q.stats(now_ms=T0 + keep).done == 0
    (job,) = q.lease(now_ms=T0 + keep)
    assert job.payload == b"again"


def test_with_keep_done_ms_0_an_acked_id_is_free_at_once(make_queue: Callable[..., Queue], r: redis.Redis) -> None:
    q = make_queue(keep_done_ms=0)
    q.enqueue(b"x", job_id="j", now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert q.ack(job, now_ms=T0) is Outcome.OK
    assert not r.exists(q.spec.keys.done)
    assert q.enqueue(b"again", job_id="j", now_ms=T0).added


def test_enqueue_with_delay_is_scheduled_until_due(q: Queue) -> None:
    q.enqueue(b"later", delay_ms=5_000, now_ms=T0)
    assert q.stats(now_ms=T0).scheduled == 1
    assert q.lease(now_ms=T0 + 4_999) == []
    (job,) = q.lease(now_ms=T0 + 5_000)
    assert job.payload == b"later"


def test_enqueue_many_reports_each_job_and_in_batch_duplicates(q: Queue) -> None:
    q.enqueue(b"old", job_id="a", now_ms=T0)
    result = q.enqueue_many(
        [NewJob(b"1", job_id="a"), NewJob(b"2", job_id="b"), NewJob(b"3", job_id="b"), b"4"], now_ms=T0
    )
    assert [e.added for e in result] == [False, True, False, True]
    assert q.stats(now_ms=T0).ready == 3


def test_enqueue_many_keeps_fifo_order(q: Queue) -> None:
    q.enqueue_many([NewJob(str(i), job_id=f"j{i}") for i in range(10)], now_ms=T0)
    assert [j.id for j in q.lease(count=10, now_ms=T0)] == [f"j{i}" for i in range(10)]


def test_enqueue_many_accepts_a_thousand_and_rejects_more(q: Queue) -> None:
    assert all(e.added for e in q.enqueue_many([b"x"] * 1000, now_ms=T0))
    with pytest.raises(InvalidArgument):
        q.enqueue_many([b"x"] * 1001)
    with pytest.raises(InvalidArgument):
        q.enqueue_many([])


# Short ids: a test's id goes into the environment (PYTEST_CURRENT_TEST), and one of 1 MiB
# makes every process the test starts fail with E2BIG (a cluster fixture's redis-server).
@pytest.mark.parametrize("payload", [b"", b"\xff\xfe\x00\x80", "žluťoučký kůň".encode(), b"x" * (1 << 20)],
                         ids=["empty", "binary", "utf8", "1MiB"])
def test_any_payload_bytes_round_trip(q: Queue, payload: bytes) -> None:
    q.enqueue(payload, now_ms=T0)
    (job,) = q.lease(now_ms=T0)
    assert job.payload == payload


def test_str_payloads_are_utf8_and_json_helpers_round_trip(q: Queue) -> None:
    q.enqueue("čaj", now_ms=T0)
    q.enqueue_json({"to": "a@b.c", "n": [1, 2]}, now_ms=T0)
    first, second = q.lease(count=2, now_ms=T0)
    assert first.text() == "čaj"
    assert second.json() == {"to": "a@b.c", "n": [1, 2]}


def test_a_payload_over_max_payload_bytes_is_refused_before_anything_is_sent(
    make_queue: Callable[..., Queue], r: redis.Redis
) -> None:
    """Issue #19: a payload Redis cannot take (over 512 MB) made it drop the connection,
    and redis-py sent it three more times before an OutcomeUnknown said "may have run".
    The driver refuses it first, with its own limit (64 MiB by default)."""
    q = make_queue("q", max_payload_bytes=1000)
    before = dump_all(r)
    with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
        q.enqueue(b"x" * 1001)
    with pytest.raises(PayloadTooLarge):
        q.enqueue_many([b"small", "y" * 1001])
    assert dump_all(r) == before
    assert q.enqueue(b"x" * 1000).added
    assert Queue("q2", r).spec.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 64 * 1024 * 1024
    for bad in (0, MAX_CALL_PAYLOAD_BYTES + 1, "1"):
        with pytest.raises(InvalidArgument, match="max_payload_bytes"):
            make_queue("q", max_payload_bytes=bad)


def test_one_enqueue_many_call_carries_at_most_max_call_payload_bytes(
    q: Queue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core, "MAX_CALL_PAYLOAD_BYTES", 1000)
    before = dump_all(r)
    with pytest.raises(PayloadTooLarge, match="several calls"):
        q.enqueue_many([b"x" * 600, b"y" * 600])
    assert dump_all(r) == before
    assert q.enqueue_many([b"x" * 500, b"y" * 500])[1].added


def test_coalesced_enqueues_weigh_payload_bytes_so_a_call_stays_under_max_call_payload_bytes() -> None:
    keys = QueueKeys("pq", "q")

    def call(*sizes: int) -> core.ScriptCall:
        return core.enqueue_call(keys, None, [(f"id{i}", b"x" * size, 0, 1, "", "", "", "") for i, size in enumerate(sizes)])

    unit = core.MAX_CALL_PAYLOAD_BYTES // core.MAX_BATCH
    assert core.enqueue_weight(call(0, 10, 100)) == 3  # small jobs weigh one each
    assert core.enqueue_weight(call(unit - 1, unit)) == 2 + 1  # plus one per unit of their payloads
    assert core.enqueue_weight(call(64 * 1024 * 1024)) == 1 + 64 * 1024 * 1024 // unit  # a 64 MiB job: 251
    # Batches of such calls, cut at MAX_BATCH units, never pass MAX_CALL_PAYLOAD_BYTES.
    batching: core.Batching[core.ScriptCall] = core.Batching()
    for _ in range(10):
        batching.join(call(64 * 1024 * 1024))
    batch = batching.take(core.enqueue_weight, core.MAX_BATCH)
    assert len(batch) == 3 and sum(64 * 1024 * 1024 for _ in batch) <= core.MAX_CALL_PAYLOAD_BYTES
