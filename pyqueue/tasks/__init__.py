"""The task layer: named functions with a policy, sent by name and run by workers.

This layer sits on the engine and adds no transition of its own: every state change is
still one of ``lua/``'s scripts (the engine never imports this package). See
``Tasks`` to start, :mod:`pyqueue.tasks.dispatch` for how a run ends, and
:mod:`pyqueue.tasks.envelope` for the payload other languages read and write.
"""

from pyqueue.worker.slots import TimeLimitExceeded
from pyqueue.tasks.app import Tasks
from pyqueue.tasks.batch import current_batch
from pyqueue.tasks.envelope import Envelope, EnvelopeError
from pyqueue.tasks.flows import FlowHandle, chain, chord, group
from pyqueue.tasks.handle import ResultTimeout, SentTask, TaskDead, TaskError, TaskResultMissing
from pyqueue.tasks.middleware import HookOutcome, Middleware, MiddlewareError, Sending
from pyqueue.tasks.policy import Backoff, SendOptionsDict, TaskOptions, TaskOptionsDict
from pyqueue.tasks.dispatch import Dispatcher, TaskRun, current_job
from pyqueue.tasks.task import BatchOptions, BatchTask, Options, Signature, Task
from pyqueue.worker.worker import Fail, Retry

__all__ = [
    "Backoff",
    "BatchOptions",
    "BatchTask",
    "Dispatcher",
    "Envelope",
    "EnvelopeError",
    "Fail",
    "FlowHandle",
    "HookOutcome",
    "Middleware",
    "MiddlewareError",
    "Options",
    "ResultTimeout",
    "Retry",
    "Sending",
    "SendOptionsDict",
    "SentTask",
    "Signature",
    "Task",
    "TaskDead",
    "TaskError",
    "TaskOptions",
    "TaskOptionsDict",
    "TaskResultMissing",
    "TaskRun",
    "Tasks",
    "TimeLimitExceeded",
    "chain",
    "chord",
    "current_batch",
    "current_job",
    "group",
]
