"""The dashboard's view of a flow (a chain, group or chord of tasks, README "Flows"):
its tree and each step's state, found by the flow's id in the queue of its first step.

It reads what ``pyqueue flow show`` reads (:func:`pyqueue.tasks.flowview.show_flow`):
the flow's record (lua/flow_show.lua, read-only) and one ``Queue.get`` per step. A
flow's steps are few and chosen by a person, so a view costs one call per step; the
page asks only when its Show button is pressed, never at a poll.

No web framework here, so these rules read, and are tested, on their own.
"""

from __future__ import annotations

from typing import Any

from pyqueue.drivers.clients import Client
from pyqueue.protocol.core import MAX_ID_BYTES, check_job_id
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.drivers.queue import Queue
from pyqueue.tasks.flowview import show_flow


def check_flow_id(value: str) -> str:
    """``value`` if it may be a flow's id (a flow's id is checked as a job id is).

    Raises:
        InvalidArgument: it is not, in words that name a flow rather than a job.
    """
    try:
        return check_job_id(value)
    except InvalidArgument:
        raise InvalidArgument(
            f"a flow id is 1..{MAX_ID_BYTES} bytes of UTF-8 without control characters, got {value!r}"
        ) from None


def flow_page(client: Client, queue: Queue, flow_id: str, *, prefix: str, text_limit: int) -> dict[str, Any] | None:
    """The flow ``flow_id`` whose record is in ``queue`` (a logical queue: a partitioned
    one finds the record in the partition of the flow's id), or None when no record of it
    is kept there (never sent from it, or expired).

    :meth:`pyqueue.tasks.flowview.FlowView.as_json`, the fields of ``pyqueue flow show
    --json``, with ``error`` and ``describe`` clipped to ``text_limit`` characters.

    Raises:
        InvalidArgument: ``flow_id`` cannot be a flow's id.
        CorruptRecord: the record is not one this version reads.
    """
    check_flow_id(flow_id)
    view = show_flow(client, queue, flow_id, prefix=prefix)
    if view is None:
        return None
    return view.as_json(text_limit)
