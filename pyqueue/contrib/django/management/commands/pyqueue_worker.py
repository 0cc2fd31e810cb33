"""``python manage.py pyqueue_worker``: a pyqueue worker of a Django task backend."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pyqueue.protocol.errors import InvalidArgument
from pyqueue.worker.lifecycle import show_worker_logs
from pyqueue.cli import prefetch_arg


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no types
    help = ("Run a pyqueue worker for the Django tasks of a PyQueueBackend (every installed app's tasks module is "
            "imported), on the backend's QUEUES or those given")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias (default: default)")
        parser.add_argument("-q", "--queue", action="append", help="a queue to serve (repeat; default: the backend's "
                            "QUEUES, in their sorted order)")
        parser.add_argument("-m", "--module", action="append", default=[], help="a module to import for its tasks "
                            "(repeat), beyond the installed apps' tasks modules")
        parser.add_argument("--concurrency", type=int, default=1, help="jobs run at once, each in a thread")
        parser.add_argument("--prefetch", type=prefetch_arg, default="auto", help="jobs leased ahead of the running "
                            "ones, or auto: as many as --concurrency while the jobs are short (the default)")
        parser.add_argument("--block-ms", type=int, default=10_000, help="how long one wait for jobs blocks")
        parser.add_argument("--burst", action="store_true", help="run until the queues are empty, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        from pyqueue.contrib.django.worker import worker_tasks

        try:
            tasks, queues = worker_tasks(options["backend"], options["module"])
            # Tasks.worker warns of a queue no registered task names, since a job there would
            # be of an unknown task; here any queue of QUEUES may get any task (Task.using),
            # and every Django task is registered by name, so the warning would mislead.
            quiet = _NoQueueWarning()
            logging.getLogger("pyqueue.tasks").addFilter(quiet)
            try:
                worker = tasks.worker(options["queue"] or queues, concurrency=options["concurrency"],
                                      prefetch=options["prefetch"], block_ms=options["block_ms"])
            finally:
                logging.getLogger("pyqueue.tasks").removeFilter(quiet)
        except InvalidArgument as exc:
            raise CommandError(str(exc)) from exc
        show_worker_logs()
        code = tasks.run_worker(worker, burst=options["burst"])
        if code:
            sys.exit(code)



class _NoQueueWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().endswith("their jobs will be retried, then dead")
