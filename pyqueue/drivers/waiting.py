"""Blocking until there is work: waiting on wake markers, on one server or across the
slots of a Redis Cluster, without polling.

A wake marker is a zset (``<prefix>:{<queue>}:wake``, or a service's private
``<prefix>:{<ns>}:service:<id>:wake``) that scripts raise with ``ZADD``; a waiting worker
pops it with ``BZPOPMIN``. One ``BZPOPMIN`` may name several keys only if they share a
slot, so :class:`Waiter` groups the keys by slot: one group on one server (all keys,
in priority order), one group per slot on a cluster.

Each group has a thread of its own that sends the group's ``BZPOPMIN``; the waiting
thread (the fetch loop) waits on a condition for the first marker of any group. So:

* the groups are waited on together, and the first marker ends the wait;
* a stop ends the wait at once, locally (:meth:`Waiter.interrupt`), without writing to
  Redis (after a lost registration, the service's own wake key may be another's);
* the group threads block only while the fetch loop waits, so a busy worker never
  takes a marker meant for an idle one; a marker popped after the wait ended (a
  thread still blocked from an earlier, longer wait) is handed back with ``ZADD``, so
  no wake-up is lost.

Idle cost: one ``BZPOPMIN`` per group per block period. Wake-up cost: one hand-over
between threads (tens of microseconds).

Threads: :meth:`Waiter.wait` is called by one thread (the fetch loop); the group
threads are the waiter's own. All blocking waits use one client whose socket timeout
outlasts the longest wait (:func:`~pyqueue.drivers.clients.blocking_twin`).
"""

from __future__ import annotations

import logging
import queue as queue_lib
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis as redis_lib
from redis.crc import key_slot

from pyqueue.drivers.clients import Client, blocking_twin, disconnect, is_cluster

log = logging.getLogger("pyqueue.worker")

#: A group thread that failed (a lost node) waits this long before it may block again,
#: so a cluster in trouble is not hammered by one worker's waits.
ERROR_PAUSE_S = 0.5


def slot_groups(client: Client, keys: Sequence[str]) -> list[list[str]]:
    """``keys`` split into groups that one ``BZPOPMIN`` may name together: all of them
    on one server; by slot on a cluster. Groups and keys keep the given (priority)
    order."""
    if not is_cluster(client):
        return [list(keys)]
    groups: dict[int, list[str]] = {}
    for key in keys:
        groups.setdefault(key_slot(key.encode()), []).append(key)
    return list(groups.values())


class Waiter:
    """Waits until one of ``keys`` holds a marker, or a timeout; see the module
    docstring. ``socket_timeout_s`` must exceed the longest wait."""

    def __init__(self, client: Client, keys: Sequence[str], socket_timeout_s: float) -> None:
        self.groups = slot_groups(client, keys)
        self._blocker = blocking_twin(client, socket_timeout_s)
        self._cond = threading.Condition()
        self._waiting = False
        self._deadline = 0.0  # monotonic end of the current wait
        self._interrupted = False
        self._popped: list[str] = []
        self._in_flight: set[int] = set()
        self._closed = False
        self._requests: list[queue_lib.SimpleQueue[float | None]] = []
        self._threads: list[threading.Thread] = []
        for index in range(len(self.groups)):
            self._requests.append(queue_lib.SimpleQueue())
            thread = threading.Thread(target=self._serve, args=(index,), name=f"pyqueue-wait-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wait(self, timeout_ms: int) -> str | None:
        """Block until a marker is popped (return its key) or ``timeout_ms`` passes
        (return None). ``timeout_ms`` must be >= 1: a ``BZPOPMIN`` timeout of 0 would
        block until a marker arrives, possibly forever.

        A wait that fails on the server (a lost connection) is logged by its group
        thread and ends at its timeout; the caller's next call finds the error.
        """
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1, got {timeout_ms}")
        deadline = time.monotonic() + timeout_ms / 1000
        with self._cond:
            self._waiting, self._deadline = True, deadline
            for index, requests in enumerate(self._requests):
                if index not in self._in_flight:  # one still blocked from an earlier wait serves this one too
                    self._in_flight.add(index)
                    requests.put(timeout_ms / 1000)
            while not self._popped and not self._closed and not self._interrupted:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._waiting, self._interrupted = False, False
            keys, self._popped = self._popped, []
        return keys[0] if keys else None

    def _serve(self, index: int) -> None:
        keys = self.groups[index]
        while True:
            timeout_s = self._requests[index].get()
            if timeout_s is None:
                return
            while True:
                popped: Any = None
                try:
                    popped = self._blocker.bzpopmin(keys, timeout_s)
                except Exception as exc:  # RedisError, and RedisClusterException (not one)
                    if self._closed:
                        return  # close() cut the connection under the blocked call
                    log.warning("waiting on %s: %s", keys[0], exc)
                    time.sleep(ERROR_PAUSE_S)
                with self._cond:
                    # A wait started for an earlier, shorter wait ran out while a later
                    # one still waits: keep watching this group until that one ends.
                    remaining = self._deadline - time.monotonic()
                    if popped is None and self._waiting and not self._closed and remaining > 0.001:
                        timeout_s = remaining
                        continue
                    self._in_flight.discard(index)
                    late = popped is not None and not self._waiting
                    if popped is not None and not late:
                        self._popped.append(bytes(popped[0]).decode())
                        self._cond.notify_all()
                break
            if late and popped is not None and not self._closed:
                self._hand_back(bytes(popped[0]).decode(), bytes(popped[1]), float(popped[2]))

    def _hand_back(self, key: str, member: bytes, score: float) -> None:
        """Raise a marker again that was popped when nobody here waited for it, so the
        worker it was meant for (another idle one, or this one at its next wait) wakes."""
        try:
            self._blocker.zadd(key, {member: score})
        except redis_lib.RedisError as exc:
            log.warning("could not hand back the wake marker of %s: %s", key, exc)

    def interrupt(self) -> None:
        """End the current wait, or the next one if none runs, at once and without
        writing to Redis (thread-safe)."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the group threads (a thread blocked in BZPOPMIN ends when its wait
        does, at most one block period later: it is a daemon) and close the client."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for requests in self._requests:
            requests.put(None)
        try:
            # Cuts a wait still blocked on the server; fakeredis cannot close a connection
            # under a blocked call from another thread: that thread then ends with its
            # wait, at most one block period later (it is a daemon).
            disconnect(self._blocker)
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.debug("closing the blocking connections: %s", exc)
