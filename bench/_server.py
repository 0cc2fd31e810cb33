"""A throwaway redis-server on the loopback interface, owned by one benchmark command.

Every benchmark talks to a real ``redis-server`` (never fakeredis): the figures are
about round trips and server-side script time. The process that owns the server
(the pyperf parent, or ``run.py``) starts it once and hands its URL to everything
else with ``--redis-url``; it is stopped by its own PID, never by name.

The server listens on 127.0.0.1 only, on a port the kernel reports free, with
persistence off (``--save '' --appendonly no``) so no disk I/O lands in a timing.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

import redis

#: The checkout root (bench/..). Benchmarks measure this checkout's pyqueue and lua/.
REPO_ROOT = Path(__file__).resolve().parent.parent

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


def use_checkout() -> None:
    """Make ``import pyqueue`` load this checkout, whether or not it is pip-installed.

    pyperf workers get a filtered environment, and ``python bench/x.py`` puts only
    ``bench/`` on ``sys.path``; inserting the root keeps every process on the same code.
    """
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LoopbackRedis:
    """A ``redis-server`` child process on 127.0.0.1; a context manager.

    Args:
        binary: the server executable; default: ``redis-server`` from ``PATH``.
        extra_args: more ``--option value`` pairs for the server command line.
    """

    def __init__(self, binary: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        found = binary or shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(found).exists():
            raise FileNotFoundError("redis-server not found; pass --redis-server PATH")
        self.binary = found
        self.extra_args = extra_args
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """The server's process id (the only handle used to stop it)."""
        if self.process is None:
            raise RuntimeError("server not started")
        return self.process.pid

    def start(self) -> LoopbackRedis:
        """Start the server and wait until it answers PING. Retries once on a port race."""
        for _attempt in range(3):
            self._workdir = tempfile.TemporaryDirectory(prefix="pyqueue-bench-")
            self.port = free_loopback_port()
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--bind", "127.0.0.1",
                    "--port", str(self.port),
                    "--protected-mode", "yes",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", self._workdir.name,
                    "--daemonize", "no",
                    *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_ready():
                return self
            self.stop()  # most likely the port was taken between probe and bind
        raise RuntimeError("redis-server did not start on 127.0.0.1")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.ConnectionError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """Terminate the server by its PID (SIGTERM, then SIGKILL after a timeout)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> LoopbackRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--redis-url`` (use a running server) and ``--redis-server`` (binary to start)."""
    parser.add_argument(
        "--redis-url",
        default=None,
        help="benchmark this server (e.g. redis://127.0.0.1:6390/0); default: start a "
        "private redis-server on a free 127.0.0.1 port and stop it at the end",
    )
    parser.add_argument("--redis-server", default=None, help="redis-server binary to start (default: from PATH)")


def client_for(url: str) -> redis.Redis:
    """A plain redis-py client (bytes replies, no retries) for benchmark bookkeeping and
    for the raw-limit loops: nothing between the loop and the socket but redis-py."""
    return redis.Redis.from_url(url, socket_timeout=60, decode_responses=False)


def require_loopback(url: str) -> None:
    """Refuse anything but a loopback server: the benchmarks flush stats and slowlogs
    and write hundreds of thousands of keys."""
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing to benchmark a non-loopback server: {url}")
