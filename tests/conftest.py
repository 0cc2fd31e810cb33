"""Fixtures: every behaviour test runs on two backends.

* ``fake``: fakeredis[lua], a fresh ``FakeServer`` per test (a script that breaks a fake
  server's Lua state must not leak into the next test).
* ``real``: a redis-server this test session starts on a unix socket in a temporary
  directory and stops at the end. Without the binary the real tests skip, except under
  ``CI=true``, where a missing server is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from pyqueue import Queue

IN_CI = os.environ.get("CI", "").lower() == "true"


class RedisServer:
    """A redis-server process on a unix socket, owned by the test session."""

    def __init__(self, directory: Path, extra: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self.socket = str(directory / "redis.sock")
        binary = shutil.which("redis-server")
        assert binary is not None
        self.process = subprocess.Popen(
            [
                binary,
                "--port", "0",
                "--unixsocket", self.socket,
                "--unixsocketperm", "700",
                "--dir", str(directory),
                "--save", "",
                "--appendonly", "no",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket, **kwargs)  # type: ignore[arg-type]

    def url(self) -> str:
        return f"unix://{self.socket}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def require_redis_server() -> None:
    if shutil.which("redis-server") is None:
        if IN_CI:
            pytest.fail("redis-server is not installed, and CI=true forbids skipping real-server tests")
        pytest.skip("redis-server is not installed")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pyqueue-test-") as tmp:
        server = RedisServer(Path(tmp))
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(params=["fake", "real"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def r(backend: str, request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A raw client of an empty server of the current backend."""
    if backend == "fake":
        client: redis.Redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        client = server.client()
        client.flushall()
    yield client
    client.close()


@pytest.fixture
def make_queue(r: redis.Redis) -> Callable[..., Queue]:
    """Factory: ``make_queue(name="q", **kwargs)`` -> a Queue on the test's server."""

    def make(name: str = "q", **kwargs: object) -> Queue:
        return Queue(name, r, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
def q(make_queue: Callable[..., Queue]) -> Queue:
    return make_queue()


def dump_all(client: redis.Redis) -> dict[bytes, bytes | None]:
    """Every key with its DUMP, to prove a failing call wrote nothing."""
    return {k: client.dump(k) for k in sorted(client.keys("*"))}
