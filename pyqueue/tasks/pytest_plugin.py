"""pytest plugin (registered as ``pyqueue``): the ``pyqueue_testing`` fixture.

::

    def test_signup_sends_a_welcome(pyqueue_testing):
        t = pyqueue_testing(app.tasks)      # app.tasks: your pyqueue.Tasks()
        signup.send("a@example.com")
        t.drain()                           # runs it, and what it sends, for real
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pyqueue.tasks.app import Tasks
from pyqueue.tasks.testing import TaskTesting


@pytest.fixture
def pyqueue_testing() -> Iterator[Callable[..., TaskTesting]]:
    """A function of a Tasks object (and :class:`TaskTesting`'s options) that points it
    at an isolated embedded server until the test ends."""
    opened: list[TaskTesting] = []

    def start(tasks: Tasks, **options: Any) -> TaskTesting:
        t = TaskTesting(tasks, **options).__enter__()
        opened.append(t)
        return t

    yield start
    for t in reversed(opened):
        t.__exit__(None, None, None)
