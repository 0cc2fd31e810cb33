"""Fixtures: every behaviour test runs on two backends.

* ``fake``: fakeredis[lua], a fresh ``FakeServer`` per test (a script that breaks a fake
  server's Lua state must not leak into the next test).
* ``real``: a redis-server this test session starts on a unix socket in a temporary
  directory and stops at the end. Without the binary the real tests skip, except under
  ``CI=true``, where a missing server is a failure.
* ``cluster``: a Redis Cluster of 3 primaries and 3 replicas on 127.0.0.1, started once
  per session (``redis-server --cluster-enabled yes`` and ``redis-cli --cluster
  create``) and stopped by PID; each test that uses it gets it empty.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import fakeredis
import pytest
import redis
from redis.cluster import RedisCluster

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


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports of 127.0.0.1 that were free a moment ago."""
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(int(s.getsockname()[1]))
    for s in sockets:
        s.close()
    return ports


class RedisClusterProcesses:
    """A Redis Cluster of ``primaries`` primaries with one replica each, on loopback,
    owned by the test session (every node's process is stopped by its PID)."""

    def __init__(self, directory: Path, primaries: int = 3) -> None:
        self.directory = directory
        binary = shutil.which("redis-server")
        assert binary is not None
        ports = free_ports(4 * primaries)  # a client port and a cluster bus port per node
        self.ports, bus_ports = ports[: 2 * primaries], ports[2 * primaries :]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        for port, bus in zip(self.ports, bus_ports):
            self.start_node(port, bus)
        for port in self.ports:
            self._wait_ping(port)
        create = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports],
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, timeout=60,
        )
        if create.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout.decode()}{create.stderr.decode()}")
        self.wait_ok()

    def start_node(self, port: int, bus: int) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-port", str(bus), "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", "1000", "--dir", str(node_dir), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def _wait_ping(self, port: int) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=port).ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} did not start") from None
                time.sleep(0.02)

    def wait_ok(self, timeout_s: float = 30) -> None:
        """Until every live node says cluster_state:ok and agrees on the slots."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = []
            for port, proc in self.processes.items():
                if proc.poll() is None:
                    try:
                        states.append(redis.Redis(port=port).cluster("info")["cluster_state"])
                    except redis.RedisError:
                        states.append("down")
            if states and all(state == "ok" for state in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not become ok: {states}")
            time.sleep(0.05)

    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def client(self, **kwargs: Any) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def flushall(self) -> None:
        for node in self.client().get_primaries():
            node.redis_connection.flushall()
            node.redis_connection.script_flush()

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcesses]:
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pyqueue-cluster-") as tmp:
        cluster = RedisClusterProcesses(Path(tmp))
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def cluster(redis_cluster: RedisClusterProcesses) -> Iterator[RedisCluster]:
    """A client of the session's Redis Cluster, emptied for this test."""
    redis_cluster.flushall()
    client = redis_cluster.client()
    yield client
    client.close()


#: Every behaviour test runs on these; a module that sets ``ON_CLUSTER = True`` (the
#: driver, worker, service and CLI tests) also runs on the cluster.
BACKENDS = ["fake", "real"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        extra = ["cluster"] if getattr(metafunc.module, "ON_CLUSTER", False) else []
        metafunc.parametrize("backend", BACKENDS + extra, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def r(backend: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A raw client of an empty server (or cluster) of the current backend."""
    if backend == "fake":
        client: Any = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    elif backend == "cluster":
        processes: RedisClusterProcesses = request.getfixturevalue("redis_cluster")
        processes.flushall()
        client = processes.client()
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


def all_keys(client: Any, pattern: str = "*") -> list[bytes]:
    """Every key matching ``pattern``, sorted: of the server, or of every primary of a
    cluster (where redis-py sends KEYS to one node only)."""
    if isinstance(client, RedisCluster):
        return sorted(k for node in client.get_primaries() for k in node.redis_connection.keys(pattern))
    return sorted(client.keys(pattern))


def dump_all(client: Any) -> dict[bytes, bytes | None]:
    """Every key with its DUMP, to prove a failing call wrote nothing."""
    return {k: client.dump(k) for k in all_keys(client)}
