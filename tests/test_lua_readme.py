"""lua/README.md, the contract other-language clients are written from, says what the
scripts and the Python driver do (issue #35, item 11): what can be checked mechanically
is checked here, against the scripts' headers and against real calls.

* the contract version every "contract vN" of the page states, against
  ``pyqueue.drivers.scripts.CONTRACT_VERSION``, every header's ``Contract v<N>`` line and the
  Lua constant;
* the KEYS (roles, in order) and the ARGV counts of every script's row in §4.2 and §7,
  against its header (``KEYS (n)`` and its list; ``ARGV (...)`` as ``helpers.argv_rule``
  reads it);
* the shape of every reply a row spells out: a fixed list (``[promoted, reclaimed,
  dead, more, next_due_ms]``) has that many values, a list with repeated groups has the
  layout the row gives (lease's ``each job 7 values``), and ``stats`` answers exactly
  the name/value pairs the row lists, in order, as many as it counts. Every script is
  called, on fakeredis and on a real redis-server (tests/conftest.py's ``r``);
* every error text the page quotes: the ``PQ_...``, ``WRONGTYPE ...`` and ``NOSCRIPT
  ...`` texts (in backticks, and the replies of its code blocks) are taken from the
  page and each is provoked by the call in :data:`SCRIPT_ERRORS`; the task layer's texts
  (§9) and the partition-count refusal (§7.1) are in :data:`WORKER_ERRORS`, each
  provoked by a job a worker runs. A text the page gains or loses without a change of
  these tables fails the test.

The worked example (§8) is run as a whole by test_readme_example.py; its error replies
are checked here too, with its SHAs and line numbers read as placeholders.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import T0, ArgvRule, argv_rule
from tasks_support import burst

from pyqueue import InvalidArgument, NewJob, Queue
from pyqueue.protocol.keys import QueueKeys
from pyqueue.drivers.scripts import CONTRACT_VERSION, SCRIPT_KEYS, contract_version, lua_dir, lua_source
from pyqueue.ops.service import Services
from pyqueue.tasks import Fail, Retry, Tasks
from pyqueue.drivers.queue import transport_of

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "lua" / "README.md"
NOW = T0 + 60


def readme() -> str:
    return README.read_text()


def between(text: str, start: str, end: str) -> str:
    """The part of ``text`` from the line ``start`` to the next line starting ``end``."""
    assert f"\n{start}\n" in text, f"lua/README.md has no heading {start!r}"
    return text.split(f"\n{start}\n", 1)[1].split(f"\n{end}", 1)[0]


def header(name: str) -> str:
    return lua_source(name).split("\n]]\n", 1)[0]


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# -- the contract version ----------------------------------------------------------------


def test_every_contract_version_the_readme_states_is_the_drivers_and_every_scripts() -> None:
    text = readme()
    current, changelog = text.split("\n### 10.1 Changelog\n", 1)  # the changelog is history
    stated = [int(v) for v in re.findall(r"(?i)\bcontract v(\d+)\b", current)]
    stated += [int(v) for v in re.findall(r"\*\*version (\d+)\*\*", current)]
    assert len(stated) >= 5, "lua/README.md should state its contract version (intro, section 10, the examples)"
    assert set(stated) == {CONTRACT_VERSION}, f"lua/README.md states contract versions {sorted(set(stated))}"
    assert re.match(r"\s*\*\*v(\d+)\.\*\*", changelog).group(1) == str(CONTRACT_VERSION), (  # type: ignore[union-attr]
        "the newest entry of lua/README.md section 10.1 is not the current version"
    )
    for path in sorted(lua_dir().glob("*.lua")):
        source = path.read_text()
        assert contract_version(source) == CONTRACT_VERSION, path.name
        assert re.findall(r"^local CONTRACT_VERSION = (\d+)$", source, re.M) == [str(CONTRACT_VERSION)], path.name
    validate = (ROOT / "lua" / "include" / "validate.lua").read_text()
    assert re.findall(r"^local CONTRACT_VERSION = (\d+)$", validate, re.M) == [str(CONTRACT_VERSION)]


# -- the per-script rows: KEYS and ARGV --------------------------------------------------


def rows() -> dict[str, list[str]]:
    """Every script's row of section 4.2 (script, KEYS, ARGV, Returns, Errors, Replay) and
    of section 7 (script, KEYS, ARGV, returns), as its cells."""
    text = readme()
    out: dict[str, list[str]] = {}
    for start, end, width in (("### 4.2 One row per script", "## 5.", 6), ("## 7. Service scripts", "### 7.1", 4)):
        for line in between(text, start, end).splitlines():
            m = re.match(r"^\| `(\w+)` \|", line)
            if m and m.group(1) != "script":
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
                assert len(cells) == width, f"{start}: the row of {m.group(1)} has {len(cells)} cells"
                assert m.group(1) not in out, f"two rows for {m.group(1)}"
                out[m.group(1)] = cells
    return out


def test_every_script_has_one_row_in_section_4_2_or_7() -> None:
    assert set(rows()) == set(SCRIPT_KEYS)


def readme_argv_rule(name: str, cell: str) -> ArgvRule:
    """The ARGV counts a row's ARGV cell gives: numbered arguments (``1 `now_ms`; 2
    ...``), ``6 or 7:`` for an optional last one, ``N.. lo..hi receipts`` (``pairs``: two
    values each) for a list from argument N, or ``then per job k values`` with ``n``'s
    range (enqueue), or a bare list (``1..1000 job ids``)."""
    plain = [int(n) for n in re.findall(r"(?:^|; |: )(\d+) `", cell)]  # "1 `now_ms`"
    assert plain == list(range(1, len(plain) + 1)), f"{name}: ARGV numbered {plain}"
    if m := re.match(r"(\d+) or (\d+):", cell):
        assert int(m.group(2)) == len(plain), f"{name}: {m.group(0)} but {len(plain)} arguments numbered"
        return ArgvRule(int(m.group(1)), int(m.group(2)))
    listed = [int(n) for n in re.findall(r"(?:^|; )(\d+)\.\. ", cell)]  # "3.. 1..1000 receipts"
    if listed:
        (start,) = listed
        assert start == len(plain) + 1, f"{name}: the list starts at {start}, after {len(plain)} arguments"
        m = re.search(rf"(?:^|; ){start}\.\. (\d+)\.\.(\d+) (\S+)", cell)
        assert m, f"{name}: no range of the list in {cell!r}"
        step = 2 if m.group(3) == "pairs" else 1
        return ArgvRule(len(plain) + step * int(m.group(1)), len(plain) + step * int(m.group(2)), step)
    if m := re.search(r"per job (\d+) values", cell):
        n = re.search(r"`n` (\d+)\.\.(\d+)", cell)
        assert n, f"{name}: no range of n"
        step = int(m.group(1))
        return ArgvRule(len(plain) + step * int(n.group(1)), len(plain) + step * int(n.group(2)), step)
    if not plain:
        m = re.match(r"(\d+)\.\.(\d+) ", cell)
        assert m, f"{name}: unreadable ARGV cell {cell!r}"
        return ArgvRule(int(m.group(1)), int(m.group(2)))
    return ArgvRule(len(plain), len(plain))


@pytest.mark.parametrize("name", sorted(SCRIPT_KEYS))
def test_the_keys_and_argv_of_each_row_are_the_headers(name: str) -> None:
    _, keys, argv, *_ = rows()[name]
    numbered = re.findall(r"(\d+) (\w+)", keys)
    assert [int(i) for i, _ in numbered] == list(range(1, len(numbered) + 1)), f"{name}: KEYS {keys!r}"
    roles = tuple(role for _, role in numbered)
    assert roles == SCRIPT_KEYS[name], f"{name}: lua/README.md lists KEYS {roles}"
    count = re.search(r"^KEYS \((\d+)\)", header(name), re.M)
    assert count and int(count.group(1)) == len(roles), f"{name}.lua's header says KEYS ({count and count.group(1)})"
    assert readme_argv_rule(name, argv) == argv_rule(name), f"{name}: lua/README.md's ARGV {argv!r}"


def test_the_argv_reader_reads_each_kind_of_cell() -> None:
    assert readme_argv_rule("x", "1 `now_ms`; 2 `limit` 1..1000") == ArgvRule(2, 2)
    assert readme_argv_rule("x", "2 or 3: 1 `now_ms`; 2 `receipt`; 3 `final` (optional)") == ArgvRule(2, 3)
    assert readme_argv_rule("x", "1 `a`; 2 `b`; 3.. 1..1000 receipts") == ArgvRule(3, 1002)
    assert readme_argv_rule("x", "1 `a`; 2 `b`; 3.. 0..1000 pairs `x`, `y`") == ArgvRule(2, 2002, 2)
    assert readme_argv_rule("x", "1 `now_ms`; 2 `n` 1..1000; then per job 6 values: ...") == ArgvRule(8, 6002, 6)
    assert readme_argv_rule("x", "1..1000 job ids") == ArgvRule(1, 1000)
    assert readme_argv_rule("x", "1.. 1..1000 job ids") == ArgvRule(1, 1000)


# -- the replies: fixed lists, repeated groups, stats' pairs -------------------------------


def reply_forms(cell: str) -> list[list[str]]:
    """The reply lists a Returns cell spells out, each backticked ``[..]`` or ``{..}``, as
    its items."""
    return [[item.strip() for item in body.split(",")] for body in re.findall(r"`[\[{]([^`\[\]{}]*)[\]}]`", cell)]


def is_repeated(form: list[str]) -> bool:
    return any(".." in item or re.search(r"_1\b", item) for item in form)


def literal(item: str) -> Any:
    """The value a literal item of a reply form stands for ('ok', -1, ''), else None."""
    if m := re.fullmatch(r"'(\w*)'", item):
        return m.group(1).encode()
    if re.fullmatch(r"-?\d+", item):
        return int(item)
    return None


def stats_names(cell: str) -> tuple[int, list[str]]:
    """The number of pairs stats' Returns cell counts, and the names it lists in order
    (the backticked names after "in this order:", parenthesized remarks left out)."""
    count = re.match(r"(\d+) name/value pairs", cell)
    assert count, f"stats: {cell[:80]!r}"
    listing = cell.split("in this order:", 1)[1].split(". The first", 1)[0]
    while re.search(r"\([^()]*\)", listing):
        listing = re.sub(r"\([^()]*\)", "", listing)
    names = [n.strip() for chunk in re.findall(r"`([^`]*)`", listing) for n in chunk.split(",")]
    return int(count.group(1)), names


#: The replies of variable length: the words of the script's Returns cell that give its
#: layout, and the length that layout means for a reply to a call with ``n`` items
#: (jobs, receipts, ids).
LAYOUTS: dict[str, tuple[tuple[str, ...], Callable[[list[Any], int], int]]] = {
    "enqueue": (("`[added, duplicates, flag_1 .. flag_n]`",), lambda reply, n: 2 + n),
    "lease": (
        ("`[now_ms, next_due_ms, r, ack_status_1..r, m, job_1..m]`", "each job 8 values",
         "index 2 = r; statuses at 3..2+r; m at 3+r; job i at 4+r+8(i−1) .. 11+r+8(i−1) (0-based)"),
        lambda reply, n: 4 + reply[2] + 8 * reply[3 + reply[2]],
    ),
    "ack": (("`[status_1 .. status_r]`",), lambda reply, n: n),
    "search": (("`[now_ms, cursor, examined, indexed_since_ms, entry_1 .. entry_k]`", "each entry 10 values"),
               lambda reply, n: 4 + 10 * n),
    "promote_now": (("`[promoted, id_1 .. id_k]`",), lambda reply, n: 1 + reply[0]),
    "ack_result": (("`[status_1 .. status_n]`",), lambda reply, n: n),
    "release": (("`[status_1 .. status_r]`",), lambda reply, n: n),
    "extend": (("`[status_1, deadline_ms_1, ..]`", "2 per receipt"), lambda reply, n: 2 * n),
    "groups": (("`[total, default_cap, group_1 .. group_k]`", "5 values each"), lambda reply, n: 2 + 5 * reply[0]),
    "dead_list": (("`[total, job_1 .. job_k]`", "each job 6 values"), lambda reply, n: 1 + 6 * reply[0]),
    "progress_show": (("per id `receipt, written_ms, value`",), lambda reply, n: 3 * n),
    "steps": (("`[now_ms, entry_1, value_1, .., entry_k, value_k]`",), lambda reply, n: 1 + 2 * n),
    "service_renew": (
        ("`{status, renewed_ms, d, dead_id, dead_registration, dead_queues, ...}`",),
        lambda reply, n: 3 + 3 * reply[2],
    ),
}

#: browse's entry width by state, as its Returns cell gives them (``ready` 5 values``).
BROWSE_WIDTHS = {"ready": 5, "scheduled": 4, "running": 6, "done": 4}

#: Scripts that answer one status string, not a list: no shape to check.
STATUS_REPLIES = {"flow_wait", "flow_record", "progress"}


@dataclass
class Call:
    name: str
    keys: Any
    args: list[Any]
    n: int = 0  # the number of items (jobs, receipts, ids) in the call


def calls(r: Any) -> list[Call]:
    """A queue (and a service namespace) with something in every state, and calls of
    every script on it, in an order in which each call finds what it acts on."""
    q = Queue("q", r)
    k = q.spec.keys
    q.enqueue(b"", job_id="corpse", max_attempts=1, now_ms=T0)
    (corpse,) = q.lease(now_ms=T0)
    q.nack(corpse, "died", now_ms=T0)
    q.enqueue(b"", job_id="acked", now_ms=T0)
    (acked,) = q.lease(now_ms=T0)
    q.ack(acked, now_ms=T0)  # a tombstone in force at NOW
    # l0 has a rate key (its permit is due: it is leased with the others), for defer_key.
    rated = {"rate_key": "api", "rate_limit": "10/s"}
    q.enqueue_many([NewJob(b"l", job_id=f"l{i}", max_attempts=1, **(rated if i == 0 else {})) for i in range(6)],
                   now_ms=T0)
    held = q.lease(count=6, lease_ms=10**6, now_ms=T0)
    q.progress(held[0], b'{"done": 1}', now_ms=T0)
    services = Services(r, namespace="ns")
    svc = services.register(["q"], registration="reg1", now_ms=T0)
    gone = services.register(["q"], registration="reg2", expire_ms=1000, now_ms=T0)
    q.enqueue(b"", job_id="orphan", now_ms=T0)
    transport_of(q).run("lease", k, [T0, gone.owner, "c0", 1, 10**6, 100, 300_000])  # the lease of a service that dies
    q.enqueue_many([NewJob(b"r", job_id=f"r{i}") for i in range(4)], now_ms=T0)
    q.enqueue(b"g", job_id="g1", group="grp", now_ms=T0)
    q.enqueue(b"s", job_id="later", delay_ms=10**9, now_ms=T0)
    stale = "w|c|99|1|nope"
    renew_at = T0 + 5000  # gone's expiry (T0 + 1000) has passed, svc's has not
    return [
        Call("stats", k, [NOW]),
        Call("peek", k, [NOW]),
        Call("get", k, [NOW, "r0", 1]),
        Call("get", k, [NOW, "nothing", 0]),
        Call("result", k, [NOW, "corpse"]),
        Call("dead_list", k, [0, 10]),
        Call("groups", k, [0, 10]),
        *(Call("browse", k, [NOW, state, 0, 10]) for state in BROWSE_WIDTHS),
        Call("progress_show", k, ["l0", "r0"], 2),
        Call("progress", k, [NOW, held[0].receipt, b'{"done": 2}']),
        Call("defer_key", k, [NOW, held[0].receipt, 1000]),
        Call("set_rate_limit", k, ["api", "0/1000/1"]),
        Call("defer_key", k, [NOW, held[0].receipt, 1000]),  # unlimited
        Call("set_rate_limit", k, ["api", ""]),
        Call("defer_key", k, [NOW, "w|c|99|1|nope", 1000]),  # lost
        Call("extend", k, [NOW, 1000, held[0].receipt, stale], 2),
        Call("set_budget", k, [1_000_000]),  # the sends below are sized (section 2.7)
        Call("set_budget", k, [1_000_000]),  # unchanged
        Call("set_result_budget", k, [1_000_000]),  # the ack_result below sizes its result (section 2)
        Call("set_result_budget", k, [1_000_000]),  # unchanged
        Call("set_tombstone_limit", k, [2]),  # the acks and cancels below keep `done` at 2 (section 2)
        Call("set_tombstone_limit", k, [2]),  # unchanged
        Call("enqueue", k, [NOW, 2, "n1", b"x", 0, 3, "", "", "", "", "n2", b"y", 0, 3, "", "", "", ""], 2),
        Call("lease", k, [NOW, "w", "c1", 2, 30_000, 100, 300_000, held[1].receipt, stale], 2),
        Call("ack", k, [NOW, 300_000, held[2].receipt, stale], 2),
        Call("ack_result", k, [NOW, 300_000, 3_600_000, 10, held[3].receipt, b"j1", stale, b"j2"], 2),
        Call("nack", k, [NOW, held[4].receipt, "e", "", 100, 1000]),  # max_attempts 1: to DEAD
        Call("release", k, [NOW, held[0].receipt, stale], 2),
        Call("step", k, [NOW, held[5].receipt, 1000, "s1", b"j1"]),
        Call("signal", k, [NOW, "l5", "go", b"jx"]),
        Call("steps", k, [NOW, "l5"], 2),
        Call("sequence_skip", k, [NOW, "seq"]),
        Call("park", k, [NOW, held[5].receipt, "sleep", "nap", 1000, 1000]),
        Call("promote", k, [NOW, 100]),
        Call("cancel", k, [NOW, "r1", 300_000]),
        Call("cancel", k, [NOW, "nothing", 300_000]),
        Call("set_budget", k, [0]),  # lifted
        Call("set_result_budget", k, [0]),  # lifted
        Call("set_tombstone_limit", k, [0]),  # lifted
        # Indexes (section 2.8): on, a job listed by its task name and group, found by
        # each; a search by state; the scheduled 'later' made due now (then nothing more).
        Call("set_indexes", k, [NOW, 1]),
        Call("set_indexes", k, [NOW, 1]),  # unchanged
        Call("enqueue", k, [NOW, 1, "ix1", b"i", 0, 3, "", "grp", "", "task|mail.send"], 1),
        Call("search", k, [NOW, "", "mail.send", "", "", "", "", "", 10], 1),
        Call("search", k, [NOW, "ready", "", "grp", "", "", "", "", 10], 1),  # not g1: sent before
        Call("search", k, [NOW, "scheduled", "", "", "", "", "", "", 10], 2),  # 'later' and l5 (asleep)
        Call("promote_now", k, [NOW, "later", "r2"], 2),
        Call("promote_now", k, [NOW, "later"], 1),
        Call("set_indexes", k, [NOW, 0]),
        Call("limit", k, [10, 1000, 5]),
        Call("limit", k, [0, 1, 1]),
        Call("set_group_limit", k, ["grp", 3]),
        Call("set_events", k, [100]),
        Call("pause", k, [NOW]),
        Call("resume", k, [NOW]),
        Call("dead_replay", k, [NOW, "corpse"], 1),
        Call("dead_purge", k, ["l4"], 1),
        Call("flow_wait", k, [NOW, "w1", b"p", 3, "", "", 1000, "", "q\tr2"], 1),
        Call("flow_done", k, [NOW, "w1", "fail", 1000, "q\tr2", "ok"], 1),
        Call("flow_record", k, [NOW, "f1", b"{}", 10**6]),
        Call("flow_show", k, [NOW, "f1"]),
        Call("flow_show", k, [NOW, "f2"]),
        Call("service_register", services.keys.of(gone.id + 1),
             [NOW, gone.id + 1, "host", 1, "q", 60_000, 1000, 10, "tok3", "reg3"]),
        Call("service_register", services.keys.of(gone.id + 1),  # the id is taken now: retry
             [NOW, gone.id + 1, "host", 1, "q", 60_000, 1000, 10, "tok3", "reg3"]),
        Call("service_renew", svc.keys, [renew_at, svc.id, svc.renewal, "next1", 60_000, 10]),
        Call("scrub", k, [renew_at, gone.owner, 100]),
        Call("service_stop", svc.keys, [renew_at, svc.id, svc.registration]),
        Call("service_stop", services.keys.of(999), [renew_at, 999, ""]),
        Call("service_deregister", gone.keys, [renew_at, gone.id, 1, "other"]),  # not its registration
        Call("service_deregister", gone.keys, [renew_at, gone.id, 1, gone.registration]),
    ]


def check_shape(call: Call, cell: str, reply: Any) -> None:
    name = call.name
    if name in STATUS_REPLIES:
        assert isinstance(reply, bytes), (name, reply)
        return
    if name == "stats":
        count, names = stats_names(cell)
        assert count == len(names), f"stats: lua/README.md counts {count} pairs and lists {len(names)}"
        assert [n.decode() for n in reply[0::2]] == names, "stats: lua/README.md lists other pairs than stats answers"
        assert len(reply) == 2 * count
        return
    if reply is None:
        assert "nil" in cell, f"{name} answered nil, which lua/README.md does not say it may"
        return
    assert isinstance(reply, list), (name, reply)
    if name == "browse":
        state = call.args[1]
        assert f"`{state}` {BROWSE_WIDTHS[state]}" in cell, f"browse: the width of a {state} entry"
        assert len(reply) == 2 + BROWSE_WIDTHS[state] * reply[1] and reply[1] > 0, (state, reply)
        return
    if name in LAYOUTS:
        phrases, length = LAYOUTS[name]
        for phrase in phrases:
            assert phrase in cell, f"{name}: lua/README.md no longer says {phrase!r}; update LAYOUTS"
        assert len(reply) == length(reply, call.n), f"{name}: {len(reply)} values: {reply!r}"
        return
    forms = [form for form in reply_forms(cell) if not is_repeated(form)]
    assert forms, f"{name}: no reply form in lua/README.md's Returns cell"
    fitting = [f for f in forms if len(f) == len(reply) and literal(f[0]) in (None, reply[0])]
    assert fitting, f"{name} answered {reply!r}, which fits none of lua/README.md's {forms}"


def test_every_reply_has_the_shape_lua_readme_gives(r: Any) -> None:
    cells = {name: cells[3] for name, cells in rows().items()}
    q = Queue("q", r)
    made = calls(r)
    assert {c.name for c in made} == set(SCRIPT_KEYS), "call every script"
    for call in made:
        reply = transport_of(q).run(call.name, call.keys, call.args)
        check_shape(call, cells[call.name], reply)


def test_the_readers_of_reply_forms() -> None:
    assert reply_forms("`[a, b]`: ... `{'ok', id}` or `{-1, 0}`") == [["a", "b"], ["'ok'", "id"], ["-1", "0"]]
    assert is_repeated(["total", "job_1 .. job_k"]) and not is_repeated(["a", "b"])
    assert (literal("'ok'"), literal("-1"), literal("''"), literal("id")) == (b"ok", -1, b"", None)
    assert stats_names("2 name/value pairs, in this order: `a` (x, `y`), `b`. The first") == (2, ["a", "b"])


# -- the error texts the page quotes ---------------------------------------------------------


def quoted_errors() -> set[str]:
    """Every error text lua/README.md quotes: in backticks, and as a reply line of a code
    block (``(error) ...``). The worked example's SHAs and script line numbers (§8, kept
    current by test_readme_example.py) are read as placeholders."""
    text = readme()
    found = {one_line(t) for t in re.findall(r"`((?:PQ_[A-Z]+|WRONGTYPE|NOSCRIPT) [^`]+)`", text)}
    for block in re.findall(r"^ *```[^\n]*\n(.*?)^ *```", text, re.S | re.M):
        replies = re.findall(r"^\s*(?:\(error\) )?((?:PQ_[A-Z]+|WRONGTYPE|NOSCRIPT) .*)$", block, re.M)
        found |= {t.strip() for t in replies}
    generic = set()
    for t in found:
        t = re.sub(r"script: [0-9a-f]{40}, on @user_script:\d+\.", "script: <sha>, on @user_script:<line>.", t)
        generic.add(t)
    return generic


def pattern(quoted: str) -> re.Pattern[str]:
    """A quoted text as a pattern: each ``<placeholder>`` and ``...`` stands for any text."""
    parts = re.split(r"<[^<>]+>|\.\.\.", quoted)
    return re.compile(".+?".join(re.escape(p) for p in parts), re.S)


def error_of(call: Callable[[], object]) -> str:
    """The error text of a call that must fail, as Redis sent it."""
    try:
        call()
    except redis.exceptions.NoScriptError as exc:
        return f"NOSCRIPT {exc}"  # redis-py strips the code of this one
    except redis.ResponseError as exc:
        return str(exc)
    raise AssertionError("the call did not fail")


def eval_error(r: Any, name: str, n_keys: int, n_args: int, queue: str = "q") -> str:
    keys = [QueueKeys("pq", queue).role(role) for role in SCRIPT_KEYS[name]]
    args = [str(NOW)] * n_args
    return error_of(lambda: r.eval(lua_source(name), n_keys, *(keys * 2)[:n_keys], *args))


EMAILS = QueueKeys("pq", "emails")


def planted_ready(r: Any, script: str, args: list[Any]) -> str:
    r.set(EMAILS.ready, "oops")
    try:
        return error_of(lambda: transport_of(Queue("emails", r)).run(script, EMAILS, args))
    finally:
        r.delete(EMAILS.ready)


def enqueue_error(r: Any, key: str) -> str:
    """The error of an enqueue of one job whose 8th value is ``key``."""
    return error_of(lambda: transport_of(Queue("emails", r)).run(
        "enqueue", EMAILS, ["", 1, "job-9", b"x", 0, 3, "", "", "", key]))


def defer_plain_job(r: Any) -> str:
    """The error of defer_key for a lease of a job sent without a rate key."""
    q = Queue("emails", r)
    q.enqueue(b"x", job_id="job-9")
    (job,) = q.lease()
    return error_of(lambda: transport_of(q).run("defer_key", EMAILS, ["", job.receipt, 1000]))


def budget_full(r: Any, queue: str, budget: int, used: int, adds: int) -> str:
    """The error of an enqueue of ``adds`` bytes into ``queue`` under a byte budget of
    ``budget`` with ``used`` bytes in use (section 2.7)."""
    q = Queue(queue, r)
    q.set_budget(budget)
    q.enqueue(b"x" * used, job_id="b-1")
    return error_of(lambda: transport_of(q).run(
        "enqueue", QueueKeys("pq", queue), ["", 1, "b-2", b"x" * adds, 0, 3, "", "", "", ""]))


def corrupt_result_bytes(r: Any) -> str:
    """The error of an ack_result under a results budget whose `result_bytes` does not
    parse (section 2, results)."""
    q = Queue("emails", r)
    q.set_result_budget(1000)
    q.enqueue_many([NewJob(b"", job_id="k0"), NewJob(b"", job_id="k1")])
    first, held = q.lease(count=2)
    q.ack_result(first, b"abc")
    r.hset(EMAILS.counters, "result_bytes", "many")
    return error_of(lambda: transport_of(q).run("ack_result", EMAILS, ["", 1000, 60_000, 100, held.receipt, b"x"]))


def corrupt_dead(r: Any) -> str:
    r.hset(EMAILS.jobs, "job-9", "garbage")
    r.zadd(EMAILS.dead, {"job-9": 1})
    return error_of(lambda: transport_of(Queue("emails", r)).run("dead_list", EMAILS, [0, 100]))


#: Each error text lua/README.md quotes from a script (or from Redis), where, and the
#: call that provokes it. ``None`` as the backend: both; "real": Redis's own text, which
#: fakeredis words otherwise.
SCRIPT_ERRORS: dict[str, tuple[str, str | None, Callable[[Any], list[str]]]] = {
    f"PQ_CONTRACT stats expects 11 keys (contract v{CONTRACT_VERSION}), got 0": (
        "§10, how a client reads it", None, lambda r: [eval_error(r, "stats", 0, 1)]),
    "PQ_CONTRACT <script> expects <what> (contract v<N>), got <count>": (
        "§10, the count check: the form", None,
        lambda r: [eval_error(r, "pause", 0, 1), eval_error(r, "stats", 11, 2), eval_error(r, "ack", 17, 2),
                   eval_error(r, "ack_result", 20, 7)]),
    f"PQ_CONTRACT nack expects 16 keys (contract v{CONTRACT_VERSION}), got 15": (
        "§10", None, lambda r: [eval_error(r, "nack", 15, 6)]),
    f"PQ_CONTRACT cancel expects 3 arguments (contract v{CONTRACT_VERSION}), got 2": (
        "§10", None, lambda r: [eval_error(r, "cancel", 21, 2)]),
    f"PQ_CONTRACT nack expects 6..7 arguments (contract v{CONTRACT_VERSION}), got 5": (
        "§10", None, lambda r: [eval_error(r, "nack", 16, 5)]),
    f"PQ_CONTRACT enqueue expects 10..8002 arguments in steps of 8 (contract v{CONTRACT_VERSION}), got 9": (
        "§10", None, lambda r: [eval_error(r, "enqueue", 16, 9)]),
    f"PQ_CONTRACT nack expects 16 keys (contract v{CONTRACT_VERSION}), got 8": (
        "§8, errors (nack of an earlier contract)", None, lambda r: [eval_error(r, "nack", 8, 6, "emails")]),
    "PQ_BADARG max_attempts must be in [1, 10000], got 0": (
        "§8, errors", None,
        lambda r: [error_of(lambda: transport_of(Queue("emails", r)).run(
            "enqueue", EMAILS, ["", 1, "job-9", b"x", 0, 0, "", "", "", ""]))]),
    'PQ_BADARG malformed receipt "not-a-receipt"': (
        "§8, errors", None,
        lambda r: [error_of(lambda: transport_of(Queue("emails", r)).run("ack", EMAILS, ["", 300_000, "not-a-receipt"]))]),
    "WRONGTYPE <key> holds a <type>, expected a <type>": (
        "§5, WRONGTYPE's two forms", None,
        lambda r: [planted_ready(r, "enqueue", ["", 1, "job-9", b"x", 0, 3, "", "", "", ""])]),
    "WRONGTYPE pq:{emails}:ready holds a string, expected a list": (
        "§8, errors", None, lambda r: [planted_ready(r, "enqueue", ["", 1, "job-9", b"x", 0, 3, "", "", "", ""])]),
    "WRONGTYPE Operation against a key holding the wrong kind of value script: <sha>, on @user_script:<line>.": (
        "§5 and §8: a read that runs into a wrong type", "real", lambda r: [planted_ready(r, "stats", [""])]),
    "PQ_CORRUPT no valid record for dead job in pq:{emails}:jobs": ("§8, errors", None, lambda r: [corrupt_dead(r)]),
    'PQ_BADARG a rate key must be "rate|<count>/<period_ms>/<burst>/<cost>|<key>", got <value>, job <i>': (
        "§2.7, rate keys", None,
        lambda r: [enqueue_error(r, "rate|10/1000/1|k"), enqueue_error(r, "debounce|100|k\nrate|10|k")]),
    "PQ_BADARG a job's cost must be in [1, burst] (<burst>): more could never pass, got <cost>, job <i>": (
        "§2.7, rate keys", None,
        lambda r: [enqueue_error(r, "rate|10/1000/2/3|k"), enqueue_error(r, "rate|10/1000/1/0|k")]),
    "PQ_BADARG job <id> has no rate key to defer": ("§2.7, deferring a key", None, lambda r: [defer_plain_job(r)]),
    "PQ_FULL the queue is at its byte budget: <used> of <budget> bytes in use, this call adds <delta> (<counters key>)": (
        "§2.7, byte budgets, and §5", None,
        lambda r: [budget_full(r, "emails", 100, 60, 50), budget_full(r, "other", 1, 0, 2)]),
    "PQ_FULL the queue is at its byte budget: 8 of 10 bytes in use, this call adds 3 (pq:{digests}:counters)": (
        "§8, byte budgets", None, lambda r: [budget_full(r, "digests", 10, 8, 3)]),
    "PQ_CORRUPT unparsable result size in <keyed key> or <counters key>": (
        "§2, results", None,
        lambda r: [corrupt_result_bytes(r)]),
    "NOSCRIPT No matching script. Please use EVAL.": (
        "§1.1 and §8", None, lambda r: [error_of(lambda: r.evalsha("0" * 40, 0))]),
}


def test_the_error_texts_lua_readme_quotes_are_the_ones_checked_here() -> None:
    assert quoted_errors() == set(SCRIPT_ERRORS), (
        "lua/README.md quotes other error texts than SCRIPT_ERRORS checks: "
        f"new {sorted(quoted_errors() - set(SCRIPT_ERRORS))}, gone {sorted(set(SCRIPT_ERRORS) - quoted_errors())}"
    )


@pytest.mark.parametrize("quoted", sorted(SCRIPT_ERRORS))
def test_each_quoted_error_text_is_what_a_call_gets(r: Any, backend: str, quoted: str) -> None:
    where, only, provoke = SCRIPT_ERRORS[quoted]
    for got in provoke(r):
        if only is not None and backend != only:
            # Redis's own text, which only the real server words exactly so: elsewhere
            # the error's kind (its first word) must still be the one quoted.
            assert got.split(" ", 1)[0] == quoted.split(" ", 1)[0], f"{where}: {quoted!r}, got {got!r}"
            continue
        assert pattern(quoted).fullmatch(got), f"lua/README.md ({where}) quotes {quoted!r}; the call got {got!r}"


# -- the task layer's error texts (§9) and the partition count (§7.1) -----------------------


#: Each text lua/README.md quotes of a Python worker or driver, where, the job id (or
#: action) that provokes it below, and the pattern the error must match.
WORKER_ERRORS: dict[str, tuple[str, str, str]] = {
    "not a task envelope: ...": ("§9.1, reading", "not-json", r"not a task envelope: .+"),
    "task envelope version <v> is not known to this worker (it reads 1)": (
        "§9.1, reading", "v2", r"task envelope version 2 is not known to this worker \(it reads 1\)"),
    "task envelope with a value this worker cannot read: ...": (
        "§9.1, reading", "unknown-tag", r"task envelope with a value this worker cannot read: .+"),
    "malformed task envelope: task must be a string, args a list, kwargs and meta objects": (
        "§9.1, reading", "malformed",
        r"malformed task envelope: task must be a string, args a list, kwargs and meta objects"),
    "max_age exceeded: due <age>s ago, max_age is <max>s; not run": (
        "§9.3, opts.max_age_ms", "old", r"max_age exceeded: due \d+\.\d{3}s ago, max_age is 30s; not run"),
    "a per-send option does not resolve on this worker: ...": (
        "§9.3, opts", "bad-opts", r"a per-send option does not resolve on this worker: .+"),
    "pyqueue.worker.slots.TimeLimitExceeded: task <name> exceeded its time limit of <s>s": (
        "§9.3, opts.time_limit_ms", "slow",
        r"pyqueue\.worker\.slots\.TimeLimitExceeded: task readme\.slow exceeded its time limit of 0\.05s"),
    "unknown task '<name>'": ("§9.5, unknown task name", "unknown", r"unknown task 'readme\.nope'"),
    "the result cannot be stored: ...": ("§9.5, result kept", "unstorable", r"the result cannot be stored: .+"),
    "card declined": ("§9.5, Fail with a reason: bare", "fail-reason", r"card declined"),
    "failed by the handler": ("§9.5, a bare Fail()", "fail-bare", r"failed by the handler"),
    "ValueError: boom": ("§9.5, an exception's text", "fail-from", r"ValueError: boom"),
    "retry requested by the handler": (
        "§9.5, Retry without a reason", "retry-bare", r"retry requested by the handler"),
    "lease expired on attempt <N> of <M>": ("§2 and §3, errors", "expired", r"lease expired on attempt 1 of 1"),
    "queue '<name>' has <n> partition(s) recorded in Redis, but this queue object was made with partitions=<K>: ...": (
        "§7.1, check before the first call", "partitions",
        r"queue 'plain' has 1 partition\(s\) recorded in Redis, but this queue object was made with "
        r"partitions=4: .+"),
}


def test_each_worker_error_text_lua_readme_quotes_is_in_it() -> None:
    text = one_line(readme().replace("`", " ` "))
    for quoted, (where, _, _) in WORKER_ERRORS.items():
        assert f"` {quoted} `" in text, f"lua/README.md ({where}) no longer quotes {quoted!r}: update WORKER_ERRORS"


def envelope(task: str, meta: dict[str, Any], args: list[Any] | None = None) -> bytes:
    return json.dumps({"v": 1, "task": task, "args": args or [], "kwargs": {}, "meta": meta}).encode()


def test_each_worker_error_text_lua_readme_quotes_is_what_a_job_gets(r: Any) -> None:
    tasks = Tasks(client=r)

    @tasks.task(name="readme.ends", max_attempts=1)
    def ends(how: str) -> None:
        if how == "fail-reason":
            raise Fail("card declined")
        if how == "fail-bare":
            raise Fail()
        if how == "retry-bare":
            raise Retry()
        try:
            raise ValueError("boom")
        except ValueError as exc:
            raise Fail() from exc

    @tasks.task(name="readme.aged", max_age=30, max_attempts=1)
    def aged() -> None:
        pass

    @tasks.task(name="readme.slow", time_limit=0.05, max_attempts=1)
    def slow() -> None:
        time.sleep(0.5)

    @tasks.task(name="readme.unstorable", keep_result=60, max_attempts=1)
    def unstorable() -> object:
        return object()

    q = tasks.queue("default")
    seconds, micros = r.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    raw = {
        "not-json": b"nonsense",
        "v2": b'{"v":2,"task":"readme.aged"}',
        "unknown-tag": b'{"v":1,"task":"readme.aged","args":[{"$pq":"nope","v":1}]}',
        "malformed": b'{"v":1,"task":5}',
        "old": envelope("readme.aged", {"enqueued_ms": now - 100_000}),
        # sent 100 s ago to run 95 s later: 5 s old by section 9.3's rule, so it runs
        "delayed": envelope("readme.aged", {"enqueued_ms": now - 100_000, "delay_ms": 95_000}),
        "bad-opts": envelope("readme.aged", {"enqueued_ms": now, "opts": {"time_limit_ms": 0}}),
        "unknown": envelope("readme.nope", {"enqueued_ms": now}),
        "slow": envelope("readme.slow", {"enqueued_ms": now}),
        "unstorable": envelope("readme.unstorable", {"enqueued_ms": now}),
        **{how: envelope("readme.ends", {"enqueued_ms": now}, [how])
           for how in ("fail-reason", "fail-bare", "fail-from", "retry-bare")},
    }
    q.enqueue_many([NewJob(payload, job_id=job_id, max_attempts=1) for job_id, payload in raw.items()])
    burst(tasks)
    assert q.get("delayed").state == "done", "a delayed job's age counts from when it was due (section 9.3)"
    plain = Queue("plain", r)
    plain.enqueue(b"", job_id="expired", max_attempts=1, now_ms=T0)
    plain.lease(lease_ms=5, now_ms=T0)
    plain.promote(now_ms=T0 + 10)
    for quoted, (where, job_id, expected) in WORKER_ERRORS.items():
        if job_id == "partitions":
            with pytest.raises(InvalidArgument) as refused:
                Queue("plain", r, partitions=4).enqueue(b"")
            got = str(refused.value)
        else:
            info = (plain if job_id == "expired" else q).get(job_id)
            assert info.state == "dead", f"{job_id}: {info.state}"
            got = info.error
        assert pattern(quoted).fullmatch(got), f"lua/README.md ({where}) quotes {quoted!r}; the job got {got!r}"
        assert re.fullmatch(expected, got), f"{job_id}: {got!r}"


def test_a_plain_queue_records_one_partition_on_its_first_call_as_section_7_1_says(r: Any) -> None:
    q = Queue("solo", r)
    assert r.hget(q.spec.keys.counters, "partitions") is None
    q.stats()  # any first call, a read too
    assert r.hget(q.spec.keys.counters, "partitions") == b"1"
    text = one_line(readme())
    assert "it holds `partitions` = `1`" in text and "`HSETNX <prefix>:{<name>}:counters partitions <K>`" in text
