"""A worker process started by the supervisor (``pyqueue worker --processes N``): its end
of the line to the supervisor, and the limits after which it asks to be replaced.

The supervisor (:mod:`pyqueue.worker.supervisor`) starts each child as
``python -m pyqueue <the same arguments>`` with :data:`ENV_VAR` set to
``<fd>:<supervisor pid>:<max jobs>:<max MiB>``: ``fd`` is the write end of a pipe the
supervisor reads. The child writes one line per event, each well under ``PIPE_BUF``
(so a line is never interleaved with another):

* ``ready <service id> <registration> <queue>,<queue>...`` once it registered: the
  supervisor now knows whose leases to scrub if this child dies, and that it serves (a
  child being replaced is asked to stop only once its replacement said ready);
* ``retire <reason>`` when it wants to be replaced: it ended ``max_jobs`` jobs, its
  resident memory passed ``max_memory_mb``, or a job's thread did not stop at its time
  limit (stuck in C code: only ending the process stops it). Past a recycling limit it
  leases nothing more (the jobs it holds finish: so it runs ``max_jobs`` jobs, plus
  at most the ones it had leased already); after a time limit its other slots go on
  serving. It stays registered until the supervisor, once the replacement serves,
  sends it SIGTERM: it then drains like any worker (a stuck thread dies with the
  process). No job is lost or run twice by the hand-over.

The child also stops (gracefully) when its supervisor is gone (its parent pid changed),
so a SIGKILLed supervisor does not leave orphans serving for ever.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pyqueue.protocol.errors import InvalidArgument

log = logging.getLogger("pyqueue.worker")

#: The environment variable that makes ``pyqueue worker`` a supervised child.
ENV_VAR = "PYQUEUE_SUPERVISOR"

#: How often resident memory is read (a read of /proc/self/statm; the check itself is
#: per heartbeat tick).
RSS_EVERY_S = 1.0


def resident_mb() -> float:
    """This process's resident memory now, in MiB: ``/proc/self/statm`` on Linux; the
    peak (``ru_maxrss``) elsewhere, which can only over-state it."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


@dataclass
class SupervisorLink:
    """This child's end of the pipe to its supervisor, and its recycling limits."""

    fd: int
    supervisor_pid: int
    #: Ask to be replaced after this many jobs ended here (0: no limit).
    max_jobs: int = 0
    #: Ask to be replaced above this resident memory, in MiB (0: no limit).
    max_memory_mb: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.retiring = ""
        self._rss_at = 0.0

    @classmethod
    def from_environment(cls) -> SupervisorLink | None:
        """The link the supervisor gave this process (removing :data:`ENV_VAR` from the
        environment, so processes the handlers start do not inherit it); None when this
        process was not started by a supervisor."""
        value = os.environ.pop(ENV_VAR, None)
        if value is None:
            return None
        try:
            fd, pid, max_jobs, max_mb = (int(part) for part in value.split(":"))
        except ValueError:
            raise InvalidArgument(f"{ENV_VAR}={value!r}: set by the supervisor as fd:pid:max_jobs:max_mb") from None
        return cls(fd, pid, max_jobs, max_mb)

    def _write(self, line: str) -> None:
        with self._lock:
            try:
                os.write(self.fd, (line.replace("\n", " ")[:500] + "\n").encode())
            except OSError as exc:  # the supervisor is gone: parent_gone() will stop us
                log.warning("could not tell the supervisor %r: %s", line.split(" ", 1)[0], exc)

    def ready(self, service_id: int, registration: str, queue_names: Sequence[str]) -> None:
        """Registered: tell the supervisor who this child is in Redis."""
        self._write(f"ready {service_id} {registration} {','.join(queue_names)}")

    def retire(self, reason: str) -> None:
        """Ask to be replaced (once; later reasons are dropped)."""
        if not self.retiring:
            self.retiring = reason
            log.warning("asking the supervisor for a replacement: %s", reason)
            self._write(f"retire {reason}")

    def parent_gone(self) -> bool:
        return os.getppid() != self.supervisor_pid

    def check_limits(self, jobs_ended: int) -> bool:
        """Ask to be replaced once a recycling limit is passed (a heartbeat duty); True
        when one was passed just now: the worker then leases nothing more (its running
        jobs finish, and the supervisor stops it once the replacement serves)."""
        if self.retiring:
            return False
        if self.max_jobs and jobs_ended >= self.max_jobs:
            self.retire(f"recycled after {jobs_ended} jobs (--max-jobs-per-child {self.max_jobs})")
            return True
        if self.max_memory_mb and time.monotonic() - self._rss_at >= RSS_EVERY_S:
            self._rss_at = time.monotonic()
            rss = resident_mb()
            if rss > self.max_memory_mb:
                self.retire(f"recycled at {rss:.0f} MiB resident (--max-memory-per-child {self.max_memory_mb})")
                return True
        return False
