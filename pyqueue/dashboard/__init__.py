"""The web dashboard (``pyqueue dashboard``): queues with their counts and charts of
throughput, lag and backlog over the last minutes, the registered workers and the task
names they serve, the task names with jobs waiting that no live worker serves, dead
letters to read, replay and purge, queues to pause and resume, jobs to look up by id,
a flow (chain, group, chord) shown by its id as a tree with each step's state, a
queue's groups (fair scheduling) with their caps to set, and a search box (any state, by
task, group, error class and time) whose results can be replayed, purged, cancelled or
promoted in bulk after a confirmation that states their count. A client like any other
(DESIGN §12): it calls the same driver verbs as the CLI, serves its own assets from this
package (no CDN), binds loopback by default and asks for a token elsewhere, protects
actions with CSRF tokens, and shows payloads only when started with
``--show-payloads``.

Needs the ``dashboard`` extra (``pip install "pyqueue-redis[dashboard]"``): Starlette, Jinja2
and uvicorn. Importing this package does not import them; :func:`require_web_stack`
says clearly what is missing.

* :mod:`.history` -- the sampler and its ring buffer (no web framework);
* :mod:`.security` -- bind, token, Host and CSRF rules (no web framework);
* :mod:`.groups` -- a queue's groups table and the group cap action's body (no web framework);
* :mod:`.flows` -- a flow's tree and its steps' states (no web framework);
* :mod:`.search` -- the search box's filter, rows and bulk actions' words (no web framework);
* :mod:`.app` -- the Starlette app and its actions table;
* :mod:`.server` -- uvicorn in a thread, and ``pyqueue dashboard``.
"""

from __future__ import annotations

import importlib

from pyqueue.protocol.errors import PyQueueError

#: The packages of the ``dashboard`` extra, by import name.
WEB_STACK = ("starlette", "jinja2", "uvicorn")


def require_web_stack() -> None:
    """Raise a :class:`~pyqueue.protocol.errors.PyQueueError` naming the extra if any package
    of the web stack cannot be imported."""
    missing = []
    for name in WEB_STACK:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise PyQueueError(
            f"the dashboard needs the dashboard extra (missing: {', '.join(missing)}): "
            "pip install \"pyqueue-redis[dashboard]\""
        )
