"""Batching for threads: the members of :class:`pyqueue.protocol.core.Batching` are threads
that wait on events. Used by group commit (:mod:`pyqueue.worker.commit`) and by coalesced
enqueues (:class:`pyqueue.drivers.scripts.Scripts`); the asyncio counterpart is in
:mod:`pyqueue.aio`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from pyqueue.protocol.core import MAX_BATCH, Batching

I = TypeVar("I")
R = TypeVar("R")


class _Member(Generic[I, R]):
    """One submitted item and what its call answers it. A member that has to wait (a
    lone caller, the common case, never does) waits on ``woken``: a lock made held, which
    whoever wakes it releases once. A lock rather than a ``threading.Event``: making an
    Event (a condition and its lock, in Python) and setting it cost several times more,
    once per job of a busy worker."""

    __slots__ = ("item", "woken", "lead", "result", "error")

    def __init__(self, item: I) -> None:
        self.item = item
        self.woken: threading.Lock | None = None
        self.lead = False  # woken to send the next call rather than with an answer
        self.result: R | None = None
        self.error: BaseException | None = None


class ThreadBatcher(Generic[I, R]):
    """Items submitted by threads at about the same time share calls of ``send``.

    ``send`` takes a batch of items and returns one result per item, in order, or
    raises (then every item of the batch gets that error). ``weigh`` and ``limit``
    bound a batch (default: at most 1000 items). Thread-safe."""

    def __init__(
        self,
        send: Callable[[list[I]], list[R]],
        weigh: Callable[[I], int] = lambda item: 1,
        limit: int = MAX_BATCH,
    ) -> None:
        self._send_batch, self._weigh, self._limit = send, weigh, limit
        self._lock = threading.Lock()
        #: Who leads; also counts the calls sent and the items they carried.
        self.state: Batching[_Member[I, R]] = Batching()

    def submit(self, item: I) -> R:
        """Send ``item`` in the next call (now, if none is in flight); its result.

        Raises:
            what ``send`` raised for the batch that carried it.
        """
        me: _Member[I, R] = _Member(item)
        with self._lock:
            lead = self.state.join(me)
            if not lead:
                me.woken = threading.Lock()
                me.woken.acquire()
        if me.woken is not None:
            me.woken.acquire()  # until _send releases it: an answer, or the lead
            # Woken once: as the new leader it is in the batch it sends itself, whose
            # members _send wakes, and it must not be released twice.
            me.woken = None
        if lead or me.lead:
            self._send()
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]  # set with the batch's results

    def _send(self) -> None:
        with self._lock:
            batch = self.state.take(lambda m: self._weigh(m.item), self._limit)
        try:
            for member, result in zip(batch, self._send_batch([m.item for m in batch])):
                member.result = result
        except BaseException as exc:  # each member raises it in its own thread
            for member in batch:
                member.error = exc
        with self._lock:
            leader = self.state.hand_over()
        if leader is not None:
            leader.lead = True
            assert leader.woken is not None  # it joined while a call was in flight
            leader.woken.release()
        for member in batch:
            if member.woken is not None:
                member.woken.release()
