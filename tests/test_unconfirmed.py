"""Acks whose WAIT fell short (pyqueue/protocol/unconfirmed.py): sent again on the same queue
object, they answer what the lost reply said. On fakeredis and a real redis-server,
both drivers; not on the cluster backend: the async driver refuses wait_replicas there,
and the failover is played by restoring one server's keys (tests/test_cluster.py covers
wait_replicas on the cluster)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from pyqueue import NewJob, NotReplicated, Outcome, Queue
from pyqueue.drivers.queue import transport_of

#: On the async driver too (conftest.Blocking).
ASYNC_TOO = True

T0 = 1_000_000


def test_an_ack_whose_wait_fell_short_answers_ok_when_sent_again_and_the_job_is_gone(
    make_queue: Callable[..., Queue], r: redis.Redis
) -> None:
    # wait_replicas=100: no backend has that many replicas, so WAIT always falls short
    # and every write raises NotReplicated after it ran. Setting the transport's
    # wait_replicas to 0 afterwards stands for the replicas catching up (or the re-send
    # reaching a promoted replica that had the first send).
    q = make_queue(wait_replicas=100, wait_timeout_ms=1)
    plain = make_queue()
    plain.enqueue_many([NewJob(b"", job_id=i) for i in "abcde"])
    a, b, c, d, e = plain.lease(count=5)
    with pytest.raises(NotReplicated) as raised:
        q.ack_many([a, b])
    assert raised.value.reply is not None and r.hlen(q.spec.keys.jobs) == 3  # it ran
    with pytest.raises(NotReplicated):
        q.lease_call(ack=[c], count=0)
    with pytest.raises(NotReplicated):
        q.ack_result(d, "kept")
    transport_of(q).wait_replicas = 0
    # The re-sends find the jobs gone, because the first sends completed them: OK, once.
    assert q.ack_many([a, b, e]) == [Outcome.OK, Outcome.OK, Outcome.OK]
    assert q.lease_call(ack=[c], count=0).acks == [Outcome.OK]
    assert q.ack_result(d, "kept") is Outcome.OK and q.result(d.id).value == "kept"
    assert q.ack_many([a, b, c, d, e]) == [Outcome.GONE] * 5  # answered: forgotten
    # Another queue object never sent them: the script's own answer.
    assert plain.ack_many([a]) == [Outcome.GONE]


def test_an_ack_whose_wait_fell_short_and_was_lost_by_a_failover_is_ok_or_stale_when_sent_again(
    make_queue: Callable[..., Queue], r: redis.Redis
) -> None:
    q = make_queue(wait_replicas=100, wait_timeout_ms=1)
    plain = make_queue()
    plain.enqueue_many([NewJob(b"", job_id=i) for i in "ab"], now_ms=T0)
    (a,) = plain.lease(lease_ms=10, now_ms=T0)
    (b,) = plain.lease(lease_ms=60_000, now_ms=T0)
    before = {k: r.dump(k) for k in r.keys("*")}
    with pytest.raises(NotReplicated):
        q.ack_many([a, b], now_ms=T0 + 1)  # acked on the primary ...
    for key in r.keys("*"):  # ... then a failover to a replica that never had it
        r.delete(key)
    for key, value in before.items():
        r.restore(key, 0, value)
    (again,) = plain.lease(now_ms=T0 + 100)  # a's lease expired there: reclaimed
    assert again.id == "a"
    transport_of(q).wait_replicas = 0
    # b's lease is still current there: the re-send acks it (OK). a is STALE, as the
    # script says: it runs again under the new lease.
    assert q.ack_many([a, b], now_ms=T0 + 100) == [Outcome.STALE, Outcome.OK]
    assert q.ack(again) is Outcome.OK
