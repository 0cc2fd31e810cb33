"""The dashboard's web layer: a Starlette app, thin over the driver's verbs.

Routes (all relative, so the app also works behind a proxy under a path prefix):

=====================================================  ==========================================
``GET /``                                              the page, with the first data inlined
``GET /api/overview?since=<ms>``                       queues (stats, unserved tasks), workers, history
``GET /api/queues/<queue>/dead?offset=&limit=``        one page of dead letters (``Queue.dead_list``)
``GET /api/queues/<queue>/job?id=<id>``                one job by id (``Queue.get``)
``GET /api/queues/<queue>/jobs?state=&start=&count=``  one page of its jobs in a state (:func:`jobs_page`)
``GET /api/queues/<queue>/result?id=<id>``             a done job's kept result (``Queue.result``)
``GET /api/queues/<queue>/groups?limit=``              its groups with ready jobs (``Queue.groups``)
``GET /api/queues/<queue>/flow?id=<id>``               a flow's tree, each step's state (:mod:`.flows`)
``POST /api/queues/<queue>/actions/<action>``          one entry of :data:`ACTIONS` (JSON body)
``GET /search?queue=&state=&task=&...&cursor=``        the search box's page of results (:mod:`.search`)
``GET /bulk?queue=&action=&<the search's fields>``     a bulk action's confirmation: its count now
``POST /bulk`` (a form: CSRF token, filter, count)     the bulk action (``act_matching``), its outcome
``GET /static/...``                                    the page's own CSS, JS and icon
=====================================================  ==========================================

Every state change is a row of :data:`ACTIONS`: a name, whether it takes job ids, and
the driver call, plus a button in ``static/dashboard.js``: dead-letter replay and purge,
a queue's pause and resume, a looked-up job's cancel, and a group cap (``group_limit``,
the only one whose body is not ids: see :mod:`.groups`). The job id of a lookup (and a
flow's id) is a query parameter, not a path segment: an id may hold any character but
control characters, ``/`` included.

The search box and its bulk actions are pages rendered here (``search.html``,
``bulk.html``; see :mod:`.search`), so a bulk action is a plain form: its CSRF token is
a hidden field instead of a header, checked the same way. In read-only mode
(``DashboardConfig.read_only``) no action is offered and every POST is refused (403).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import jinja2
import redis as redis_lib
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyqueue.drivers.clients import Client, check_server
from pyqueue.dashboard.flows import flow_page
from pyqueue.dashboard.groups import (
    GROUPS_PAGE,
    GROUPS_PAGE_MAX,
    cap_message,
    groups_page,
    parse_cap_change,
    set_cap,
)
from pyqueue.dashboard import search as searching
from pyqueue.dashboard.history import CENSUS_S, SERIES, Point, QueueRow, Sampler, Snapshot, WorkerRow
from pyqueue.dashboard.security import (
    CSRF_COOKIE,
    CSRF_HEADER,
    REALM,
    Csrf,
    authorized,
    host_name,
    same_origin,
)
from pyqueue.dashboard.taskview import FRESH_S, TaskView
from pyqueue.protocol.errors import InvalidArgument, PyQueueError
from pyqueue.protocol.verbs.events import MAX_EVENTS_PAGE
from pyqueue.protocol.verbs.search import SEARCH_STATES
from pyqueue.protocol.verbs.steps import TIMED_OUT, JobSteps
from pyqueue.drivers.queue import Queue
from pyqueue.ops.find import BulkResult, JobFilter, act_matching
from pyqueue.tasks.flowview import no_record_message

HERE = Path(__file__).resolve().parent
#: Dead letters per page, and the most one request may ask for.
DEAD_PAGE, DEAD_PAGE_MAX = 50, 500
#: Error text and payload shown per dead letter (the page is for reading, not export).
TEXT_LIMIT = 4096
#: Jobs per page of the Jobs panel, and the most one request may ask for.
JOBS_PAGE, JOBS_PAGE_MAX = 50, 200
#: Events the Events panel shows at first (the newest), and reads at most per poll.
EVENTS_PAGE = 50
#: The states the Jobs panel shows: ``Queue.browse``'s, and the dead letters.
JOB_STATES = ("ready", "scheduled", "running", "done", "dead")
#: Ids one action may name (the scripts take at most 1,000 per call).
MAX_IDS = 1000
#: "All" replays or purges in batches of this many, for at most this long per request.
ALL_BATCH, ALL_SECONDS = 500, 20.0

#: Sent with every response. No inline script or style is needed: the first data is a
#: JSON block the script reads, and charts are SVG drawn through the DOM.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}


@dataclass(frozen=True)
class DashboardConfig:
    """How a dashboard reads and what it allows.

    Args:
        redis: a client of the queues' server or cluster.
        prefix: the key prefix.
        queues: only these queues (default: every queue found).
        namespaces: the service namespaces whose workers to show.
        token: required of every request when set (see :mod:`.security`).
        show_payloads: show dead letters' payloads (they may hold personal data).
        allowed_hosts: Host header names to answer (None: any; a loopback-bound
            dashboard gets the loopback names, see :func:`.security.loopback_hosts`).
        every_s, history_s: history sampling period and length (see :class:`Sampler`).
        poll_s: how often the page asks for new data.
        fresh_s: a poll reuses a snapshot younger than this (tests: 0, read anew).
        census_s: how often each queue's waiting task names are read again, to show
            those no live worker serves (see :class:`Sampler`; tests: short).
        label: what the page says it is connected to (a URL without credentials).
        worker_metrics: the workers' metrics URLs (``pyqueue worker --metrics-port``)
            the task view reads and sums (see :mod:`.taskview`); none: no task view.
        read_only: offer no action (no button, no bulk action) and refuse every POST
            (403): a dashboard to look, search and read only.
    """

    redis: Client
    prefix: str = "pq"
    queues: Sequence[str] | None = None
    namespaces: Sequence[str] = ("workers",)
    token: str | None = None
    show_payloads: bool = False
    allowed_hosts: frozenset[str] | None = None
    every_s: float = 5.0
    history_s: float = 600.0
    poll_s: float = 2.0
    fresh_s: float = 1.0
    census_s: float = CENSUS_S
    label: str = ""
    worker_metrics: Sequence[str] = ()
    read_only: bool = False


# -- actions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """A state change the page may ask for: one driver verb on one queue.

    ``run(queue, argument)`` gets what :meth:`argument` made of the request's JSON body:
    by default the ids it named, or None for "every job" (only when ``takes_ids``; an
    action without ids gets None). It returns how many jobs (or settings) it changed,
    and whether more remain."""

    name: str
    takes_ids: bool
    run: Callable[[Queue, Any], tuple[int, bool]]
    #: The page's message: "<count> <done>"; for an action without ids, "<queue>
    #: <done>", or "<queue> <unchanged>" when it changed nothing (count 0).
    done: str = ""
    unchanged: str = ""
    #: For an action whose body says more than ids: its argument from the body (raises
    #: InvalidArgument, before anything runs), and its message from the queue's name,
    #: that argument and the count.
    parse: Callable[[object], Any] | None = None
    say: Callable[[str, Any, int], str] | None = None

    def argument(self, body: object) -> Any:
        return self.parse(body) if self.parse is not None else _action_ids(self, body)

    def message(self, queue: str, count: int, more: bool, argument: Any = None) -> str:
        if self.say is not None:
            return self.say(queue, argument, count)
        if not self.takes_ids:
            return f"{queue} {self.done if count else self.unchanged}"
        return f"{count} {self.done}" + (" (more remain: ask again)" if more else "")


def _cancel(queue: Queue, ids: list[str] | None) -> int:
    """Cancel the jobs named (never "every job": there is no such button); how many
    this call ended."""
    if ids is None:
        raise InvalidArgument('name the jobs to cancel: {"ids": [...]}')
    return sum(queue.cancel(job_id).cancelled for job_id in ids)


def _some_or_all(verb: str) -> Callable[[Queue, list[str] | None], tuple[int, bool]]:
    """The dead-letter verb ``verb`` (looked up on the queue, so a partitioned queue's
    own runs) on the ids given, or on every dead job: batches of
    :data:`ALL_BATCH` oldest first until none is left, for at most :data:`ALL_SECONDS`
    (then ``more`` is true and the page says so). Returns (count, more)."""

    def run(queue: Queue, ids: list[str] | None) -> tuple[int, bool]:
        call: Callable[..., int] = getattr(queue, verb)
        if ids is not None:
            return call(ids), False
        total, deadline = 0, time.monotonic() + ALL_SECONDS
        while time.monotonic() < deadline:
            moved = call(None, limit=ALL_BATCH)
            total += moved
            if moved == 0:
                return total, False
        return total, True

    return run


ACTIONS: dict[str, Action] = {
    action.name: action
    for action in (
        Action("dead_replay", True, _some_or_all("dead_replay"), "replayed"),
        Action("dead_purge", True, _some_or_all("dead_purge"), "purged"),
        # A partitioned queue pauses and resumes every partition (count 1 if any changed).
        Action("pause", False, lambda q, _: (int(q.pause()), False), "paused", "was paused already"),
        Action("resume", False, lambda q, _: (int(q.resume()), False), "resumed", "was not paused"),
        Action("cancel", True, lambda q, ids: (_cancel(q, ids), False), "cancelled"),
        # A partitioned queue sets the cap in every partition (a group lives in one).
        Action("group_limit", False, set_cap, parse=parse_cap_change, say=cap_message),
    )
}


# -- JSON shapes -----------------------------------------------------------------------


def overview(snapshot: Snapshot, points: list[Point]) -> dict[str, Any]:
    """The page's data: every queue's stats (summed over partitions), throughput and
    the task names with jobs waiting that no live worker serves (``unserved_tasks``:
    ``{"task", "jobs"}`` with the sampled job count; ``census_ms``: when the sample was
    read, 0 if not yet), the workers with the task names they advertise, and the
    history points given, column by column."""
    queues = []
    for row in snapshot.queues:
        stats = dataclasses.asdict(row.stats)
        del stats["now_ms"]
        queues.append({"name": row.name, "partitions": row.partitions, **stats,
                       "acked_per_s": round(row.acked_per_s, 3),
                       "unserved_tasks": [{"task": task, "jobs": jobs} for task, jobs in row.unserved],
                       "census_ms": row.census_ms})
    workers = [
        {
            "namespace": w.namespace, "id": w.info.id,
            "state": ("stopping" if w.info.stopping else "alive") if w.info.alive else "dead",
            "host": w.info.host, "pid": w.info.pid, "queues": w.info.queues, "tasks": list(w.info.tasks),
            "started_ms": w.info.started_ms, "renewed_ms": w.info.renewed_ms, "expires_ms": w.info.expires_ms,
        }
        for w in snapshot.workers
    ]
    names = sorted({name for p in points for name in p.values})
    history = {
        "t": [p.t_ms for p in points],
        "series": list(SERIES),
        "queues": {
            name: {s: [p.values[name][i] if name in p.values else None for p in points] for i, s in enumerate(SERIES)}
            for name in names
        },
    }
    return {"now_ms": snapshot.now_ms, "error": snapshot.error, "queues": queues, "workers": workers,
            "history": history}


def _clip(text: str) -> tuple[str, bool]:
    return (text[:TEXT_LIMIT], True) if len(text) > TEXT_LIMIT else (text, False)


def _clip_bytes(data: bytes) -> tuple[str, bool]:
    """A payload as text (invalid UTF-8 replaced), clipped to :data:`TEXT_LIMIT`
    characters. A character is at most 4 bytes and an invalid byte becomes one, so the
    first ``4 * TEXT_LIMIT + 4`` bytes decode to more than the limit whenever there is
    more than that."""
    return _clip(data[: 4 * TEXT_LIMIT + 4].decode("utf-8", "replace"))


def dead_page(queue: Queue, offset: int, limit: int, show_payloads: bool) -> dict[str, Any]:
    """One page of a queue's dead letters; payloads only when the dashboard shows them."""
    page = queue.dead_list(offset, limit)
    jobs = []
    for job in page.jobs:
        error, error_cut = _clip(job.error)
        item: dict[str, Any] = {"id": job.id, "dead_ms": job.dead_ms, "attempts": job.attempts,
                                "max_attempts": job.max_attempts, "error": error, "error_truncated": error_cut,
                                "payload_bytes": len(job.payload)}
        if show_payloads:
            item["payload"], item["payload_truncated"] = _clip_bytes(job.payload)
        jobs.append(item)
    return {"queue": queue.name, "total": page.total, "offset": offset, "limit": limit, "jobs": jobs}


def jobs_page(
    queue: Queue, state: str, start: int, count: int, row: QueueRow | None, workers: Sequence[WorkerRow] = ()
) -> dict[str, Any]:
    """One page of a queue's jobs in ``state`` (:data:`JOB_STATES`): ``Queue.browse``,
    or ``Queue.dead_list`` for the dead ones (their errors clipped, no payload: the
    dead letters panel shows those). Never a payload. Each job as its fields
    (``JobEntry``'s, plus ``waiting`` for scheduled ones; ``queue``: the partition that
    holds it). A running job also has ``leased_ms`` and ``limit_ms`` (its time limit's
    end), as its worker reported them at its last renewal (``workers``: the latest
    sample's; null when not reported yet, or for a lease no worker holds), and
    ``progress`` (clipped text, null if none). With the queue's task names no live
    worker serves, as the overview has them (``row``: its latest sample)."""
    body: dict[str, Any] = {"queue": queue.name, "state": state, "start": start, "count": count}
    if state == "dead":
        dead = queue.dead_list(start, count)
        jobs = []
        for job in dead.jobs:
            error, error_cut = _clip(job.error)
            jobs.append({"id": job.id, "dead_ms": job.dead_ms, "attempts": job.attempts,
                         "max_attempts": job.max_attempts, "error": error, "error_truncated": error_cut})
        body.update(total=dead.total, now_ms=0, jobs=jobs)
    else:
        page = queue.browse(state, start, count)
        entries: list[dict[str, Any]] = [{**dataclasses.asdict(e), "waiting": e.waiting} for e in page.jobs]
        if state == "running" and entries:
            reported = {(w.info.owner, r.queue, r.job_id): r for w in workers for r in w.info.running}
            progress = queue.progress_of([entry["id"] for entry in entries])
            for entry in entries:
                report = reported.get((entry["owner"], entry["queue"], entry["id"]))
                entry["leased_ms"] = report.leased_ms if report else None
                entry["limit_ms"] = report.limit_ms if report else None
                shown = progress.get(entry["id"])
                entry["progress"] = _clip(shown.value.decode("utf-8", "replace"))[0] if shown else None
        body.update(total=page.total, now_ms=page.now_ms, jobs=entries)
    body["unserved_tasks"] = [{"task": task, "jobs": jobs} for task, jobs in (row.unserved if row else ())]
    body["census_ms"] = row.census_ms if row else 0
    return body


def result_info(queue: Queue, job_id: str) -> dict[str, Any]:
    """A job's outcome as ``Queue.result`` reads it, the value as text (JSON for a
    JSON value, bytes decoded with invalid UTF-8 replaced) clipped to
    :data:`TEXT_LIMIT`; ``value`` null when no result is kept."""
    found = queue.result(job_id)
    value: str | None = None
    cut = False
    if found.state == "ok":
        raw = found.value
        if isinstance(raw, bytes):
            value, cut = _clip_bytes(raw)
        else:
            value, cut = _clip(raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False))
    error, error_cut = _clip(found.error)
    return {"id": found.id, "queue": found.queue, "state": found.state, "finished_ms": found.finished_ms,
            "value": value, "value_truncated": cut, "error": error, "error_truncated": error_cut}


def job_info(queue: Queue, job_id: str, show_payloads: bool) -> dict[str, Any]:
    """One job as ``Queue.get`` reads it (``queue``: the partition that holds it), plus
    ``exists``. Its error clipped as a dead letter's is; its payload as text, only when
    the dashboard shows payloads (null for a job that is done or unknown), else only
    ``payload_bytes``. A running job's progress (``Queue.progress_of``: what its task
    reported with ``current_job().progress``) as text with ``progress_written_ms``;
    null for a job that is not running or reported none. Its durable steps, sleeps,
    waits and signals (``Queue.steps``) as ``steps``: kind, name, until_ms (a sleep's
    end, a wait's timeout) and, only when the dashboard shows payloads, the value as
    text (a step's result may hold personal data, as a payload may)."""
    info = queue.get(job_id, with_payload=show_payloads)
    item = dataclasses.asdict(info)
    item["exists"] = info.exists
    progress = queue.progress_of([info.id]).get(info.id) if info.state == "leased" else None
    item["progress"] = None if progress is None else progress.value.decode("utf-8", "replace")
    item["progress_written_ms"] = None if progress is None else progress.written_ms
    item["error"], item["error_truncated"] = _clip(info.error)
    item["steps"] = step_entries(queue.steps(info.id), show_payloads) if info.exists else []
    del item["payload"]
    if show_payloads:
        shown = (None, False) if info.payload is None else _clip_bytes(info.payload)
        item["payload"], item["payload_truncated"] = shown
    return item


def step_entries(found: JobSteps, show_values: bool) -> list[dict[str, Any]]:
    """A job's durable steps for the job view: committed steps (``step``; a wait's
    outcome too), sleeps and waits not ended (``sleep``, ``wait``), signals not taken
    (``signal``), in that order."""
    entries: list[dict[str, Any]] = []

    def add(kind: str, name: str, value: bytes | None, until_ms: int = -1) -> None:
        entry: dict[str, Any] = {"kind": kind, "name": name, "until_ms": until_ms}
        if show_values and value is not None:
            text = "timed out" if kind == "step" and value == TIMED_OUT else \
                value[1:].decode("utf-8", "replace") if value[:1] == b"j" else f"{len(value)} bytes"
            entry["value"], entry["value_truncated"] = _clip(text)
        entries.append(entry)

    for name, value in found.results.items():
        add("step", name, value)
    for name, park in found.parks.items():
        if name not in found.results and (park.kind == "wait" or park.until_ms > found.now_ms):
            add(park.kind, name, None, park.until_ms)
    for name, value in found.signals.items():
        if name not in found.results:
            add("signal", name, value)
    return entries


# -- the request guard -------------------------------------------------------------------


class Guard:
    """ASGI middleware in front of everything: answers only allowed Host names, asks
    every request for the token when there is one (401 with a Basic challenge, so a
    browser prompts), records how the request authenticated (``scope["state"]["auth"]``)
    and adds :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp, *, token: str | None, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.token = token
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    out.setdefault(name, value)
            await send(message)

        refusal: Response | None = None
        auth = "none"
        if self.allowed_hosts is not None and host_name(headers.get("host", "")) not in self.allowed_hosts:
            refusal = PlainTextResponse("unknown Host header (this dashboard answers loopback names only)", 400)
        elif self.token is not None:
            how = authorized(self.token, headers.get("authorization"))
            if how is None:
                refusal = PlainTextResponse(
                    "the dashboard token is required (HTTP Basic: any user, the token as password; or "
                    "Authorization: Bearer <token>)", 401,
                    headers={"www-authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
                )
            else:
                auth = how
        if refusal is not None:
            await refusal(scope, receive, send_secured)
            return
        scope.setdefault("state", {})["auth"] = auth
        await self.app(scope, receive, send_secured)


# -- the app ---------------------------------------------------------------------------


def _json_error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _int_param(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name} must be in {lo}..{hi}, got {value}")
    return value


class NoSuchQueue(LookupError):
    """A URL names a queue the dashboard does not show (404)."""


#: What the search and bulk pages say on the page instead of raising (see ``failed``).
PAGE_ERRORS = (NoSuchQueue, InvalidArgument, PyQueueError, redis_lib.RedisError)


def _handles_errors(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Driver errors as JSON: a queue it does not show is 404, a refused argument is the
    caller's (400), an unreachable Redis is not (503)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except NoSuchQueue as exc:
            return _json_error(str(exc), 404)
        except InvalidArgument as exc:
            return _json_error(str(exc), 400)
        except (PyQueueError, redis_lib.RedisError) as exc:
            return _json_error(f"{type(exc).__name__}: {exc}", 503)

    return wrapped


def create_app(config: DashboardConfig, *, sampler: Sampler | None = None) -> Starlette:
    """The dashboard as an ASGI app. Its lifespan starts and stops the sampler thread
    (``sampler``: one made already, e.g. with a shorter period for a test)."""
    check_server(config.redis)  # the eviction-policy warning, once per process and server
    sampler = sampler or Sampler(config.redis, prefix=config.prefix, queues=config.queues,
                                 namespaces=config.namespaces, every_s=config.every_s, history_s=config.history_s,
                                 fresh_s=config.fresh_s, census_s=config.census_s)
    csrf = Csrf()
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    page_template = templates.get_template("index.html")
    search_template = templates.get_template("search.html")
    bulk_template = templates.get_template("bulk.html")
    task_view = TaskView(config.worker_metrics, fresh_s=min(FRESH_S, config.fresh_s))

    async def queue_of(request: Request) -> Queue:
        """The queue the URL names, or NoSuchQueue (404)."""
        return await queue_named(request.path_params["queue"])

    async def queue_named(name: str) -> Queue:
        """The queue ``name``, or NoSuchQueue (404)."""
        queue = await run_in_threadpool(sampler.queue, name)
        if queue is None:
            raise NoSuchQueue(f"no queue {name!r}")
        return queue

    def csrf_token(request: Request) -> str:
        """The browser's CSRF token if this process signed it, else a new one."""
        cookie = request.cookies.get(CSRF_COOKIE)
        return cookie if cookie and csrf.signed(cookie) else csrf.new_token()

    def html_page(request: Request, template: jinja2.Template, status: int = 200, **context: Any) -> Response:
        """A page of ``template`` with the CSRF cookie its forms need (and its token as
        ``csrf_token``)."""
        token = csrf_token(request)
        html = template.render(csrf_token=token, label=config.label, read_only=config.read_only, **context)
        response = HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})
        response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return response

    def refusal(request: Request, token: str | None) -> str | None:
        """Why a state change is refused (403), or None: the dashboard is read-only, or
        the request came from another origin or without this browser's CSRF token
        (``token``: the header's, or a form's field). Authentication happened in Guard;
        what is left is whether this browser meant it. A Bearer request needs no CSRF
        token: browsers never add that header by themselves."""
        if config.read_only:
            return "this dashboard is read-only: it changes nothing"
        if request.scope.get("state", {}).get("auth") != "bearer":
            if not same_origin(request.headers.get("origin"), request.headers.get("host")):
                return "cross-origin request refused"
            if not csrf.check(request.cookies.get(CSRF_COOKIE), token):
                return "missing or invalid CSRF token (reload the page)"
        return None

    async def queue_names() -> list[str]:
        snapshot = await run_in_threadpool(sampler.snapshot)
        return [row.name for row in snapshot.queues]

    async def page(request: Request) -> Response:
        snapshot = await run_in_threadpool(sampler.snapshot)
        points = await run_in_threadpool(sampler.history)
        initial = {
            "overview": overview(snapshot, points),
            "config": {"poll_ms": int(config.poll_s * 1000), "history_ms": int(config.history_s * 1000),
                       "show_payloads": config.show_payloads,
                       "actions": [] if config.read_only else sorted(ACTIONS), "read_only": config.read_only,
                       "dead_page": DEAD_PAGE, "groups_page": GROUPS_PAGE, "jobs_page": JOBS_PAGE,
                       "label": config.label, "prefix": config.prefix,
                       "task_view": bool(config.worker_metrics), "events_page": EVENTS_PAGE},
        }
        return html_page(request, page_template, initial=initial, queues=[row.name for row in snapshot.queues],
                         queue="", form=searching.SearchForm(), states=SEARCH_STATES)

    @_handles_errors
    async def api_overview(request: Request) -> Response:
        since = _int_param(request, "since", -1, -1, 2**53)
        snapshot = await run_in_threadpool(sampler.snapshot)
        points = await run_in_threadpool(sampler.history, since)
        return JSONResponse(overview(snapshot, points), headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_tasks(request: Request) -> Response:
        body = await run_in_threadpool(task_view.read)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_events(request: Request) -> Response:
        count = _int_param(request, "count", EVENTS_PAGE, 1, MAX_EVENTS_PAGE)
        since = _int_param(request, "since", -1, -1, 2**63 - 1)
        queue = await queue_of(request)
        if since < 0:  # the newest, to start from
            page = await run_in_threadpool(queue.recent_events, count)
        else:
            page = await run_in_threadpool(queue.events, since, count)
        body = {"events": [event.as_json() for event in page.events], "last": page.last, "missed": page.missed}
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_dead(request: Request) -> Response:
        offset = _int_param(request, "offset", 0, 0, 2**31)
        limit = _int_param(request, "limit", DEAD_PAGE, 1, DEAD_PAGE_MAX)
        queue = await queue_of(request)
        body = await run_in_threadpool(dead_page, queue, offset, limit, config.show_payloads)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_job(request: Request) -> Response:
        job_id = request.query_params.get("id")
        if job_id is None:
            raise InvalidArgument("name the job: ?id=<job id>")
        queue = await queue_of(request)
        body = await run_in_threadpool(job_info, queue, job_id, config.show_payloads)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_jobs(request: Request) -> Response:
        state = request.query_params.get("state", "ready")
        if state not in JOB_STATES:
            raise InvalidArgument(f"state must be one of {', '.join(JOB_STATES)}, got {state!r}")
        start = _int_param(request, "start", 0, 0, 2**31)
        count = _int_param(request, "count", JOBS_PAGE, 1, JOBS_PAGE_MAX)
        queue = await queue_of(request)
        snapshot = await run_in_threadpool(sampler.snapshot)
        row = next((row for row in snapshot.queues if row.name == queue.name), None)
        body = await run_in_threadpool(jobs_page, queue, state, start, count, row, snapshot.workers)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_result(request: Request) -> Response:
        job_id = request.query_params.get("id")
        if job_id is None:
            raise InvalidArgument("name the job: ?id=<job id>")
        queue = await queue_of(request)
        body = await run_in_threadpool(result_info, queue, job_id)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_flow(request: Request) -> Response:
        flow_id = request.query_params.get("id")
        if flow_id is None:
            raise InvalidArgument("name the flow: ?id=<flow id>")
        queue = await queue_of(request)
        body = await run_in_threadpool(flow_page, config.redis, queue, flow_id, prefix=config.prefix,
                                       text_limit=TEXT_LIMIT)
        if body is None:
            return _json_error(no_record_message(queue.name, flow_id), 404)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_groups(request: Request) -> Response:
        limit = _int_param(request, "limit", GROUPS_PAGE, 1, GROUPS_PAGE_MAX)
        queue = await queue_of(request)
        body = await run_in_threadpool(groups_page, queue, limit)
        return JSONResponse(body, headers={"cache-control": "no-store"})

    @_handles_errors
    async def api_action(request: Request) -> Response:
        refused = refusal(request, request.headers.get(CSRF_HEADER))
        if refused is not None:
            return _json_error(refused, 403)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return _json_error("send the action as application/json", 415)
        action = ACTIONS.get(request.path_params["action"])
        if action is None:
            return _json_error(f"no action {request.path_params['action']!r}", 404)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            return _json_error("the body is not JSON", 400)
        argument = action.argument(body)
        queue = await queue_of(request)
        count, more = await run_in_threadpool(action.run, queue, argument)
        sampler.invalidate()
        return JSONResponse({"action": action.name, "queue": queue.name, "count": count, "more": more,
                             "message": action.message(queue.name, count, more, argument)})

    # -- the search box and its bulk actions (see .search) --------------------------------

    def failed(request: Request, template: jinja2.Template, context: dict[str, Any], exc: Exception) -> Response:
        """A queue not shown is 404; a refused filter 400, with the reason (and how to
        turn indexes on, when the filter needs them); an unreachable Redis 503."""
        if isinstance(exc, NoSuchQueue):
            status, said = 404, str(exc)
        elif isinstance(exc, InvalidArgument):
            status, said = 400, searching.reason(exc, context["queue"])
        else:
            status, said = 503, f"{type(exc).__name__}: {exc}"
        return html_page(request, template, status, **{**context, "message": said})

    async def search_page(request: Request) -> Response:
        params = request.query_params
        form = searching.SearchForm.of(params)
        name = params.get("queue", "")
        context: dict[str, Any] = {"queues": await queue_names(), "queue": name, "form": form,
                                   "states": SEARCH_STATES, "message": "", "rows": [], "searched": False,
                                   "summary": "", "more": "", "actions": [], "partitioned": False}
        if not name:
            return html_page(request, search_template, **context)
        try:
            queue = await queue_named(name)
            where = await run_in_threadpool(searching.read_filter, queue, form)
            found = await run_in_threadpool(lambda: queue.search(cursor=params.get("cursor", ""),
                                                                 count=searching.SEARCH_PAGE, **where.search_args()))
        except PAGE_ERRORS as exc:
            return failed(request, search_template, context, exc)
        context.update(
            searched=True, rows=[searching.row(job, found.now_ms, name) for job in found.jobs],
            summary=searching.summary(found, where),
            more=searching.search_link(name, form, found.cursor) if found.cursor else "",
            actions=[] if config.read_only else searching.offered_actions(where),
            partitioned=queue.spec.partitions > 1,
        )
        return html_page(request, search_template, **context)

    def bulk_context(name: str, action: str, where: JobFilter) -> dict[str, Any]:
        return {"queue": name, "action": action, "action_label": searching.ACTION_LABELS.get(action, ("", ""))[0],
                "filter": searching.describe(where), "fields": searching.filter_fields(where),
                "back": searching.search_link(name, searching.form_of(where)), "question": "", "found": -1,
                "danger": action in searching.DANGEROUS, "message": "", "result": "", "sample": []}

    async def bulk_confirm(request: Request) -> Response:
        params = request.query_params
        name, action = params.get("queue", ""), params.get("action", "")
        form = searching.SearchForm.of(params)
        context = {**bulk_context(name, action, JobFilter()), "back": searching.search_link(name, form)}
        if config.read_only:
            return html_page(request, bulk_template, 403, **{**context, "message": refusal(request, None)})
        try:
            queue = await queue_named(name)
            where = searching.for_action(await run_in_threadpool(searching.read_filter, queue, form), action)
            dry: BulkResult = await run_in_threadpool(lambda: act_matching(queue, action, where, dry_run=True))
        except PAGE_ERRORS as exc:
            return failed(request, bulk_template, context, exc)
        return html_page(request, bulk_template, **{
            **bulk_context(name, action, where), "found": dry.found, "sample": dry.sample,
            "question": searching.confirm_question(name, action, dry.found)})

    async def bulk_run(request: Request) -> Response:
        body = await request.body()
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)) \
            if kind == "application/x-www-form-urlencoded" and len(body) <= 65536 else {}
        name, action = fields.get("queue", ""), fields.get("action", "")
        context = bulk_context(name, action, JobFilter())
        refused = refusal(request, fields.get("csrf"))
        if refused is not None:
            return html_page(request, bulk_template, 403, **{**context, "message": refused})
        if not fields:
            return html_page(request, bulk_template, 415, **{
                **context, "message": "send the confirmation form (application/x-www-form-urlencoded, at most 64 KB)"})
        try:
            queue = await queue_named(name)
            where = searching.for_action(searching.confirmed_filter(fields), action)
            context = bulk_context(name, action, where)
            confirmed = fields.get("count", "")
            if not confirmed.isdigit():
                raise InvalidArgument(f"count is the number of jobs confirmed, got {confirmed!r}")
            # Never act on more jobs than the person confirmed: the filter may find
            # more now (jobs sent meanwhile). Then ask again, changing nothing.
            dry: BulkResult = await run_in_threadpool(lambda: act_matching(queue, action, where, dry_run=True))
            if dry.found > int(confirmed):
                return html_page(request, bulk_template, 409, **{
                    **context, "found": dry.found, "sample": dry.sample,
                    "question": searching.confirm_question(name, action, dry.found),
                    "message": f"The filter finds {searching.n_jobs(dry.found)} now, more than the {confirmed} "
                               "you confirmed: nothing was changed. Confirm the new count, or go back."})
            done: BulkResult = await run_in_threadpool(lambda: act_matching(queue, action, where))
        except PAGE_ERRORS as exc:
            return failed(request, bulk_template, context, exc)
        sampler.invalidate()
        return html_page(request, bulk_template, **{
            **context, "result": searching.outcome(action, done.found, done.done, int(confirmed))})

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sampler.start()
        try:
            yield
        finally:
            await run_in_threadpool(sampler.stop)

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/api/overview", api_overview),
            Route("/api/tasks", api_tasks),
            Route("/api/queues/{queue:path}/dead", api_dead),
            Route("/api/queues/{queue:path}/job", api_job),
            Route("/api/queues/{queue:path}/jobs", api_jobs),
            Route("/api/queues/{queue:path}/result", api_result),
            Route("/api/queues/{queue:path}/groups", api_groups),
            Route("/api/queues/{queue:path}/events", api_events),
            Route("/api/queues/{queue:path}/flow", api_flow),
            Route("/api/queues/{queue:path}/actions/{action}", api_action, methods=["POST"]),
            Route("/search", search_page),
            Route("/bulk", bulk_confirm, methods=["GET"]),
            Route("/bulk", bulk_run, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[
            Middleware(Guard, token=config.token, allowed_hosts=config.allowed_hosts),
            Middleware(GZipMiddleware, minimum_size=1000),
        ],
        lifespan=lifespan,
    )
    app.state.sampler = sampler
    app.state.config = config
    return app


def _action_ids(action: Action, body: object) -> list[str] | None:
    """The ids a request names: ``{"ids": [...]}`` (1..1000 strings) or ``{"all":
    true}`` (None). Actions that take no ids get None."""
    if not action.takes_ids:
        return None
    if not isinstance(body, dict):
        raise InvalidArgument('send {"ids": [...]} or {"all": true}')
    ids, every = body.get("ids"), body.get("all")
    if every is True and ids is None:
        return None
    if every not in (None, False) or not isinstance(ids, list) or not 1 <= len(ids) <= MAX_IDS \
            or not all(isinstance(i, str) for i in ids):
        raise InvalidArgument(f'send {{"ids": [1..{MAX_IDS} job ids]}} or {{"all": true}}')
    return ids
