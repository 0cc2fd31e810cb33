"""What every part of a worker waits out rather than stops on: the connection, a cluster
in motion, a server at its memory limit. Anything else a loop catches is a bug."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from pyqueue.protocol.errors import OutcomeUnknown, OutOfMemory, PyQueueError
from pyqueue.drivers.scripts import CLUSTER_WEATHER

log = logging.getLogger("pyqueue.worker")

T = TypeVar("T")

#: Cap of the backoff after connection errors.
MAX_BACKOFF_S = 5.0

#: What the worker's loops catch and test with retryable (anything else is a bug).
RETRY_ON: tuple[type[BaseException], ...] = (*CLUSTER_WEATHER, PyQueueError)


def retryable(exc: BaseException) -> bool:
    """Errors a worker waits out with backoff: the connection, and a server at its memory
    limit (acks still run there and free memory)."""
    return isinstance(exc, (*CLUSTER_WEATHER, OutcomeUnknown, OutOfMemory))


class Retrying:
    """Runs a replay-safe call until it answers, backing off on connection errors (the
    call is sent again with the same arguments: one effect). Gives up once ``hard_stop``
    is set: a worker past its grace period (or killed) no longer waits for Redis."""

    def __init__(self, hard_stop: threading.Event) -> None:
        self.hard_stop = hard_stop

    def __call__(self, call: Callable[[], T]) -> T:
        delay = 0.05
        while True:
            try:
                return call()
            except RETRY_ON as exc:
                if not retryable(exc) or self.hard_stop.is_set():
                    raise
                log.warning("call failed (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
