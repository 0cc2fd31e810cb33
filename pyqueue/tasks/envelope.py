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
  the producer estimates it (its clock plus an offset read with ``TIME``). ``delay_ms``:
  present when it was sent to run later, how much later (``max_age`` counts from then).
  ``opts``:
  per-send policy overrides (``fn.options(...)``), present only when there are any.
  Any other key (``traceparent``, ``tracestate``, a tenant or request id) is kept and
  ignored by the worker: room for trace context and middleware.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.tasks.codec import dumps, loads

if TYPE_CHECKING:
    from pyqueue.protocol.models import Job

VERSION = 1


class EnvelopeError(InvalidArgument):
    """A payload that is not a task envelope this worker can read."""


class NotAnEnvelope(EnvelopeError):
    """A payload that is no task envelope at all (not a JSON object with a ``task``):
    a raw job, which ``Tasks.raw_handler`` may run. An envelope of an unknown version,
    or a malformed one, is an :class:`EnvelopeError` but not this: never run as raw."""


class Envelope:
    """A decoded task envelope. (A plain class with slots: one is made per job.)"""

    __slots__ = ("task", "args", "kwargs", "meta")

    def __init__(self, task: str, args: list[Any], kwargs: dict[str, Any], meta: dict[str, Any]) -> None:
        self.task, self.args, self.kwargs, self.meta = task, args, kwargs, meta

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Envelope) and (self.task, self.args, self.kwargs, self.meta) == (
            other.task, other.args, other.kwargs, other.meta)

    def __repr__(self) -> str:
        return f"Envelope(task={self.task!r}, args={self.args!r}, kwargs={self.kwargs!r}, meta={self.meta!r})"

    @property
    def enqueued_ms(self) -> int | None:
        value = self.meta.get("enqueued_ms")
        return value if type(value) is int else None

    def sent_ms(self, job: Job) -> int | None:
        """When ``job`` (this envelope's job) was sent: this envelope's ``enqueued_ms``
        (section 9.3 of lua/README.md counts ``max_age`` from it, and a producer may set
        it, as a relay keeping a job's first send does), else the engine's record of
        it (the server's clock: a producer that wrote no ``enqueued_ms``)."""
        return self.enqueued_ms if self.enqueued_ms is not None else job.enqueued_ms

    @property
    def delay_ms(self) -> int:
        """How long after ``enqueued_ms`` the job was due (``send_in``, ``send_at``)."""
        value = self.meta.get("delay_ms")
        return value if type(value) is int and value > 0 else 0

    @property
    def opts(self) -> dict[str, Any]:
        value = self.meta.get("opts")
        return value if isinstance(value, dict) else {}


def encode(task: str, args: list[Any], kwargs: dict[str, Any], meta: dict[str, Any]) -> bytes:
    """The payload of a task job; ``args``, ``kwargs`` and ``meta`` are plain JSON data
    already (:func:`pyqueue.tasks.codec.to_json`)."""
    return Encoder(task)(args, kwargs, meta)


class Encoder:
    """:func:`encode` for one task name, the same bytes, faster: the envelope's head is
    encoded once, and each send encodes only its arguments and meta (a send's JSON
    encoding costs more than the rest of its Python)."""

    def __init__(self, task: str) -> None:
        self.head = ('{"v":%d,"task":%s,"args":' % (VERSION, dumps(task))).encode("utf-8")

    def __call__(self, args: list[Any], kwargs: dict[str, Any], meta: dict[str, Any]) -> bytes:
        kwargs_text = dumps(kwargs).encode("utf-8") if kwargs else b"{}"
        if len(meta) == 1 and type(meta.get("enqueued_ms")) is int:  # the usual meta
            meta_text = b'{"enqueued_ms":%d}' % meta["enqueued_ms"]
        else:
            meta_text = dumps(meta).encode("utf-8")
        return b"".join((self.head, dumps(args).encode("utf-8"), b',"kwargs":', kwargs_text, b',"meta":', meta_text, b"}"))


def decode(payload: bytes) -> Envelope:
    """A payload as an :class:`Envelope`.

    Raises:
        EnvelopeError: not JSON, not an object, an unknown version, or fields of the
            wrong type (a raw job in a task queue, or a producer of a newer version).
    """
    try:
        obj = loads(payload)
    except InvalidArgument as exc:  # JSON, with a tagged value this worker cannot read
        raise EnvelopeError(f"task envelope with a value this worker cannot read: {exc}") from None
    except ValueError as exc:
        raise NotAnEnvelope(f"not a task envelope: {exc}") from None
    if not isinstance(obj, dict) or "task" not in obj:
        raise NotAnEnvelope("not a task envelope: a JSON object with 'v' and 'task' is expected")
    version = obj.get("v")
    if type(version) is not int or version != VERSION:  # true and 1.0 are not 1
        raise EnvelopeError(f"task envelope version {obj.get('v')!r} is not known to this worker (it reads {VERSION})")
    task, args, kwargs, meta = obj["task"], obj.get("args", []), obj.get("kwargs", {}), obj.get("meta", {})
    if not isinstance(task, str) or not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(
        meta, dict
    ):
        raise EnvelopeError("malformed task envelope: task must be a string, args a list, kwargs and meta objects")
    return Envelope(task, args, kwargs, meta)
