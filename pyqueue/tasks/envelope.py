"""The task envelope: what a task job's payload is, in every language.

One JSON object (UTF-8), documented in ``lua/README.md`` beside the scripts::

    {"v": 1, "task": "billing.charge", "args": [42], "kwargs": {"cents": 500},
     "meta": {"enqueued_ms": 1764120000123}}

* ``v``: the envelope version, 1. A worker refuses (retries, then dead-letters) a
  version it does not know, so a newer producer never has its jobs run wrongly.
* ``task``: the task's registered name.
* ``args`` / ``kwargs``: the call's arguments, JSON with pyqueue's tagged extra types
  (:mod:`pyqueue.tasks.codec`).
* ``meta``: an object. ``enqueued_ms``: when it was sent, on the Redis server's clock as
  the producer estimates it (its clock plus an offset read with ``TIME``). ``opts``:
  per-send policy overrides (``fn.options(...)``), present only when there are any.
  Any other key (``traceparent``, ``tracestate``, a tenant or request id) is kept and
  ignored by the worker: room for trace context and middleware.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyqueue.errors import InvalidArgument
from pyqueue.tasks.codec import dumps, untag

VERSION = 1


class EnvelopeError(InvalidArgument):
    """A payload that is not a task envelope this worker can read."""


@dataclass(frozen=True)
class Envelope:
    """A decoded task envelope."""

    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def enqueued_ms(self) -> int | None:
        value = self.meta.get("enqueued_ms")
        return value if type(value) is int else None

    @property
    def opts(self) -> dict[str, Any]:
        value = self.meta.get("opts")
        return value if isinstance(value, dict) else {}


def encode(task: str, args: list[Any], kwargs: dict[str, Any], meta: dict[str, Any]) -> bytes:
    """The payload of a task job; ``args``, ``kwargs`` and ``meta`` are plain JSON data
    already (:func:`pyqueue.tasks.codec.to_json`)."""
    return dumps({"v": VERSION, "task": task, "args": args, "kwargs": kwargs, "meta": meta}).encode("utf-8")


def decode(payload: bytes) -> Envelope:
    """A payload as an :class:`Envelope`.

    Raises:
        EnvelopeError: not JSON, not an object, an unknown version, or fields of the
            wrong type (a raw job in a task queue, or a producer of a newer version).
    """
    try:
        obj = json.loads(payload, object_hook=untag)
    except (ValueError, InvalidArgument) as exc:
        raise EnvelopeError(f"not a task envelope: {exc}") from None
    if not isinstance(obj, dict) or "task" not in obj:
        raise EnvelopeError("not a task envelope: a JSON object with 'v' and 'task' is expected")
    if obj.get("v") != VERSION:
        raise EnvelopeError(f"task envelope version {obj.get('v')!r} is not known to this worker (it reads {VERSION})")
    task, args, kwargs, meta = obj["task"], obj.get("args", []), obj.get("kwargs", {}), obj.get("meta", {})
    if not isinstance(task, str) or not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(
        meta, dict
    ):
        raise EnvelopeError("malformed task envelope: task must be a string, args a list, kwargs and meta objects")
    return Envelope(task, args, kwargs, meta)
