"""pyqueue: an atomic job queue on Redis. Every state transition is one Lua script in
``lua/``; this package is a thin typed driver over them, in two transports over one
I/O-free core (:mod:`pyqueue.core`), plus the workers.

Start with :class:`Queue` (blocking) or :class:`pyqueue.aio.AsyncQueue` (asyncio);
workers: :class:`pyqueue.worker.Worker`, :class:`pyqueue.aio_worker.AsyncWorker`.
Delivery semantics are stated in :mod:`pyqueue.queue`.
"""

from importlib.metadata import PackageNotFoundError, version

from pyqueue.errors import (
    CorruptRecord,
    InvalidArgument,
    NotReplicated,
    OutcomeUnknown,
    OutOfMemory,
    PermissionDenied,
    PyQueueError,
    ScriptError,
    ServiceError,
    ServiceExists,
    ServiceLost,
    WrongTypeError,
)
from pyqueue.keys import QueueKeys
from pyqueue.models import (
    Cancelled,
    DeadJob,
    DeadPage,
    Enqueued,
    Extended,
    Job,
    JobInfo,
    JobResult,
    Leased,
    Nacked,
    NewJob,
    Outcome,
    Peeked,
    Promoted,
    Result,
    Stats,
)
from pyqueue.clients import connect, default_client, embedded_redis
from pyqueue.queue import Queue

try:
    __version__ = version("pyqueue")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Cancelled",
    "CorruptRecord",
    "DeadJob",
    "DeadPage",
    "Enqueued",
    "Extended",
    "InvalidArgument",
    "Job",
    "JobInfo",
    "JobResult",
    "Leased",
    "Nacked",
    "NewJob",
    "NotReplicated",
    "OutOfMemory",
    "Outcome",
    "OutcomeUnknown",
    "Peeked",
    "PermissionDenied",
    "Promoted",
    "PyQueueError",
    "Queue",
    "QueueKeys",
    "Result",
    "ScriptError",
    "ServiceError",
    "ServiceExists",
    "ServiceLost",
    "Stats",
    "WrongTypeError",
    "__version__",
    "connect",
    "default_client",
    "embedded_redis",
]
