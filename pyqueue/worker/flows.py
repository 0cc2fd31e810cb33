"""Flow checks: the heartbeat's safety net for jobs that wait for others (flow_wait.lua).

The worker that acks a job another waits for reports it at once (``flow_done``). If that
worker died between its ack and its report, or the job ended in a way no worker
reports (dead by lease expiry or scrub, cancelled, purged), the waiting job's check
comes due (``fwait``); each worker, on its renewal tick, reads the due checks of the
queues it serves, reads the state of every job they still wait for (``result``), and
reports those that ended: 'ok' with a kept result, 'failed' when dead, ended without a
result, or unknown. A report counts once whoever sends it, so two workers checking the
same job, or a check racing the acking worker's report, release it exactly once.

Checks report under the policy 'continue': a waiting job is released once everything
it waits for has ended, and the task layer then reads how each ended (under 'fail' it
fails there). Only the fast report, which knows the flow's policy, releases a job early
on a failure. A queue without flows costs one read per tick here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pyqueue.drivers.queue import Queue
from pyqueue.protocol.verbs.flows import DEFAULT_FLOW_CHECK_MS

log = logging.getLogger("pyqueue.worker")

#: Waiting jobs checked per queue and tick, at most (the rest at the next tick).
CHECKS_PER_TICK = 100
#: The result states of a job that has ended, and how a check reports them.
ENDINGS = {"ok": "ok", "dead": "failed", "done": "failed", "unknown": "failed"}


class FlowChecks:
    """The flow checks of one worker's queues (see the module docstring).

    Args:
        queues: the physical queues the worker serves (their waiting jobs).
        reader: a queue object for a physical queue name, on the worker's client (the
            jobs waited for may be in queues this worker does not serve).
    """

    def __init__(self, queues: Sequence[Queue], reader: Callable[[str], Queue], check_ms: int = DEFAULT_FLOW_CHECK_MS) -> None:
        self.queues = list(queues)
        self.reader = reader
        self.check_ms = check_ms
        self._readers: dict[str, Queue] = {q.name: q for q in queues}

    def check(self) -> int:
        """Run the checks due now; returns how many waiting jobs they released."""
        released = 0
        for q in self.queues:
            for waiting in q.flow_due(CHECKS_PER_TICK):
                ended = []
                for queue, ref in waiting.waits_for:
                    reader = self._readers.get(queue)
                    if reader is None:
                        reader = self._readers[queue] = self.reader(queue)
                    how = ENDINGS.get(reader.result(ref).state)
                    if how is not None:
                        ended.append((queue, ref, how))
                done = q.flow_done(waiting.id, ended, policy="continue", check_ms=self.check_ms)
                if done.counted:
                    log.info("flow check: job %s had %d ended job(s) nobody reported%s", waiting.id, done.counted,
                             "; released" if done.state == "released" else "")
                released += done.state == "released"
        return released
