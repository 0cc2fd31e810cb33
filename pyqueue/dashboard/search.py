"""The dashboard's search box and its bulk actions (#39), without a web framework: the
box's fields as typed (:class:`SearchForm`), the :class:`~pyqueue.ops.find.JobFilter`
they make, a page of ``Queue.search`` as table rows, and the words of a bulk action's
confirmation and outcome.

The pages themselves are rendered on the server (``search.html``, ``bulk.html``):

1. ``GET search?queue=Q&state=&task=&group=&error=&since=&until=&cursor=`` shows a page
   of what the filter finds (``Queue.search``), a "more" link carrying the cursor, and a
   button per bulk action the filter allows (:func:`offered_actions`).
2. ``GET bulk?queue=Q&action=A&<the same fields>`` is the confirmation: a dry run of
   ``act_matching`` counts what the filter finds now, and a form holds the filter (its
   times resolved to ms, so "10:00" cannot mean another day when it is sent), that
   count and the page's CSRF token.
3. ``POST bulk`` checks the CSRF token (or a Bearer token) and that the filter does not
   find more jobs than were confirmed (then it asks again, changing nothing), and runs
   ``act_matching``: "cancelled 35 of 37 found (2 moved meanwhile by others)".

Times are the server's: ``HH:MM`` is today by the server's clock (one ``peek`` reads
it, :func:`pyqueue.ops.schedules.server_now_ms`), a date and time without a zone is UTC.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlencode

from pyqueue.drivers.queue import Queue
from pyqueue.ops.find import BULK_ACTIONS, CLOCK, JobFilter, parse_when
from pyqueue.ops.schedules import server_now_ms
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.protocol.models import JobEntry, SearchPage

#: Jobs per page of the search's results.
SEARCH_PAGE = 50
#: An error shown in a row of the results (all of it, up to this, in its title).
ROW_ERROR, TITLE_ERROR = 160, 4096
#: Each bulk action's button, and its confirmation's question ({n} jobs, {queue}).
ACTION_LABELS = {"replay": ("Replay", "Replay {n} of {queue}? They go back to ready, attempts reset."),
                 "purge": ("Purge", "Purge {n} of {queue} for good?"),
                 "cancel": ("Cancel", "Cancel {n} of {queue}? They will not run (again)."),
                 "promote": ("Promote", "Make {n} of {queue} due now?")}
#: The actions that end jobs for good (their buttons are red).
DANGEROUS = frozenset({"purge", "cancel"})

def no_indexes(exc: InvalidArgument) -> bool:
    """Whether ``exc`` is search's refusal of a task or group filter on a queue that
    keeps no indexes (lua/search.lua)."""
    return "keeps no indexes" in str(exc)


def reason(exc: InvalidArgument, queue: str) -> str:
    """A refusal in words for the page: how to turn indexes on when they are missing,
    else the driver's reason (without the scripts' error code)."""
    if no_indexes(exc):
        return indexes_hint(queue)
    return str(exc).removeprefix("PQ_BADARG ")


def indexes_hint(queue: str) -> str:
    return (f"{queue} keeps no indexes, so it cannot be searched by task or group. Turn them on with "
            f"`pyqueue indexes {queue} on` (or Queue.set_indexes(True)): the jobs sent from then on are found "
            "by task and group. State, error class and time work on any queue.")


def utc(ms: int) -> str:
    """A server time (ms) as UTC, to the second: ``2026-11-29 10:00:05Z``."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def iso(ms: int) -> str:
    """A server time (ms) as the search box takes it back: ``2026-11-29T10:00:05.250Z``."""
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ago(ms: int, now_ms: int) -> str:
    """How long before ``now_ms`` (both server ms) ``ms`` was: ``3 min ago``."""
    d = max(0, now_ms - ms)
    if d < 1000:
        return f"{d} ms ago"
    if d < 60_000:
        return f"{d // 1000} s ago"
    if d < 3_600_000:
        return f"{d // 60_000} min ago"
    if d < 172_800_000:
        return f"{d / 3_600_000:.1f} h ago"
    return f"{d // 86_400_000} d ago"


@dataclass(frozen=True)
class SearchForm:
    """The search box's fields as typed ('' for an empty one), spaces around trimmed."""

    state: str = ""
    task: str = ""
    group: str = ""
    error: str = ""
    since: str = ""
    until: str = ""

    @classmethod
    def of(cls, params: Mapping[str, str]) -> SearchForm:
        return cls(**{f.name: str(params.get(f.name, "") or "").strip() for f in fields(cls)})

    def query(self) -> dict[str, str]:
        """The fields given, for a link (the "more" link, a bulk action's button)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    def needs_clock(self) -> bool:
        """Whether a time is an ``HH:MM`` of today: the server's clock decides the day."""
        return any(CLOCK.fullmatch(t) for t in (self.since, self.until))

    def to_filter(self, now_ms: int | None) -> JobFilter:
        """The filter the fields make (InvalidArgument with the reason: a state not
        known, a ':' in an error class, a time not understood...). Checks nothing
        against Redis."""
        return JobFilter(state=self.state or None, task=self.task or None, group=self.group or None,
                         error=self.error or None,
                         since_ms=parse_when(self.since, "since", now_ms) if self.since else None,
                         until_ms=parse_when(self.until, "until", now_ms) if self.until else None)


def read_filter(queue: Queue, form: SearchForm) -> JobFilter:
    """The filter of ``form`` for ``queue``: its HH:MM times are today by the server's
    clock (read only when one is given)."""
    return form.to_filter(server_now_ms(queue) if form.needs_clock() else None)


def confirmed_filter(params: Mapping[str, str]) -> JobFilter:
    """The filter a confirmation form sent back: state, task, group, error as they were,
    ``since_ms`` and ``until_ms`` resolved already."""
    def ms(name: str) -> int | None:
        raw = str(params.get(name, "") or "")
        if raw == "":
            return None
        if not raw.isdigit():
            raise InvalidArgument(f"{name} is a time in ms, got {raw!r}")
        return int(raw)

    text = {name: str(params.get(name, "") or "") or None for name in ("state", "task", "group", "error")}
    return JobFilter(since_ms=ms("since_ms"), until_ms=ms("until_ms"), **text)


def filter_fields(where: JobFilter) -> dict[str, str]:
    """A filter as the confirmation form's hidden fields ('' for a field not given)."""
    return {name: "" if value is None else str(value) for name, value in where.search_args().items()}


def form_of(where: JobFilter) -> SearchForm:
    """The search box that finds what ``where`` does (its times as ISO 8601, UTC)."""
    return SearchForm(state=where.state or "", task=where.task or "", group=where.group or "",
                      error=where.error or "", since="" if where.since_ms is None else iso(where.since_ms),
                      until="" if where.until_ms is None else iso(where.until_ms))


def for_action(where: JobFilter, action: str) -> JobFilter:
    """``where`` as ``act_matching`` runs ``action`` with it: an action for one state
    (replay and purge: dead; promote: scheduled) sets it when the filter has none.
    InvalidArgument when the action cannot go with the filter."""
    if action not in BULK_ACTIONS:
        raise InvalidArgument(f"action must be one of {', '.join(BULK_ACTIONS)}, got {action!r}")
    state, _verb = BULK_ACTIONS[action]
    if state is None or where.state == state:
        return where
    if where.state is not None:
        raise InvalidArgument(f"{action} acts on {state} jobs: the filter's state is {where.state!r}")
    return JobFilter(**{**where.search_args(), "state": state})


def offered_actions(where: JobFilter) -> list[dict[str, Any]]:
    """The bulk actions that can go with ``where``: each a name, its button's label, and
    whether it destroys (shown as danger)."""
    offered = []
    for action in BULK_ACTIONS:
        try:
            for_action(where, action)
        except InvalidArgument:  # replay of ready jobs, promote of jobs with an error...
            continue
        offered.append({"name": action, "label": ACTION_LABELS[action][0], "danger": action in DANGEROUS})
    return offered


def describe(where: JobFilter) -> str:
    """A filter in words: ``state dead, task send_invoice, since 2026-11-29 10:00:00Z``."""
    parts = [f"{name} {getattr(where, name)}" for name in ("state", "task", "group", "error")
             if getattr(where, name) is not None]
    if where.since_ms is not None:
        parts.append(f"since {utc(where.since_ms)}")
    if where.until_ms is not None:
        parts.append(f"until {utc(where.until_ms)}")
    return ", ".join(parts) or "every job"


def n_jobs(count: int) -> str:
    """``1 job``, ``2 jobs``."""
    return f"{count} job" + ("" if count == 1 else "s")


def confirm_question(queue: str, action: str, found: int) -> str:
    return ACTION_LABELS[action][1].format(n=n_jobs(found), queue=queue)


def outcome(action: str, found: int, done: int, confirmed: int) -> str:
    """What a bulk action did, counted from what was confirmed: ``cancelled 35 of 37
    found (2 moved meanwhile by others)``. ``found``: what ``act_matching`` found as it
    ran (jobs others moved since the confirmation are not among them), ``done``: what its
    scripts moved."""
    verb = BULK_ACTIONS[action][1]
    base = max(found, confirmed)
    said = f"{verb} {done} of {base} found"
    if base > done:
        said += f" ({base - done} moved meanwhile by others)"
    if found > confirmed:
        said += f"; {found - confirmed} more matched after the {confirmed} confirmed"
    return said


def row(job: JobEntry, now_ms: int, logical: str) -> dict[str, Any]:
    """One row of the results: id and the link to its job view (the page's job
    lookup), state, task, group, when it was sent, attempts, and a dead job's error or a
    leased one's owner (with when it died or its lease ends)."""
    error = job.error
    first = error.splitlines()[0] if error else ""
    shown = first[:ROW_ERROR] + (" …" if len(first) > ROW_ERROR or len(first) < len(error) else "")
    if job.state == "dead":
        note, title = shown, error[:TITLE_ERROR] + ("" if job.dead_ms < 0 else f"\n(died {utc(job.dead_ms)})")
    elif job.state == "leased":
        note, title = job.owner, "" if job.deadline_ms < 0 else f"lease deadline {utc(job.deadline_ms)}"
    else:
        note, title = "", ""
    return {
        "id": job.id, "state": job.state, "task": job.task, "group": job.group,
        "href": "./?" + urlencode({"queue": logical, "job": job.id}) + "#lookup",
        "sent": ago(job.enqueued_ms, now_ms) if job.enqueued_ms >= 0 else "",
        "sent_title": utc(job.enqueued_ms) if job.enqueued_ms >= 0 else "",
        "attempts": f"{job.attempts}/{job.max_attempts}" if job.attempts >= 0 else "",
        "note": note, "note_title": title, "partition": job.queue,
    }


def summary(page: SearchPage, where: JobFilter) -> str:
    """The line above the results: how many shown, how many read, and the indexes'
    start when the filter needs them."""
    said = f"{n_jobs(len(page.jobs))} shown, {page.examined} read"
    if page.cursor:
        said += "; there may be more"
    if (where.task or where.group) and page.indexed_since_ms is not None:
        said += (f" (indexes kept since {utc(page.indexed_since_ms)}: jobs sent before are not found by task "
                 "or group)")
    return said


def search_link(queue: str, form: SearchForm, cursor: str = "") -> str:
    """The search page of ``form`` (and a cursor: the next page)."""
    return "search?" + urlencode({"queue": queue, **form.query(), **({"cursor": cursor} if cursor else {})})

