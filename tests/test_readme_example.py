"""The worked redis-cli example in lua/README.md (section 8) prints what the scripts print.

Its replies include script SHAs and line numbers, which change with any edit to a script;
this runs the example on a fresh redis-server (tests/readme_example.py) so they cannot
drift unnoticed.
"""

from __future__ import annotations

import shutil

import pytest
import readme_example
from conftest import IN_CI


def test_lua_readme_worked_example_replies_are_current() -> None:
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        if IN_CI:
            pytest.fail(f"{' and '.join(missing)} not installed, and CI=true forbids skipping")
        pytest.skip(f"{' and '.join(missing)} not installed")
    drift = readme_example.diff()
    if drift:
        pytest.fail(
            "lua/README.md section 8: a reply differs from what the scripts print now.\n"
            "If the change is intended, run: python tests/readme_example.py --write\n\n" + drift,
            pytrace=False,
        )
