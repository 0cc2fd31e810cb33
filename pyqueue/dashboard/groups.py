"""The dashboard's view of fair scheduling (README "Fair scheduling"): one page of a
queue's groups, and the argument and message of the ``group_limit`` action.

The page reads ``Queue.groups`` (lua/groups.lua, read-only): one script call per
partition for the whole table, never one per group. The action calls
``Queue.set_group_limit`` (lua/set_group_limit.lua): the dashboard writes no key
itself, and the driver checks the cap's range and the group key once more.

No web framework here, so these rules read, and are tested, on their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyqueue.protocol.core import MAX_BATCH, check_group
from pyqueue.protocol.errors import InvalidArgument
from pyqueue.drivers.queue import Queue

#: Groups per table by default, and the most one request may ask for (groups.lua's bound).
GROUPS_PAGE, GROUPS_PAGE_MAX = 50, MAX_BATCH
#: A cap typed as text: ASCII digits only (``str.isdigit`` also takes other scripts'
#: digits), few enough that ``int()`` is cheap; the driver checks the range.
_DIGITS = re.compile(r"[0-9]{1,10}")
_USAGE = 'send {"cap": <number of jobs> | "off" | "default", "group": "<group>"} (no group: every group\'s default)'


def groups_page(queue: Queue, limit: int) -> dict[str, Any]:
    """The groups of ``queue`` with READY jobs that ``Queue.groups(0, limit)`` reads
    (those parked at their cap first, then in the order lease serves them; on a
    partitioned queue that many per partition), at most ``limit`` of them, the largest
    backlogs first, as ``pyqueue groups`` shows them.

    Each group: ``ready``, ``running``, ``cap`` (the cap in force, 0: none),
    ``own_cap``, ``parked`` (at its cap: lease skips it until a lease of it ends) and
    ``partition`` (the queue that holds it). ``own_cap`` is true when the cap differs
    from the queue's default, so it is the group's own: groups.lua answers the cap in
    force, not where it comes from, so an own cap equal to the default reads as the
    default. ``total`` counts every group with READY jobs; ``default_cap`` is the
    queue's default cap (0: none)."""
    page = queue.groups(0, limit)
    shown = sorted(page.groups, key=lambda g: (-g.ready, g.name))[:limit]
    return {
        "queue": queue.name, "partitions": queue.spec.partitions, "total": page.total,
        "default_cap": page.default_cap, "limit": limit,
        "groups": [{"name": g.name, "ready": g.ready, "running": g.running, "cap": g.cap,
                    "own_cap": g.cap != page.default_cap, "parked": g.parked, "partition": g.queue}
                   for g in shown],
    }


@dataclass(frozen=True)
class CapChange:
    """A ``group_limit`` request, as ``Queue.set_group_limit(cap, group=group)`` takes
    it: ``group`` None is the default cap of every group."""

    cap: int | None
    group: str | None


def parse_cap_change(body: object) -> CapChange:
    """The change ``{"cap": ..., "group": ...}`` asks for, with the words of ``pyqueue
    group-limit``: ``cap`` a number of jobs (a JSON integer, or digits as text), or
    ``"off"``, or for one group ``"default"``; ``group`` left out (or null) for the
    queue's default cap.

    For the default cap, off (or 0) lifts it; for one group, off exempts the group (its
    own cap 0) and default deletes its own cap, so that the default applies to it again.

    Raises:
        InvalidArgument: anything else (a negative or fractional number, other text,
            other keys, default without a group, a malformed group key); nothing has
            been run then. A number out of 0..1,000,000 is refused by the driver, before
            its script runs.
    """
    if not isinstance(body, dict) or not body.keys() <= {"cap", "group"} or "cap" not in body:
        # Unknown keys are refused: a misspelt "group" must not set every group's cap.
        raise InvalidArgument(_USAGE)
    group = body.get("group")
    if group is not None:
        check_group(group)
    raw = body["cap"]
    word = raw.strip().lower() if isinstance(raw, str) else None
    if word == "off":
        return CapChange(0 if group is not None else None, group)
    if word == "default":
        if group is None:
            raise InvalidArgument("default applies to one group: name the group (every group's default cap is a "
                                  "number of jobs, or off)")
        return CapChange(None, group)
    if word is not None and _DIGITS.fullmatch(word):
        return CapChange(int(word), group)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return CapChange(raw, group)
    raise InvalidArgument(f"a cap is a number of jobs (0..1000000), off, or for one group default; got {raw!r}")


def cap_message(queue: str, change: CapChange, changed: int) -> str:
    """The page's message, in the words of ``pyqueue group-limit``: "<queue>: <who>:
    <what>", and "(unchanged)" when the call changed no cap."""
    who = f"group {change.group!r}" if change.group is not None else "every group"
    if change.cap is None:
        what = "the default cap" if change.group is not None else "no cap"
    else:
        what = "no cap" if change.cap == 0 else f"at most {change.cap} running at once"
    return f"{queue}: {who}: {what}{'' if changed else ' (unchanged)'}"


def set_cap(queue: Queue, change: CapChange) -> tuple[int, bool]:
    """Run the change (every partition of a partitioned queue); (1 if a cap changed,
    else 0; False: nothing more to do)."""
    return int(queue.set_group_limit(change.cap, group=change.group)), False
