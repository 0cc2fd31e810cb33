"""Keep the helpers shared by the scripts in one place: tests/lua_prelude.lua.

    python tests/lua_prelude.py --check   # exit 1 naming every script whose copy differs
    python tests/lua_prelude.py --write   # copy the prelude into every lua/*.lua

Each ``lua/*.lua`` is loaded byte for byte by every client (no includes, no templating at
load time, lua/README.md section 1), so the helpers are copied into each file. The copy is
one block, from the marker line ``-- >>> pyqueue prelude`` to ``-- <<< pyqueue prelude``,
identical in every script and to ``tests/lua_prelude.lua``: edit that file, run
``--write``, and commit the scripts with it. ``--write`` replaces the block of a script
that has one; a script without one gets it after its header comment and its
``local ... = KEYS[..]`` lines. ``tests/test_contract.py`` fails when a copy differs or a
script defines a prelude name again outside its block.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "lua_prelude.lua"
LUA = ROOT / "lua"
START = "-- >>> pyqueue prelude"
END = "-- <<< pyqueue prelude"

#: ``local a, b =  KEYS[1], KEYS[2]`` (the value may continue on the next line), or the
#: same with ARGV: the named locals a script binds right after its header.
_ARG = r"(?:KEYS|ARGV)\[\d+\]"
_NAMED_LOCALS = re.compile(rf"local [\w, ]+ =[ \t]*\n?[ \t]*{_ARG}(?:,[ \t]*\n?[ \t]*{_ARG})*[ \t]*\n")


class PreludeError(Exception):
    """A script's or the source's prelude block is missing, repeated or malformed."""


def read(path: Path) -> str:
    """``path`` as text, byte for byte (ASCII only, LF line ends: the scripts' rules)."""
    data = path.read_bytes()
    if not data.isascii() or b"\r" in data:
        raise PreludeError(f"{path.name}: not pure ASCII with LF line ends")
    return data.decode("ascii")


def block_spans(text: str) -> list[tuple[int, int]]:
    """Where each prelude block of ``text`` starts and ends (its last newline included)."""
    starts = [m.start() for m in re.finditer(rf"^{re.escape(START)}", text, re.M)]
    ends = [m.end() for m in re.finditer(rf"^{re.escape(END)}\n", text, re.M)]
    spans = list(zip(starts, ends))
    if len(starts) != len(ends) or any(
        not start < end or (i + 1 < len(spans) and spans[i + 1][0] < end) for i, (start, end) in enumerate(spans)
    ):
        raise PreludeError(f"unpaired or nested prelude markers ({len(starts)} start, {len(ends)} end)")
    return spans


def source() -> str:
    """The prelude, as every script must hold it: tests/lua_prelude.lua, whole."""
    text = read(SOURCE)
    if block_spans(text) != [(0, len(text))]:
        raise PreludeError(f"{SOURCE.name} must be exactly one block, from {START!r} to {END!r}")
    return text


def prelude_names(block: str) -> set[str]:
    """The names the prelude binds at its top level: its functions and its constants."""
    return set(re.findall(r"^local (?:function )?(\w+)", block, re.M))


def outside(text: str) -> str:
    """``text`` without its prelude block(s)."""
    parts, at = [], 0
    for start, end in block_spans(text):
        parts.append(text[at:start])
        at = end
    return "".join(parts) + text[at:]


def stray_definitions(text: str, block: str) -> list[str]:
    """Prelude names that ``text`` declares again outside its prelude block."""
    rest = outside(text)
    return sorted(
        name for name in prelude_names(block)
        if re.search(rf"\blocal\s+(?:function\s+)?{name}\b|\bfunction\s+{name}\s*\(", rest)
    )


def problems(text: str, block: str) -> list[str]:
    """Why ``text`` (a script) does not hold exactly one copy of ``block``; [] if it does."""
    try:
        spans = block_spans(text)
    except PreludeError as exc:
        return [str(exc)]
    if not spans:
        return ["no prelude block"]
    if len(spans) > 1:
        return [f"{len(spans)} prelude blocks"]
    (start, end), found = spans[0], []
    copy = text[start:end]
    if copy != block:
        line = next(
            (i for i, (a, b) in enumerate(zip(copy.splitlines(), block.splitlines()), 1) if a != b),
            min(len(copy.splitlines()), len(block.splitlines())) + 1,
        )
        found.append(f"its prelude differs from tests/{SOURCE.name} (block line {line})")
    stray = stray_definitions(text, block)
    if stray:
        found.append(f"defines prelude names outside the block: {', '.join(stray)}")
    return found


def with_prelude(text: str, block: str) -> str:
    """``text`` with its prelude replaced by ``block``, or inserted after the header."""
    spans = block_spans(text)
    if len(spans) > 1:
        raise PreludeError(f"{len(spans)} prelude blocks")
    if spans:
        start, end = spans[0]
        return text[:start] + block + text[end:]
    header_end = text.find("\n]]\n")
    if not text.startswith("--[[") or header_end < 0:
        raise PreludeError("no header comment --[[ ... ]] to put the prelude after")
    at = header_end + len("\n]]\n")
    while True:
        m = _NAMED_LOCALS.match(text, len(text) - len(text[at:].lstrip("\n")))
        if not m:
            break
        at = m.end()
    return text[:at] + "\n" + block + ("" if text[at:].startswith("\n") else "\n") + text[at:]


def scripts() -> list[Path]:
    return sorted(LUA.glob("*.lua"))


def check() -> int:
    block = source()
    bad = 0
    for path in scripts():
        for problem in problems(read(path), block):
            print(f"lua/{path.name}: {problem}")
            bad += 1
    if bad:
        print("to fix: python tests/lua_prelude.py --write copies the block; remove a script's own"
              " copy of a prelude helper by hand", file=sys.stderr)
    return 1 if bad else 0


def write() -> int:
    block = source()
    for path in scripts():
        text = read(path)
        new = with_prelude(text, block)
        if new != text:
            path.write_bytes(new.encode("ascii"))
            print(f"lua/{path.name}: prelude written")
    return check()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 if a script's prelude differs")
    mode.add_argument("--write", action="store_true", help="copy tests/lua_prelude.lua into lua/*.lua")
    args = parser.parse_args(argv)
    try:
        return write() if args.write else check()
    except PreludeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
