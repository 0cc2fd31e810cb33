"""A loopback TCP proxy between a Redis client and a redis-server that loses traffic on
purpose, for tests of replay safety (tests/test_lost_replies.py).

It listens on 127.0.0.1 (an OS-chosen port) and forwards every connection to the
upstream server, reading the client's RESP commands one by one. A :class:`Rule` armed
with :meth:`FaultProxy.arm` picks the next command(s) it matches and applies one fault:

* ``DROP_COMMAND``: the command never reaches the server; the proxy closes the client's
  connection (so the client sees a connection error at once, not after its timeout);
* ``SWALLOW_REPLY``: the command reaches the server and runs (the proxy waits for the
  first bytes of its reply, so it surely ran); the reply is thrown away and the client's
  connection closed;
* ``DELAY_REPLY``: the command runs; its reply is held for ``delay_s`` and then sent (a
  client whose socket timeout is shorter gives up first: a reply that comes too late).

Commands that match no armed rule pass through unchanged. Thread-based and bounded: one
thread accepts, one thread serves each connection, at most ``max_connections`` at once
(more are refused). :meth:`close` closes every socket and joins every thread.
"""

from __future__ import annotations

import enum
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Most bytes read from a socket at once.
CHUNK = 65536


class Fault(enum.Enum):
    DROP_COMMAND = "drop the command"
    SWALLOW_REPLY = "swallow the reply"
    DELAY_REPLY = "delay the reply"


@dataclass
class Rule:
    """Apply ``fault`` to the next ``times`` commands for which ``match(args)`` is true."""

    fault: Fault
    match: Callable[[list[bytes]], bool]
    times: int = 1
    delay_s: float = 0.0
    #: commands this rule was applied to
    fired: int = 0
    #: set when the command of a SWALLOW_REPLY / DELAY_REPLY was seen to run
    ran: threading.Event = field(default_factory=threading.Event)


def parse_command(buf: bytes | bytearray) -> tuple[list[bytes], int] | None:
    """The first complete command in ``buf`` as (arguments, bytes it takes), or None if
    ``buf`` holds only part of one. Understands RESP arrays of bulk strings (what
    redis-py sends) and inline commands."""
    if not buf:
        return None
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    if buf[:1] != b"*":
        return [bytes(a) for a in bytes(buf[:end]).split()], end + 2
    n = int(buf[1:end])
    pos, args = end + 2, []
    for _ in range(n):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        if buf[pos : pos + 1] != b"$":
            raise ValueError(f"not a bulk string at {pos}: {bytes(buf[pos:pos + 16])!r}")
        size = int(buf[pos + 1 : end])
        start = end + 2
        if len(buf) < start + size + 2:
            return None
        args.append(bytes(buf[start : start + size]))
        pos = start + size + 2
    return args, pos


def evalsha_of(sha: str) -> Callable[[list[bytes]], bool]:
    """A matcher for ``EVALSHA <sha> ...``."""
    want = sha.encode()

    def match(args: list[bytes]) -> bool:
        return len(args) >= 2 and args[0].upper() == b"EVALSHA" and args[1] == want

    return match


class FaultProxy:
    """The proxy; use as a context manager or call :meth:`close`."""

    def __init__(self, upstream: tuple[str, int], *, max_connections: int = 32) -> None:
        if upstream[0] not in ("127.0.0.1", "localhost"):
            raise ValueError("the proxy only forwards to a loopback server")
        self.upstream = upstream
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True)
        self._acceptor.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- rules -------------------------------------------------------------------------

    def arm(self, fault: Fault, match: Callable[[list[bytes]], bool], *, times: int = 1,
            delay_s: float = 0.0) -> Rule:
        """Apply ``fault`` to the next ``times`` matching commands (on any connection)."""
        rule = Rule(fault, match, times, delay_s)
        with self._lock:
            self._rules.append(rule)
        return rule

    def disarm(self) -> None:
        """Forget every rule (fired or not)."""
        with self._lock:
            self._rules.clear()

    def _take(self, args: list[bytes]) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.fired < rule.times and rule.match(args):
                    rule.fired += 1
                    return rule
        return None

    # -- plumbing ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._threads = {t for t in self._threads if t.is_alive()}
                if len(self._threads) >= self.max_connections or self._closed.is_set():
                    client.close()
                    continue
                self._sockets.add(client)
                thread = threading.Thread(target=self._serve, args=(client,), name="proxy-conn", daemon=True)
                self._threads.add(thread)
            thread.start()

    def _open_upstream(self) -> socket.socket:
        upstream = socket.create_connection(self.upstream, timeout=5)
        with self._lock:
            self._sockets.add(upstream)
        return upstream

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for s in socks:
                self._sockets.discard(s)
        for s in socks:
            s.close()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self._open_upstream()
        except OSError:
            self._forget(client)
            return
        try:
            self._pump(client, upstream)
        except OSError:
            pass  # either side hung up, or close() closed the sockets
        finally:
            self._forget(client, upstream)

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Forward both ways until either side closes; apply the rules to each command."""
        pending = bytearray()  # client bytes not yet forwarded (part of a command)
        delayed: Rule | None = None  # a DELAY_REPLY rule whose reply is still to come
        with selectors.DefaultSelector() as sel:
            sel.register(client, selectors.EVENT_READ, "client")
            sel.register(upstream, selectors.EVENT_READ, "upstream")
            while not self._closed.is_set():
                for key, _ in sel.select(timeout=0.1):
                    data = key.fileobj.recv(CHUNK)  # type: ignore[union-attr]
                    if not data:
                        return
                    if key.data == "upstream":
                        if delayed is not None:  # the reply began: the command ran
                            delayed.ran.set()
                            time.sleep(delayed.delay_s)
                            delayed = None
                        client.sendall(data)
                        continue
                    pending += data
                    while (parsed := parse_command(pending)) is not None:
                        args, size = parsed
                        raw = bytes(pending[:size])
                        del pending[:size]
                        rule = self._take(args)
                        if rule is None:
                            upstream.sendall(raw)
                        elif rule.fault is Fault.DROP_COMMAND:
                            return  # never sent; closing tells the client at once
                        elif rule.fault is Fault.SWALLOW_REPLY:
                            upstream.sendall(raw)
                            upstream.settimeout(5)
                            if upstream.recv(CHUNK):  # the reply began: the command ran
                                rule.ran.set()
                            return
                        else:
                            upstream.sendall(raw)
                            delayed = rule

    def close(self) -> None:
        """Stop accepting, close every socket, join every thread."""
        self._closed.set()
        self._listener.close()
        self._acceptor.join(5)
        with self._lock:
            socks, threads = list(self._sockets), list(self._threads)
            self._sockets.clear()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in threads:
            t.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
