"""The ``django.tasks`` backend (see :mod:`pyqueue.contrib.django` for the settings).

One module for both task frameworks: Django's own ``django.tasks`` (Django 6.0 and
later) when it exists, else the ``django_tasks`` backport package (``pip install
django-tasks``, Django 5.x). :func:`framework` picks it once; the backend subclasses that
framework's ``BaseTaskBackend`` and returns its ``TaskResult``.

How a Django task maps onto pyqueue:

* **Name.** Each Django task is registered, when its ``@task`` decorator validates it,
  as a pyqueue task named by its module path (``module.qualname``, the Django task's
  ``module_path``); a worker calls the function by that name.
* **Queue and priority.** ``task.queue_name`` is the pyqueue queue (it must be one of
  ``QUEUES``, as Django checks). ``task.priority`` (-100..100, higher runs sooner) is one
  of pyqueue's 11 levels (-5..5, higher is leased sooner): ``(priority + 10) // 20``, the
  nearest multiple of 20, halves rounded up, divided by 20. Order is kept, but priorities
  of one band (-10..9 all map to 0) run first come, first served.
* **run_after** is a delayed send (``send_at``) on the Redis server's clock; a naive
  datetime (``USE_TZ = False``) is read in the current time zone.
* **Arguments and return values** are JSON, as Django requires: normalized with
  Django's ``normalize_json`` (a tuple becomes a list, bytes UTF-8 text); anything else
  is refused by ``enqueue`` (``ValueError``, nothing is sent) or, returned, fails the
  run. A call that does not fit the function's signature raises ``TypeError`` in
  ``enqueue``, before anything is sent.
* **Results.** The result id is the pyqueue job id. A run that returns keeps, as the
  job's pyqueue result (``keep_result``, a day by default), a record with the return
  value, the task's path, its arguments and the times of the run; ``get_result`` reads
  it, or the job itself while it is queued, running or dead.
* **Failures.** A task that raises is retried with pyqueue's backoff until
  ``max_attempts`` runs (default 1: no retry, as Django's own backends); its last error
  is kept with the dead job. A job that died in another way (a time limit, a lease that
  expired with its worker, after ``max_attempts`` attempts) is FAILED too.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import secrets
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone as dt_timezone
from types import SimpleNamespace
from typing import Any

import redis as redis_lib
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from pyqueue.drivers.clients import client_settings, is_sentinel_url
from pyqueue.protocol.core import MAX_ERROR_BYTES
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import JobInfo, JobResult
from pyqueue.drivers.queue import DEFAULT_PREFIX
from pyqueue.tasks import Retry, Tasks, current_job
from pyqueue.tasks import envelope
from pyqueue.tasks.codec import from_json


@functools.cache
def framework() -> SimpleNamespace:
    """The task framework this process has: ``django.tasks`` (Django 6.0+), else the
    ``django_tasks`` backport. Its names, under the Django 6 spelling (the backport's
    ``InvalidTaskError`` is ``InvalidTask`` here).

    Raises:
        ImportError: neither is installed.
    """
    try:
        base = importlib.import_module("django.tasks.base")
        root = "django.tasks"
        invalid = "InvalidTask"
        normalize = importlib.import_module("django.utils.json").normalize_json
    except ImportError:
        try:
            base = importlib.import_module("django_tasks.base")
        except ImportError:
            raise ImportError(
                "pyqueue.contrib.django needs django.tasks (Django 6.0 or later) or the django-tasks backport "
                "(pip install django-tasks)"
            ) from None
        root = "django_tasks"
        invalid = "InvalidTaskError"
        normalize = importlib.import_module("django_tasks.utils").normalize_json
    exceptions = importlib.import_module(f"{root}.exceptions")
    signals = importlib.import_module(f"{root}.signals")
    return SimpleNamespace(
        name=root,
        BaseTaskBackend=importlib.import_module(f"{root}.backends.base").BaseTaskBackend,
        Task=base.Task,
        TaskResult=base.TaskResult,
        TaskResultStatus=base.TaskResultStatus,
        TaskContext=base.TaskContext,
        TaskError=base.TaskError,
        InvalidTask=getattr(exceptions, invalid),
        TaskResultDoesNotExist=exceptions.TaskResultDoesNotExist,
        normalize_json=normalize,
        task_enqueued=signals.task_enqueued,
        task_started=signals.task_started,
        task_finished=signals.task_finished,
        checks=importlib.import_module(f"{root}.checks"),
    )


_fw = framework()

#: The keys of ``OPTIONS`` (anything else is a system check error).
OPTION_NAMES = ("url", "prefix", "on_commit", "max_attempts", "keep_result", "time_limit")
#: How long a run's result record is kept by default (seconds): a day.
DEFAULT_KEEP_RESULT = 86_400
#: The most of a traceback kept as a dead job's error (the engine takes 64 KiB).
MAX_TRACEBACK_CHARS = 16_000
#: A worker's entry in ``worker_ids``: this host and process.
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
_CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class Settings:
    """A backend's ``OPTIONS``, checked (:func:`read_options`)."""

    url: str
    prefix: str = DEFAULT_PREFIX
    on_commit: bool = True
    max_attempts: int = 1
    keep_result: float = DEFAULT_KEEP_RESULT
    time_limit: float | None = None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a backend's settings, as a system check reports it."""

    id: str
    msg: str
    hint: str | None = None
    warning: bool = False


def read_options(options: object, queues: Iterable[str]) -> tuple[Settings | None, list[Problem]]:
    """A backend's ``OPTIONS`` and ``QUEUES`` as :class:`Settings`, and what is wrong
    with them. Connects to nothing. Settings is None when any problem is an error (not
    a warning)."""
    problems: list[Problem] = []
    if not isinstance(options, Mapping):
        return None, [Problem("pyqueue.E004", f"OPTIONS must be a dict, got {type(options).__name__}")]
    unknown = sorted(str(k) for k in options if k not in OPTION_NAMES)
    if unknown:
        problems.append(Problem("pyqueue.E003", f"unknown OPTIONS {unknown}", f"the options are {', '.join(OPTION_NAMES)}"))
    if not list(queues):
        problems.append(Problem("pyqueue.E005", "QUEUES is empty", "list the queues the tasks use: the worker serves "
                                "them and get_result looks in them"))
    url = options.get("url")
    if url is None:
        problems.append(Problem("pyqueue.E001", "OPTIONS has no 'url'", "the Redis server producers and workers share, "
                                "e.g. \"url\": os.environ[\"PYQUEUE_URL\"] (redis://, rediss://, unix://, "
                                "redis+cluster://, redis+sentinel://)"))
    elif not isinstance(url, str):
        problems.append(Problem("pyqueue.E002", f"OPTIONS 'url' must be a str, got {type(url).__name__}"))
    elif url in ("embedded", "fakeredis://"):
        problems.append(Problem("pyqueue.W001", "OPTIONS 'url' is the embedded server", "each process has its own: "
                                "the web process's tasks never reach a worker process", warning=True))
    else:
        error = _url_error(url)
        if error is not None:
            problems.append(Problem("pyqueue.E002", f"OPTIONS 'url' is invalid: {error}"))
    values: dict[str, Any] = {}
    rules: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
        ("prefix", lambda v: isinstance(v, str) and v != "", "a non-empty str"),
        ("on_commit", lambda v: isinstance(v, bool), "True or False"),
        ("max_attempts", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an int >= 1"),
        ("keep_result", lambda v: _is_seconds(v) and v > 0, "seconds > 0"),
        ("time_limit", lambda v: v is None or (_is_seconds(v) and v > 0), "None or seconds > 0"),
    )
    for key, check, what in rules:
        if key in options:
            if check(options[key]):
                values[key] = options[key]
            else:
                problems.append(Problem("pyqueue.E004", f"OPTIONS {key!r} must be {what}, got {options[key]!r}"))
    if any(not p.warning for p in problems):
        return None, problems
    return Settings(url=str(url), **values), problems


def _is_seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _url_error(url: str) -> str | None:
    """What is wrong with ``url`` without connecting (a cluster is not probed), or None."""
    try:
        parsed, _, _ = client_settings(url, cluster=False)
        if not is_sentinel_url(parsed):
            redis_lib.connection.parse_url(parsed)  # type: ignore[no-untyped-call]
    except (InvalidArgument, ValueError) as exc:
        return str(exc)
    return None


def priority_level(priority: int) -> int:
    """A Django priority (-100..100) as a pyqueue level (-5..5); see the module docstring."""
    return (priority + 10) // 20


# -- the pyqueue side: one Tasks object per backend configuration ---------------------

_lock = threading.Lock()
#: The Django tasks each backend alias validated, by module path (every process).
_known: dict[str, dict[str, Any]] = {}
#: The pyqueue Tasks object of each (alias, Settings), with the paths registered in it.
_apps: dict[tuple[str, Settings], tuple[Tasks, set[str]]] = {}


def _remember(alias: str, task: Any) -> None:
    with _lock:
        _known.setdefault(alias, {}).setdefault(task.module_path, task)


def pyqueue_tasks(alias: str, settings: Settings) -> Tasks:
    """The pyqueue :class:`~pyqueue.Tasks` of backend ``alias`` with ``settings``: one per
    process (Django makes a backend per thread; they share it and its Redis clients),
    with every Django task of that backend validated so far registered under its module
    path."""
    with _lock:
        entry = _apps.get((alias, settings))
        if entry is None:
            entry = _apps[(alias, settings)] = (Tasks(url=settings.url, prefix=settings.prefix), set())
        app, registered = entry
        for path, task in _known.get(alias, {}).items():
            if path not in registered:
                app.task(name=path, queue=task.queue_name, max_attempts=settings.max_attempts,
                         keep_result=settings.keep_result, time_limit=settings.time_limit)(_runner(task, alias))
                registered.add(path)
    return app


def _runner(task: Any, alias: str) -> Callable[..., dict[str, Any]]:
    """What a worker runs for Django task ``task``: calls it (with a ``TaskContext``
    first when it takes one), sends Django's ``task_started`` and ``task_finished``
    signals, and returns the record that ``get_result`` reads. A raised exception
    becomes a :class:`~pyqueue.Retry` whose error text is the exception's class path,
    a newline and its traceback (retried by the backoff, dead at ``max_attempts``)."""

    def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        job = current_job()
        started_ms = _now_ms()
        worker_ids = [""] * (job.attempt - 1) + [WORKER_ID]
        result = _result(task, job.id, _fw.TaskResultStatus.RUNNING, alias, list(args), kwargs, worker_ids,
                         enqueued_ms=job.enqueued_ms, started_ms=started_ms)
        _fw.task_started.send(PyQueueBackend, task_result=result)
        try:
            if task.takes_context:
                value = task.call(_fw.TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = _fw.normalize_json(value)
        except Exception as exc:
            kind = type(exc)
            path = f"{kind.__module__}.{kind.__qualname__}"
            text = "".join(traceback.format_exception(exc))[-MAX_TRACEBACK_CHARS:]
            if job.attempt >= job.max_attempts:  # its last: Django hears it failed
                error = _fw.TaskError(exception_class_path=path, traceback=text)
                failed = _result(task, job.id, _fw.TaskResultStatus.FAILED, alias, list(args), kwargs, worker_ids,
                                 enqueued_ms=job.enqueued_ms, started_ms=started_ms, finished_ms=_now_ms(),
                                 errors=[error])
                _fw.task_finished.send(PyQueueBackend, task_result=failed)
            raise Retry(reason=f"{path}\n{text}"[:MAX_ERROR_BYTES // 4]) from exc
        record = {"return_value": value, "task": task.module_path, "args": list(args), "kwargs": kwargs,
                  "enqueued_ms": job.enqueued_ms, "started_ms": started_ms, "finished_ms": _now_ms(),
                  "attempt": job.attempt, "worker": WORKER_ID}
        done = _record_result(task, job.id, alias, record)
        _fw.task_finished.send(PyQueueBackend, task_result=done)
        return record

    run.__name__ = run.__qualname__ = task.func.__name__
    run.__module__ = task.func.__module__
    return run


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _when(ms: int | None) -> datetime | None:
    """Milliseconds since the epoch as Django shows times: aware UTC with ``USE_TZ``,
    else naive in the current time zone."""
    if ms is None or ms < 0:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=dt_timezone.utc)
    from django.conf import settings

    return moment if settings.USE_TZ else timezone.make_naive(moment)


def _result(
    task: Any, job_id: str, status: Any, alias: str, args: list[Any], kwargs: dict[str, Any], worker_ids: list[str], *,
    enqueued_ms: int | None = None, started_ms: int | None = None, finished_ms: int | None = None,
    errors: list[Any] | None = None,
) -> Any:
    return _fw.TaskResult(
        task=task, id=job_id, status=status, enqueued_at=_when(enqueued_ms), started_at=_when(started_ms),
        finished_at=_when(finished_ms), last_attempted_at=_when(started_ms), args=args, kwargs=kwargs,
        backend=alias, errors=errors or [], worker_ids=worker_ids,
    )


def _record_result(task: Any, job_id: str, alias: str, record: Mapping[str, Any]) -> Any:
    """The SUCCESSFUL TaskResult of a run's record (what :func:`_runner` returns)."""
    attempt = int(record["attempt"])
    result = _result(task, job_id, _fw.TaskResultStatus.SUCCESSFUL, alias, list(record["args"]),
                     dict(record["kwargs"]), [""] * (attempt - 1) + [str(record["worker"])],
                     enqueued_ms=record["enqueued_ms"], started_ms=record["started_ms"],
                     finished_ms=record["finished_ms"])
    object.__setattr__(result, "_return_value", record["return_value"])  # as Django's own backends set it
    return result


def task_error(text: str) -> Any:
    """A dead job's error text as a Django ``TaskError``. The runner writes the class
    path, a newline and the traceback; pyqueue's own errors (a time limit, an expired
    lease, an unknown task) are ``Type: message``, whose type is taken as the class
    (``builtins.`` when it has no module), or ``builtins.Exception`` when there is none.
    The traceback is the text as kept."""
    first, _, rest = text.partition("\n")
    if _CLASS_PATH.fullmatch(first) and rest.startswith("Traceback"):
        return _fw.TaskError(exception_class_path=first, traceback=rest)
    head = text.partition(":")[0].strip()
    path = head if _CLASS_PATH.fullmatch(head) else "builtins.Exception"
    return _fw.TaskError(exception_class_path=path if "." in path else f"builtins.{path}", traceback=text)


_Base: Any = _fw.BaseTaskBackend  # the framework's class, untyped here


class PyQueueBackend(_Base):  # type: ignore[misc]
    """A ``TASKS`` backend sending Django tasks as pyqueue jobs; ``manage.py
    pyqueue_worker`` runs them (:mod:`pyqueue.contrib.django`)."""

    supports_defer = True
    supports_async_task = True  # the worker runs a coroutine function with Task.call (async_to_sync)
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Bad settings are kept, not raised: Django's checks then report them
        # (check()), and enqueue/get_result raise ImproperlyConfigured.
        self.settings, self.problems = read_options(self.options, self.queues)

    def check(self, **kwargs: Any) -> Iterable[Any]:
        """Django's system checks of this backend: ``pyqueue.E001`` no ``url``,
        ``E002`` a url that is no Redis URL (read, never connected to), ``E003`` an
        unknown option, ``E004`` an option of the wrong type or range, ``E005`` no
        QUEUES; ``W001`` the embedded server (one per process)."""
        where = f"TASKS[{self.alias!r}]"
        return [
            (checks.Warning if p.warning else checks.Error)(p.msg, hint=p.hint, obj=where, id=p.id)
            for p in self.problems
        ]

    def configured(self) -> Settings:
        """The settings, or ImproperlyConfigured naming every error in them."""
        if self.settings is None:
            errors = "; ".join(f"{p.id} {p.msg}" for p in self.problems if not p.warning)
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: {errors}")
        return self.settings

    def pyqueue(self) -> Tasks:
        """This backend's pyqueue :class:`~pyqueue.Tasks` (:func:`pyqueue_tasks`)."""
        return pyqueue_tasks(self.alias, self.configured())

    def validate_task(self, task: Any) -> None:
        """Django's checks, then records ``task`` as one of this backend's, to be
        registered with pyqueue under its module path."""
        super().validate_task(task)
        _remember(self.alias, task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Send a run of ``task``: now, or, with ``on_commit`` (the default) inside a
        transaction of the default database, when it commits (``transaction.on_commit``:
        a rollback sends nothing). Returns its READY ``TaskResult``, whose id is the job
        id even before the send. ``enqueued_at`` is when ``enqueue`` was called.

        A send after the commit that fails (Redis unreachable) raises from the exit of
        the ``atomic`` block, the transaction committed and the task not sent.

        Raises:
            InvalidTask: ``task`` is not valid for this backend (Django's rules).
            TypeError: the arguments do not fit the function's signature.
            ValueError: an argument is not JSON (Django's ``normalize_json``).
            ImproperlyConfigured: the backend's settings are wrong (the checks say how).
        """
        self.validate_task(task)
        settings = self.configured()
        leading = (None,) if task.takes_context else ()
        try:
            inspect.signature(task.func).bind(*leading, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{task.module_path}: {exc}") from None
        args, kwargs = _fw.normalize_json(list(args)), _fw.normalize_json(dict(kwargs))
        job_id = secrets.token_hex(16)
        sender = self.pyqueue().tasks[task.module_path].options(
            queue=task.queue_name, priority=priority_level(task.priority), job_id=job_id,
        )
        result = _fw.TaskResult(
            task=task, id=job_id, status=_fw.TaskResultStatus.READY, enqueued_at=timezone.now(), started_at=None,
            finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs, backend=self.alias, errors=[],
            worker_ids=[],
        )

        def send() -> None:
            if task.run_after is None:
                sender.send(*args, **kwargs)
            else:
                when = task.run_after if timezone.is_aware(task.run_after) else timezone.make_aware(task.run_after)
                sender.send_at(when, *args, **kwargs)
            _fw.task_enqueued.send(type(self), task_result=result)

        if settings.on_commit:
            transaction.on_commit(send)  # outside a transaction: at once
        else:
            send()
        return result

    def get_result(self, result_id: str) -> Any:
        """The ``TaskResult`` of job ``result_id``, looked for in each of ``QUEUES``:
        READY (queued, scheduled, or waiting for a retry), RUNNING (leased), FAILED
        (dead: ``errors`` holds its last error; earlier attempts' errors are not kept),
        or SUCCESSFUL (its return value, from the record kept for ``keep_result``).
        ``worker_ids`` has one entry per attempt begun; only the last attempt's worker
        is known (``host:pid`` of a finished run, the lease's owner of a running one),
        earlier ones are ``""``. ``started_at`` and ``last_attempted_at`` (the last
        attempt's start) are known once it succeeded.

        Raises:
            TaskResultDoesNotExist: no queue has the job or its result: never sent (a
                rollback, or not yet committed), cancelled, or ended longer ago than
                ``keep_result``.
            ImproperlyConfigured: the backend's settings are wrong.
        """
        app = self.pyqueue()
        for name in sorted(self.queues):
            queue = app.queue(name)
            try:
                outcome = queue.result(result_id)
            except InvalidArgument:  # not a job id at all
                break
            if outcome.state == "unknown":
                continue
            if outcome.state != "ok":
                info = queue.get(result_id, with_payload=True)
                if info.payload is not None:
                    return self._from_job(info)
                outcome = queue.result(result_id)  # it ended between the two reads
            if outcome.state == "ok":
                return self._from_record(outcome)
            break
        raise _fw.TaskResultDoesNotExist(f"no task result {result_id!r} in queues {sorted(self.queues)}")

    def _from_record(self, outcome: JobResult) -> Any:
        record = from_json(outcome.value)
        if not isinstance(record, dict) or "task" not in record:
            raise _fw.TaskResultDoesNotExist(f"job {outcome.id!r} is not a Django task's")
        return _record_result(self._task(record["task"], outcome.id), outcome.id, self.alias, record)

    def _from_job(self, info: JobInfo) -> Any:
        assert info.payload is not None
        try:
            env = envelope.decode(info.payload)
        except InvalidArgument:
            raise _fw.TaskResultDoesNotExist(f"job {info.id!r} is not a Django task's") from None
        status = _fw.TaskResultStatus
        attempts = max(info.attempts, 0)
        worker_ids = [""] * attempts
        errors: list[Any] = []
        finished_ms = None
        if info.state == "leased":
            state = status.RUNNING
            if worker_ids:
                worker_ids[-1] = info.owner
        elif info.state == "dead":
            state, finished_ms = status.FAILED, info.due_ms
            errors = [task_error(info.error)]
        else:  # ready, scheduled (a retry's backoff, run_after) or ready_or_leased
            state = status.READY
        enqueued = env.meta.get("enqueued_ms")
        return _result(self._task(env.task, info.id), info.id, state, self.alias, env.args, env.kwargs, worker_ids,
                       enqueued_ms=enqueued if isinstance(enqueued, int) else None, finished_ms=finished_ms,
                       errors=errors)

    def _task(self, path: str, job_id: str) -> Any:
        """The Django task at module path ``path``: the one this process knows, else
        imported."""
        known = _known.get(self.alias, {}).get(path)
        if known is not None:
            return known
        try:
            task = import_string(path)
        except ImportError:
            task = None
        if not isinstance(task, _fw.Task):
            raise _fw.TaskResultDoesNotExist(f"job {job_id!r} is of task {path!r}, which is no Django task here")
        return task
