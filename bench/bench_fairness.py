"""Fair scheduling (lua/README.md section 2.1) against a real redis-server: how long a
small tenant waits behind a large one, what a per-tenant cap costs in throughput, and
what a queue that uses neither groups nor priorities pays for them (nothing, we claim).

Three parts, each in one run on one server:

1. **Timeline.** Tenant A enqueues ``--backlog`` jobs (10,000), then tenants B..J enqueue
   10 each; one in-process Worker (concurrency 8, a handler that takes ``--work-ms``)
   drains them. Reported per tenant: when its first and its last job started, in ms
   after the last enqueue, and how many jobs of other tenants started between its
   enqueue and its first job (a "round" is one job of each tenant with work: at most 10
   here, plus the 8 leased before B..J arrived). The same load on a queue without groups
   is the reference: there B..J's jobs wait behind all of A's. The ratio reported is
   when the last of B..J's jobs started against when A's last job did.
2. **Cap throughput.** ``--cap-jobs`` jobs spread evenly over T tenants (4 and 8)
   and 8 handler threads: with a cap of 2 per tenant, with groups and no cap, and
   without groups: jobs/s of a burst drain by one Worker, interleaved repetitions,
   median. Twice: no-op jobs (bound by CPU: what a grouped lease costs), then jobs
   that take ``--cap-work-ms`` (5 ms: whether the cap keeps the 8 threads busy).
3. **Cost for a queue without groups or priorities.** The Redis CPU of a job's life
   (enqueue, then lease-and-ack one at a time, through raw EVALSHA with each
   contract's keys) under the scripts of this checkout against those of
   ``--baseline-lua`` (an older ``lua/``, contract v2), interleaved in blocks, from
   ``INFO commandstats``. Skipped without ``--baseline-lua``.
4. **The pick's cost by ring size.** A busy worker's call (ack one job and lease the
   next, one job in flight) in a queue whose jobs are spread over G groups (1, 8, 100,
   1000), against the same call in a queue without groups: server µs per call from
   ``INFO commandstats``, median of ``--repetitions`` rounds of ``--pick-calls`` calls.

Run::

    git worktree add --detach /tmp/pyqueue-v2 2b2a1f0   # the scripts before fair scheduling
    python bench/bench_fairness.py --baseline-lua /tmp/pyqueue-v2/lua [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402

from pyqueue import Job, NewJob, Queue  # noqa: E402
from pyqueue.worker import Worker  # noqa: E402

TENANTS = "ABCDEFGHIJ"
SMALL_JOBS = 10  # each of B..J


# -- 1. timeline ----------------------------------------------------------------------


def timeline(client: redis.Redis, backlog: int, work_ms: float, grouped: bool, tag: str) -> dict[str, Any]:
    """Enqueue A's backlog then B..J's jobs, drain with one Worker, and time every start."""
    q = Queue(f"bench-fair-{'g' if grouped else 'plain'}-{tag}", client)
    starts: list[tuple[float, str]] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            starts.append((time.perf_counter(), job.payload.decode()))
        if work_ms:
            time.sleep(work_ms / 1000)

    for first in range(0, backlog, 1000):
        q.enqueue_many([NewJob(b"A", group="A" if grouped else None) for _ in range(min(1000, backlog - first))])
    worker = Worker([q.name], handler, redis=client, concurrency=8, block_ms=200)
    thread = threading.Thread(target=worker.run, kwargs={"burst": True, "install_signal_handlers": False})
    thread.start()
    while len(starts) < 8:  # the worker is busy with A's backlog before the others arrive
        time.sleep(0.001)
    small_enqueued = {}
    for tenant in TENANTS[1:]:
        q.enqueue_many([NewJob(tenant.encode(), group=tenant if grouped else None) for _ in range(SMALL_JOBS)])
        small_enqueued[tenant] = time.perf_counter()
    t0 = time.perf_counter()
    thread.join(timeout=600)
    assert not thread.is_alive(), "the drain did not end within 10 minutes"
    assert len(starts) == backlog + SMALL_JOBS * (len(TENANTS) - 1), f"{len(starts)} jobs ran"
    per: dict[str, Any] = {}
    for tenant in TENANTS:
        mine = [(i, t) for i, (t, who) in enumerate(starts) if who == tenant]
        first_i, first_t = mine[0]
        entry = {"first_start_ms": round((first_t - t0) * 1000, 1), "last_start_ms": round((mine[-1][1] - t0) * 1000, 1)}
        if tenant != "A":
            since = small_enqueued[tenant]
            before = sum(1 for t, who in starts if since <= t < first_t and who != tenant)
            entry["jobs_of_others_before_its_first"] = before
        per[tenant] = entry
    small_last = max(per[t]["last_start_ms"] for t in TENANTS[1:])
    return {
        "per_tenant": per,
        "last_small_start_ms": small_last,
        "last_a_start_ms": per["A"]["last_start_ms"],
        "small_last / a_last": round(small_last / per["A"]["last_start_ms"], 4),
        "most_jobs_of_others_before_a_first": max(per[t]["jobs_of_others_before_its_first"] for t in TENANTS[1:]),
    }


# -- 2. cap throughput -----------------------------------------------------------------


def drain_rate(client: redis.Redis, jobs: int, tenants: int, kind: str, tag: str, work_ms: float) -> float:
    """Jobs/s of one Worker (8 threads) draining ``jobs`` spread over ``tenants``
    tenants: ``capped`` (groups, a cap of 2 each), ``grouped`` (groups, no cap) or
    ``plain`` (the same jobs without groups). Each job sleeps ``work_ms`` (0: a no-op)."""
    q = Queue(f"bench-fair-cap-{tenants}-{kind}-{work_ms:g}-{tag}", client)
    if kind == "capped":
        q.set_group_limit(2)
    for first in range(0, jobs, 1000):
        q.enqueue_many(
            [NewJob(b"", group=None if kind == "plain" else f"t{(first + i) % tenants}") for i in range(min(1000, jobs - first))]
        )
    done = [0]

    def handler(job: Job) -> None:
        if work_ms:
            time.sleep(work_ms / 1000)
        done[0] += 1

    worker = Worker([q.name], handler, redis=client, concurrency=8, block_ms=200)
    started = time.perf_counter()
    worker.run(burst=True, install_signal_handlers=False)
    elapsed = time.perf_counter() - started
    assert done[0] == jobs, f"{done[0]} of {jobs} ran"
    return jobs / elapsed


def cap_throughput(client: redis.Redis, jobs: int, repetitions: int, tag: str, work_ms: float) -> dict[str, Any]:
    """Per tenant count, the median jobs/s of each kind, and the ratios per repetition
    (median): capped / grouped is what the cap costs, capped / plain what groups and the
    cap cost together. With no-op jobs (``work_ms`` 0) the drain is bound by the scripts'
    and the worker's CPU, so capped / plain is what a grouped lease costs over a plain
    one; with jobs that take time it is whether a cap of 2 x the tenants keeps the 8
    threads busy (the scheduling)."""
    out: dict[str, Any] = {"work_ms": work_ms}
    kinds = ["capped", "grouped", "plain"]
    for tenants in (4, 8):
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        for rep in range(repetitions):
            order = kinds[:]
            random.shuffle(order)
            for kind in order:
                rates[kind].append(drain_rate(client, jobs, tenants, kind, f"{tag}-{rep}", work_ms))
        out[f"{tenants}_tenants"] = {
            **{f"{k}_jobs_per_s": round(statistics.median(v)) for k, v in rates.items()},
            "capped / grouped": round(statistics.median(c / g for c, g in zip(rates["capped"], rates["grouped"])), 3),
            "capped / plain": round(statistics.median(c / p for c, p in zip(rates["capped"], rates["plain"])), 3),
            "grouped / plain": round(statistics.median(g / p for g, p in zip(rates["grouped"], rates["plain"])), 3),
        }
    return out


# -- 3. cost for a queue without groups or priorities ----------------------------------

V2_KEYS = {
    "enqueue": ("jobs", "ready", "scheduled", "counters", "wake", "done"),
    "lease": ("jobs", "ready", "scheduled", "leased", "owners", "dead", "errors", "counters", "wake", "done"),
}
FAIR = ("meta", "gready", "ring", "groups")
# This checkout's contract (v4): the fair-scheduling keys, then the event stream.
NEW_KEYS = {"enqueue": V2_KEYS["enqueue"] + FAIR + ("events",), "lease": V2_KEYS["lease"] + FAIR + ("events",)}


class RawScripts:
    """enqueue and lease of one scripts directory, called with raw EVALSHA."""

    def __init__(self, client: redis.Redis, directory: Path, keys: dict[str, tuple[str, ...]], v3: bool, queue: str) -> None:
        # v3: the contract since fair scheduling (each job also has a priority and a group).
        self.client, self.v3 = client, v3
        self.sha = {name: client.script_load((directory / f"{name}.lua").read_text()) for name in keys}
        self.keys = {name: [f"pq:{{{queue}}}:{role}" for role in roles] for name, roles in keys.items()}
        self.calls = 0

    def enqueue(self, job_id: str) -> None:
        per_job = [job_id, b"x" * 64, 0, 5] + (["", ""] if self.v3 else [])
        self.client.evalsha(self.sha["enqueue"], len(self.keys["enqueue"]), *self.keys["enqueue"], "", 1, *per_job)

    def lease(self, acks: list[str]) -> list[str]:
        self.calls += 1
        reply = self.client.evalsha(
            self.sha["lease"], len(self.keys["lease"]), *self.keys["lease"], "", "bench", f"c{self.calls}", 1, 30000, 100,
            300000, *acks,
        )
        r = reply[2]
        m = reply[3 + r]
        return [reply[4 + r + 7 * i].decode() for i in range(m)]


def script_usec(admin: redis.Redis) -> float:
    """Total usec the server spent in EVALSHA (scripts included)."""
    stats = admin.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def plain_cost(url: str, baseline: Path, jobs: int, rounds: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    tag = str(time.time_ns())
    new = RawScripts(client, _server.REPO_ROOT / "lua", NEW_KEYS, True, f"bench-plain-new-{tag}")
    old = RawScripts(client, baseline, V2_KEYS, False, f"bench-plain-old-{tag}")
    per_job: dict[str, list[float]] = {"new": [], "old": []}
    for rnd in range(rounds):
        pair = [("new", new), ("old", old)]
        random.shuffle(pair)
        for name, scripts in pair:
            before = script_usec(client)
            for i in range(jobs):
                scripts.enqueue(f"{rnd}-{i}")
            held = scripts.lease([])
            while held:
                held = scripts.lease(held)
            per_job[name].append((script_usec(client) - before) / jobs)
    ratios = [n / o for n, o in zip(per_job["new"], per_job["old"])]
    return {
        "redis_script_usec_per_job_new": round(statistics.median(per_job["new"]), 2),
        "redis_script_usec_per_job_old": round(statistics.median(per_job["old"]), 2),
        "new / old": round(statistics.median(ratios), 3),
        "rounds": rounds,
        "jobs_per_round": jobs,
    }


# -- 4. the pick's cost by ring size --------------------------------------------------


PICK_GROUPS = (0, 1, 8, 100, 1000)  # 0: no groups


def pick_usec(client: redis.Redis, groups: int, calls: int, tag: str) -> float:
    """Server µs per ack+lease call, one job in flight, in a fresh queue of ``groups``
    groups (0: none) holding enough jobs for every call."""
    q = Queue(f"bench-pick-{groups}-{tag}", client)
    total = calls + 200 + max(groups, 1)
    names = [f"g{i % groups}" if groups else None for i in range(total)]
    for start in range(0, total, 1000):
        q.enqueue_many([NewJob(b"x" * 32, group=name) for name in names[start:start + 1000]])
    (job,) = q.lease(count=1)
    for _ in range(200):  # every group in the ring once, its turn taken
        _, (job,) = q.ack_and_lease(job)
    before = client.info("commandstats").get("cmdstat_evalsha", {})
    for _ in range(calls):
        _, (job,) = q.ack_and_lease(job)
    after = client.info("commandstats")["cmdstat_evalsha"]
    usec = (after["usec"] - before.get("usec", 0)) / (after["calls"] - before.get("calls", 0))
    client.delete(*client.keys(f"pq:{{{q.name}}}:*"))
    return usec


def pick_cost(client: redis.Redis, calls: int, repetitions: int, tag: str) -> dict[str, Any]:
    runs: dict[int, list[float]] = {g: [] for g in PICK_GROUPS}
    for rep in range(repetitions):
        order = list(PICK_GROUPS)
        random.shuffle(order)
        for groups in order:
            runs[groups].append(pick_usec(client, groups, calls, f"{tag}-{rep}"))
    plain = statistics.median(runs[0])
    return {
        ("no groups" if g == 0 else f"{g} groups"): {
            "server_usec_per_call": round(statistics.median(runs[g]), 1),
            "vs_no_groups": round(statistics.median(runs[g]) / plain, 2),
        }
        for g in PICK_GROUPS
    } | {"calls_per_round": calls, "rounds": repetitions}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--backlog", type=int, default=10_000, help="tenant A's jobs")
    parser.add_argument("--work-ms", type=float, default=1.0, help="what each job of the timeline takes")
    parser.add_argument("--cap-jobs", type=int, default=8000, help="jobs per drain of the cap throughput part")
    parser.add_argument("--cap-work-ms", type=float, default=5.0,
                        help="what each job takes in the cap throughput's second part (the first runs no-op jobs)")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--baseline-lua", type=Path, default=None, help="an older lua/ (contract v2) for part 3")
    parser.add_argument("--plain-jobs", type=int, default=2000)
    parser.add_argument("--plain-rounds", type=int, default=10)
    parser.add_argument("--pick-calls", type=int, default=3000, help="ack+lease calls per round of the pick part")
    parser.add_argument("--only", nargs="+", choices=["timeline", "cap", "plain", "pick"], default=None,
                        help="the parts to run (default: all, plain only with --baseline-lua)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    if not (100 <= args.backlog <= 100_000 and 800 <= args.cap_jobs <= 100_000 and 1 <= args.repetitions <= 20
            and 0 < args.cap_work_ms <= 100):
        parser.error("--backlog in [100, 100000], --cap-jobs in [800, 100000], --repetitions in [1, 20], "
                     "--cap-work-ms in (0, 100]")
    if args.only is not None and "plain" in args.only and args.baseline_lua is None:
        parser.error("--only plain compares with older scripts: give them with --baseline-lua DIR")
    if not 100 <= args.pick_calls <= 100_000:
        parser.error("--pick-calls in [100, 100000]")
    parts = args.only or ["timeline", "cap", "plain", "pick"]
    server: _server.LoopbackRedis | None = None
    if args.redis_url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
    _server.require_loopback(args.redis_url)
    try:
        client = redis.Redis.from_url(args.redis_url)
        tag = str(time.time_ns())
        report: dict[str, Any] = {}
        if "timeline" in parts:
            report["timeline_grouped"] = timeline(client, args.backlog, args.work_ms, True, tag)
            report["timeline_without_groups"] = timeline(client, args.backlog, args.work_ms, False, tag)
        if "cap" in parts:
            report["cap_throughput"] = cap_throughput(client, args.cap_jobs, args.repetitions, tag, 0.0)
            report["cap_throughput_with_work"] = cap_throughput(client, args.cap_jobs, args.repetitions, tag,
                                                                args.cap_work_ms)
        if "plain" in parts and args.baseline_lua is not None:
            report["plain_queue_cost"] = plain_cost(args.redis_url, args.baseline_lua, args.plain_jobs, args.plain_rounds)
        if "pick" in parts:
            report["pick_cost"] = pick_cost(client, args.pick_calls, args.repetitions, tag)
    finally:
        if server is not None:
            server.stop()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
