"""lua/build.py, the tool that writes the helpers of lua/include/ into each script, as a
module the tests import (it lives beside the scripts and runs without pyqueue)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "lua" / "build.py"
_spec = importlib.util.spec_from_file_location("pyqueue_lua_build", _PATH)
assert _spec and _spec.loader
build = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = build  # dataclasses look their module up there
_spec.loader.exec_module(build)


def include_span(text: str) -> tuple[int, int]:
    """Where the include block of ``text`` (a script) starts and ends."""
    before, block, _ = build.split(text, "script")
    assert block is not None, "no include block"
    return len(before), len(before) + len(block)


def outside(text: str) -> str:
    """``text`` (a script) without its include block: its header and its own code."""
    before, _, after = build.split(text, "script")
    return before + after
