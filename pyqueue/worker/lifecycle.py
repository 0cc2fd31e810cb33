"""A worker's lifecycle: the stop (why, with which exit code), signals, start-up retries
and the graceful shutdown.

Exit codes of ``Worker.run`` and ``pyqueue worker`` (sysexits.h numbers; the README's
table says what a supervisor should do with each): :data:`EXIT_OK` after a requested
stop (signal, ``pyqueue stop``, burst drained); :data:`EXIT_REGISTRATION_LOST` when the
registration was lost; :data:`EXIT_MISCONFIGURED` when the handler returned an awaitable.
A second SIGTERM or SIGINT exits 1 at once.

Threads: signal handlers run in the main thread (the one that called ``Worker.run``, or
the event loop's for an AsyncWorker); they only set the stop, and the heartbeat wakes
the fetch loop within a tick. :meth:`Control.stop` is safe from any thread.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, TypeVar

from pyqueue.protocol.errors import AuthenticationFailed
from pyqueue.drivers.queue import Queue
from pyqueue.worker.retries import RETRY_ON, retryable, MAX_BACKOFF_S
from pyqueue.worker.running import Running
from pyqueue.ops.service import Service, Services

log = logging.getLogger("pyqueue.worker")

T = TypeVar("T")

#: Exit codes of Worker.run and `pyqueue worker` (sysexits.h numbers).
EXIT_OK = 0
#: EX_TEMPFAIL: the registration expired or was overwritten (a pause past expire_ms, or
#: Redis lost its data). Transient: a supervisor should start the worker again.
EXIT_REGISTRATION_LOST = 75
#: EX_TEMPFAIL too: every handler thread is stuck past its job's hard time limit (in C
#: code that Python cannot interrupt); their jobs stay leased until the process ends.
#: A supervisor should start a fresh worker.
EXIT_STUCK = 75
#: EX_CONFIG: the handler cannot run in this worker (it returned an awaitable).
EXIT_MISCONFIGURED = 78

#: How long a starting worker waits out credentials Redis refuses before it gives up
#: (AuthenticationFailed; ``pyqueue worker`` exits 2): long enough for a password being
#: rotated, short enough that a wrong one is reported rather than retried for ever.
AUTH_GRACE_S = 10.0


def show_worker_logs() -> None:
    """For a worker command of a framework (``flask pyqueue worker``, ``manage.py
    pyqueue_worker``): pyqueue's log lines (the start and stop, failed attempts) go to
    stderr at INFO, as ``pyqueue worker`` prints them, unless the application has said
    where they go (a handler on the ``pyqueue`` logger or above it)."""
    logger = logging.getLogger("pyqueue")
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


class StoppedDuringStartUp(Exception):
    """A stop was requested while the worker was still starting (:meth:`Control.start_up`)."""


class Control:
    """The stop of one worker: the events its parts wait on, and why it stopped.

    ``stopping``: stop leasing and drain (graceful). ``hard_stop``: give up on what is
    left (the grace period is over, or killed): retries end, the heartbeat ends.
    ``killed``: nothing more is written (a simulated SIGKILL)."""

    def __init__(self, running: Running, parent_gone: Callable[[], bool] | None = None) -> None:
        self.running = running
        #: A supervised child's check that its supervisor died (None: not supervised):
        #: start-up retries end on it, as on a stop.
        self.parent_gone = parent_gone
        self.stopping = threading.Event()
        self.hard_stop = threading.Event()
        self.killed = threading.Event()
        #: Lease nothing more, but keep serving what runs and stay registered until the
        #: stop: a supervised child past its recycling limit, waiting for its replacement.
        self.leasing_paused = threading.Event()
        self.exit_reason = ""
        #: What run() returns: EXIT_OK unless the stop was caused by a failure.
        self.exit_code = EXIT_OK
        self._signals = 0
        #: Whether refused credentials were reported (a warning, once per worker).
        self._auth_warned = False

    def stop(self, reason: str = "stop requested", exit_code: int = EXIT_OK) -> None:
        """Ask the worker to stop gracefully (thread-safe, idempotent). The first stop's
        reason and exit code stand."""
        if not self.stopping.is_set():
            self.exit_reason, self.exit_code = reason, exit_code
            log.log(logging.INFO if exit_code == EXIT_OK else logging.ERROR, "stopping: %s", reason)
        self.stopping.set()
        self.running.wake()

    def kill(self) -> None:
        """Stop at once, as SIGKILL would: nothing is acked, released or deregistered."""
        self.killed.set()
        self.hard_stop.set()
        self.stop("killed")

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Count signals, not stops: a worker already stopping on its own (burst drained,
        # a remote stop, a lost registration) drains gracefully on the first signal too.
        self._signals += 1
        if self._signals > 1:
            # Second signal: leave now. Leases expire and other workers reclaim them.
            log.warning("second %s: exiting at once", signal.Signals(signum).name)
            os._exit(1)
        self.stop(f"received {signal.Signals(signum).name}")

    def install_signal_handlers(self, install: bool) -> dict[int, Any]:
        """SIGTERM and SIGINT stop the worker (when asked and in the main thread); the
        handlers they replace, for :meth:`restore_signal_handlers`."""
        previous: dict[int, Any] = {}
        if install and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self.on_signal)
        return previous

    @staticmethod
    def restore_signal_handlers(previous: dict[int, Any]) -> None:
        for signum, old_handler in previous.items():
            signal.signal(signum, old_handler)

    def start_up(
        self, call: Callable[[], T], what: str, auth_grace_s: float = AUTH_GRACE_S, *, server: str = "Redis"
    ) -> T:
        """``call()`` (replay-safe) until it answers, as the worker starts. It waits out,
        with backoff, what a running worker waits out (the connection, a cluster in
        motion, a server at its memory limit), and refused credentials for
        ``auth_grace_s`` (a password being rotated) before raising
        :class:`AuthenticationFailed`. A stop (SIGTERM, SIGINT, :meth:`stop`) ends it at
        once, also in the middle of a wait: it raises :class:`StoppedDuringStartUp`, and
        ``Worker.run`` returns the stop's exit code.

        The first refusal of the credentials is logged as a WARNING naming ``server``
        (the URL without its password, :func:`pyqueue.drivers.clients.client_url`) and how long
        the worker keeps trying: once per worker, at the first failure, so a wrong
        password is visible at once; the retries after it are logged at INFO."""
        delay, refused_since = 0.1, None
        while not self.stopping.is_set():
            try:
                return call()
            except RETRY_ON as exc:
                refused = isinstance(exc, AuthenticationFailed)
                if refused:
                    refused_since = refused_since if refused_since is not None else time.monotonic()
                    if time.monotonic() - refused_since >= auth_grace_s:
                        raise
                elif not retryable(exc):
                    raise
                if self.parent_gone is not None and self.parent_gone():
                    self.stop("its supervisor is gone (while starting)")
                if self.stopping.is_set():
                    break
                if refused and not self._auth_warned:
                    self._auth_warned = True
                    log.warning(
                        "Redis at %s refused this worker's credentials at its %s (%s): retrying for %gs in case the "
                        "password is being rotated, then giving up", server, what, exc, auth_grace_s,
                    )
                elif refused:
                    log.info("%s: the credentials are still refused; retrying in %.1fs", what, delay)
                else:
                    log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        raise StoppedDuringStartUp


def shutdown(
    *, control: Control, running: Running, queues: Sequence[Queue], services: Services, service: Service,
    grace_ms: int, lease_ms: int, close_executor: Callable[[], None],
) -> None:
    """The graceful end of a registered worker: let running jobs finish within
    ``grace_ms``, release the rest to other workers, deregister. A job whose thread is
    stuck past its hard time limit is not released: it is nacked under its policy, its
    retry due no sooner than ``lease_ms`` from now (the time its lease would take to
    expire were this process dead, which it is by then), so its next attempt never
    overlaps it."""
    control.stopping.set()
    running.wait_idle(time.monotonic() + grace_ms / 1000)
    leftover = running.take_all()
    # Releasing and deregistering are courtesies: if Redis cannot be reached (the
    # reason this worker may be stopping), the leases expire and the service key
    # expires by themselves, and live workers scrub what it held. So a failure is
    # logged and the worker ends with its own exit code.
    try:
        for q in queues:
            jobs = [job for job, stuck in leftover if job.queue == q.name and stuck is None]
            if jobs:
                outcomes = q.release(jobs)
                log.warning("grace period over: released %d running jobs of %s (%s)", len(jobs), q.name,
                            ",".join(o.value for o in outcomes))
            for job, stuck in leftover:
                if job.queue == q.name and stuck is not None:
                    nacked = q.nack(job, stuck.error, delay_ms=max(stuck.delay_ms or 0, lease_ms), final=stuck.final)
                    log.warning("job %s still runs past its time limit in a thread this exit ends: nacked (%s)",
                                job.id, nacked.state)
        close_executor()
        deleted, removed = services.deregister(service)
    except RETRY_ON as exc:
        if not retryable(exc):
            raise
        close_executor()
        log.warning("service %s ended: %s; could not release or deregister (%s): its leases and key expire "
                    "by themselves", service.owner, control.exit_reason or "stopped", exc)
        return
    if deleted < 0:
        log.warning("service %s ended: %s; its id now belongs to another registration, left untouched",
                    service.owner, control.exit_reason or "stopped")
    else:
        log.info("service %s ended: %s {del: %d, lrem: %d}", service.owner, control.exit_reason or "stopped",
                 deleted, removed)
