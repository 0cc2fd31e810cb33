"""The queue a running task job writes to, besides its ack: its progress
(``current_job().progress``) and its durable steps (:mod:`pyqueue.tasks.steps`). It is
the job's physical queue (a partition's own name, for a partitioned queue), on the Tasks
object's blocking or asyncio client."""

from __future__ import annotations

from typing import Any

from pyqueue.drivers.facade import client_of, physical
from pyqueue.protocol.errors import InvalidArgument


#: Per (Tasks object, physical queue, driver): the queue object a run reports progress
#: and commits durable steps through (one per queue, not one per call).
_run_queues: dict[tuple[int, str, bool], Any] = {}


class ClientUnavailable(InvalidArgument):
    """The Tasks object cannot make the asyncio client a run's writes would be sent on."""


def run_queue(app: Any, queue: str, use_asyncio: bool = False) -> Any:
    """The queue object of the physical queue ``queue`` (a partition's own name for a
    partitioned queue) on ``app``'s blocking or asyncio client.

    Raises:
        ClientUnavailable: ``use_asyncio``, and ``app`` has no asyncio client to give.
    """
    if app is None:
        raise InvalidArgument("progress and durable steps are written by a task run by a worker (current_job())")
    key = (id(app), queue, use_asyncio)
    found = _run_queues.get(key)
    if use_asyncio:
        try:
            client = app.connection.aredis
        except InvalidArgument as exc:
            raise ClientUnavailable(str(exc)) from None
    else:
        client = app.redis
    if found is None or client_of(found) is not client:
        from pyqueue.aio import AsyncQueue
        from pyqueue.drivers.queue import Queue

        # the physical queue, named by the job itself
        found = physical((AsyncQueue if use_asyncio else Queue)(queue, client, prefix=app.prefix))
        _run_queues[key] = found
    return found
