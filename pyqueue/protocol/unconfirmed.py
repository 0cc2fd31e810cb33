"""Acks whose answer was lost to ``WAIT``: what a queue object remembers so that the
re-sent ack answers what the first send did.

With ``wait_replicas``, an ack that ran on the primary but that too few replicas
confirmed raises :class:`~pyqueue.protocol.errors.NotReplicated`; the caller sends it again
(replay-safe). If the replica the re-send reaches had received the first send (it was
promoted, or it confirmed late), the job is already gone there, and ack.lua answers
GONE: the answer the script gives to any replay. Yet this lease did complete the job,
once. So each queue object remembers the receipts that such a send acked (answered OK),
and a later ack of the same receipt that finds the job GONE answers OK, and forgets it.
A re-send that finds the lease current acks it (OK: the first send was lost with the old
primary); one that finds it STALE reports STALE (it was reclaimed: the job may run
again). No I/O here: both drivers' plans use it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pyqueue.protocol.models import Outcome

#: Receipts remembered at most (the oldest are forgotten first). A worker re-sends an
#: ack at once, so only the acks of the last few calls are ever looked up.
MAX_REMEMBERED = 10_000


class UnconfirmedAcks:
    """Receipts acked by sends whose replies were lost to NotReplicated. Thread-safe."""

    def __init__(self) -> None:
        self._receipts: dict[str, None] = {}  # insertion-ordered: the oldest first
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._receipts)

    def note(self, receipts: Sequence[str], outcomes: Sequence[Outcome]) -> None:
        """The send of ``receipts`` answered ``outcomes`` and raised NotReplicated."""
        with self._lock:
            for receipt, outcome in zip(receipts, outcomes):
                if outcome is Outcome.OK:
                    self._receipts[receipt] = None
            while len(self._receipts) > MAX_REMEMBERED:
                del self._receipts[next(iter(self._receipts))]

    def resolve(self, receipts: Sequence[str], outcomes: list[Outcome]) -> list[Outcome]:
        """``outcomes`` of an ack of ``receipts`` that answered, with GONE read as OK for
        a receipt an unconfirmed send acked. Every receipt answered is forgotten."""
        resolved = []
        with self._lock:
            for receipt, outcome in zip(receipts, outcomes):
                acked_before = receipt in self._receipts
                self._receipts.pop(receipt, None)
                resolved.append(Outcome.OK if acked_before and outcome is Outcome.GONE else outcome)
        return resolved
