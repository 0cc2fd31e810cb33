"""A queue made without a client (``Queue(name)``, ``AsyncQueue(name)``) talks to the
server named by ``PYQUEUE_URL``, and only without it to the embedded fakeredis; the
choice is logged once, a password hidden (pyqueue.drivers.clients.default_client, DESIGN §17)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import fakeredis
import pytest
import redis

from pyqueue import InvalidArgument, Queue, connect
from pyqueue.aio import AsyncQueue
from pyqueue.drivers.clients import client_url, embedded_redis, embedded_server, redact_url, reset_default_clients
from pyqueue.drivers.facade import client_of, plans_of
from pyqueue.drivers.partitioned import PartitionedQueue

from pyqueue.drivers.queue import transport_of
from helpers import queue_parts

from conftest import RedisServer, free_ports


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No PYQUEUE_URL unless a test sets one, and default_client's clients and log
    memory emptied before and after each test, as in a new process."""
    monkeypatch.delenv("PYQUEUE_URL", raising=False)
    reset_default_clients()
    yield
    reset_default_clients()


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    redis_server.client().flushall()
    return redis_server


def choices(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines of logger "pyqueue" that tell which server a default queue uses."""
    return [
        rec.getMessage() for rec in caplog.records
        if rec.name == "pyqueue" and rec.levelno >= logging.INFO and "PYQUEUE_URL" in rec.getMessage()
    ]


def test_with_pyqueue_url_a_queue_without_a_client_writes_to_that_server(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYQUEUE_URL", server.url())
    q = Queue("q")
    assert q.enqueue(b"hello", job_id="j1").added
    real = server.client()
    assert real.hexists(q.spec.keys.jobs, "j1")
    assert not embedded_redis().exists(q.spec.keys.jobs)
    # Every such queue of the process shares one client (one connection pool) ...
    assert transport_of(Queue("other")).client is transport_of(q).client
    # ... a partitioned one too, through the same constructor.
    p = Queue("p", partitions=2)
    assert isinstance(plans_of(p), PartitionedQueue) and transport_of(p).client is transport_of(q).client
    p.enqueue(b"", job_id="k")
    assert sum(real.hlen(part.spec.keys.jobs) for part in queue_parts(p)) == 1
    # A client passed explicitly still wins.
    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    assert client_of(Queue("q", fake)) is fake


def test_without_pyqueue_url_a_queue_uses_the_embedded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    q = Queue("embedded-default-q")
    assert isinstance(transport_of(q).client, fakeredis.FakeRedis)
    assert transport_of(q).client.connection_pool.connection_kwargs["server"] is embedded_server()
    q.enqueue(b"", job_id="e1")
    assert embedded_redis().hexists(q.spec.keys.jobs, "e1")
    q.cancel("e1")
    for value in ("", "  ", "embedded"):  # empty, or asking for it by name: the same
        monkeypatch.setenv("PYQUEUE_URL", value)
        assert client_of(Queue("embedded-default-q")).connection_pool.connection_kwargs["server"] is embedded_server()


def test_the_choice_is_logged_once_per_process(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "pyqueue"):
        for name in ("a", "b", "c"):
            Queue(name)
        assert choices(caplog) == [
            "no PYQUEUE_URL: using the embedded in-process server (fakeredis), which no other process sees (a worker "
            "elsewhere will not get these jobs); set PYQUEUE_URL=redis://host:6379/0 to share queues between processes"
        ]
        # A warning: seen on stderr even by an application that configured no logging.
        assert [r.levelname for r in caplog.records if "PYQUEUE_URL" in r.getMessage()] == ["WARNING"]
        caplog.clear()
        monkeypatch.setenv("PYQUEUE_URL", server.url())
        for name in ("a", "b", "c"):
            Queue(name)
        assert choices(caplog) == [f"using PYQUEUE_URL={server.url()} (from the environment)"]


def test_the_log_line_hides_a_password(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (port,) = free_ports(1)  # nothing listens: making the queue sends nothing that must succeed
    monkeypatch.setenv("PYQUEUE_URL", f"redis://:s3cret@127.0.0.1:{port}/0")
    with caplog.at_level(logging.INFO, "pyqueue"):
        Queue("q")
    assert choices(caplog) == [f"using PYQUEUE_URL=redis://:***@127.0.0.1:{port}/0 (from the environment)"]
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize("url", ["http://localhost:6379", "localhost:6379", "redis:/localhost", "sentinel://h:1"])
def test_a_pyqueue_url_pyqueue_cannot_use_is_a_clear_error_naming_the_variable(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYQUEUE_URL", url)
    with pytest.raises(InvalidArgument, match="PYQUEUE_URL") as raised:
        Queue("q")
    assert "redis://" in str(raised.value)  # it says what would do
    with pytest.raises(InvalidArgument, match="PYQUEUE_URL"):
        AsyncQueue("q")


def test_an_unparsable_url_of_a_known_scheme_is_a_clear_error_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYQUEUE_URL", "redis://:s3cret@localhost:notaport/0")
    with pytest.raises(InvalidArgument, match="PYQUEUE_URL") as raised:
        Queue("q")
    assert "s3cret" not in str(raised.value)


def test_redact_url_hides_only_passwords() -> None:
    assert redact_url("redis://user:pw@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact_url("rediss+cluster://:p%40ss@h:7000") == "rediss+cluster://:***@h:7000"
    assert redact_url("unix:///tmp/r.sock?db=1&password=pw") == "unix:///tmp/r.sock?db=1&password=***"
    assert redact_url("unix://:pw@/tmp/r.sock") == "unix://:***@/tmp/r.sock"
    for plain in ("redis://h:6379/0", "unix:///tmp/r.sock", "redis://user@h"):
        assert redact_url(plain) == plain


def test_client_url_names_a_clients_server_without_its_password() -> None:
    """What a worker's warnings call its server (pyqueue.drivers.clients.client_url)."""
    made = connect("unix://:s3cret@/tmp/nowhere.sock?db=2")  # no connection is opened yet
    assert client_url(made) == "unix://:***@/tmp/nowhere.sock?db=2"  # the URL it was made from
    assert client_url(connect("redis://u:s3cret@10.0.0.1:7000/1", cluster=False)) == "redis://u:***@10.0.0.1:7000/1"
    # A client made without connect(): built from its settings, never with the password.
    assert client_url(redis.Redis(host="10.0.0.1", port=7000, db=3, password="s3cret")) == "redis://:***@10.0.0.1:7000/3"
    assert client_url(redis.Redis(host="h", username="worker")) == "redis://worker@h:6379/0"
    assert client_url(redis.Redis(unix_socket_path="/tmp/r.sock")) == "unix:///tmp/r.sock"
    assert client_url(redis.Redis(host="h", ssl=True)) == "rediss://h:6379/0"
    assert client_url(embedded_redis()) == "embedded"


def test_the_async_driver_honours_pyqueue_url_too(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with AsyncQueue("aq") as q:  # a client of its own, closed at the end
            assert q._owns_client
            assert (await q.enqueue(b"", job_id="a1")).added
        monkeypatch.delenv("PYQUEUE_URL")
        embedded = AsyncQueue("aq-embedded")
        assert isinstance(client_of(embedded), fakeredis.FakeAsyncRedis)
        await embedded.enqueue(b"", job_id="e1")
        await embedded.cancel("e1")
        await embedded.aclose()

    monkeypatch.setenv("PYQUEUE_URL", server.url())
    asyncio.run(main())
    assert server.client().hexists(Queue("aq", server.client()).spec.keys.jobs, "a1")
