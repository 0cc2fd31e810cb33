"""The driver's plumbing: NOSCRIPT recovery, pipelines, client settings, error mapping."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis

from pyqueue.protocol.core import enqueue_call, stats_call
from pyqueue import OutcomeUnknown, Queue, connect
from pyqueue.drivers.clients import bytes_client, node_for_key, primaries
from pyqueue.drivers.scripts import lua_dir
from pyqueue.drivers.queue import transport_of

#: Also on the Redis Cluster backend (conftest.BACKENDS).
ON_CLUSTER = True

T0 = 1_000_000


def test_script_flush_then_a_call_reloads_the_script(q: Queue, r: redis.Redis) -> None:
    q.enqueue(b"x", now_ms=T0)
    r.script_flush()
    (job,) = q.lease(now_ms=T0)
    r.script_flush()
    assert q.ack(job)


def test_script_flush_then_a_pipeline_of_scripts_reloads_them(q: Queue, r: redis.Redis) -> None:
    for node in primaries(r):
        node.script_flush()
    # One queue's keys share a slot: on a cluster, pipeline on the node that holds it
    # (redis-py's cluster pipelines refuse EVALSHA).
    pipe = node_for_key(r, q.spec.keys.jobs).pipeline()
    for i in range(3):
        transport_of(q).call(enqueue_call(q.spec.keys, T0, [(f"j{i}", b"x", 0, 3, "", "", "", "")]), client=pipe)
    transport_of(q).call(stats_call(q.spec.keys, T0), client=pipe)
    replies = pipe.execute()
    assert [reply[0] for reply in replies[:3]] == [1, 1, 1]
    assert q.stats(now_ms=T0).ready == 3


def test_a_client_with_decode_responses_gets_bytes_payloads(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "fake":
        client: Any = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    elif backend == "cluster":
        request.getfixturevalue("redis_cluster").flushall()
        client = request.getfixturevalue("redis_cluster").client(decode_responses=True)
    else:
        client = request.getfixturevalue("redis_server").client(decode_responses=True)
        client.flushall()
    q = Queue("d", client)
    q.enqueue(b"\xff\x00binary", job_id="ü")
    (job,) = q.lease()
    assert job.payload == b"\xff\x00binary" and job.id == "ü"
    assert q.ack(job)
    assert client.get("untouched") is None  # the user's client still decodes, untouched
    client.set("untouched", "é")
    assert client.get("untouched") == "é"


def test_bytes_client_returns_an_undecoding_client_unchanged() -> None:
    client = fakeredis.FakeRedis()
    assert bytes_client(client) is client


def test_queues_without_a_client_share_the_embedded_server() -> None:
    producer, consumer = Queue("embedded-shared"), Queue("embedded-shared")
    producer.enqueue(b"hi", job_id="shared-1")
    (job,) = consumer.lease()
    assert job.id == "shared-1" and consumer.ack(job)


def test_from_url_talks_to_a_real_server(redis_server: object) -> None:
    url = redis_server.url()  # type: ignore[attr-defined]
    q = Queue.from_url(url, "fromurl")
    q.enqueue(b"x")
    (job,) = q.lease()
    assert q.ack(job)


def test_connect_sets_retry_policy_and_timeouts_explicitly() -> None:
    client = connect("redis://127.0.0.1:1/0", retries=2, socket_timeout_s=3.0)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 3.0 and kwargs["socket_connect_timeout"] == 5.0
    retry = kwargs["retry"]
    assert retry._retries == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("call", [lambda q: q.enqueue(b"x"), lambda q: q.lease(), lambda q: q.stats()])
def test_a_connection_error_surfaces_as_outcome_unknown_never_as_success(call: Callable[[Queue], object]) -> None:
    q = Queue.from_url(f"redis://127.0.0.1:{_closed_port()}/0", "down", retries=0)
    with pytest.raises(OutcomeUnknown) as info:
        call(q)
    assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_scripts_are_found_in_the_checkout() -> None:
    assert (lua_dir() / "lease.lua").is_file()
