"""The supervisor of ``pyqueue worker --processes N``: N worker processes, each a whole
:class:`~pyqueue.worker.Worker` (fetch loop, heartbeat, ``--concurrency`` handler slots),
kept alive by one parent that runs no job itself. The model is gunicorn's arbiter: one
thread, a loop that reads the children's pipes, reaps the dead and acts on signals.

What it does, and the guarantees:

* **Replaces only a child that died** (a crash, an OOM kill, exit 75 after its
  registration was lost). Its leases are scrubbed at once, through the scrub transition
  (lua/scrub.lua), with the registration the child reported when it registered: its jobs
  are back at the head of their queues with the attempt counted (or DEAD at their last
  attempt) in well under a second, not at lease expiry, and its service is forgotten.
  A job it ran may therefore run again (at least once, as always); a job is never lost.
* **Backoff and a crash-loop cap.** A child that dies within :data:`FAST_DEATH_S` of
  its start (``--fast-death-ms``) is a fast death; the replacement of the k-th fast death in a row waits
  0.25 s × 2^(k-1), at most 10 s. After ``crash_loop`` fast deaths in a row it gives up: it stops
  the children (they drain) and exits :data:`EXIT_CRASH_LOOP`. A death after a longer
  life restarts at once and ends the row.
* **Misconfiguration stops everything.** A child that exits 2 (bad configuration) or 78
  (:data:`~pyqueue.worker.lifecycle.EXIT_MISCONFIGURED`) would fail again the same way:
  the others are drained and the supervisor exits with that code.
* **Recycling** (``--max-jobs-per-child``, ``--max-memory-per-child``) and a job whose
  thread did not stop at its **time limit** (the hard limit: only ending the process
  stops a thread stuck in C code): the child asks to be replaced
  (:mod:`pyqueue.worker.supervised`); the supervisor starts the replacement first and
  sends the old child SIGTERM once the replacement has registered. The old child
  finishes its running jobs (within ``--grace-ms``) and deregisters; a thread stuck past
  its limit dies with its process. No capacity gap, no job lost or run twice by it.
* **SIGHUP**: a rolling restart, one child at a time, by the same hand-over (new code
  is imported by the new children: the deploy case).
* **SIGTERM / SIGINT**: every child drains and deregisters; exit 0. A second signal
  kills the children (SIGKILL), scrubs their leases and exits 1.
* A child that exits 0 on its own (``--burst`` drained, or ``pyqueue stop <its id>``)
  is not replaced; the supervisor exits 0 when no child is left.
* **Metrics** (``--metrics-port``): the supervisor creates a temporary directory,
  gives it to every child as ``PROMETHEUS_MULTIPROC_DIR`` (replacing one the
  environment may have), which puts prometheus_client in its multiprocess mode there:
  each process writes its values to memory-mapped files named by its pid in that
  directory, as it records them. The supervisor serves the sum over every file on
  ``/metrics`` from a thread of its own. A child's counts are in the page cache the
  moment they are recorded, so a child that is killed (even with SIGKILL), recycled or
  replaced keeps them: its files stay and are summed with the others', once each. The
  directory is removed when the supervisor exits (a SIGKILLed supervisor leaves it in
  the temporary directory). Each child ever started adds its files: a scrape reads
  every one of them (64 KiB each to start with, sparse). Why files and not the pipe:
  figures sent over the pipe now and then die with a SIGKILLed child since its last
  report, and sending them per run costs a system call per job and a parser in this
  loop; a memory-mapped write costs about what an in-memory metric does and loses
  nothing but the run in progress.

The children are ``python -m pyqueue <the same arguments>`` in a new session (so a
terminal's Ctrl-C reaches the supervisor only, which passes it on as one SIGTERM), with
the pipe's write end and :data:`~pyqueue.worker.supervised.ENV_VAR`. A child whose
supervisor died stops by itself.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import redis as redis_lib

from pyqueue.protocol.errors import InvalidArgument, PyQueueError
from pyqueue.worker.lifecycle import EXIT_MISCONFIGURED, EXIT_OK
from pyqueue.worker.registration import scrub_service
from pyqueue.worker.supervised import ENV_VAR
from pyqueue.ops.service import DeadService, Services

log = logging.getLogger("pyqueue.supervisor")

#: Exit code of a supervisor that gave up on a crash loop (EX_SOFTWARE).
EXIT_CRASH_LOOP = 70
#: Exit code of a child (and the supervisor) for bad arguments or configuration.
EXIT_USAGE = 2
#: A child that dies sooner than this after its start counts toward the crash loop.
FAST_DEATH_S = 10.0
#: Fast deaths in a row before the supervisor gives up (``--crash-loop``).
DEFAULT_CRASH_LOOP = 5
#: The first restart delay after a fast death; doubled for each one in a row, up to
#: RESTART_BACKOFF_MAX_S.
RESTART_BACKOFF_S = 0.25
RESTART_BACKOFF_MAX_S = 10.0
#: The environment variable of prometheus_client's multiprocess mode (read when a child
#: imports prometheus_client).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(eq=False)
class Child:
    """One worker process, as the supervisor knows it."""

    proc: subprocess.Popen[bytes]
    #: The read end of its pipe (None once closed).
    fd: int | None
    started: float
    buffer: bytes = b""
    #: Set by its ``ready`` line: who it is in Redis.
    service: DeadService | None = None
    #: Why it is being replaced ('' while it is not); its replacement is started.
    retiring: str = ""
    #: SIGTERM was sent: it drains and exits.
    stopping: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid


class Supervisor:
    """Runs ``processes`` children of ``pyqueue <argv>`` (see the module docstring).

    Args:
        argv: the ``pyqueue`` command line each child runs (the supervisor's own).
        url, prefix, namespace: where the children register: what the supervisor needs
            to scrub a dead child's leases.
        max_jobs_per_child / max_memory_mb_per_child: recycling limits (0: none).
        crash_loop: fast deaths in a row before giving up (exit :data:`EXIT_CRASH_LOOP`).
        fast_death_s: a child that dies sooner than this after its start is a fast death
            (0: none is; every death is then replaced at once and the loop never gives up).
        metrics: (host, port) to serve the children's Prometheus metrics on, summed
            (see the module docstring); None: no metrics. Port 0 picks a free port
            (``summed.port`` says which).
    """

    def __init__(
        self, argv: Sequence[str], *, processes: int, url: str, prefix: str, namespace: str,
        max_jobs_per_child: int = 0, max_memory_mb_per_child: int = 0, crash_loop: int = DEFAULT_CRASH_LOOP,
        fast_death_s: float = FAST_DEATH_S, metrics: tuple[str, int] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.processes = processes
        self.url, self.prefix, self.namespace = url, prefix, namespace
        self.max_jobs, self.max_mb = max_jobs_per_child, max_memory_mb_per_child
        self.crash_loop, self.fast_death_s = crash_loop, fast_death_s
        self.children: list[Child] = []
        #: Monotonic due times of the replacements of dead children.
        self.restarts: list[float] = []
        #: Children a SIGHUP asked to restart, one at a time.
        self.rolling: list[Child] = []
        self.fast_deaths = 0
        self.stopping = False
        self.exit_code = EXIT_OK
        self._signals: list[int] = []
        self._selector = selectors.DefaultSelector()
        self._redis: Any = None
        self.metrics = metrics
        #: The children's figures, summed and served while it runs (with ``metrics``).
        self.summed = SummedMetrics()

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        """Start the children and supervise them until the end; the exit code.

        Raises:
            InvalidArgument: the metrics' address cannot be listened on.
        """
        if self.metrics is not None:
            self.summed.serve(*self.metrics)
        try:
            return self._run()
        finally:
            self.summed.stop()

    def _run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self._selector.register(wake_r, selectors.EVENT_READ, None)
        previous_wakeup = signal.set_wakeup_fd(wake_w)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in
                    (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)}
        log.info("supervisor pid %d: starting %d worker processes", os.getpid(), self.processes)
        try:
            for _ in range(self.processes):
                self.spawn()
            while self.children or (self.restarts and not self.stopping):
                due = min(self.restarts, default=time.monotonic() + 1.0)
                for key, _ in self._selector.select(max(0.0, min(1.0, due - time.monotonic()))):
                    if key.data is None:
                        while _read_some(wake_r):
                            pass
                    else:
                        self.read(key.data)
                if self.handle_signals():
                    return 1
                self.reap()
                self.start_due_restarts()
            log.info("supervisor pid %d: every worker process ended; exit %d", os.getpid(), self.exit_code)
            return self.exit_code
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._selector.close()
            os.close(wake_r)
            os.close(wake_w)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals.append(signum)  # acted on by the loop (set_wakeup_fd wakes it)

    def handle_signals(self) -> bool:
        """Act on the signals received; True: a second stop signal, exit now."""
        while self._signals:
            signum = self._signals.pop(0)
            if signum == signal.SIGHUP and not self.stopping:
                log.info("SIGHUP: restarting the worker processes one by one")
                self.rolling = [c for c in self.children if not c.retiring and not c.stopping]
                self.roll_next()
            elif signum in (signal.SIGTERM, signal.SIGINT):
                if self.stopping:
                    self.kill_all(f"second {signal.Signals(signum).name}")
                    return True
                log.info("%s: draining the worker processes", signal.Signals(signum).name)
                self.stop_all()
        return False

    # -- children ----------------------------------------------------------------------

    def spawn(self) -> Child:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env[ENV_VAR] = f"{write_fd}:{os.getpid()}:{self.max_jobs}:{self.max_mb}"
        if self.summed.directory is not None:
            env[MULTIPROC_ENV] = self.summed.directory
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pyqueue", *self.argv], env=env, pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        child = Child(proc, read_fd, time.monotonic())
        self.children.append(child)
        self._selector.register(read_fd, selectors.EVENT_READ, child)
        log.info("started worker process %d", child.pid)
        return child

    def read(self, child: Child) -> None:
        """Read what ``child`` wrote; act on each whole line."""
        assert child.fd is not None
        while True:
            data = _read_some(child.fd)
            if not data:
                if data is not None:  # EOF: it exited (reaped by the loop)
                    self._close(child)
                break
            child.buffer += data
        *lines, child.buffer = child.buffer.split(b"\n")
        for line in lines:
            self.on_line(child, line.decode(errors="replace"))

    def on_line(self, child: Child, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "ready":
            sid, registration, queues = (rest.split(" ") + ["", ""])[:3]
            child.service = DeadService(
                int(sid), registration, f"{self.namespace}.{sid}.{registration}", [q for q in queues.split(",") if q]
            )
            log.info("worker process %d serves as service %s", child.pid, child.service.owner)
            # Its predecessor (if it replaces one) stops now that it serves.
            for old in self.children:
                if old.retiring and not old.stopping:
                    self.terminate(old)
                    break
            self.roll_next()
        elif word == "retire":
            self.replace(child, rest)
        else:
            log.warning("worker process %d said something unknown: %r", child.pid, line[:100])

    def replace(self, child: Child, reason: str) -> None:
        """Start ``child``'s replacement; ``child`` is stopped once that one serves."""
        if child.retiring or child.stopping or self.stopping:
            return
        child.retiring = reason
        log.info("replacing worker process %d: %s", child.pid, reason)
        self.spawn()

    def roll_next(self) -> None:
        """A SIGHUP's rolling restart: replace the next child once no hand-over is pending."""
        if any(c.retiring and not c.stopping for c in self.children):
            return
        while self.rolling:
            child = self.rolling.pop(0)
            if child in self.children and not child.retiring and not child.stopping:
                self.replace(child, "rolling restart (SIGHUP)")
                return

    def terminate(self, child: Child) -> None:
        child.stopping = True
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def stop_all(self) -> None:
        self.stopping = True
        self.restarts.clear()
        self.rolling.clear()
        for child in self.children:
            if not child.stopping:
                self.terminate(child)

    def kill_all(self, why: str) -> None:
        log.warning("%s: killing the worker processes and scrubbing their leases", why)
        for child in self.children:
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for child in list(self.children):
            child.proc.wait()
            self.ended(child, child.proc.returncode)

    def reap(self) -> None:
        for child in list(self.children):
            code = child.proc.poll()
            if code is not None:
                self.ended(child, code)

    def ended(self, child: Child, code: int) -> None:
        """``child`` exited with ``code`` (negative: killed by that signal)."""
        if child.fd is not None:
            self.read(child)  # a last line (its ready) may still be in the pipe
            self._close(child)
        self.children.remove(child)
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        if code != 0:
            if child.service is not None:
                self.scrub(child, how)
            else:
                log.warning("worker process %d %s before it registered: it held no lease", child.pid, how)
        if self.stopping or child.retiring:
            log.info("worker process %d %s", child.pid, how)
            return
        if code in (EXIT_USAGE, EXIT_MISCONFIGURED):
            log.error("worker process %d %s: its configuration is refused; stopping the others", child.pid, how)
            self.give_up(code)
        elif code == 0:
            log.info("worker process %d %s on its own (burst drained, or stopped remotely): not replaced",
                     child.pid, how)
        else:
            lived = time.monotonic() - child.started
            self.fast_deaths = self.fast_deaths + 1 if lived < self.fast_death_s else 0
            if self.fast_deaths >= self.crash_loop:
                log.error("worker process %d %s after %.1fs: %d fast deaths in a row (crash loop); giving up",
                          child.pid, how, lived, self.fast_deaths)
                self.give_up(EXIT_CRASH_LOOP)
                return
            delay = min(RESTART_BACKOFF_S * 2 ** (self.fast_deaths - 1), RESTART_BACKOFF_MAX_S) if self.fast_deaths else 0.0
            log.warning("worker process %d %s after %.1fs; replacing it in %.2fs", child.pid, how, lived, delay)
            self.restarts.append(time.monotonic() + delay)

    def give_up(self, code: int) -> None:
        self.exit_code = code
        self.stop_all()

    def start_due_restarts(self) -> None:
        now = time.monotonic()
        due = [t for t in self.restarts if t <= now]
        self.restarts = [t for t in self.restarts if t > now]
        for _ in due:
            self.spawn()

    def scrub(self, child: Child, how: str) -> None:
        """Put the leases of a dead child back at the head of their queues now."""
        assert child.service is not None
        try:
            if self._redis is None:
                from pyqueue.drivers.clients import bytes_client, connect

                self._redis = bytes_client(connect(self.url))
            services = Services(self._redis, namespace=self.namespace, prefix=self.prefix)
            total = scrub_service(services, child.service, redis=self._redis, prefix=self.prefix, expired=False)
            log.warning("worker process %d %s: %d of its leases are back at the head of their queues",
                        child.pid, how, total)
        except (redis_lib.RedisError, PyQueueError) as exc:
            log.warning("worker process %d %s; its leases could not be scrubbed now (%s): they come back when "
                        "its registration expires", child.pid, how, exc)

    def _close(self, child: Child) -> None:
        if child.fd is not None:
            self._selector.unregister(child.fd)
            os.close(child.fd)
            child.fd = None


def _read_some(fd: int) -> bytes | None:
    """Up to 64 KiB from a non-blocking fd; None if nothing is there now, b'' at EOF."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


class SummedMetrics:
    """The children's Prometheus metrics, summed (see the module docstring): a directory
    every child writes its figures in (``PROMETHEUS_MULTIPROC_DIR``), served by one
    HTTP thread of the supervisor."""

    def __init__(self) -> None:
        #: The children's PROMETHEUS_MULTIPROC_DIR while metrics are served.
        self.directory: str | None = None
        #: The port served on (port 0 picks one).
        self.port: int | None = None
        self._server: Any = None

    def serve(self, host: str, port: int) -> None:
        """Serve the sum of the children's metrics on ``http://host:port/metrics``, from
        a directory made now.

        Raises:
            InvalidArgument: ``host:port`` cannot be listened on (in use, not an address
                of this host).
        """
        import shutil
        import tempfile

        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        self.directory = tempfile.mkdtemp(prefix="pyqueue-metrics-")
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            raise InvalidArgument(f"cannot serve metrics on {host}:{port}: {exc}") from None
        self.port = int(self._server.server_port)
        log.info("serving the worker processes' task metrics on http://%s:%d/metrics", host, self.port)

    def stop(self) -> None:
        """Stop serving and remove the directory (nothing if not serving)."""
        import shutil

        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
