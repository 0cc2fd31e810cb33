"""What every group of a queue's verbs uses of the queue object: its settings, and the
call every verb makes through (``_run``: the partition-count guard around the first
call). :class:`pyqueue.drivers.queue.QueueCore` sets and defines them."""

from __future__ import annotations

from typing import Any

from pyqueue.protocol.core import Plan, Step
from pyqueue.protocol.keys import QueueKeys
from pyqueue.protocol.unconfirmed import UnconfirmedAcks


class QueueVerbs:
    """The base of the verb groups a queue is made of (see :mod:`pyqueue.protocol.verbs`)."""

    #: The queue name, its keys, and who holds the leases this object takes.
    name: str
    keys: QueueKeys
    owner: str
    #: Settings (see :class:`pyqueue.drivers.queue.QueueCore`).
    keep_done_ms: int
    max_payload_bytes: int
    partitions: int
    #: Acks that ran but that too few replicas confirmed (see :mod:`pyqueue.protocol.unconfirmed`).
    _unconfirmed: UnconfirmedAcks

    def _run(self, step: Step) -> Plan[Any]:
        """One call of this queue (defined by QueueCore)."""
        raise NotImplementedError
