"""pyqueue in a Flask application (``pip install pyqueue-redis[flask]``)::

    from flask import Flask, current_app
    from pyqueue.contrib.flask import PyQueue

    pq = PyQueue()

    @pq.task(keep_result=60)
    def greet(name: str) -> str:
        return f"{current_app.config['GREETING']}, {name}"   # runs inside the app context

    def create_app() -> Flask:
        app = Flask(__name__)
        app.config.from_prefixed_env()   # FLASK_PYQUEUE_URL=redis://... in the environment
        pq.init_app(app)
        return app

``PyQueue(app)`` or ``init_app(app)`` connects :attr:`PyQueue.tasks` (a
:class:`pyqueue.Tasks`) with the app's config: ``PYQUEUE_URL`` (default: what
``pyqueue.Tasks()`` uses, ``$PYQUEUE_URL`` else the embedded server), ``PYQUEUE_PREFIX``
(the key prefix, default ``"pq"``). ``pq.task`` is ``pq.tasks.task``: sending, results,
policy and testing are the task layer's.

Each run in a worker happens inside ``app.app_context()`` of the app given last to
``init_app`` (a run middleware), so ``current_app``, ``flask.g`` and extensions that
need the context work in tasks. ``flask --app module pyqueue worker`` (Flask's CLI; the
``pyqueue`` group is added to ``app.cli``) runs a worker of these tasks:
``--concurrency``, ``-q/--queue`` (default: the tasks' queues), ``--burst``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Literal

import click
from flask import Flask, current_app
from flask.cli import AppGroup

from pyqueue.drivers.clients import connect
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.worker.settings import parse_prefetch
from pyqueue.drivers.queue import DEFAULT_PREFIX
from pyqueue.tasks import HookOutcome, Middleware, Tasks, TaskRun
from pyqueue.worker.lifecycle import show_worker_logs


class PyQueue(Middleware):
    """The extension: a :class:`pyqueue.Tasks` configured from ``app.config``, its runs
    inside the app context (see the module docstring). ``tasks_options`` go to
    ``Tasks(...)`` (``default_queue=``)."""

    def __init__(self, app: Flask | None = None, **tasks_options: Any) -> None:
        self.tasks = Tasks(**tasks_options)
        self.app: Flask | None = None
        self.tasks.middleware(self)  # around_run below
        if app is not None:
            self.init_app(app)

    @property
    def task(self) -> Any:
        """``@pq.task`` / ``@pq.task(...)``: :meth:`pyqueue.Tasks.task`."""
        return self.tasks.task

    def init_app(self, app: Flask) -> None:
        """Connect the tasks with ``app.config`` (``PYQUEUE_URL``, ``PYQUEUE_PREFIX``), make
        ``app`` the one runs happen in, register ``app.extensions["pyqueue"]`` and add the
        ``pyqueue`` command group to ``app.cli``."""
        url = app.config.get("PYQUEUE_URL")
        prefix = app.config.get("PYQUEUE_PREFIX", DEFAULT_PREFIX)
        # Bound now, whatever was used before: the config is read once, here.
        self.tasks.bind(connect(url) if url is not None else self.tasks.redis, prefix=prefix)
        self.app = app
        app.extensions["pyqueue"] = self
        app.cli.add_command(_commands())

    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        """Each run inside the app's context (a new one per run, popped after it)."""
        if self.app is None:
            raise RuntimeError("PyQueue has no app: call init_app(app) where the worker imports the tasks")
        with self.app.app_context():
            yield


def _prefetch(ctx: click.Context, param: click.Parameter, value: str) -> int | Literal["auto"]:
    try:
        return parse_prefetch(str(value))
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc)) from None


def _commands() -> AppGroup:
    group = AppGroup("pyqueue", help="pyqueue's commands for this app's tasks.")

    @group.command("worker")
    @click.option("-q", "--queue", "queues", multiple=True, help="a queue to serve (repeat; default: the tasks' queues)")
    @click.option("--concurrency", default=1, show_default=True, help="jobs run at once")
    @click.option("--prefetch", default="auto", show_default=True, callback=_prefetch,
                  help="jobs leased ahead of the running ones, or auto (while the jobs are short)")
    @click.option("--block-ms", default=10_000, show_default=True, help="how long one wait for jobs blocks")
    @click.option("--burst", is_flag=True, help="run until the queues are empty, then exit")
    def worker(queues: tuple[str, ...], concurrency: int, prefetch: int | Literal["auto"], block_ms: int,
               burst: bool) -> None:
        """Run a worker of the app's pyqueue tasks."""
        pq: PyQueue = current_app.extensions["pyqueue"]
        if not pq.tasks.tasks:
            raise click.ClickException("no pyqueue tasks are registered: is the module defining them imported by the app?")
        worker = pq.tasks.worker(list(queues) or None, concurrency=concurrency, prefetch=prefetch, block_ms=block_ms)
        show_worker_logs()
        code = pq.tasks.run_worker(worker, burst=burst)
        if code:
            raise SystemExit(code)

    return group
