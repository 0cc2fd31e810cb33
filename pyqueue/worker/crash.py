"""Named crash points for fault-injection tests (tests/test_crash.py, the crash harness).

With PYQUEUE_CRASH_POINT=<name> (or several, comma-separated) and
PYQUEUE_CRASH_PROBABILITY=<p> (default 1), the worker SIGKILLs itself at that point with
probability p. Unset in production: one set lookup per point.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from typing import Any

from pyqueue.drivers.clients import node_for_key
from pyqueue.protocol.core import ack_call
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import Job
from pyqueue.drivers.queue import Queue, transport_of
from pyqueue.drivers.scripts import lua_source

log = logging.getLogger("pyqueue.worker")

CRASH_POINTS = (
    "after_register",  # right after registration
    "after_lease",  # after a lease reply arrived, before any handler ran
    "in_handler",  # while the handler runs
    "before_ack",  # after the handler returned, before the ack is sent
    "ack_sent",  # after the ack was sent, before its reply was read
    "in_extend",  # during a lease extension
)
#: Points only a task worker passes (the flow crash harness, tests/flow_crash.py).
TASK_CRASH_POINTS = (
    "before_report",  # after an ack or dead-nack answered OK, before the handler's job_ended hook
)


class Crasher:
    """Kills this process at named points when the environment asks for it (tests)."""

    def __init__(self) -> None:
        self.points = {p for p in os.environ.get("PYQUEUE_CRASH_POINT", "").split(",") if p}
        unknown = self.points - set(CRASH_POINTS) - set(TASK_CRASH_POINTS)
        if unknown:
            raise InvalidArgument(f"unknown crash points {sorted(unknown)}; known: {CRASH_POINTS + TASK_CRASH_POINTS}")
        self.probability = float(os.environ.get("PYQUEUE_CRASH_PROBABILITY", "1"))
        self.rng = random.Random()

    def armed(self, point: str) -> bool:
        return point in self.points and self.rng.random() < self.probability

    def at(self, point: str) -> None:
        if self.armed(point):
            self.die(point)

    def die(self, point: str) -> None:
        log.warning("crash point %s: SIGKILL", point)
        os.kill(os.getpid(), signal.SIGKILL)


def send_and_die(queue: Queue, job: Job, crasher: Crasher) -> None:
    """Send lua/ack.lua for ``job`` and die before reading the reply (crash point
    ``ack_sent``): the server may run it, the worker never learns the answer."""
    client = node_for_key(transport_of(queue).client, queue.spec.keys.jobs)
    sha = transport_of(queue).sha("ack")
    client.script_load(lua_source("ack"))  # EVALSHA must not fail with NOSCRIPT
    connection: Any = client.connection_pool.get_connection()
    # The call the worker's ack makes (the contract's keys and ARGV: a call the script
    # refused with PQ_CONTRACT would test nothing), sent, its reply never read.
    call = ack_call(queue.spec.keys, None, queue.spec.keep_done_ms, [job.receipt])
    keys = transport_of(queue).key_list(call.script, call.keys)
    connection.send_command("EVALSHA", sha, len(keys), *keys, *call.args)
    crasher.die("ack_sent")
