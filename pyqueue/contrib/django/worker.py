"""What ``manage.py pyqueue_worker`` runs: a pyqueue worker of one Django task backend's
tasks, each job between ``close_old_connections`` calls."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from django.db import close_old_connections
from django.utils.module_loading import autodiscover_modules

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.tasks import HookOutcome, Middleware, Tasks, TaskRun


class CloseOldConnections(Middleware):
    """Around each run: ``django.db.close_old_connections()`` before and after, as
    Django's request signals do around a request, so a run never starts on a database
    connection past its ``CONN_MAX_AGE`` or left broken by the run before, and a
    connection the run opened is closed (or kept, with ``CONN_MAX_AGE``) after it."""

    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        close_old_connections()
        try:
            yield
        finally:  # also when the worker closes the hook without an outcome
            close_old_connections()


def worker_tasks(alias: str = "default", modules: Sequence[str] = ()) -> tuple[Tasks, list[str]]:
    """The pyqueue Tasks of Django task backend ``alias``, ready to serve, and the
    backend's ``QUEUES`` (sorted): every
    installed app's ``tasks`` module imported, then ``modules`` (so their Django tasks
    are registered), with :class:`CloseOldConnections` as its run middleware.

    Raises:
        InvalidArgument: the backend is not a ``PyQueueBackend``, or has no tasks.
        ImproperlyConfigured: its settings are wrong.
    """
    import importlib

    from pyqueue.contrib.django.backend import PyQueueBackend, framework

    autodiscover_modules("tasks")
    for module in modules:
        importlib.import_module(module)
    backend: Any = importlib.import_module(framework().name).task_backends[alias]
    if not isinstance(backend, PyQueueBackend):
        raise InvalidArgument(f"TASKS[{alias!r}] is {type(backend).__module__}.{type(backend).__qualname__}, not "
                              "pyqueue.contrib.django.PyQueueBackend")
    tasks = backend.pyqueue()
    if not tasks.tasks:
        raise InvalidArgument(f"TASKS[{alias!r}] has no tasks: define them in an installed app's tasks module, or "
                              "name their modules with --module")
    if not any(isinstance(m, CloseOldConnections) for m in tasks._middleware):
        tasks.middleware(CloseOldConnections())
    return tasks, sorted(backend.queues)
