"""The contract of results budgets (lua/README.md section 2, results) where
tests/test_result_budget.py does not reach: a result stored again under the same id,
and the sizes' invariants over a mixed run (expired, over max_results, over the budget,
replaced, lifted). Plain tests on ``q`` and ``r``, which tests/test_mutations.py also
runs against planted bugs of lua/ack_result.lua. On fakeredis and a real redis-server."""

from __future__ import annotations

from typing import Any

import redis

from pyqueue import Outcome, Queue

T0 = 1_000_000
#: What ack_result stores of a result: "<finished_ms>|" then the encoded value (one kind
#: byte, "b" for bytes); every time in these tests has as many digits as T0.
PREFIX = len(f"{T0}|") + 1
KEEP_DONE_MS = 300_000  # the driver's default: an acked id may be sent again after it


def finish(q: Queue, job_id: str, value: bytes, at: int, ttl_ms: int = 3_600_000, max_results: int = 100) -> None:
    assert q.enqueue(b"", job_id=job_id, now_ms=at).added
    (job,) = [j for j in q.lease(count=100, now_ms=at) if j.id == job_id]
    assert q.ack_result(job, value, result_ttl_ms=ttl_ms, max_results=max_results, now_ms=at) is Outcome.OK


def sizes(r: Any, q: Queue) -> dict[str, int]:
    keyed = r.hgetall(q.spec.keys.keyed)
    return {k[3:].decode(): int(v) for k, v in keyed.items() if k.startswith(b"rb:")}


def used(r: Any, q: Queue) -> int:
    return int(r.hget(q.spec.keys.counters, "result_bytes") or 0)


def check_sizes(r: Any, q: Queue) -> dict[str, int]:
    """The invariants: `result_bytes` is the sum of the `rb:<id>` sizes, and every size
    is the `HSTRLEN` of a result still kept. Answers the sizes."""
    kept = sizes(r, q)
    assert used(r, q) == sum(kept.values()), (used(r, q), kept)
    for job_id, size in kept.items():
        assert r.hstrlen(q.spec.keys.results, job_id) == size, (job_id, size)
    return kept


def test_a_result_stored_again_under_its_id_replaces_the_old_ones_size(q: Queue, r: redis.Redis) -> None:
    q.set_result_budget(10_000)
    finish(q, "j", b"a" * 100, T0)
    assert check_sizes(r, q) == {"j": PREFIX + 100}
    # Sent again once its tombstone is over, while its first result is still kept (an
    # hour): the new result replaces it, and only the new size counts.
    again = T0 + KEEP_DONE_MS + 1
    finish(q, "j", b"b" * 10, again)
    assert check_sizes(r, q) == {"j": PREFIX + 10}
    assert q.result("j", now_ms=again).value == b"b" * 10


def test_sizes_stay_the_sum_of_the_kept_results_through_every_kind_of_trim(q: Queue, r: redis.Redis) -> None:
    budget, most = 4 * (PREFIX + 50), 6
    q.set_result_budget(budget)
    at, expires, seen = T0, dict[str, int](), set[str]()
    # Empty results (`most` binds first), then 90-byte ones (the budget binds), then
    # results of 0..90 bytes of which every other expires by the call after next.
    runs = [(b"", 3_600_000)] * 10 + [(bytes(90), 3_600_000)] * 10
    runs += [(bytes(i % 10 * 10), 15 if i % 2 else 3_600_000) for i in range(20)]
    for i, (value, ttl) in enumerate(runs):
        at += 10
        before = {k.decode() for k in r.hkeys(q.spec.keys.results)}
        finish(q, f"j{i}", value, at, ttl_ms=ttl, max_results=most)
        expires[f"j{i}"] = at + ttl
        kept = check_sizes(r, q)
        assert used(r, q) <= budget, (i, kept)
        after = {k.decode() for k in r.hkeys(q.spec.keys.results)}
        assert len(after) <= most
        # What made room: their time; then the count (past `most`); then the budget.
        gone = before - after
        expired = {g for g in gone if expires[g] <= at}
        by_count = max(0, len(before) - len(expired) + 1 - most)
        seen |= {"expired"} if expired else set()
        seen |= {"count"} if by_count else set()
        seen |= {"budget"} if len(gone) - len(expired) > by_count else set()
    assert seen == {"expired", "count", "budget"}
    # Lifted: new results are not sized, and the sizes kept go as their results are
    # trimmed (the new ones, kept longer, push them past max_results).
    assert q.set_result_budget(None) is True
    for i in range(len(runs), len(runs) + 20):
        at += 10
        finish(q, f"j{i}", bytes(50), at, ttl_ms=7_200_000, max_results=most)
        check_sizes(r, q)
    assert sizes(r, q) == {} and used(r, q) == 0
