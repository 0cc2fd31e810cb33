"""Serving the dashboard: uvicorn in a thread of this process, on a socket bound here.

Binding the socket before uvicorn starts lets ``--port 0`` print the port the kernel
chose, and running uvicorn in a thread leaves signals to the caller: ``pyqueue
dashboard`` stops on SIGTERM/SIGINT and exits 0, and the demo stops its dashboard when
it is done.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

import uvicorn

from pyqueue.drivers.clients import Client, redact_url
from pyqueue.dashboard.app import DashboardConfig, create_app
from pyqueue.dashboard.history import Sampler
from pyqueue.dashboard.security import DashboardRefused, check_bind, is_loopback, loopback_hosts
from pyqueue.dashboard.taskview import check_urls

log = logging.getLogger("pyqueue.dashboard")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:  # a port in use, an address not of this machine: say which
        raise DashboardRefused(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def public_label(url: str) -> str:
    """The URL without its passwords (also a Sentinel URL's ``sentinel_password=``), for
    the page's header."""
    if url == "embedded":
        return "embedded fakeredis"
    return redact_url(url)


class RunningDashboard:
    """A dashboard served by uvicorn in a daemon thread; :meth:`stop` ends it."""

    def __init__(self, config: DashboardConfig, host: str, port: int, sampler: Sampler | None = None) -> None:
        check_bind(host, config.token)
        if config.allowed_hosts is None and is_loopback(host):
            config = dataclasses.replace(config, allowed_hosts=frozenset(loopback_hosts(host)))
        self.app = create_app(config, sampler=sampler)
        self.socket = bind(host, port)
        bound_port = self.socket.getsockname()[1]
        shown = f"[{host.strip('[]')}]" if ":" in host else host
        self.url = f"http://{shown}:{bound_port}/"
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="pyqueue-dashboard", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.socket.close()


def serve_until_signalled(
    client: Client,
    *,
    url: str,
    host: str,
    port: int,
    prefix: str,
    queues: Sequence[str] | None,
    namespaces: Sequence[str],
    token: str | None,
    show_payloads: bool,
    every_s: float,
    history_s: float,
    worker_metrics: Sequence[str] = (),
    read_only: bool = False,
) -> int:
    """``pyqueue dashboard``: serve until SIGTERM or SIGINT, then exit 0 (``read_only``:
    offer no action and refuse every POST, see :class:`DashboardConfig`)."""
    config = DashboardConfig(client, prefix=prefix, queues=queues, namespaces=namespaces, token=token,
                             show_payloads=show_payloads, every_s=every_s, history_s=history_s,
                             label=public_label(url), worker_metrics=check_urls(worker_metrics),
                             read_only=read_only)
    # The handlers first: a supervisor may send SIGTERM as soon as it reads the line
    # below, and that must stop the server cleanly (exit 0), not kill the process.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    running = RunningDashboard(config, host, port)
    notes = []
    if token:
        notes.append("token required: HTTP Basic with any user name and the token as password, or Bearer")
    notes.append("payloads shown" if show_payloads else "payloads hidden (--show-payloads shows them)")
    if read_only:
        notes.append("read-only: no action")
    print(f"serving the pyqueue dashboard on {running.url} ({'; '.join(notes)})", flush=True)
    while not stop.wait(0.5):
        if not running.thread.is_alive():
            log.error("the dashboard server stopped by itself")
            return 1
    running.stop()
    return 0


class DemoDashboard:
    """The dashboard of ``pyqueue demo --dashboard``: samples twice a second (the demo
    lasts seconds), shows the demo's worker namespace, and stays up after the demo until
    Ctrl-C, so the charts can be read at leisure."""

    def __init__(self, running: RunningDashboard) -> None:
        self.running = running

    def linger(self, say: Callable[[str], None]) -> None:
        """Serve until SIGINT or SIGTERM, then stop the server."""
        say(f"  the dashboard keeps serving the run's history on {self.running.url}: Ctrl-C to stop")
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not stop.wait(0.5) and self.running.thread.is_alive():
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.running.stop()


def start_demo_dashboard(
    client: Client,
    *,
    url: str,
    prefix: str,
    queues: Sequence[str],
    namespace: str,
    port: int,
    say: Callable[[str], None],
) -> DemoDashboard:
    """Start the demo's dashboard on 127.0.0.1 and say where; on a terminal, give the
    reader a few seconds to open it before the queues start to drain."""
    config = DashboardConfig(client, prefix=prefix, queues=list(queues), namespaces=[namespace],
                             every_s=0.5, history_s=300, poll_s=1.0, label=public_label(url))
    running = RunningDashboard(config, "127.0.0.1", port)
    say(f"  dashboard: {running.url}")
    if sys.stdout.isatty():
        say("  (open it now: the workers start in 3 s)")
        time.sleep(3)
    return DemoDashboard(running)
