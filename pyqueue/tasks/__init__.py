"""The task layer: named functions with a policy, sent by name and run by workers.

This layer sits on the engine and adds no transition of its own: every state change is
still one of ``lua/``'s scripts (the engine never imports this package). See
``Tasks`` to start, :mod:`pyqueue.tasks.dispatch` for how a run ends, and
:mod:`pyqueue.tasks.envelope` for the payload other languages read and write.

Its modules are floors: each imports only the ones listed before it (counting imports
under TYPE_CHECKING and inside functions). Where a lower module needs something of a
higher one (of ``Tasks``, of a ``Task``, of the dispatcher) it declares what in a small
``typing.Protocol``. Bottom to top:

1. ``codec``: the JSON that arguments and results travel as.
2. ``envelope``: the payload of a task job, as every language reads and writes it.
3. ``policy``: task options (``TaskOptions``, ``Backoff``), their defaults and checks.
4. ``connection``: a Tasks object's clients, queues and server clock.
5. ``flowview``: a flow's record read back and shown (CLI, dashboard).
6. ``census``: which tasks the registered workers serve (CLI, dashboard).
7. ``handle``: what a send returns (``SentTask``) and the errors of reading a result.
8. ``run``: the running job (``TaskRun``, ``current_job``, ``current_batch``).
9. ``middleware``: the hooks around sends and runs, and their chains.
10. ``flows``: a task call (``Signature``) and chains, groups and chords of calls: sent,
    watched (``FlowHandle``) and continued by workers.
11. ``sending``: the send path (``send_many``, ``asend``) through the send hooks.
12. ``task``: a registered function and its send verbs (``Task``, ``BatchTask``).
13. ``telemetry``: the Prometheus middleware (``TaskMetrics``).
14. ``batch``: running a batch task's batch.
15. ``dispatch``: the worker's handler (``Dispatcher``): a job to its task, an ending
    to its transition.
16. ``serving``: a Tasks object's dispatcher and workers, run between their hooks.
17. ``testing``: ``tasks.testing()``, an isolated server and ``drain``.
18. ``app``: ``Tasks``, the registry.
19. ``pytest_plugin``: the ``pyqueue_testing`` fixture.
"""

from pyqueue.worker.slots import TimeLimitExceeded
from pyqueue.tasks.app import Tasks
from pyqueue.tasks.envelope import Envelope, EnvelopeError
from pyqueue.tasks.flows import FlowHandle, Signature, chain, chord, group
from pyqueue.tasks.handle import ResultTimeout, SentTask, TaskDead, TaskError, TaskResultMissing
from pyqueue.tasks.middleware import HookOutcome, Middleware, MiddlewareError, Sending
from pyqueue.tasks.policy import Backoff, SendOptionsDict, TaskOptions, TaskOptionsDict
from pyqueue.tasks.dispatch import Dispatcher
from pyqueue.tasks.run import TaskRun, current_batch, current_job
from pyqueue.tasks.task import BatchOptions, BatchTask, Options, Task
from pyqueue.worker import Fail, Retry

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
