"""Write into each lua/<verb>.lua the helpers it calls, from lua/include/.

    python lua/build.py           # regenerate every script's include block
    python lua/build.py --check   # exit 1 naming each script whose block is stale

Every ``lua/*.lua`` is loaded byte for byte by every client (lua/README.md section 1):
other languages get no build step and no include mechanism. So the helpers a script
calls are written into it, between the marker lines ``-- >>> pyqueue includes`` and
``-- <<< pyqueue includes``, right after its header comment and its named ``KEYS``
locals. The block is generated, never edited: it holds exactly the helpers the rest of
the script names, and the helpers those name (the dependency closure), in the order
of ``FAMILIES`` and, within a family, of its file. ``tests/test_contract.py`` fails
when a block is stale or a script defines a helper name again.

A helper is one top-level definition of an include file (``local NAME = ...`` or
``local function name(...) ... end``) with the comment lines right above it. The
scan that decides what a piece of code names skips comments, strings and fields
(``x.name``), so a helper is pulled in only by code that really refers to it.

Standard library only: this runs before pyqueue is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

LUA = Path(__file__).resolve().parent
INCLUDE = LUA / "include"
START = "-- >>> pyqueue includes"
END = "-- <<< pyqueue includes"

#: The include files, in the order their helpers are written into a script (a helper
#: may use only those of its own file above it, or of an earlier file).
FAMILIES = ("validate", "calls", "records", "tombstones", "events", "steps", "control", "groups", "acks", "reclaim", "flows")


class BuildError(Exception):
    """An include file or a script cannot be read as this tool expects."""


@dataclass(frozen=True)
class Helper:
    """One top-level definition of an include file."""

    family: str
    names: tuple[str, ...]  # what it binds (a `local a, b = ...` binds two)
    text: str  # its comment lines, then its code; ends with a newline
    code: str  # its code alone, from its `local` line: what a script carries
    uses: frozenset[str]  # the identifiers its code names


def read(path: Path) -> str:
    """``path`` as text, byte for byte (the scripts' rules: ASCII, LF line ends)."""
    data = path.read_bytes()
    if not data.isascii() or b"\r" in data:
        raise BuildError(f"{path.name}: not pure ASCII with LF line ends")
    return data.decode("ascii")


_LONG_BRACKET = re.compile(r"\[(=*)\[")


def identifiers(code: str) -> set[str]:
    """The names ``code`` refers to: identifiers outside comments and strings, and not
    fields (``t.name``, ``t:name``)."""
    found: set[str] = set()
    i, n = 0, len(code)
    previous = ""
    while i < n:
        c = code[i]
        if code.startswith("--", i):
            m = _LONG_BRACKET.match(code, i + 2)
            if m:
                close = code.find("]" + m.group(1) + "]", m.end())
                i = n if close < 0 else close + len(m.group(1)) + 2
            else:
                eol = code.find("\n", i)
                i = n if eol < 0 else eol
        elif c in "'\"":
            j = i + 1
            while j < n and code[j] != c:
                j += 2 if code[j] == "\\" else 1
            i, previous = j + 1, "s"
        elif c == "[" and _LONG_BRACKET.match(code, i):
            m = _LONG_BRACKET.match(code, i)
            assert m is not None
            close = code.find("]" + m.group(1) + "]", m.end())
            i, previous = (n if close < 0 else close + len(m.group(1)) + 2), "s"
        elif c.isalpha() or c == "_":
            m = re.compile(r"[A-Za-z_]\w*").match(code, i)
            assert m is not None
            if previous not in (".", ":"):
                found.add(m.group(0))
            i, previous = m.end(), "w"
        elif c.isspace():
            i += 1
        else:
            # `..` is concatenation, not a field access.
            previous = "" if code.startswith("..", i) else c
            i += 2 if code.startswith("..", i) else 1
    return found


_DEFINES = re.compile(r"^local (?:function )?([\w, ]+?)\s*(?:=|\(|$)")


def helpers_of(family: str) -> list[Helper]:
    """The top-level definitions of ``lua/include/<family>.lua``, in file order.

    A definition starts at a line ``local ...`` in column 0, with the comment lines
    right above it, and runs to the next one; blank lines and comment lines at its end
    are notes of the file, not part of it."""
    lines = read(INCLUDE / f"{family}.lua").splitlines(keepends=True)
    starts = []
    for i, line in enumerate(lines):
        if line.startswith("local "):
            at = i
            while at > 0 and lines[at - 1].startswith("--"):
                at -= 1
            starts.append((at, i))
    out = []
    for k, (at, code_at) in enumerate(starts):
        unit = lines[at:starts[k + 1][0] if k + 1 < len(starts) else len(lines)]
        while unit and (unit[-1].strip() == "" or unit[-1].startswith("--")):
            unit.pop()
        m = _DEFINES.match(lines[code_at])
        if not m:
            raise BuildError(f"include/{family}.lua: cannot read what this binds: {lines[code_at].rstrip()}")
        names = tuple(name.strip() for name in m.group(1).split(","))
        code = "".join(unit[code_at - at:])
        out.append(Helper(family, names, "".join(unit), code, frozenset(identifiers(code)) - set(names)))
    return out


def all_helpers() -> list[Helper]:
    """Every helper of every family, in the order they are written into a script."""
    helpers = [helper for family in FAMILIES for helper in helpers_of(family)]
    seen: dict[str, str] = {}
    for helper in helpers:
        for name in helper.names:
            if name in seen:
                raise BuildError(f"{name} is defined twice (include/{seen[name]}.lua, include/{helper.family}.lua)")
            seen[name] = helper.family
        # A local is in scope only below its definition: a use of a later one would read
        # a global (nil) at run time.
        later = sorted(name for name in helper.uses if name in defined_names(helpers) and name not in seen)
        if later:
            raise BuildError(f"include/{helper.family}.lua: {helper.names[0]} uses {', '.join(later)}, defined below it")
    return helpers


def defined_names(helpers: list[Helper]) -> set[str]:
    return {name for helper in helpers for name in helper.names}


def closure(code: str, helpers: list[Helper]) -> list[Helper]:
    """The helpers ``code`` names, and those they name, in the order of ``helpers``."""
    by_name = {name: helper for helper in helpers for name in helper.names}
    wanted: set[int] = set()
    pending = [name for name in identifiers(code) if name in by_name]
    while pending:
        helper = by_name[pending.pop()]
        if id(helper) in wanted:
            continue
        wanted.add(id(helper))
        pending.extend(name for name in helper.uses if name in by_name)
    return [helper for helper in helpers if id(helper) in wanted]


def block_for(helpers: list[Helper]) -> str:
    """The include block holding ``helpers``, marker lines included.

    A helper is written as its code only: the comment above it, which says what it does
    and why, stays in its include file, named on the line that opens its family. (Comments
    inside its code are written: they explain the lines beside them.)"""
    families = sorted({h.family for h in helpers}, key=FAMILIES.index)
    out = [f"{START}: generated by `python lua/build.py`; do not edit\n"]
    for family in families:
        out.append(f"-- lua/include/{family}.lua (each helper's note is there)\n")
        out.extend(h.code for h in helpers if h.family == family)
    return "".join(out) + END + "\n"


def split(text: str, name: str) -> tuple[str, str | None, str]:
    """``text`` as what comes before its include block, the block, and what comes after.

    A script without a block gets an empty one after its header comment and the named
    ``local ... = KEYS[i]`` lines that follow it."""
    starts = [m.start() for m in re.finditer(rf"^{re.escape(START)}", text, re.M)]
    ends = [m.end() for m in re.finditer(rf"^{re.escape(END)}\n", text, re.M)]
    if len(starts) > 1 or len(ends) > 1 or len(starts) != len(ends):
        raise BuildError(f"{name}: {len(starts)} start and {len(ends)} end markers; want one of each")
    if starts:
        if ends[0] <= starts[0]:
            raise BuildError(f"{name}: its end marker comes before its start marker")
        return text[:starts[0]], text[starts[0]:ends[0]], text[ends[0]:]
    header_end = text.find("\n]]\n")
    if not text.startswith("--[[") or header_end < 0:
        raise BuildError(f"{name}: no header comment --[[ ... ]]")
    at = header_end + len("\n]]\n")
    keys = re.compile(r"\n*local [\w, ]+ =\s*KEYS\[\d+\](?:,\s*KEYS\[\d+\])*\n")
    while m := keys.match(text, at):
        at = m.end()
    return text[:at] + "\n", None, "\n" + text[at:].lstrip("\n")


def built(text: str, name: str, helpers: list[Helper]) -> str:
    """``text`` (a script) with its include block generated anew."""
    before, _, after = split(text, name)
    own = before + after
    defined = {n for h in helpers for n in h.names}
    stray = sorted(
        n for n in defined
        if re.search(rf"^\s*local\s+(?:function\s+)?{n}\b|^\s*function\s+{n}\s*\(", own, re.M)
    )
    if stray:
        raise BuildError(f"{name} defines helper names of lua/include/ again: {', '.join(stray)}")
    return before + block_for(closure(own, helpers)) + after


def scripts() -> list[Path]:
    return sorted(LUA.glob("*.lua"))


def stale() -> list[str]:
    """The scripts whose include block differs from what this tool writes."""
    helpers = all_helpers()
    return [path.name for path in scripts() if built(read(path), path.name, helpers) != read(path)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a script's include block is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            names = stale()
            for name in names:
                print(f"lua/{name}: its include block is stale; run python lua/build.py")
            return 1 if names else 0
        helpers = all_helpers()
        for path in scripts():
            text = read(path)
            new = built(text, path.name, helpers)
            if new != text:
                path.write_bytes(new.encode("ascii"))
                print(f"lua/{path.name}: written")
        return 0
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
