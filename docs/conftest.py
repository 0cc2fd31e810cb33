"""The site's code blocks run under pytest (Sybil): every ```python block of every page
under docs/, in page order, one namespace per page, so a page's first block can set up
the names its later blocks use. Each page starts on an empty embedded server (the
fakeredis a ``Queue("x")`` or ``Tasks()`` made without a client uses), with
``PYQUEUE_URL`` unset. A block that needs a real server, another process or a framework
project is not run: ``<!-- not run: why -->`` then ``<!-- skip: next -->`` (or ``skip:
start`` ... ``skip: end``) above it. (Not Sybil's ``skip: next "why"``, which pytest
would report as SKIPPED, and tests/run.sh fails a CI run with any skipped test.)
``<!-- invisible-code-block: python -->`` comments hold setup a reader does not need to
see. Shell blocks (```console, ```sh, ```bash) and others are not run.

Run them: ``python -m pytest docs`` (the docs extra installs Sybil), alone: not with
tests/ in one run, and not under pytest-xdist (a page's blocks share its namespace).
tests/test_docs.py runs them so in CI.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser


def start_page(namespace: dict[str, Any]) -> None:
    namespace["_saved_url"] = os.environ.pop("PYQUEUE_URL", None)
    running: list[tuple[Any, threading.Thread]] = []

    def in_background(worker: Any) -> None:
        """Run a worker in a thread until the page ends (a page's invisible setup: the
        worker another process would be)."""
        thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
        thread.start()
        running.append((worker, thread))

    namespace["in_background"] = in_background
    namespace["_running"] = running
    from pyqueue.drivers.clients import embedded_redis

    embedded_redis().flushall()


def end_page(namespace: dict[str, Any]) -> None:
    for worker, thread in namespace["_running"]:
        worker.stop()
        thread.join(timeout=30)
    saved = namespace.get("_saved_url")
    if saved is not None:
        os.environ["PYQUEUE_URL"] = saved


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(), SkipParser()],
    patterns=["*.md"],
    setup=start_page,
    teardown=end_page,
).pytest()
