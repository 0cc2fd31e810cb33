"""pyqueue: an atomic job queue on Redis. Every state transition is one Lua script in
``lua/``; this package is a thin typed driver over them, in two transports over one
I/O-free core (:mod:`pyqueue.protocol.core`), plus the workers.

Most code starts with :class:`Tasks` (the task layer, :mod:`pyqueue.tasks`): named
functions sent by name and run by ``pyqueue worker module:tasks``. Under it, the engine:
:class:`Queue` (blocking) or :class:`pyqueue.aio.AsyncQueue` (asyncio); workers:
:class:`pyqueue.worker.Worker`, :class:`pyqueue.worker.aio.AsyncWorker`. Delivery
semantics are stated in :mod:`pyqueue.drivers.queue`.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from pyqueue.protocol.version import VERSION as __version__

from pyqueue.protocol.errors import (
    AuthenticationFailed,
    ContractMismatch,
    CorruptRecord,
    InvalidArgument,
    LeaseLost,
    NotReplicated,
    OutcomeUnknown,
    OutOfMemory,
    PayloadTooLarge,
    PermissionDenied,
    PyQueueError,
    QueueFull,
    ScriptError,
    ScriptNotLoaded,
    ServiceError,
    ServiceExists,
    ServiceLost,
    SignalTimeout,
    TLSError,
    WrongTypeError,
)
from pyqueue.protocol.keys import QueueKeys
from pyqueue.protocol.models import (
    CancelFlag,
    Cancelled,
    DeadJob,
    DeadPage,
    Enqueued,
    Extended,
    GroupInfo,
    GroupsPage,
    Job,
    JobEntry,
    JobInfo,
    JobPage,
    SearchPage,
    JobResult,
    Leased,
    Nacked,
    NewJob,
    RateLimit,
    Outcome,
    Peeked,
    Promoted,
    Result,
    Stats,
)
from pyqueue.drivers.clients import connect, default_client, embedded_redis
from pyqueue.drivers.queue import Queue
from pyqueue.protocol.verbs.events import Event, EventPage, EventsSetting
from pyqueue.worker.slots import TimeLimitExceeded
from pyqueue.worker import Fail, Retry, Worker

if _TYPE_CHECKING:
    from pyqueue.tasks import (
        Backoff,
        FlowHandle,
        Middleware,
        MiddlewareError,
        ResultTimeout,
        TaskDead,
        TaskResultMissing,
        Tasks,
        chain,
        chord,
        current_batch,
        current_job,
        group,
    )

#: Names of the task layer, imported on first use: ``import pyqueue`` for the engine
#: alone does not load it (the engine never imports the task layer).
_TASK_LAYER = (
    "Backoff", "FlowHandle", "Middleware", "MiddlewareError", "ResultTimeout", "TaskDead", "TaskResultMissing", "Tasks",
    "chain", "chord", "current_batch", "current_job", "group",
)


def __getattr__(name: str) -> _Any:
    if name in _TASK_LAYER:
        import pyqueue.tasks

        return getattr(pyqueue.tasks, name)
    raise AttributeError(f"module 'pyqueue' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TASK_LAYER))


__all__ = [
    "__version__",
    "AuthenticationFailed",
    "Backoff",
    "CancelFlag",
    "Cancelled",
    "chain",
    "chord",
    "connect",
    "ContractMismatch",
    "CorruptRecord",
    "current_batch",
    "current_job",
    "DeadJob",
    "DeadPage",
    "default_client",
    "embedded_redis",
    "Enqueued",
    "Event",
    "EventPage",
    "EventsSetting",
    "Extended",
    "Fail",
    "FlowHandle",
    "group",
    "GroupInfo",
    "GroupsPage",
    "InvalidArgument",
    "Job",
    "JobEntry",
    "JobInfo",
    "JobPage",
    "JobResult",
    "Leased",
    "LeaseLost",
    "Middleware",
    "MiddlewareError",
    "Nacked",
    "NewJob",
    "NotReplicated",
    "Outcome",
    "OutcomeUnknown",
    "OutOfMemory",
    "PayloadTooLarge",
    "Peeked",
    "PermissionDenied",
    "Promoted",
    "PyQueueError",
    "Queue",
    "QueueFull",
    "QueueKeys",
    "RateLimit",
    "Result",
    "ResultTimeout",
    "Retry",
    "ScriptError",
    "ScriptNotLoaded",
    "SearchPage",
    "ServiceError",
    "ServiceExists",
    "ServiceLost",
    "SignalTimeout",
    "Stats",
    "TaskDead",
    "TaskResultMissing",
    "Tasks",
    "TimeLimitExceeded",
    "TLSError",
    "Worker",
    "WrongTypeError",
]
