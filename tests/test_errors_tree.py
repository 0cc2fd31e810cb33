"""The error tree drawn in ``pyqueue/protocol/errors.py``'s docstring is the tree of its
classes: every class that derives from PyQueueError stands in it once, under its
parent, and nothing else does."""

from __future__ import annotations

import inspect
import re

import pyqueue
from pyqueue.protocol import errors

#: A row of the tree: the root's name at the margin, or a branch (``├──``, ``└──``) and
#: a class name; other lines continue a row's description.
ROW = re.compile(r"^(?P<indent> *(?:[│ ]*[├└]── )?)(?P<name>[A-Z][A-Za-z]+)\b")


def drawn_tree() -> dict[str, str | None]:
    """Each class the docstring draws -> the class it is drawn under (None: the root)."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1].split("\n\n", 2)[1]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = ROW.match(line)
        if match is None or (parents and "──" not in match.group("indent")):
            continue  # a continuation line of a description
        depth = len(match.group("indent"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        name = match.group("name")
        assert name not in parents, f"{name} is drawn twice"
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def class_tree() -> dict[str, str | None]:
    """Each PyQueueError class of the module -> its pyqueue base (None: the root)."""
    tree: dict[str, str | None] = {}
    for name, cls in vars(errors).items():
        if inspect.isclass(cls) and issubclass(cls, errors.PyQueueError) and cls.__module__ == errors.__name__:
            bases = [b for b in cls.__bases__ if issubclass(b, errors.PyQueueError)]
            tree[name] = bases[0].__name__ if bases else None
    return tree


def test_the_docstring_draws_the_error_classes_as_they_derive() -> None:
    assert drawn_tree() == class_tree()


def test_every_error_class_is_exported_by_pyqueue() -> None:
    missing = sorted(name for name in class_tree() if getattr(pyqueue, name, None) is not getattr(errors, name))
    assert missing == []
