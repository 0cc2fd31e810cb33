"""The scripts' headers, the Python wrappers and lua/README.md say the same thing."""

from __future__ import annotations

import re
from pathlib import Path

import lua_build
import pytest

import pyqueue
from pyqueue.protocol.errors import CODES
from pyqueue.drivers.scripts import SCRIPT_KEYS, lua_dir

ROOT = Path(__file__).resolve().parent.parent


def header(name: str) -> str:
    return (lua_dir() / f"{name}.lua").read_text().split("\n]]\n", 1)[0]


@pytest.mark.parametrize("name", sorted(SCRIPT_KEYS))
def test_header_keys_agree_with_the_python_wrapper(name: str) -> None:
    text = header(name)
    m = re.search(r"^KEYS \((\d+)\)", text, re.M)
    assert m, f"{name}.lua: no 'KEYS (n)' line"
    block = text[m.end():].split("\n\n", 1)[0]
    roles = re.findall(r"^\s+(\d+)\s+(\w+)\s+(hash|list|zset|string|set|stream)\b", block, re.M)
    assert [int(i) for i, _, _ in roles] == list(range(1, len(roles) + 1))
    assert int(m.group(1)) == len(roles) == len(SCRIPT_KEYS[name])
    assert tuple(role for _, role, _ in roles) == SCRIPT_KEYS[name]


@pytest.mark.parametrize("name", sorted(SCRIPT_KEYS))
def test_header_has_argv_returns_and_errors_sections(name: str) -> None:
    text = header(name)
    for section in ("ARGV (", "Returns", "Errors"):
        assert section in text, f"{name}.lua header lacks {section!r}"


@pytest.mark.parametrize("name", sorted(SCRIPT_KEYS))
def test_key_locals_are_bound_in_header_order(name: str) -> None:
    body = (lua_dir() / f"{name}.lua").read_text()
    bound: dict[int, str] = {}
    for names, values in re.findall(r"^local ([\w, ]+) =\s*((?:KEYS\[\d+\],?\s*)+)$", body, re.M):
        for local, index in zip([n.strip() for n in names.split(",")], re.findall(r"KEYS\[(\d+)\]", values)):
            bound[int(index)] = local
    # The four fair-scheduling keys are bound together, as one table: `F = fair_keys(n)`.
    for first in re.findall(r"^local F = fair_keys\((\d+)\)$", body, re.M):
        for offset, role in enumerate(("meta", "gready", "ring", "groups")):
            bound[int(first) + offset] = f"{role}_key"
    # A key used only by the helpers' key table may be bound as its field, named for its
    # role: `K.index = KEYS[17]`, or `index = KEYS[21]` in the table's constructor.
    for role, index in re.findall(r"(?:\bK\.|[{,]\s*)(\w+) = KEYS\[(\d+)\]", body):
        bound.setdefault(int(index), f"{role}_key")
    assert [bound[i] for i in sorted(bound)] == [f"{role}_key" for role in SCRIPT_KEYS[name]]


def test_every_error_code_in_the_scripts_is_mapped_in_python() -> None:
    used = set()
    for path in lua_dir().glob("*.lua"):
        used |= set(re.findall(r"\b(PQ_[A-Z_]+)\b", path.read_text()))
    assert used <= set(CODES), used - set(CODES)


def test_every_error_code_is_documented_in_lua_readme() -> None:
    readme = (ROOT / "lua" / "README.md").read_text()
    for code in CODES:
        assert code in readme, code


def test_every_script_has_a_row_in_lua_readme() -> None:
    readme = (ROOT / "lua" / "README.md").read_text()
    for name in SCRIPT_KEYS:
        assert f"`{name}`" in readme, name


def test_every_key_role_is_documented_in_lua_readme() -> None:
    readme = (ROOT / "lua" / "README.md").read_text()
    for role in ("jobs", "ready", "scheduled", "leased", "owners", "dead", "errors", "counters", "wake"):
        assert f":{role}" in readme or f"`{role}`" in readme, role


def test_public_api_all_is_sorted_and_complete() -> None:
    public = {name for name in dir(pyqueue) if not name.startswith("_")} - {
        "errors", "keys", "models", "queue", "scripts", "version", "PackageNotFoundError",
    }
    public = {name for name in public if not isinstance(getattr(pyqueue, name), type(pyqueue))}
    assert pyqueue.__all__ == sorted(pyqueue.__all__, key=str.casefold) or pyqueue.__all__ == sorted(pyqueue.__all__)
    assert public == set(pyqueue.__all__) - {"__version__"}


def test_every_script_holds_exactly_the_helpers_it_calls_as_lua_build_writes_them() -> None:
    # Scripts load verbatim with no includes (DESIGN §19), so the helpers of lua/include/
    # a script calls are written into it by `python lua/build.py`; a stale block fails here.
    assert lua_build.build.stale() == [], "run python lua/build.py"
    scripts = sorted(lua_dir().glob("*.lua"))
    assert {p.stem for p in scripts} == set(SCRIPT_KEYS)
    helpers = lua_build.build.all_helpers()
    for path in scripts:
        text = path.read_bytes().decode("ascii")
        held = {h.names[0] for h in lua_build.build.closure(lua_build.outside(text), helpers)}
        assert {"contract", "CONTRACT_VERSION"} <= held, path.name  # every script checks its contract first
    # A script carries only what it calls: pause holds no fair scheduling, lease does.
    pause = (lua_dir() / "pause.lua").read_text()
    lease = (lua_dir() / "lease.lua").read_text()
    assert "fair_" not in pause and "hmget" not in pause and "emit" not in pause
    assert "local function fair_pick(" in lease and "local function bury(" in lease
    # ack gives group slots back but never enters a job into a group.
    ack = (lua_dir() / "ack.lua").read_text()
    assert "local function fair_finish(" in ack and "local function fair_enter(" not in ack


def test_the_build_check_finds_a_stale_block_and_a_stray_helper() -> None:
    build, helpers = lua_build.build, lua_build.build.all_helpers()
    script = (lua_dir() / "ack.lua").read_text()
    assert build.built(script, "ack.lua", helpers) == script
    drifted = script.replace("local CHUNK = 500", "local CHUNK = 400", 1)
    assert drifted != script and build.built(drifted, "ack.lua", helpers) == script
    # A body that stops calling a helper drops it (and what only it needed) from its block.
    assert "local function write_acked(" in script and "local function bury(" in script
    unacked = script.replace("write_acked(K, F", "nothing(K, F")
    assert "local function write_acked(" not in build.built(unacked, "ack.lua", helpers)
    assert "local function bury(" not in build.built(unacked, "ack.lua", helpers)
    stray = script + "\nlocal function hmget(key, fields) return {} end\n"
    with pytest.raises(build.BuildError, match="hmget"):
        build.built(stray, "ack.lua", helpers)
    # A script without a block gets one after its header and its named KEYS locals.
    start, end = lua_build.include_span(script)
    bare = script[:start] + script[end:]
    written = build.built(bare, "ack.lua", helpers)
    assert written.index("= KEYS[1]") < written.index(build.START) < written.index("-- 1. Validate.")
    assert build.built(written, "ack.lua", helpers) == written


def test_the_build_reads_names_outside_strings_comments_and_fields() -> None:
    code = "local x = hmget(k, f) -- bury(k)\nlocal s = 'emit(x)' .. t.fair_pick .. call_chunked"
    assert lua_build.build.identifiers(code) >= {"hmget", "call_chunked", "x", "s", "t"}
    assert not lua_build.build.identifiers(code) & {"bury", "emit", "fair_pick"}


def test_every_script_is_pure_ascii_so_a_string_api_loads_it_byte_for_byte() -> None:
    # ioredis defineCommand, go-redis NewScript and others take the source as a string:
    # non-ASCII bytes could be re-encoded on the way and change the SHA1 (lua/README.md §6).
    for path in sorted((ROOT / "lua").glob("*.lua")):
        assert path.read_bytes().isascii(), path.name
