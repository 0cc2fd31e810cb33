"""The ``pyqueue`` command: run workers, enqueue, inspect, stop services, manage dead
letters, and run the demo. ``python -m pyqueue`` is the same command.

``--url`` (or ``PYQUEUE_URL``) names the server; the default ``embedded`` is a
fakeredis inside this process, which only makes sense for ``demo`` (other processes
cannot see it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import functools
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import redis

from pyqueue.protocol.core import parse_duration_ms, parse_rate as core_parse_rate
from pyqueue.protocol.errors import InvalidArgument, PyQueueError, map_redis_error
from pyqueue.protocol.models import Job, JobEntry, JobInfo, RateLimit
from pyqueue.protocol.verbs.events import Event, Since
from pyqueue.drivers.clients import Client, embedded_redis
from pyqueue.drivers.clients import connect as _connect
from pyqueue.ops.discovery import existing_queue, logical_queues, open_queue
from pyqueue.protocol.keys import check_name
from pyqueue.protocol.version import VERSION
from pyqueue.drivers.facade import parts_of
from pyqueue.drivers.queue import DEFAULT_KEEP_DONE_MS, DEFAULT_LEASE_MS, Queue, physical_queue
from pyqueue.protocol.verbs.flows import DEFAULT_FLOW_CHECK_MS
from pyqueue.protocol.verbs.steps import TIMED_OUT, JobSteps
from pyqueue.worker.supervised import ENV_VAR, SupervisorLink
from pyqueue.worker.supervisor import DEFAULT_CRASH_LOOP, EXIT_CRASH_LOOP, FAST_DEATH_S, Supervisor
from pyqueue.ops.schedules import parse_schedule, server_now_ms
from pyqueue.ops.service import DEFAULT_EXPIRE_MS, DEFAULT_NAMESPACE, Services
from pyqueue.worker.aio import AsyncWorker
from pyqueue.worker import Worker
from pyqueue.worker.settings import parse_prefetch
from pyqueue.worker.executor import is_async_handler

log = logging.getLogger("pyqueue.cli")

#: Where ``pyqueue worker --metrics-port`` listens unless ``--metrics-host`` says: loopback.
DEFAULT_METRICS_HOST = "127.0.0.1"


def load_target(target: str) -> object:
    """Import ``module:attribute`` (a handler function, or a :class:`pyqueue.Tasks`), with
    the current directory on the import path, as other workers do.

    Raises:
        InvalidArgument: a malformed target, a module that does not import, or a missing
            attribute (``pyqueue`` prints it as one line and exits 2).
    """
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise InvalidArgument(f"the worker's target must be module:function or module:tasks, got {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import {module_name!r} (from {os.getcwd()}): {exc}") from None
    except Exception as exc:  # the module itself raised while importing
        raise InvalidArgument(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    try:
        found: object = module
        for part in attr.split("."):
            found = getattr(found, part)
    except AttributeError:
        raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    return found


def load_handler(target: str) -> Callable[[Job], object]:
    """Import ``module:function``, a job handler.

    Raises:
        InvalidArgument: as :func:`load_target`, or not callable.
    """
    handler = load_target(target)
    if not callable(handler):
        raise InvalidArgument(f"{target} is a {type(handler).__name__}, not a function of a Job or a pyqueue.Tasks")
    return handler


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Rows as an aligned text table."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if c.lstrip("-").isdigit() else c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def parse_partitions(values: Sequence[str] | None) -> dict[str, int]:
    """``NAME=K`` options as a dict."""
    out = {}
    for value in values or ():
        name, sep, count = value.rpartition("=")
        if not sep or not name or not count.isdigit():
            raise PyQueueError(f"--partitions takes NAME=COUNT, got {value!r}")
        out[name] = int(count)
    return out


def prefetch_arg(value: str) -> int | str:
    """``--prefetch``: ``auto`` or an integer 0..1000."""
    try:
        return parse_prefetch(value)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ms(value: int) -> str:
    return f"{value} ms" if value < 10_000 else f"{value / 1000:.0f} s"


def _utc(at_ms: int) -> str:
    """A server time (ms since the epoch) as UTC, to the second: 2026-11-29 02:51:07Z."""
    return datetime.datetime.fromtimestamp(at_ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _task_of(payload: bytes | None) -> str:
    """The task a job's payload names, if it is a task envelope; '' for a raw job."""
    from pyqueue.tasks import envelope  # the task layer sits above the engine: imported only here

    if not payload:
        return ""
    try:
        return envelope.decode(payload).task
    except envelope.EnvelopeError:
        return ""


def cmd_worker(args: argparse.Namespace) -> int:
    from pyqueue.tasks import Tasks  # the task layer sits above the engine: imported only here
    from pyqueue.tasks.task import Task

    link = SupervisorLink.from_environment()
    check_metrics_options(args)
    if args.processes is not None and link is None:
        return run_supervisor(args)
    if link is None and (args.max_jobs_per_child or args.max_memory_per_child):
        raise InvalidArgument("--max-jobs-per-child and --max-memory-per-child recycle the children of --processes N")
    target = load_target(args.handler)
    if isinstance(target, Task):
        # Its jobs carry a task envelope, not the function's arguments: served as a job
        # handler, every one would die with a TypeError.
        module = args.handler.partition(":")[0]
        raise InvalidArgument(
            f"{args.handler} is the task {target.name!r} of a pyqueue.Tasks: run the Tasks object, which serves "
            f"every task on the queues they name: pyqueue worker {module}:<the Tasks object's name>"
        )
    queues = list(args.queue or []) + [q for spec in args.queues or () for q in spec.split(",") if q]
    if isinstance(target, Tasks):
        if not target.tasks:
            raise InvalidArgument(f"{args.handler} has no tasks registered (is the module that defines them imported?)")
        queues = queues or target.queue_names()
    elif args.metrics_port is not None:
        raise InvalidArgument(METRICS_NEED_TASKS)
    elif not queues:
        raise InvalidArgument("a handler function serves the queues given with -q/--queue (or --queues a,b)")
    schedules = [parse_schedule(spec, queues[0], "every") for spec in args.every or ()]
    schedules += [parse_schedule(spec, queues[0], "cron") for spec in args.cron or ()]
    if args.schedule_attempts is not None:
        if not schedules:
            raise InvalidArgument("--schedule-attempts sets the attempts of --every/--cron jobs; none is given")
        schedules = [dataclasses.replace(s, max_attempts=args.schedule_attempts) for s in schedules]
    options: dict[str, Any] = dict(
        redis=connect(args.url),
        prefix=args.prefix,
        namespace=args.namespace,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        lease_ms=args.lease_ms,
        block_ms=args.block_ms,
        renew_ms=args.renew_ms,
        expire_ms=args.expire_ms,
        grace_ms=args.grace_ms,
        keep_done_ms=args.keep_done_ms,
        partitions=parse_partitions(args.partitions),
        wait_replicas=args.wait_replicas,
        schedules=schedules,
        keep_results_ms=args.keep_results_ms,
        flow_check_ms=args.flow_check_ms,
    )
    if link is not None:
        options["supervisor_link"] = link
    if args.batch is not None or args.batch_wait_ms is not None:
        # A batch handler (a Tasks object refuses: its batch tasks say it themselves).
        options.update(batch=args.batch, batch_wait_ms=args.batch_wait_ms)
    if isinstance(target, Tasks):
        if args.metrics_port is not None:
            record_task_metrics(args, target, supervised=link is not None)
        # Every task on the queues they name (or those given); async tasks or hooks make
        # it an AsyncWorker. The start and stop hooks run around it.
        worker = target.worker(queues, **options)
        code = target.run_worker(worker, burst=args.burst)
    else:
        handler = load_handler(args.handler)
        # An async def handler runs as tasks of an event loop (AsyncWorker); a plain one in
        # the thread-pool Worker. Both keep the same lifecycle and exit codes.
        worker = (AsyncWorker if is_async_handler(handler) else Worker)(queues, handler, **options)
        if isinstance(worker, AsyncWorker):
            code = asyncio.run(worker.run(burst=args.burst))
        else:
            code = worker.run(burst=args.burst)
    # Leave even if a handler is stuck past the grace period (its job was released to
    # other workers): the executor's threads would otherwise keep the process alive.
    sys.stdout.flush()
    logging.shutdown()
    os._exit(code)


METRICS_NEED_TASKS = ("--metrics-port exports per-task metrics: the worker's target must be a pyqueue.Tasks "
                      "(module:tasks), not a handler function")


def check_metrics_options(args: argparse.Namespace) -> None:
    """Refuse ``--metrics-port``/``--metrics-host`` that cannot work, before anything starts.

    Raises:
        InvalidArgument: a port outside 0..65535, ``--metrics-host`` alone, or
            prometheus-client is not installed (the ``metrics`` extra).
    """
    if args.metrics_port is None:
        if args.metrics_host is not None:
            raise InvalidArgument("--metrics-host is where --metrics-port listens: give --metrics-port too")
        return
    if not 0 <= args.metrics_port <= 65535:
        raise InvalidArgument(f"--metrics-port must be 0..65535 (0: any free port), got {args.metrics_port}")
    try:
        importlib.import_module("prometheus_client")  # only whether it imports
    except ImportError:
        raise InvalidArgument('--metrics-port needs prometheus-client: pip install "pyqueue-redis[metrics]"') from None


def record_task_metrics(args: argparse.Namespace, tasks: Any, *, supervised: bool) -> None:
    """``--metrics-port``: register a :class:`~pyqueue.tasks.telemetry.TaskMetrics` as the
    outermost middleware of ``tasks`` (so it sees the ending the app's middleware makes).
    A worker on its own serves it on ``--metrics-host:--metrics-port`` from a thread
    until the process exits; a supervised child only records, into the directory its
    supervisor serves from (``PROMETHEUS_MULTIPROC_DIR``).

    Raises:
        InvalidArgument: the address cannot be listened on; a supervised child without
            the supervisor's directory.
    """
    from prometheus_client import CollectorRegistry, start_http_server

    from pyqueue.worker.supervisor import MULTIPROC_ENV
    from pyqueue.tasks.telemetry import TaskMetrics

    if supervised:
        if not os.environ.get(MULTIPROC_ENV):
            raise InvalidArgument(f"a supervised worker with --metrics-port needs {MULTIPROC_ENV} from its supervisor")
        # Multiprocess mode: the values go to this process's files whatever the registry.
        tasks.middleware(TaskMetrics(registry=None), outermost=True)
        return
    registry = CollectorRegistry()
    metrics = TaskMetrics(registry)
    host = args.metrics_host or DEFAULT_METRICS_HOST
    try:
        # A daemon thread: os._exit at the worker's end closes it, with no shutdown wait.
        server, _thread = start_http_server(args.metrics_port, addr=host, registry=registry)
    except OSError as exc:
        raise InvalidArgument(f"cannot serve metrics on {host}:{args.metrics_port}: {exc}") from None
    tasks.middleware(metrics, outermost=True)  # once it serves: a refusal leaves the Tasks object as it was
    log.info("serving task metrics on http://%s:%d/metrics", host, server.server_port)


def run_supervisor(args: argparse.Namespace) -> int:
    """``pyqueue worker --processes N``: the supervisor (:mod:`pyqueue.worker.supervisor`)
    of N children, each this same command."""
    if not 1 <= args.processes <= 256:
        raise InvalidArgument(f"--processes must be 1..256, got {args.processes}")
    if args.url == "embedded":
        raise InvalidArgument(
            "--processes needs a Redis server every process shares (--url or PYQUEUE_URL): the embedded "
            "fakeredis lives inside one process"
        )
    for name in ("max_jobs_per_child", "max_memory_per_child"):
        if getattr(args, name) < 0:
            raise InvalidArgument(f"--{name.replace('_', '-')} must be >= 0 (0: no limit)")
    if args.crash_loop < 1:
        raise InvalidArgument(f"--crash-loop must be >= 1, got {args.crash_loop}")
    if args.fast_death_ms < 0:
        raise InvalidArgument(f"--fast-death-ms must be >= 0 (0: no death counts as fast), got {args.fast_death_ms}")
    # Import the target here first: a handler that does not import is reported once, by
    # the supervisor (exit 2), not by every child in turn.
    target = load_target(args.handler)
    metrics = None
    if args.metrics_port is not None:
        from pyqueue.tasks import Tasks

        if not isinstance(target, Tasks):
            raise InvalidArgument(METRICS_NEED_TASKS)
        metrics = (args.metrics_host or DEFAULT_METRICS_HOST, args.metrics_port)
    supervisor = Supervisor(
        args.argv, processes=args.processes, url=args.url, prefix=args.prefix, namespace=args.namespace,
        max_jobs_per_child=args.max_jobs_per_child, max_memory_mb_per_child=args.max_memory_per_child,
        crash_loop=args.crash_loop, fast_death_s=args.fast_death_ms / 1000, metrics=metrics,
    )
    return supervisor.run()


def tasks_served(client: Client, args: argparse.Namespace) -> dict[str, set[str]]:
    """Queue name -> the task names its live workers advertise (their registrations)."""
    from pyqueue.tasks.census import served_tasks  # the task layer sits above the engine

    return served_tasks(Services(client, namespace=args.namespace, prefix=args.prefix).list())


def cmd_enqueue(args: argparse.Namespace) -> int:
    from pyqueue.tasks import envelope

    client = connect(args.url)
    payload = args.payload.encode()
    served = tasks_served(client, args).get(args.queue)
    if served and not args.raw:
        try:
            envelope.decode(payload)
        except envelope.EnvelopeError:
            # Its workers would dead-letter it as undeliverable after its attempts.
            raise InvalidArgument(
                f"queue {args.queue!r} is served by task workers (tasks: {', '.join(sorted(served))}): a raw job "
                f"there is no task; send one with: pyqueue send TASK --args '[...]' (or give --raw)"
            ) from None
    q = open_queue(client, args.queue, args.prefix)
    result = q.enqueue(args.payload.encode(), job_id=args.id, delay_ms=args.delay_ms, max_attempts=args.max_attempts,
                       priority=args.priority, group=args.group, expires_ms=args.expires_ms,
                       debounce_ms=args.debounce_ms, throttle_ms=args.throttle_ms, key=args.key,
                       sequence=args.sequence, on_failure=args.on_failure, rate_key=args.rate_key,
                       rate_limit=None if args.rate_limit is None else rate_limit_of(args.rate_limit, args.rate_burst),
                       cost=args.cost)
    print(f"{result.by_key or ('added' if result.added else 'duplicate')} {result.job_id}")
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    """Send a task by name, as ``fn.send`` does (the same envelope), to the queue its
    live workers serve it on (or ``--queue``), without importing the application."""
    from pyqueue.tasks import envelope

    client = connect(args.url)
    try:
        call_args, call_kwargs = json.loads(args.args), json.loads(args.kwargs)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"--args and --kwargs are JSON: {exc}") from None
    if not isinstance(call_args, list) or not isinstance(call_kwargs, dict):
        raise InvalidArgument("--args is a JSON array, --kwargs a JSON object")
    queue = args.queue
    if queue is None:
        served = tasks_served(client, args)
        serving = sorted(name for name, tasks in served.items() if args.task in tasks)
        if len(serving) != 1:
            known = sorted({task for tasks in served.values() for task in tasks})
            raise InvalidArgument(
                (f"task {args.task!r} is served on several queues ({', '.join(serving)}): give --queue"
                 if serving else
                 f"no live worker serves task {args.task!r} (tasks served: {', '.join(known) or 'none'}): check the "
                 "name, or give --queue to send it anyway")
            )
        (queue,) = serving
    seconds, micros = client.time()
    payload = envelope.encode(args.task, call_args, call_kwargs, {"enqueued_ms": int(seconds) * 1000 + int(micros) // 1000})
    result = open_queue(client, queue, args.prefix).enqueue(
        payload, job_id=args.id, delay_ms=round(args.delay * 1000), max_attempts=args.max_attempts
    )
    print(f"{'sent' if result.added else 'duplicate'} {args.task} as job {result.job_id} to {queue}")
    return 0


#: Byte units of ``pyqueue budget``: SI (1000) and binary (1024).
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """``512MiB``, ``1GB``, ``64KiB`` or ``1000`` (bytes) as bytes."""
    match = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", text.strip())
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise PyQueueError(f"a size is a whole number with a unit B, KB, MB, GB, KiB, MiB or GiB (512MiB), got {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[unit]


def _size(n: int) -> str:
    """Bytes for people: 512.0 MiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def cmd_budget(args: argparse.Namespace) -> int:
    """Set or lift a queue's byte budget (Queue.set_budget)."""
    max_bytes = None if args.size == "off" else parse_size(args.size)
    q = configured_queue(args, connect(args.url))
    if args.results:
        changed = q.set_result_budget(max_bytes)
        if max_bytes is None:
            print(f"{args.queue}: {'results budget lifted' if changed else 'had no results budget'}")
        else:
            print(f"{args.queue}: results kept within {_size(max_bytes)} ({max_bytes} bytes)"
                  f"{'' if changed else ' (unchanged)'}; past it the oldest-expiring results go first")
        return 0
    changed = q.set_budget(max_bytes)
    used = q.stats().bytes
    if max_bytes is None:
        print(f"{args.queue}: {'byte budget lifted' if changed else 'had no byte budget'}")
    else:
        print(f"{args.queue}: at most {_size(max_bytes)} of payloads ({max_bytes} bytes; {_size(used)} in use)"
              f"{'' if changed else ' (unchanged)'}; an enqueue past it is refused with QueueFull")
    return 0


def cmd_tombstones(args: argparse.Namespace) -> int:
    """Cap how many tombstones a queue keeps, or lift the cap (Queue.set_tombstone_limit)."""
    max_count = None if args.max == "off" else _count(args.max)
    q = configured_queue(args, connect(args.url))
    changed = q.set_tombstone_limit(max_count)
    if max_count is None:
        print(f"{args.queue}: {'tombstone limit lifted' if changed else 'had no tombstone limit'}")
    else:
        print(f"{args.queue}: at most {max_count} tombstones{'' if changed else ' (unchanged)'}; past it the "
              "earliest-expiring go first (their ids are then no longer duplicates)")
    return 0


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PyQueueError(f"a limit is a whole number of tombstones (100000) or off, got {text!r}")
    return int(text)


def cmd_indexes(args: argparse.Namespace) -> int:
    """Keep a queue's search indexes, or stop (Queue.set_indexes)."""
    q = configured_queue(args, connect(args.url))
    since_ms = q.set_indexes(args.on == "on")
    if since_ms is None:
        print(f"{args.queue}: keeps no indexes (the members kept go as their jobs end)")
    else:
        print(f"{args.queue}: keeps indexes since {_utc(since_ms)} UTC: pyqueue search --task/--group finds the jobs "
              "sent since then")
    return 0


#: Jobs a call of ``pyqueue search --all`` asks of each search page.
SEARCH_PAGE = 500


def cmd_search(args: argparse.Namespace) -> int:
    """``pyqueue search QUEUE --state --task --group --error --since --until [--replay|--purge|--cancel|--promote]``."""
    from pyqueue.ops.find import BULK_ACTIONS, JobFilter, act_matching, parse_when

    q = existing_queue(connect(args.url), args.queue, args.prefix)
    now_ms = server_now_ms(q) if args.since is not None or args.until is not None else 0
    where = JobFilter(state=args.state, task=args.task, group=args.group, error=args.error,
                      since_ms=None if args.since is None else parse_when(args.since, "--since", now_ms),
                      until_ms=None if args.until is None else parse_when(args.until, "--until", now_ms))
    actions = [a for a in BULK_ACTIONS if getattr(args, a)]
    if len(actions) > 1:
        raise PyQueueError(f"one action at a time, got {', '.join('--' + a for a in actions)}")
    if args.dry_run and not actions:
        raise PyQueueError("--dry-run goes with an action (--replay, --purge, --cancel, --promote)")
    if actions:
        result = act_matching(q, actions[0], where, dry_run=args.dry_run)
        verb = BULK_ACTIONS[actions[0]][1]
        if args.json:
            print(json.dumps({"action": actions[0], "dry_run": args.dry_run, "found": result.found,
                              "done": result.done, "sample": list(result.sample)}))
        elif args.dry_run:
            print(f"would have {verb} {result.found} (a dry run: nothing changed); first: "
                  f"{', '.join(result.sample) or '-'}")
        else:
            others = result.found - result.done
            print(f"{verb} {result.done} of {result.found} found"
                  + (f" ({others} moved meanwhile by others)" if others else ""))
        return 0
    if args.all and args.cursor:
        raise PyQueueError("--all reads from the first page: it takes no --cursor")
    jobs: list[JobEntry] = []
    cursor, examined, shown = args.cursor, 0, 0
    while True:
        page = q.search(count=SEARCH_PAGE if args.all else args.limit, cursor=cursor, **where.search_args())
        examined, shown = examined + page.examined, shown + len(page.jobs)
        if args.json:  # each page as it comes: lines a program reads on stdout
            for j in page.jobs:
                print(json.dumps(dataclasses.asdict(j)))
        else:
            jobs.extend(page.jobs)
        cursor = page.cursor
        if not (args.all and cursor):
            break
    if not args.json:
        rows = [[j.id, j.state, j.task or "-", j.group or "-", _utc(j.enqueued_ms) if j.enqueued_ms >= 0 else "-",
                 f"{j.attempts}/{j.max_attempts}", (j.error or j.owner)[:50]] for j in jobs]
        print(table(rows, ["id", "state", "task", "group", "sent (UTC)", "attempts", "error / owner"]) if rows
              else "no jobs found")
    # What a person reads: on stderr under --json.
    out = sys.stderr if args.json else sys.stdout
    print(f"{shown} shown, {examined} read"
          + (f"; more: --cursor '{cursor}'" if cursor else ""), file=out)
    if page.indexed_since_ms is not None and (args.task or args.group):
        print(f"(indexes since {_utc(page.indexed_since_ms)} UTC: jobs sent before are not found by task or group)",
              file=out)
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    """What each queue holds in Redis, by part (pyqueue.ops.memory)."""
    from pyqueue.ops.memory import PARTS, memory_of

    client = connect(args.url)
    for name in args.queue or ():
        existing_queue(client, name, args.prefix)  # a typo is refused, not shown as an empty queue
    reports = [memory_of(q) for q in logical_queues(client, args.prefix, args.queue)]
    if not reports:
        print("no queues")
        return 0
    rows = [[m.queue, *(_size(m.parts[part]) for part in PARTS), _size(m.total), _size(m.payload_bytes),
             _size(m.budget_bytes) if m.budget_bytes else "none"] for m in reports]
    print(table(rows, ["queue", *PARTS, "total", "payloads", "budget"]))
    if any(m.measure == "dump" for m in reports):
        print("\n(this server has no MEMORY USAGE: sizes are each key's DUMP length, its serialized size)")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    client = connect(args.url)
    rows = []
    # A partitioned queue shows its sum, then one row per partition.
    for name in args.queue or ():
        existing_queue(client, name, args.prefix)  # a typo is refused, not shown as an empty queue
    for q in logical_queues(client, args.prefix, args.queue):
        label = f"{q.name} ({q.spec.partitions} partitions)" if q.spec.partitions > 1 else q.name
        parts = parts_of(q) if q.spec.partitions > 1 else []
        for name, s in [(label, q.stats())] + [(f"  {part.name}", part.stats()) for part in parts]:
            rows.append([name, "paused" if s.paused else "running", s.ready, s.scheduled, s.waiting, s.sequenced,
                         s.leased, s.dead, s.done, _ms(s.lag_ms), s.enqueued, s.acked, s.nacked, s.reclaimed,
                         s.scrubbed, s.dead_total, s.expired_total, s.deferred])
    # waiting: the scheduled jobs parked for a signal (durable steps), counted in scheduled too
    # sequenced: jobs waiting behind their sequence's head (in no other state)
    # expired: jobs ended unrun past their expiry (flow control)
    # deferred: leases put off to their rate key's next permit (flow control)
    header = ["queue", "state", "ready", "scheduled", "waiting", "sequenced", "leased", "dead", "done", "lag", "enqueued",
              "acked", "nacked", "reclaimed", "scrubbed", "dead_total", "expired", "deferred"]
    print(table(rows, header) if rows else "no queues")
    # Task names with jobs waiting that no live worker advertises (a sample of each queue).
    from pyqueue.tasks.census import unserved_tasks  # the task layer, above the engine

    services = Services(client, namespace=args.namespace, prefix=args.prefix).list()
    unserved = [(q.name, name, n) for q in logical_queues(client, args.prefix, args.queue)
                for name, n in sorted(unserved_tasks(q, services).items())]
    if unserved:
        print("\ntasks with jobs waiting and no live worker serving them (a sample of each queue):")
        print(table(unserved, ["queue", "task", "jobs sampled"]))
    return 0


def cmd_services(args: argparse.Namespace) -> int:
    services = Services(connect(args.url), namespace=args.namespace, prefix=args.prefix)
    rows = [[i.id, ("stopping" if i.stopping else "alive") if i.alive else "dead", i.host, i.pid, _utc(i.started_ms),
             _utc(i.renewed_ms), ",".join(i.queues), _names(i.tasks), i.owner] for i in services.list()]
    header = ["id", "state", "host", "pid", "started (UTC)", "renewed (UTC)", "queues", "tasks", "owner"]
    print(table(rows, header) if rows else "no services")
    return 0


def _names(names: Sequence[str], shown: int = 3) -> str:
    """A few names, comma-separated, and how many more ('-' for none)."""
    if not names:
        return "-"
    more = len(names) - shown
    return ",".join(names[:shown]) + (f" (+{more} more)" if more > 0 else "")


def cmd_stop(args: argparse.Namespace) -> int:
    services = Services(connect(args.url), namespace=args.namespace, prefix=args.prefix)
    if services.stop(args.service_id):
        print(f"service {args.service_id}: asked to stop; it stops leasing at once, finishes its running jobs, "
              "deregisters and exits 0")
        return 0
    print(f"service {args.service_id}: no such live service", file=sys.stderr)
    return 1


def cmd_dead(args: argparse.Namespace) -> int:
    client = connect(args.url)
    if args.queue is None:
        if args.action != "list":
            raise PyQueueError(f"dead {args.action} needs a queue name (only list goes over every queue)")
        return _dead_everywhere(client, args.prefix)
    q = existing_queue(client, args.queue, args.prefix)
    ids = args.id or None
    where = dead_filter(args, q)
    if where is not None:
        if ids:
            raise PyQueueError("give --id, or a filter (--task, --error, --since, --until): not both")
        return dead_by_filter(q, args, where)
    if args.dry_run:
        raise PyQueueError("--dry-run goes with a filter (--task, --error, --since, --until)")
    if args.action == "list":
        page = q.dead_list(args.offset, args.limit)
        rows = [[d.id, _task_of(d.payload), _utc(d.dead_ms), f"{d.attempts}/{d.max_attempts}", d.error[:60],
                 len(d.payload)] for d in page.jobs]
        print(table(rows, ["id", "task", "died (UTC)", "attempts", "error", "bytes"]) if rows else "no dead jobs")
        print(f"{page.total} dead in all")
    elif args.action == "replay":
        print(f"replayed {q.dead_replay(ids, limit=args.limit)}")
    else:
        print(f"purged {q.dead_purge(ids, limit=args.limit)}")
    return 0


def dead_filter(args: argparse.Namespace, q: Queue) -> Any:
    """The dead letters' filter the options give (pyqueue.ops.find.DeadFilter), or None.
    "Today" is the server's (one clock)."""
    from pyqueue.ops.find import DeadFilter, parse_when

    if args.task is None and args.error is None and args.since is None and args.until is None:
        return None
    task = args.task
    now_ms = server_now_ms(q) if args.since is not None or args.until is not None else 0
    return DeadFilter(error=args.error, since_ms=None if args.since is None else parse_when(args.since, "--since", now_ms),
                      until_ms=None if args.until is None else parse_when(args.until, "--until", now_ms),
                      match=None if task is None else (lambda job: _task_of(job.payload) == task))


def dead_by_filter(q: Queue, args: argparse.Namespace, where: Any) -> int:
    """``pyqueue dead list|replay|purge QUEUE --task/--error/--since/--until [--dry-run]``:
    by ``Queue.search`` (lua/search.lua), unless a task is asked of a queue that keeps
    no indexes: then the dead letters' payloads are read (pyqueue.ops.find.DeadFilter)."""
    from pyqueue.ops.find import JobFilter, act_matching, dead_matching, matching, purge_matching, replay_matching

    by_index = args.task is None or q.search(state="dead", count=1).indexed_since_ms is not None
    found: list[Any]
    if by_index:
        job_filter = JobFilter(state="dead", task=args.task, error=args.error, since_ms=where.since_ms,
                               until_ms=where.until_ms)
    if args.action == "list":
        if by_index:
            found = list(matching(q, job_filter))
            rows = [[d.id, d.task or "-", _utc(d.dead_ms), f"{d.attempts}/{d.max_attempts}", d.error[:60],
                     d.payload_bytes] for d in found[: args.limit]]
        else:
            found = list(dead_matching(q, where))
            rows = [[d.id, _task_of(d.payload), _utc(d.dead_ms), f"{d.attempts}/{d.max_attempts}", d.error[:60],
                     len(d.payload)] for d in found[: args.limit]]
        print(table(rows, ["id", "task", "died (UTC)", "attempts", "error", "bytes"]) if rows else "no dead jobs found")
        print(f"{len(found)} found")
        return 0
    if by_index:
        result = act_matching(q, args.action, job_filter, dry_run=args.dry_run)
    else:
        result = (replay_matching if args.action == "replay" else purge_matching)(q, where, dry_run=args.dry_run)
    verb = "replayed" if args.action == "replay" else "purged"
    if args.dry_run:
        print(f"would have {verb} {result.found} (a dry run: nothing changed); first: {', '.join(result.sample) or '-'}")
    else:
        others = result.found - result.done
        print(f"{verb} {result.done} of {result.found} found" + (f" ({others} moved meanwhile by others)" if others
                                                                   else ""))
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause or resume a queue (Queue.pause / Queue.resume)."""
    client = connect(args.url)
    q = configured_queue(args, client) if args.command == "pause" else existing_queue(client, args.queue, args.prefix)
    if args.command == "pause":
        print(f"{args.queue}: {'paused' if q.pause() else 'was paused already'}; enqueue goes on, nothing is leased "
              "until pyqueue resume")
    else:
        print(f"{args.queue}: {'resumed' if q.resume() else 'was not paused'}")
    return 0


def parse_rate(value: str) -> tuple[int, int]:
    """``100/s``, ``5/m``, ``1/h``, ``20/500ms`` or ``off`` as (count, period_ms); off is
    (0, 1000). The forms are :func:`pyqueue.protocol.core.parse_rate`'s."""
    if value == "off":
        return 0, 1000
    try:
        rate = core_parse_rate(value)
    except InvalidArgument:
        raise PyQueueError(f"a rate is COUNT/PERIOD (100/s, 5/m, 1/h, 20/500ms) or off, got {value!r}") from None
    return rate.count, rate.period_ms


def rate_limit_of(text: str, burst: int) -> RateLimit:
    """A RateLimit from ``COUNT/PERIOD`` and a burst, or a clear error."""
    try:
        return core_parse_rate(text, burst)
    except InvalidArgument as exc:
        raise PyQueueError(str(exc)) from None


def cmd_limit(args: argparse.Namespace) -> int:
    """Set or lift a queue's rate limit (Queue.limit), or one rate key's (Queue.set_rate_limit)."""
    if args.key is not None:
        return limit_key(args)
    if args.rate == "default":
        raise PyQueueError("default is a rate key's (the limit its jobs carry): give --key")
    count, period_ms = parse_rate(args.rate)
    q = configured_queue(args, connect(args.url))
    changed = q.limit(count, period_ms, burst=args.burst)
    if count == 0:
        print(f"{args.queue}: {'rate limit lifted' if changed else 'had no rate limit'}")
    else:
        print(f"{args.queue}: at most {count} leases per {_ms(period_ms)} across all workers, "
              f"{args.burst} at once{'' if changed else ' (unchanged)'}")
    return 0


def limit_key(args: argparse.Namespace) -> int:
    """``pyqueue limit QUEUE RATE --key KEY``: Queue.set_rate_limit."""
    q = configured_queue(args, connect(args.url))
    rate: RateLimit | None
    if args.rate == "default":
        rate = None
    elif args.rate == "off":
        rate = RateLimit(0, 1000)
    else:
        rate = rate_limit_of(args.rate, args.burst)
    changed = q.set_rate_limit(args.key, rate)
    if rate is None:
        what = "the limit its jobs carry"
    elif rate.count == 0:
        what = "no limit: its jobs pass unchecked"
    else:
        what = f"at most {rate.count} leases per {_ms(rate.period_ms)}, {rate.burst} at once"
    print(f"{args.queue}: rate key {args.key!r}: {what}{'' if changed else ' (unchanged)'}")
    return 0


def cmd_group_limit(args: argparse.Namespace) -> int:
    """Set, lift or (for one group) reset a group cap (Queue.set_group_limit)."""
    value = args.cap
    cap: int | None
    if value == "off":
        cap = 0 if args.group else None
    elif value == "default" and args.group:
        cap = None
    elif value.isdigit():
        cap = int(value)
    else:
        raise PyQueueError(f"a cap is a number of jobs, off, or (with --group) default; got {value!r}")
    q = configured_queue(args, connect(args.url))
    changed = q.set_group_limit(cap, group=args.group)
    who = f"group {args.group!r}" if args.group else "every group"
    what = {None: "the default cap" if args.group else "no cap", 0: "no cap"}.get(cap, f"at most {cap} running at once")
    print(f"{args.queue}: {who}: {what}{'' if changed else ' (unchanged)'}")
    return 0


def cmd_groups(args: argparse.Namespace) -> int:
    """The groups with READY jobs of a queue (Queue.groups), the largest backlogs first."""
    q = existing_queue(connect(args.url), args.queue, args.prefix)
    page = q.groups(0, args.limit)
    rows = [[g.name, "parked (at cap)" if g.parked else "waiting", g.ready, g.running, g.cap or "-"]
            + ([g.queue] if q.spec.partitions > 1 else [])
            for g in sorted(page.groups, key=lambda g: (-g.ready, g.name))]
    header = ["group", "state", "ready", "running", "cap"] + (["partition"] if q.spec.partitions > 1 else [])
    print(table(rows, header) if rows else "no group has ready jobs")
    shown = len(page.groups)
    print(f"{page.total} groups with ready jobs{'' if shown >= page.total else f', {shown} shown (--limit)'}; "
          f"default cap: {page.default_cap or 'none'}")
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    """A job's outcome (Queue.result, or Queue.wait_result with --wait-ms); exit 0 if it
    finished with a result, 1 otherwise."""
    q = existing_queue(connect(args.url), args.queue, args.prefix)
    got = q.wait_result(args.id, args.wait_ms) if args.wait_ms else q.result(args.id)
    if got.state == "ok":
        value = got.value
        print(value.decode("utf-8", "replace") if isinstance(value, bytes) else
              value if isinstance(value, str) else json.dumps(value))
        return 0
    print({"dead": f"dead: {got.error}", "pending": "pending: not finished yet",
           "done": "done: it ended without a kept result (acked without one, cancelled, or expired)",
           "unknown": "unknown: no such job"}[got.state])
    return 1


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel a job (Queue.cancel); exit 1 if there was nothing to cancel."""
    result = existing_queue(connect(args.url), args.queue, args.prefix).cancel(args.id)
    what = {
        "leased": "cancelled while running: its worker tells the handler at its next lease extension, and "
                  "whatever the handler does the job is never retried",
        "done": "not cancelled: it had ended already",
        "unknown": "not cancelled: no such job",
    }
    print(f"{result.queue} {result.id}: {what.get(result.state, f'cancelled (it was {result.state})')}")
    return 0 if result.cancelled else 1


def cmd_sequence_skip(args: argparse.Namespace) -> int:
    """Let a sequence blocked by its dead head go on (Queue.sequence_skip); exit 1 if its
    head is not dead (nothing changed) or it has no job."""
    result = existing_queue(connect(args.url), args.queue, args.prefix).sequence_skip(args.key)
    if result.status == "skipped":
        print(f"skipped: the dead head left sequence {args.key!r}; "
              + (f"{result.next_id} runs next" if result.next_id else "no job was waiting: the key is free"))
        return 0
    print(f"not skipped: the head of {args.key!r}, {result.next_id}, is not dead" if result.status == "running"
          else f"not skipped: sequence {args.key!r} has no job")
    return 1


def cmd_signal(args: argparse.Namespace) -> int:
    """Send a job a signal (Queue.signal): its data is JSON, as a task's wait reads it
    (``current_job().wait_signal``); exit 1 if the signal was refused."""
    try:
        data = json.loads(args.data)
    except ValueError as exc:
        raise InvalidArgument(f"the signal's data must be JSON, got {args.data!r}: {exc}") from None
    from pyqueue.tasks.steps import encode

    result = existing_queue(connect(args.url), args.queue, args.prefix).signal(args.id, args.name, encode(data, "signal"))
    what = {
        "woke": "sent: the job was waiting for it and is due now",
        "kept": "sent: kept for the job's wait",
        "unknown": "refused: no such job (it has ended, or never was)",
        "dead": "refused: the job is dead",
        "duplicate": "refused: a signal of that name was sent before (the first is kept)",
        "closed": "refused: the job's wait for it has timed out",
    }
    print(f"{args.queue} {args.id} {args.name}: {what[result.status]}")
    return 0 if result.accepted else 1


#: How many of a queue's newest events ``pyqueue job`` reads (one XREVRANGE) to tell a
#: cancelled job from an acked one, which leave the same tombstone.
JOB_EVENTS_READ = 1000


def how_it_ended(queue: Queue, info: JobInfo) -> tuple[str, str]:
    """The state ``pyqueue job`` shows for a job ``get`` finds ended ('done') or
    forgotten ('unknown'), and how it ended, in words ('' if unknown).

    The engine records the end of a job that is gone in two places only: a kept
    result (``ack_result``; cancel keeps none), and the queue's event stream when the
    queue keeps one ('acked' or 'cancelled'). Its tombstone in ``done`` is the same for
    an ack and a cancel. So: a kept result says acked; else the newest
    :data:`JOB_EVENTS_READ` events are searched for the job's end; else it stays 'done',
    and the words say that it may have been cancelled."""
    if queue.result(info.id).state == "ok":
        return "done", "acked; its result is kept"
    if info.state != "done":
        return info.state, ""
    for event in reversed(queue.recent_events(JOB_EVENTS_READ).events):
        if event.job_id == info.id and event.type == "cancelled":
            return "cancelled", f"cancelled while {event.fields.get('state', 'in an unknown state')} (its event #{event.seq})"
        if event.job_id == info.id and event.type == "acked":
            return "done", f"acked (its event #{event.seq})"
    return "done", "acked, or cancelled: both leave the same tombstone (the queue's events, when it keeps them, tell)"


def cmd_job(args: argparse.Namespace) -> int:
    """One job's state and what is known of it (Queue.get); exit 1 if it is unknown.
    Attempts count from 1 (a running first attempt is 1/N); a job that ended says how,
    where the engine recorded it (:func:`how_it_ended`)."""
    client = connect(args.url)
    queue = existing_queue(client, args.queue, args.prefix)
    info = queue.get(args.id, with_payload=True)  # (for the task it names; printed with --payload)
    state, ended = info.state, ""
    if not info.exists:
        # info.queue: the partition that holds the id, for a partitioned queue
        state, ended = how_it_ended(physical_queue(info.queue, client, prefix=args.prefix), info)
    rows: list[list[object]] = [["queue", info.queue], ["id", info.id], ["state", state]]
    if info.exists:
        attempts = f"{info.attempts_made}/{info.max_attempts}"
        if info.state == "leased":
            attempts += f" (attempt {info.attempts_made} running)"
        task = _task_of(info.payload)
        if task:
            rows.append(["task", task])
        rows += [["attempts", attempts], ["payload", f"{info.payload_bytes} bytes"]]
        if info.enqueued_ms >= 0:
            rows.append(["enqueued", f"{_ms(info.now_ms - info.enqueued_ms)} ago"])
        by_state: dict[str, list[list[object]]] = {
            "scheduled": [["due in", _ms(info.due_ms - info.now_ms)]],
            "waiting": [["timeout in", _ms(info.due_ms - info.now_ms)]],
            "leased": [["owner", info.owner], ["fence", info.fence], ["deadline in", _ms(info.deadline_ms - info.now_ms)]],
            "dead": [["died", f"{_ms(info.now_ms - info.due_ms)} ago"], ["error", info.error]],
        }
        rows += by_state.get(info.state, [])
        rows += step_rows(queue.steps(info.id))
        progress = queue.progress_of([info.id]).get(info.id) if info.state == "leased" else None
        if progress is not None:
            rows.append(["progress", f"{progress.value.decode('utf-8', 'replace')} ({_ms(info.now_ms - progress.written_ms)} ago)"])
        if args.payload and info.payload is not None:
            rows.append(["payload bytes", info.payload.decode("utf-8", "replace")])
    if ended:
        rows.append(["ended", ended])
    if info.state == "done":
        rows.append(["duplicate for", _ms(info.done_until_ms - info.now_ms)])
    print(table(rows, ["field", "value"]))
    return 0 if state != "unknown" else 1


def step_rows(found: JobSteps) -> list[list[object]]:
    """``pyqueue job``'s rows of a job's durable steps, sleeps, waits and signals."""
    rows: list[list[object]] = []
    for name, value in found.results.items():
        shown = "timed out" if value == TIMED_OUT else value[1:].decode("utf-8", "replace") if value[:1] == b"j" \
            else f"{len(value)} bytes"
        rows.append([f"step {name}", shown if len(shown) <= 200 else shown[:200] + "..."])
    for name, park in found.parks.items():
        if name not in found.results:
            left = park.until_ms - found.now_ms
            rows.append([f"{park.kind} {name}", f"until {_ms(left)} from now" if left > 0 else "over"])
    for name in found.signals:
        if name not in found.results:
            rows.append([f"signal {name}", "kept for its wait"])
    return rows


def _token(value: str) -> str:
    """``value`` as is when it is one plain word, else quoted as JSON (errors, progress)."""
    plain = value and value.isprintable() and not any(c in value for c in ' ="\\')
    return value if plain else json.dumps(value)


def format_event(event: Event) -> str:
    """One line of ``pyqueue events``: number, server time (UTC), type, job, details."""
    when = datetime.datetime.fromtimestamp(event.at_ms / 1000, datetime.timezone.utc)
    details = ([f"attempt={event.attempt}"] if event.attempt is not None else []) + [
        f"{name}={_token(value)}" for name, value in event.fields.items()
    ]
    return " ".join([f"#{event.seq}", when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                     event.type, event.job_id, *details])


def cmd_events(args: argparse.Namespace) -> int:
    """Opt a queue in to its event stream (--keep N) or out (--keep 0); or print its
    events (Queue.events) from --since (an event number, ``now`` or the oldest kept),
    and with --follow keep printing new ones until interrupted. Trimmed events a read
    skipped are reported on stderr."""
    client = connect(args.url)
    if args.create and args.keep is None:
        raise InvalidArgument("--create goes with --keep N (opting a new queue in to its events)")
    q = configured_queue(args, client) if args.keep is not None else existing_queue(client, args.queue, args.prefix)
    if args.keep is not None:
        setting = q.set_events(args.keep)
        was = f"kept {setting.previous}" if setting.previous else "was off"
        now = f"keeps the newest {args.keep} events" if args.keep else "writes no more events (the stream is kept)"
        print(f"{args.queue}: events {was}; now {now}; {setting.length} in the stream")
        return 0
    since: Since = None
    if args.since == "now":
        since = "now"
    elif args.since is not None:
        if not args.since.isdigit():
            raise PyQueueError(f"--since takes an event number or now, got {args.since!r}")
        since = int(args.since)
    if args.follow:
        # Ctrl-C and SIGTERM end a follow, also when it was started with SIGINT ignored
        # (a background job of a non-interactive shell, a test runner's worker): there
        # Python installs no KeyboardInterrupt of its own.
        import signal

        def interrupt(_signum: int, _frame: object) -> None:
            raise KeyboardInterrupt

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, interrupt)
    if not client.hget(q.spec.keys.counters, "events") and not q.events(None, 1).events:
        # Not opted in and nothing kept: an empty answer (or a follow) would wait for
        # events that are never written.
        raise PyQueueError(
            f"{args.queue} records no events (it has not opted in): pyqueue events {args.queue} --keep N opts it in"
        )
    try:
        while True:
            page = q.events(since, args.count, block_ms=5_000 if args.follow else 0)
            if page.missed:
                print(f"({page.missed} events were trimmed before they were read: raise the bound with --keep)",
                      file=sys.stderr)
            for event in page.events:
                print(json.dumps(event.as_json()) if args.json else format_event(event), flush=True)
            since = page.last
            if not args.follow and len(page.events) < args.count:
                return 0
    except KeyboardInterrupt:
        return 0


def cmd_flow_show(args: argparse.Namespace) -> int:
    """A flow's tree, each step with its state (pyqueue.tasks.flowview); exit 1 if no
    record of it is kept in the queue named."""
    from pyqueue.tasks.flowview import no_record_message, show_flow

    client = connect(args.url)
    view = show_flow(client, existing_queue(client, args.queue, args.prefix), args.id, prefix=args.prefix)
    if view is None:
        print(no_record_message(args.queue, args.id))
        return 1
    if args.json:
        print(json.dumps(view.as_json(), indent=2))
    else:
        print(view.render())
    return 0


def _dead_everywhere(client: Client, prefix: str) -> int:
    """Dead letters per queue, for every queue of every primary (SCAN-based discovery),
    with the oldest one's error."""
    rows = []
    for q in logical_queues(client, prefix):
        page = q.dead_list(0, 1)
        if page.total:
            oldest = page.jobs[0]
            rows.append([q.name, page.total, oldest.id, oldest.error[:60]])
    print(table(rows, ["queue", "dead", "oldest", "its error"]) if rows else "no dead jobs")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    """Serve Prometheus metrics (pyqueue.ops.metrics) on ``/metrics`` until SIGTERM/SIGINT."""
    import signal
    import threading

    try:
        from prometheus_client import CollectorRegistry, make_wsgi_app
    except ImportError:
        raise PyQueueError(
            "pyqueue metrics needs the metrics extra (prometheus-client): pip install \"pyqueue-redis[metrics]\""
        ) from None
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from pyqueue.ops.autoscale import backlog_app
    from pyqueue.ops.metrics import PyQueueCollector

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            pass  # a scrape every few seconds is not worth a line

    client = connect(args.url)
    registry = CollectorRegistry()
    registry.register(PyQueueCollector(client, queues=args.queue, prefix=args.prefix, namespaces=[args.namespace]))
    app = backlog_app(client, args.prefix, args.queue, make_wsgi_app(registry))
    try:
        server = make_server(args.bind, args.port, app, server_class=Server, handler_class=QuietHandler)
    except OSError as exc:  # the port in use, or an address this host does not have
        raise PyQueueError(f"cannot serve metrics on {args.bind}:{args.port}: {exc.strerror or exc}") from None
    thread = threading.Thread(target=server.serve_forever, name="pyqueue-metrics", daemon=True)
    thread.start()
    base = f"http://{args.bind}:{server.server_port}"
    print(f"serving pyqueue metrics on {base}/metrics and the autoscaling signal on {base}/backlog", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the web dashboard (pyqueue.dashboard) until SIGTERM/SIGINT."""
    from pyqueue.dashboard import require_web_stack

    require_web_stack()  # before anything else: name the missing extra, not a traceback
    from pyqueue.dashboard.server import serve_until_signalled

    return serve_until_signalled(
        connect(args.url), url=args.url, host=args.bind, port=args.port, prefix=args.prefix, queues=args.queue,
        namespaces=args.workers_namespace or [args.namespace], token=args.token or None,
        show_payloads=args.show_payloads, every_s=args.sample_s, history_s=args.history_s,
        worker_metrics=args.worker_metrics or (), read_only=args.read_only,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from pyqueue.demo import run_demo

    if args.dashboard:
        from pyqueue.dashboard import require_web_stack

        require_web_stack()
        from pyqueue.dashboard.server import start_demo_dashboard

        return run_demo(url=args.url, prefix=args.prefix, jobs=args.jobs, workers=args.workers,
                        dashboard=functools.partial(start_demo_dashboard, port=args.dashboard_port))
    return run_demo(url=args.url, prefix=args.prefix, jobs=args.jobs, workers=args.workers)


def add_connection_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options every command shares. They are accepted before the command and after
    it (``pyqueue --url U stats`` and ``pyqueue stats --url U``); a command's parser
    sets them only when they are given there, so the top-level defaults stand."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--url", default=default(os.environ.get("PYQUEUE_URL", "embedded")),
                        help="redis://, rediss://, unix://, redis+cluster:// or redis+sentinel://host:26379,.../service "
                             "URL (a redis:// URL of a cluster node is found to be a cluster; README, Deploying), or "
                             "'embedded' (default; env PYQUEUE_URL)")
    parser.add_argument("--prefix", default=default("pq"), help="key prefix (default pq)")
    parser.add_argument("--namespace", default=default(DEFAULT_NAMESPACE), help="service namespace (default workers)")
    parser.add_argument("-v", "--verbose", action="store_true", default=default(False), help="debug logging")


def commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command's parser under ``parser``, nested ones (``flow show``) included."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in dict.fromkeys(action.choices.values()):  # aliases share a parser
                found += [command, *commands(command)]
    return found


CREATE_HELP = "set this up on a queue that has not been used yet (else a queue name no one used is refused as a typo)"


def configured_queue(args: argparse.Namespace, client: Client) -> Queue:
    """The queue a configuring command (pause, limit, group-limit, events --keep) acts
    on: one that exists, or with ``--create`` a queue not used yet (set up before its
    first job)."""
    return (open_queue if args.create else existing_queue)(client, args.queue, args.prefix)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyqueue", description="An atomic job queue on Redis.")
    add_connection_options(parser, defaults=True)
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}",
                        help="print the installed version (pyqueue-redis) and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("worker", help="run a worker: of the tasks of module:tasks (a pyqueue.Tasks), or of a "
                                      "module:function that receives each Job")
    p.add_argument("handler", metavar="module:tasks|module:function",
                   help="a pyqueue.Tasks (serves its tasks on the queues they name), or a function of a Job; "
                        "imported with the current directory on the path")
    p.add_argument("-q", "--queue", action="append", help="queue to serve; repeat, highest priority first (a "
                   "function handler needs one; a Tasks object defaults to its tasks' queues)")
    p.add_argument("--queues", action="append", metavar="A,B", help="queues to serve, comma-separated (as -q)")
    p.add_argument("--concurrency", type=int, default=1, metavar="N",
                   help="handler threads per worker process (default 1)")
    p.add_argument("--prefetch", type=prefetch_arg, default="auto", metavar="P|auto",
                   help="hold up to P jobs leased ahead of the handler threads, so a busy worker never waits for a "
                        "lease's round trip; a prefetched job waits for a free thread (default auto: as many as "
                        "--concurrency while the jobs average under 10 ms, none once they average over 50 ms; 0: none)")
    p.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS, metavar="MS",
                   help=f"lease length; a running job's lease is extended every third of it (default {DEFAULT_LEASE_MS})")
    p.add_argument("--block-ms", type=int, default=10_000, metavar="MS",
                   help="longest blocking wait for work when idle (default 10000)")
    p.add_argument("--renew-ms", type=int, default=15_000, metavar="MS",
                   help="how often the worker renews its service registration and scrubs dead workers' leases "
                        "(default 15000)")
    p.add_argument("--expire-ms", type=int, default=DEFAULT_EXPIRE_MS, metavar="MS",
                   help=f"a registration not renewed for this long is dead (default {DEFAULT_EXPIRE_MS})")
    p.add_argument("--grace-ms", type=int, default=30_000, metavar="MS",
                   help="on stop, how long running jobs may take before they are released to other workers "
                        "(default 30000)")
    p.add_argument("--flow-check-ms", type=int, default=DEFAULT_FLOW_CHECK_MS,
                   help="how often a check of a waiting flow step is due again (default 10000; checks run on the "
                        "renewal tick)")
    p.add_argument("--keep-done-ms", type=int, default=DEFAULT_KEEP_DONE_MS,
                   help="how long an acked id stays a duplicate for enqueue (default 300000; 0: none)")
    p.add_argument("--partitions", action="append", metavar="NAME=COUNT",
                   help="a partitioned queue's partition count (repeat per queue; must match its producers')")
    p.add_argument("--wait-replicas", type=int, default=0, metavar="N",
                   help="after every write, WAIT for N replicas (opt-in durability; default 0)")
    p.add_argument("--every", action="append", metavar="NAME[@QUEUE]=INTERVAL",
                   help="a periodic job: enqueue job NAME:<tick> every INTERVAL (60s, 5m, 1h, 90000ms; whole "
                        "seconds, aligned to the unix epoch) into QUEUE (default: the first -q). Repeat for more. "
                        "Any number of workers may carry it: each tick is enqueued once")
    p.add_argument("--cron", action="append", metavar="NAME[@QUEUE]=EXPR",
                   help="a periodic job on a cron expression in UTC, e.g. 'report=0 * * * *' (six fields: seconds "
                        "first); otherwise as --every")
    p.add_argument("--schedule-attempts", type=int, default=None, metavar="N",
                   help="each --every/--cron tick job's max attempts (default: the queue's default, 5)")
    p.add_argument("--keep-results-ms", type=int, default=None, metavar="MS",
                   help="keep each handler's return value as its job's result for MS (default: only results the "
                        "handler wraps in pyqueue.Result)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="a batch handler: the function receives up to N jobs of one queue (a list[Job], from one "
                        "lease call) and returns one result per job, in order (tasks set it with "
                        "@tasks.task(batch=N))")
    p.add_argument("--batch-wait-ms", type=int, default=None, metavar="MS",
                   help="with --batch: how long a short batch waits for more jobs before it runs (default 0)")
    p.add_argument("--burst", action="store_true",
                   help="exit once no job is ready, none runs and none is due within --block-ms (jobs scheduled "
                        "later stay in their queues)")
    p.add_argument("--processes", type=int, metavar="N",
                   help="run N worker processes (each with --concurrency slots) under a supervisor that replaces a "
                        "dead one, scrubbing its leases at once; SIGHUP restarts them one by one")
    p.add_argument("--max-jobs-per-child", type=int, default=0, metavar="N",
                   help="with --processes: replace a child after N jobs (0: never)")
    p.add_argument("--max-memory-per-child", type=int, default=0, metavar="MIB",
                   help="with --processes: replace a child above this resident memory, in MiB (0: never)")
    p.add_argument("--crash-loop", type=int, default=DEFAULT_CRASH_LOOP, metavar="K",
                   help=f"with --processes: give up (exit {EXIT_CRASH_LOOP}) after K children in a row died within "
                        f"--fast-death-ms of starting (default {DEFAULT_CRASH_LOOP}); the replacement of each such "
                        "death waits 0.25 s, doubled per death in the row, at most 10 s")
    p.add_argument("--fast-death-ms", type=int, default=int(FAST_DEATH_S * 1000), metavar="MS",
                   help=f"with --processes: a child that dies sooner than this after its start is a fast death "
                        f"(default {FAST_DEATH_S * 1000:.0f}; 0: none is, so every death is replaced at once and "
                        "--crash-loop never gives up)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve per-task Prometheus metrics (run time, queue wait, runs by outcome; README, Metrics) "
                        "on http://HOST:PORT/metrics; a Tasks target only; with --processes the supervisor serves "
                        "them summed over its children; 0 picks a free port (logged); needs pyqueue-redis[metrics]")
    p.add_argument("--metrics-host", default=None, metavar="HOST",
                   help=f"the address --metrics-port listens on (default {DEFAULT_METRICS_HOST}: loopback only)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("enqueue", help="enqueue one job")
    p.add_argument("queue")
    p.add_argument("payload")
    p.add_argument("--id")
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--priority", type=int, default=0, help="-5..5; a higher level is leased sooner (default 0)")
    p.add_argument("--group", help="the job's group, for fair scheduling (see group-limit)")
    p.add_argument("--expires-ms", type=int, help="not leased within this long of now: it ends expired, never run")
    p.add_argument("--debounce-ms", type=int,
                   help="with --key: due this long after the key's last send, which replaces its payload")
    p.add_argument("--throttle-ms", type=int, help="with --key: at most one job per key per this long")
    p.add_argument("--key", help="the debounce or throttle key")
    p.add_argument("--sequence", help="the sequence key: its jobs run one at a time, in send order")
    p.add_argument("--on-failure", choices=("block", "skip"), default="block",
                   help="with --sequence: what its dead job does: block the key (default) or let the next run")
    p.add_argument("--rate-key", help="the rate key: its jobs are leased no faster than --rate-limit")
    p.add_argument("--rate-limit", metavar="COUNT/PERIOD", help="with --rate-key: 100/s, 5/m, 1/h, 20/500ms")
    p.add_argument("--rate-burst", type=int, default=1, help="with --rate-limit: leases at once after a quiet spell "
                                                             "(default 1: evenly spaced)")
    p.add_argument("--cost", type=int, default=1, help="with --rate-key: the permits this job takes (default 1)")
    p.add_argument("--raw", action="store_true",
                   help="enqueue even into a queue whose workers serve tasks (the job is no task: they dead-letter it)")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("send", help="send a task by name, to the queue its workers serve it on")
    p.add_argument("task", help="the task's name (@tasks.task(name=...), or module.function)")
    p.add_argument("--args", default="[]", help="its positional arguments, a JSON array (default [])")
    p.add_argument("--kwargs", default="{}", help="its keyword arguments, a JSON object (default {})")
    p.add_argument("--queue", help="the queue (default: the one its live workers serve it on)")
    p.add_argument("--delay", type=float, default=0.0, metavar="SECONDS", help="run no earlier than this (default 0)")
    p.add_argument("--id", help="a job id: sending the same id again adds nothing (default: a random one)")
    p.add_argument("--max-attempts", type=int,
                   help="attempts before the dead letters (default 5: the task's own max_attempts is not known here)")
    p.set_defaults(func=cmd_send)

    p = sub.add_parser("stats", help="per-state counts, lag and counters")
    p.add_argument("queue", nargs="*", help="default: every queue under the prefix")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("budget", help="cap the payload bytes a queue holds (or: off); an enqueue past it is "
                                      "refused with QueueFull")
    p.add_argument("queue")
    p.add_argument("size", help="512MiB, 1GB, 64KiB, 1000 (bytes); or off")
    p.add_argument("--results", action="store_true", help="cap the bytes of results the queue keeps instead: past "
                                                          "it, ack_result deletes the oldest-expiring results first")
    p.add_argument("--create", action="store_true", help=CREATE_HELP)
    p.set_defaults(func=cmd_budget)

    p = sub.add_parser("tombstones", help="cap how many tombstones (ended ids kept as duplicates) a queue keeps "
                                          "(or: off)")
    p.add_argument("queue")
    p.add_argument("max", help="the most tombstones kept (100000), or off")
    p.add_argument("--create", action="store_true", help=CREATE_HELP)
    p.set_defaults(func=cmd_tombstones)

    p = sub.add_parser("indexes", help="keep a queue's search indexes by task and group (or: off)")
    p.add_argument("queue")
    p.add_argument("on", choices=["on", "off"])
    p.add_argument("--create", action="store_true", help=CREATE_HELP)
    p.set_defaults(func=cmd_indexes)

    p = sub.add_parser("search", help="find jobs in any state by state, task, group, error class and time; and "
                                      "replay, purge, cancel or promote what is found")
    p.add_argument("queue")
    p.add_argument("--state", choices=["ready", "scheduled", "waiting", "sequenced", "leased", "dead"])
    p.add_argument("--task", help="the jobs of this task (needs indexes: pyqueue indexes QUEUE on)")
    p.add_argument("--group", help="the jobs of this group (needs indexes)")
    p.add_argument("--error", metavar="CLASS", help="dead jobs whose error is this exception class (TimeoutError)")
    p.add_argument("--since", metavar="WHEN", help="died (dead jobs) or sent (others) at or after WHEN: HH:MM (today, "
                                                   "UTC) or ISO 8601")
    p.add_argument("--until", metavar="WHEN", help="died or sent before WHEN")
    p.add_argument("--limit", type=int, default=50, help="rows shown (1..500, default 50)")
    p.add_argument("--cursor", default="", help="go on from where a page stopped")
    for action, text in (("replay", "replay the dead jobs found"), ("purge", "delete the dead jobs found"),
                         ("cancel", "cancel the jobs found, in any state"),
                         ("promote", "make the scheduled jobs found due now")):
        p.add_argument("--" + action, action="store_true", help=text + " (each job's state is checked again as it is "
                                                                      "acted on)")
    p.add_argument("--dry-run", action="store_true", help="with an action: say how many it would act on, change nothing")
    p.add_argument("--all", action="store_true", help="every job found, page after page, in place of --limit (each "
                                                      "page is one atomic read: a job that moves meanwhile may be "
                                                      "seen twice or missed)")
    p.add_argument("--json", action="store_true", help="one JSON object per job found (an action: one for its "
                                                       "counts); the summary and the next cursor go to stderr")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("memory", help="what each queue holds in Redis: jobs, results, tombstones, events, indexes")
    p.add_argument("queue", nargs="*", help="default: every queue under the prefix")
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("services", help="registered workers")
    p.set_defaults(func=cmd_services)

    p = sub.add_parser("stop", help="remote shutdown of a service")
    p.add_argument("service_id", type=int)
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("dead", help="dead letters: list, replay, purge")
    p.add_argument("action", choices=["list", "replay", "purge"])
    p.add_argument("queue", nargs="?", help="the queue (list without it: every queue of every primary)")
    p.add_argument("--id", action="append", help="only these ids (repeat)")
    p.add_argument("--limit", type=int, default=100, help="list: rows shown; replay/purge without a filter: the "
                                                          "oldest this many (default 100)")
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--task", help="filter: the dead jobs of this task (by the queue's indexes when it keeps them, "
                                  "else read from each dead job's payload)")
    p.add_argument("--error", metavar="CLASS", help="filter: the dead jobs whose error is this exception class "
                                                    "(TimeoutError)")
    p.add_argument("--since", metavar="WHEN", help="filter: died at or after WHEN: HH:MM (today, UTC) or ISO 8601")
    p.add_argument("--until", metavar="WHEN", help="filter: died before WHEN")
    p.add_argument("--dry-run", action="store_true",
                   help="with a filter: say how many replay/purge would move, and change nothing")
    p.set_defaults(func=cmd_dead)

    for command, text in (("pause", "stop a queue from handing out jobs (enqueue goes on)"),
                          ("resume", "let a paused queue hand out jobs again")):
        p = sub.add_parser(command, help=text)
        p.add_argument("queue")
        if command == "pause":
            p.add_argument("--create", action="store_true", help=CREATE_HELP)
        p.set_defaults(func=cmd_pause)  # args.command names which (the subparsers' dest)

    p = sub.add_parser("limit", help="cap how fast a queue hands out jobs, across all workers (or: off); with --key, "
                                     "how fast the jobs of one rate key are")
    p.add_argument("queue")
    p.add_argument("rate", help="COUNT/PERIOD: 100/s, 5/m, 1/h, 20/500ms; or off; with --key also default (the "
                                "limit its jobs were sent with)")
    p.add_argument("--key", help="a rate key (enqueue --rate-key, a task's rate_key): set its limit at run time, "
                                 "over the one its jobs carry")
    p.add_argument("--burst", type=int, default=1,
                   help="leases at once after a quiet spell (default 1: evenly spaced, never more than COUNT "
                        "in any PERIOD)")
    p.add_argument("--create", action="store_true", help=CREATE_HELP)
    p.set_defaults(func=cmd_limit)

    p = sub.add_parser("group-limit", help="cap how many jobs of one group run at once, for every group or one")
    p.add_argument("queue")
    p.add_argument("cap", help="a number of jobs; off (no cap); with --group also default (back to the default cap)")
    p.add_argument("--group", help="only this group (its own cap wins over the default)")
    p.add_argument("--create", action="store_true", help=CREATE_HELP)
    p.set_defaults(func=cmd_group_limit)

    p = sub.add_parser("groups", help="groups with ready jobs: ready and running counts, caps, parked ones")
    p.add_argument("queue")
    p.add_argument("--limit", type=int, default=100, help="most groups per partition (1..1000)")
    p.set_defaults(func=cmd_groups)

    p = sub.add_parser("result", help="a job's result, or its last error if it died")
    p.add_argument("queue")
    p.add_argument("id")
    p.add_argument("--wait-ms", type=int, default=0, help="wait this long for it while it is pending")
    p.set_defaults(func=cmd_result)

    p = sub.add_parser("cancel", help="cancel a job: removed now, or stopped at its worker's next extension")
    p.add_argument("queue")
    p.add_argument("id")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("signal", help="send a job a signal its task waits for (current_job().wait_signal)")
    p.add_argument("queue")
    p.add_argument("id")
    p.add_argument("name")
    p.add_argument("data", nargs="?", default="null", help="JSON (default: null)")
    p.set_defaults(func=cmd_signal)

    p = sub.add_parser("sequence", help="sequences: skip a dead head that blocks its key")
    seq = p.add_subparsers(dest="action", required=True)
    p = seq.add_parser("skip", help="the next job of the key runs; the dead head stays a dead letter")
    p.add_argument("queue")
    p.add_argument("key")
    p.set_defaults(func=cmd_sequence_skip)

    p = sub.add_parser("job", help="where is a job: its state, attempts, lease or last error")
    p.add_argument("queue")
    p.add_argument("id")
    p.add_argument("--payload", action="store_true", help="print the payload too (it may hold personal data)")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("events", help="a queue's event stream: print it, follow it, or opt in (--keep N)")
    p.add_argument("queue")
    p.add_argument("--create", action="store_true", help="with --keep: " + CREATE_HELP)
    p.add_argument("--since", default=None,
                   help="print the events after this event number, or only new ones (now); default: from the "
                        "oldest kept")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events until interrupted")
    p.add_argument("--count", type=int, default=100, help="events per read (1..1000)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--keep", type=int, default=None, metavar="N",
                   help="opt the queue in, keeping its newest N events (every producer and worker writes them "
                        "from their next call); 0 opts out")
    p.set_defaults(func=cmd_events)

    p = sub.add_parser("flow", help="workflows: show a flow's steps and their states")
    flow = p.add_subparsers(dest="flow_command", required=True)
    p = flow.add_parser("show", help="a flow's tree, each step with its state, by the flow's id")
    p.add_argument("queue", help="the queue of the flow's first step (its record is kept there)")
    p.add_argument("id", help="the flow's id (FlowHandle.id)")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_flow_show)

    p = sub.add_parser("metrics", help="serve Prometheus metrics on /metrics, and the autoscaling signal for KEDA "
                                       "on /backlog (needs pyqueue-redis[metrics])")
    p.add_argument("--port", type=int, default=9808, help="default 9808; 0 picks a free port")
    p.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1: loopback only)")
    p.add_argument("-q", "--queue", action="append", help="only these queues (default: every queue found at each scrape)")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("dashboard", help="serve the web dashboard (needs pyqueue-redis[dashboard])")
    p.add_argument("--port", type=int, default=8080, help="default 8080; 0 picks a free port")
    p.add_argument("--bind", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: loopback only; anything else needs --token)")
    p.add_argument("--token", default=os.environ.get("PYQUEUE_DASHBOARD_TOKEN", ""),
                   help="required of every request: HTTP Basic password (any user name) or Bearer token; "
                        "at least 16 characters (env PYQUEUE_DASHBOARD_TOKEN, which keeps it out of ps)")
    p.add_argument("--show-payloads", action="store_true",
                   help="show dead letters' payloads (hidden by default: they may hold personal data)")
    p.add_argument("--read-only", action="store_true",
                   help="offer no action (replay, purge, cancel, pause, bulk actions) and refuse every POST")
    p.add_argument("-q", "--queue", action="append", help="only these queues (default: every queue found)")
    p.add_argument("--workers-namespace", action="append", metavar="NS",
                   help="service namespaces whose workers to show (repeat; default: --namespace)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between history points (default 5)")
    p.add_argument("--history-s", type=float, default=600.0, help="seconds of history to keep (default 600)")
    p.add_argument("--worker-metrics", action="append", metavar="URL",
                   help="a worker's (or a --processes supervisor's) metrics, http://HOST:PORT/metrics from "
                        "`pyqueue worker --metrics-port`: the Tasks panel shows runs, failures and p50/p99 "
                        "durations summed over every URL given (repeat; needs pyqueue-redis[metrics])")
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("demo", help="the main job: workers drain two queues while one is killed")
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--dashboard", action="store_true",
                   help="serve the dashboard on 127.0.0.1 while the demo runs, and after it until Ctrl-C "
                        "(needs pyqueue-redis[dashboard])")
    p.add_argument("--dashboard-port", type=int, default=8080, help="the dashboard's port (default 8080; 0: any)")
    p.set_defaults(func=cmd_demo)
    for each in commands(parser):
        add_connection_options(each, defaults=False)
    return parser


#: The clients the running command opened, closed when it ends: a command run inside a
#: long-lived process (``main([...])`` from code or a test) leaves no connection behind.
_opened: list[Client] = []


def connect(url: str) -> Client:
    """:func:`pyqueue.drivers.clients.connect`, the client remembered to be closed when
    the command ends (but the embedded fakeredis, which the process shares)."""
    client = _connect(url)
    if client is not embedded_redis():
        _opened.append(client)
    return client


def close_opened() -> None:
    """Close the clients the command opened (each once; a close that fails is ignored:
    the command's outcome is decided)."""
    while _opened:
        client = _opened.pop()
        try:
            client.close()
        except Exception:  # the connection may be gone already
            log.debug("closing a client failed", exc_info=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    #: The command line, as a supervisor's children run it again.
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    # The processes of `--processes N` share one log: each line says which process wrote it.
    several = getattr(args, "processes", None) is not None or ENV_VAR in os.environ
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s" + ("[%(process)d]" if several else "") + ": %(message)s",
    )
    try:
        check_name(args.prefix, "prefix")
        if args.url == "embedded" and args.command not in ("demo",):
            log.warning("--url is the embedded fakeredis: no other process sees these queues")
        return int(args.func(args))
    except (PyQueueError, redis.RedisError) as exc:
        if isinstance(exc, redis.RedisError):
            exc = map_redis_error(exc)
        print(f"pyqueue: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of stdout went away (`pyqueue search ... --json | head`): stop
        # quietly, as a Unix tool does, not with a traceback. stdout points at devnull so
        # that the interpreter's last flush fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it
    finally:
        close_opened()


if __name__ == "__main__":
    sys.exit(main())
