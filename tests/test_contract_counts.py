"""A versioned contract (issue #19, item 10): every script checks the number of KEYS and
ARGV it takes before anything else, and a wrong count answers
``PQ_CONTRACT <script> expects ... (contract v<N>), got <n>``, never a Lua error, an error
about some other argument, or a write.

The counts each script takes are read from its header (``KEYS (n)``, ``ARGV (...)``),
not copied here; the calls are otherwise valid ones on a queue and a service namespace
with something in every key, so a script that ignored the count would write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import T0, ArgvRule, argv_rule, busy_queue, calls_touching_every_key, dump_all

import pyqueue
from pyqueue import ContractMismatch, InvalidArgument, OutcomeUnknown, Queue
from pyqueue.protocol.errors import map_redis_error
from pyqueue.drivers.scripts import CONTRACT_VERSION, SCRIPT_KEYS, contract_version, lua_dir, lua_source
from pyqueue.ops.service import Service, Services
from pyqueue.drivers.queue import transport_of

NOW = T0 + 60


def test_the_header_rules_read_as_expected() -> None:
    # A few spot checks of the parser itself; every other rule is read the same way.
    assert argv_rule("nack") == ArgvRule(6, 7)
    assert argv_rule("service_register") == ArgvRule(10, 11)
    assert argv_rule("cancel") == ArgvRule(3, 3)
    assert argv_rule("enqueue") == ArgvRule(10, 8002, 8)
    assert argv_rule("ack_result") == ArgvRule(6, 2004, 2)
    assert argv_rule("lease") == ArgvRule(7, 1007)
    assert len(SCRIPT_KEYS["lease"]) == 23 and SCRIPT_KEYS["lease"][-2:] == ("windows", "index")
    assert argv_rule("set_rate_limit") == ArgvRule(2, 2)
    assert argv_rule("defer_key") == ArgvRule(3, 3)
    assert argv_rule("set_budget") == ArgvRule(1, 1) and SCRIPT_KEYS["set_budget"] == ("counters",)
    assert argv_rule("set_result_budget") == ArgvRule(1, 1) and SCRIPT_KEYS["set_result_budget"] == ("counters",)
    assert argv_rule("set_tombstone_limit") == ArgvRule(1, 1) and SCRIPT_KEYS["set_tombstone_limit"] == ("counters",)
    assert argv_rule("dead_purge") == ArgvRule(1, 1000)
    assert argv_rule("set_indexes") == ArgvRule(2, 2) and SCRIPT_KEYS["set_indexes"] == ("counters",)
    assert argv_rule("search") == ArgvRule(9, 9) and len(SCRIPT_KEYS["search"]) == 11
    assert argv_rule("promote_now") == ArgvRule(2, 1001)


@dataclass
class World:
    """A busy queue and a service namespace with one live service."""

    q: Queue
    service: Service
    calls: dict[str, tuple[Any, list[Any]]]  # script -> (its keys object, a valid ARGV)


def world(r: redis.Redis) -> World:
    q = Queue("q", r)
    handles = busy_queue(q)
    services = Services(r, namespace="ns")
    svc = services.register(["q"], registration="reg1", now_ms=T0)
    # 'held' as if it was sent with a rate key, so that defer_key of its lease writes.
    r.hset(q.spec.keys.role("keyed"), "r:held", "10/1000/2/1||api")
    touching = calls_touching_every_key(q, handles)
    calls: dict[str, tuple[Any, list[Any]]] = {script: (q.spec.keys, args) for script, args in touching.values()}
    calls["nack"] = (q.spec.keys, touching["nack_to_scheduled"][1])  # 6 ARGV: the smallest valid count
    calls.update({
        "get": (q.spec.keys, [NOW, "held", 1]),
        "cancel": (q.spec.keys, [NOW, "r0", 1000]),
        "limit": (q.spec.keys, [10, 1000, 5]),
        "set_group_limit": (q.spec.keys, ["g", 3]),
        "groups": (q.spec.keys, [0, 10]),
        "pause": (q.spec.keys, [NOW]),
        "resume": (q.spec.keys, [NOW]),
        "peek": (q.spec.keys, [NOW]),
        "scrub": (q.spec.keys, [NOW, svc.owner, 100]),
        "flow_wait": (q.spec.keys, [NOW, "w1", b"p", 3, "", "", 1000, "", "q\tr0"]),
        "flow_done": (q.spec.keys, [NOW, "w1", "fail", 1000, "q\tr0", "ok"]),
        "flow_record": (q.spec.keys, [NOW, "f1", b"{}", 1000]),
        "flow_show": (q.spec.keys, [NOW, "f1"]),
        "browse": (q.spec.keys, [NOW, "running", 0, 10]),
        "progress": (q.spec.keys, [NOW, handles["held"].receipt, b"{}"]),
        "progress_show": (q.spec.keys, ["held"]),
        "set_events": (q.spec.keys, [50]),
        "step": (q.spec.keys, [NOW, handles["held"].receipt, 1000, "s1", b"j1"]),
        "park": (q.spec.keys, [NOW, handles["held"].receipt, "sleep", "nap", 1000, 1000]),
        "signal": (q.spec.keys, [NOW, "held", "go", b"j1"]),
        "steps": (q.spec.keys, [NOW, "held"]),
        "sequence_skip": (q.spec.keys, [NOW, "seq"]),
        "set_rate_limit": (q.spec.keys, ["api", "5/1000/1"]),
        "defer_key": (q.spec.keys, [NOW, handles["held"].receipt, 5000]),
        "set_budget": (q.spec.keys, [1_000_000]),
        "set_result_budget": (q.spec.keys, [1_000_000]),
        "set_tombstone_limit": (q.spec.keys, [1000]),
        "set_indexes": (q.spec.keys, [NOW, 1]),
        "search": (q.spec.keys, [NOW, "", "", "", "", "", "", "", 10]),
        "promote_now": (q.spec.keys, [T0, "due"]),  # at T0 it is due later (T0 + 10): it would write
        "service_register": (
            services.keys.of(svc.id + 1), [NOW, svc.id + 1, "host", 1, "q", 60_000, 1000, 10, "tok2", "reg2"]
        ),
        "service_renew": (svc.keys, [NOW, svc.id, svc.renewal, "next1", 60_000, 10]),
        "service_deregister": (svc.keys, [NOW, svc.id, 0, svc.registration]),
        "service_stop": (svc.keys, [NOW, svc.id, svc.registration]),
    })
    assert set(calls) == set(SCRIPT_KEYS)
    return World(q, svc, calls)


def wrong_counts(name: str, keys: list[str], args: list[Any]) -> dict[str, tuple[list[str], list[Any]]]:
    """The calls with one key too few or too many, and ARGV one short of the least and
    one past the most the header allows (and off the step of a list of pairs or jobs):
    ``args`` is a valid ARGV of the least count or more."""
    rule = argv_rule(name)
    assert rule.allows(len(args)), (name, len(args), rule)
    extra_key = keys[0].rsplit(":", 1)[0] + ":extra"  # the same hash tag
    cases = {
        "one_key_too_few": (keys[:-1], args),
        "one_key_too_many": ([*keys, extra_key], args),
        "one_argument_too_few": (keys, args[: rule.lo - 1]),
        "one_argument_too_many": (keys, (args * (rule.hi // len(args) + 2))[: rule.hi + 1]),
    }
    if rule.step > 1:
        cases["one_argument_off_the_step"] = (keys, [*args, ""])
    return cases


CASES = [
    (name, case)
    for name in sorted(SCRIPT_KEYS)
    for case in ("one_key_too_few", "one_key_too_many", "one_argument_too_few", "one_argument_too_many",
                 "one_argument_off_the_step")
    if case != "one_argument_off_the_step" or argv_rule(name).step > 1
]


@pytest.mark.parametrize(("name", "case"), CASES)
def test_a_wrong_count_is_a_contract_error_and_writes_nothing(r: redis.Redis, name: str, case: str) -> None:
    w = world(r)
    keys_obj, args = w.calls[name]
    keys = [keys_obj.role(role) for role in SCRIPT_KEYS[name]]
    bad_keys, bad_args = wrong_counts(name, keys, args)[case]
    rule = argv_rule(name)
    before = dump_all(r)
    with pytest.raises(redis.ResponseError) as info:
        r.eval(lua_source(name), len(bad_keys), *bad_keys, *bad_args)
    message = str(info.value)
    got = len(bad_keys) if "key" in case else len(bad_args)
    assert message.startswith(f"PQ_CONTRACT {name} expects "), message
    assert message.endswith(f"(contract v{CONTRACT_VERSION}), got {got}"), message
    if "key" in case:
        assert f" expects {len(keys)} key" in message, message
    else:
        assert f" expects {rule.lo}" in message and (rule.lo == rule.hi or f"..{rule.hi} " in message), message
    assert dump_all(r) == before, "a refused call wrote"
    mapped = map_redis_error(info.value)
    assert isinstance(mapped, ContractMismatch) and isinstance(mapped, InvalidArgument)
    assert not isinstance(mapped, OutcomeUnknown)
    # The same call with the right counts is accepted: only the count was wrong.
    transport_of(w.q).run(name, keys_obj, args)


def test_the_exact_wording_of_a_contract_error(r: redis.Redis) -> None:
    w = world(r)
    keys_obj, args = w.calls["nack"]
    keys = [keys_obj.role(role) for role in SCRIPT_KEYS["nack"]]
    expect = {
        (15, 6): f"PQ_CONTRACT nack expects 16 keys (contract v{CONTRACT_VERSION}), got 15",
        (16, 5): f"PQ_CONTRACT nack expects 6..7 arguments (contract v{CONTRACT_VERSION}), got 5",
    }
    for (n_keys, n_args), text in expect.items():
        with pytest.raises(redis.ResponseError, match=rf"^{re.escape(text)}$"):
            r.eval(lua_source("nack"), n_keys, *keys[:n_keys], *args[:n_args])
    with pytest.raises(redis.ResponseError, match=r"^PQ_CONTRACT pause expects 1 key \(contract v\d+\), got 0$"):
        r.eval(lua_source("pause"), 0, NOW)
    with pytest.raises(redis.ResponseError, match=r"^PQ_CONTRACT stats expects 1 argument \(contract v\d+\), got 2$"):
        r.eval(lua_source("stats"), 11, *[w.q.spec.keys.role(k) for k in SCRIPT_KEYS["stats"]], NOW, NOW)
    enqueue = [w.q.spec.keys.role(k) for k in SCRIPT_KEYS["enqueue"]]
    with pytest.raises(redis.ResponseError, match=r"^PQ_CONTRACT enqueue expects 10\.\.8002 arguments in steps of 8 "):
        r.eval(lua_source("enqueue"), len(enqueue), *enqueue, NOW, 1, "id", b"", 0)


def test_the_count_table_of_lua_readme_agrees_with_the_headers() -> None:
    readme = (Path(__file__).resolve().parent.parent / "lua" / "README.md").read_text()
    section = readme.split("\n## 10. Contract version\n", 1)[1].split("\n### ", 1)[0]
    assert f"**version {CONTRACT_VERSION}**" in section
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| (\d+)(?:\.\.(\d+))?(?:[^|]*?in steps of (\d+))?[^|]*\|$", section, re.M)
    assert {name for name, *_ in rows} == set(SCRIPT_KEYS)
    for name, keys, lo, hi, step in rows:
        assert int(keys) == len(SCRIPT_KEYS[name]), name
        assert ArgvRule(int(lo), int(hi or lo), int(step or 1)) == argv_rule(name), name


def test_every_header_states_the_drivers_contract_version() -> None:
    for path in sorted(lua_dir().glob("*.lua")):
        assert contract_version(path.read_text()) == CONTRACT_VERSION, path.name


def test_the_version_in_the_scripts_is_the_drivers(r: redis.Redis) -> None:
    # The Lua constant, as a contract error reports it, is the Python constant.
    for name in SCRIPT_KEYS:
        with pytest.raises(redis.ResponseError, match=rf"\(contract v{CONTRACT_VERSION}\), got 0$"):
            r.eval(lua_source(name), 0)


def test_the_driver_refuses_scripts_of_another_contract_version(r: redis.Redis, tmp_path: Path) -> None:
    for path in lua_dir().glob("*.lua"):
        (tmp_path / path.name).write_text(path.read_text())
    nack = tmp_path / "nack.lua"
    nack.write_text(nack.read_text().replace(f"\nContract v{CONTRACT_VERSION} ", f"\nContract v{CONTRACT_VERSION + 1} ", 1))
    with pytest.raises(ContractMismatch, match=rf"nack\.lua states contract v{CONTRACT_VERSION + 1}"):
        Queue("q", r, lua_directory=tmp_path)
    Queue("q", r)  # the installed scripts are of its own version
    assert pyqueue.ContractMismatch is ContractMismatch
