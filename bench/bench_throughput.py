"""End-to-end throughput of one process, against raw limits measured in the same run,
and the Redis commands and round trips one job costs over its whole life.

Method: plain ``time.perf_counter`` loops, not pyperf. A throughput figure here is one
pass over N jobs ("enqueue N, then drain N with one process"), and a drain depends on
the enqueue before it, which does not fit pyperf's independent loop iterations.

Loopback latency on a shared virtual machine drifts by a factor of 2-3 within seconds,
so a pyqueue figure and the raw limit it is compared with must see the same drift.
Each repetition therefore interleaves them in blocks of 100 items, in a shuffled order
per block, and sums the time of each measurement over its blocks:

* enqueue phase, N items each: ``raw_lpush``, ``raw_evalsha``, ``enqueue_one``,
  ``raw_evalsha_pipelined_x100``, ``enqueue_batched_x100`` (the last one filling a second
  queue);
* drain phase, N items each: ``raw_lmove_lrem``, ``raw_evalsha_drain_phase``,
  ``drain_one`` (lease once, then ``ack_and_lease`` per job, from the queue
  ``enqueue_one`` filled) and ``drain_batched_x100`` (``lease(count=100)`` then
  ``ack_many``, from the queue ``enqueue_batched_x100`` filled).

A ratio is computed per repetition from measurements of the same phase, and the
report gives the median over repetitions (and the median rates). The definitions:

* ``raw_lpush``                   LPUSH, one item per call.
* ``raw_lmove_lrem``              LMOVE src->processing + LREM, per item (2 calls).
* ``raw_evalsha``                 EVALSHA of ``return 1``, one call per round trip.
* ``raw_evalsha_pipelined_x100``  the same, 100 calls pipelined per round trip.
* ``enqueue_one``                 Queue.enqueue, one job per call.
* ``enqueue_batched_x100``        Queue.enqueue_many, 100 jobs per call.
* ``drain_one``                   Queue.ack_and_lease, one job per call.
* ``drain_batched_x100``          Queue.lease(count=100) + Queue.ack_many per 100 jobs.

Then, on a fresh queue, the lifecycle cost (enqueue one per call + ack_and_lease one
per call, as ``drain_one`` does): ``CONFIG RESETSTAT``, run M jobs through, read
``INFO commandstats`` (which counts the commands scripts run inside Redis as well as
the EVALSHA calls themselves), and count client calls on the client side.

Run::

    python bench/bench_throughput.py [--jobs 5000] [--repetitions 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402

from pyqueue import Job, Queue, connect  # noqa: E402
from pyqueue.scripts import SCRIPT_KEYS, lua_source  # noqa: E402

PAYLOAD = b"p" * 64
LONG_LEASE_MS = 3_600_000
#: Jobs per enqueue_many / lease call in the batched measurements.
BATCH = 100
#: Items per interleaving block of every measurement.
BLOCK = 100
#: Commands the measurement itself sends; excluded from the per-job command count.
BOOKKEEPING_COMMANDS = frozenset({"config|resetstat", "info", "ping"})

UNITS: dict[str, str] = {
    "raw_lpush": "items/s",
    "raw_lmove_lrem": "items/s",
    "raw_evalsha": "calls/s",
    "raw_evalsha_pipelined_x100": "calls/s",
    "raw_evalsha_drain_phase": "calls/s",
    "enqueue_one": "jobs/s",
    "enqueue_batched_x100": "jobs/s",
    "drain_one": "jobs/s",
    "drain_batched_x100": "jobs/s",
}
#: label -> (numerator, denominator, target): each ratio should be at least its target.
RATIO_TARGETS: dict[str, tuple[str, str, float]] = {
    "enqueue_one / raw_evalsha": ("enqueue_one", "raw_evalsha", 0.70),
    "enqueue_batched_x100 / raw_evalsha_pipelined_x100": ("enqueue_batched_x100", "raw_evalsha_pipelined_x100", 0.60),
    "drain_one / raw_evalsha (drain phase)": ("drain_one", "raw_evalsha_drain_phase", 0.60),
    "drain_batched_x100 / drain_one": ("drain_batched_x100", "drain_one", 3.0),
}
#: Context ratios without a target: pyqueue against the logic-free list commands.
CONTEXT_RATIOS: dict[str, tuple[str, str]] = {
    "enqueue_one / raw_lpush": ("enqueue_one", "raw_lpush"),
    "drain_one / raw_lmove_lrem": ("drain_one", "raw_lmove_lrem"),
}


class CountingRedis(redis.Redis):
    """A redis-py client that counts the commands it sends, one per round trip (no
    pipelines are used through it), so ``round_trips`` is the client-side call count."""

    round_trips: int = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def load_scripts(client: redis.Redis) -> None:
    """SCRIPT LOAD every pyqueue script so no timed call pays the NOSCRIPT detour."""
    for name in SCRIPT_KEYS:
        client.script_load(lua_source(name))


class Repetition:
    """One enqueue-N-then-drain-N pass with every measurement interleaved in blocks."""

    def __init__(self, raw: redis.Redis, pyqueue_client: redis.Redis, sha_return1: str, jobs: int, tag: str) -> None:
        self.raw = raw
        self.sha = sha_return1
        self.jobs = jobs
        self.tag = tag
        self.one = Queue(f"bench-tp-one-{tag}", pyqueue_client)
        self.batched = Queue(f"bench-tp-batched-{tag}", pyqueue_client)
        self.seconds: dict[str, float] = dict.fromkeys(UNITS, 0.0)
        self.rng = random.Random(tag)
        self._current: list[Job] = []  # drain_one's job in hand between blocks
        self._drained = {"one": 0, "batched": 0}

    def _timed_block(self, steps: dict[str, Callable[[], None]]) -> None:
        """Run one block of every measurement in a shuffled order, adding up times."""
        names = list(steps)
        self.rng.shuffle(names)
        for name in names:
            t0 = time.perf_counter()
            steps[name]()
            self.seconds[name] += time.perf_counter() - t0

    # -- enqueue phase ----------------------------------------------------------------------------

    def enqueue_phase(self) -> None:
        raw, sha = self.raw, self.sha
        lpush_key = f"bench-tp-lpush-{self.tag}"
        one, batched = self.one, self.batched
        batch = [PAYLOAD] * BATCH

        def raw_lpush() -> None:
            for _ in range(BLOCK):
                raw.lpush(lpush_key, PAYLOAD)

        def raw_evalsha() -> None:
            for _ in range(BLOCK):
                raw.evalsha(sha, 0)

        def raw_evalsha_pipelined() -> None:
            for _ in range(BLOCK // 100):
                pipe = raw.pipeline(transaction=False)
                for _ in range(100):
                    pipe.evalsha(sha, 0)
                pipe.execute()

        def enqueue_one() -> None:
            for _ in range(BLOCK):
                one.enqueue(PAYLOAD)

        def enqueue_batched() -> None:
            for _ in range(BLOCK // BATCH):
                batched.enqueue_many(batch)

        steps = {
            "raw_lpush": raw_lpush,
            "raw_evalsha": raw_evalsha,
            "raw_evalsha_pipelined_x100": raw_evalsha_pipelined,
            "enqueue_one": enqueue_one,
            "enqueue_batched_x100": enqueue_batched,
        }
        for _ in range(self.jobs // BLOCK):
            self._timed_block(steps)
        raw.unlink(lpush_key)

    # -- drain phase ------------------------------------------------------------------------------

    def drain_phase(self) -> None:
        raw, sha = self.raw, self.sha
        src, processing = f"bench-tp-src-{self.tag}", f"bench-tp-proc-{self.tag}"
        for start in range(0, self.jobs, 1000):  # untimed: the items LMOVE takes
            raw.rpush(src, *[b"%d:" % i + PAYLOAD for i in range(start, min(self.jobs, start + 1000))])
        one, batched = self.one, self.batched

        def raw_lmove_lrem() -> None:
            for _ in range(BLOCK):
                item = raw.lmove(src, processing, "LEFT", "RIGHT")
                raw.lrem(processing, 1, item)  # type: ignore[arg-type]  # redis-py types values as str; bytes work

        def raw_evalsha() -> None:
            for _ in range(BLOCK):
                raw.evalsha(sha, 0)

        def drain_one() -> None:
            # The first block starts the chain with one lease; after that every call acks
            # the job in hand and leases the next (the last one leases nothing).
            if not self._current and self._drained["one"] == 0:
                self._current = one.lease(LONG_LEASE_MS)
            for _ in range(BLOCK):
                _outcome, self._current = one.ack_and_lease(self._current[0], lease_ms=LONG_LEASE_MS)
                self._drained["one"] += 1

        def drain_batched() -> None:
            for _ in range(BLOCK // BATCH):
                jobs = batched.lease(LONG_LEASE_MS, count=BATCH)
                batched.ack_many(jobs)
                self._drained["batched"] += len(jobs)

        steps = {
            "raw_lmove_lrem": raw_lmove_lrem,
            "raw_evalsha_drain_phase": raw_evalsha,
            "drain_one": drain_one,
            "drain_batched_x100": drain_batched,
        }
        for _ in range(self.jobs // BLOCK):
            self._timed_block(steps)
        raw.unlink(src, processing)

    def check_and_drop(self) -> None:
        """Every job enqueued was drained and acked exactly once; then delete the queues."""
        for label, queue in (("one", self.one), ("batched", self.batched)):
            stats = queue.stats()
            if self._drained[label] != self.jobs or stats.ready or stats.leased or stats.acked != self.jobs:
                raise RuntimeError(f"drain {label} incomplete: drained {self._drained[label]} of {self.jobs}, {stats}")
            queue.redis.unlink(*queue.keys.all())

    def rates_per_s(self) -> dict[str, float]:
        return {name: self.jobs / seconds for name, seconds in self.seconds.items()}


def lifecycle_cost(url: str, jobs: int) -> dict[str, Any]:
    """Commands and round trips per job for enqueue (one per call) + ack_and_lease (one
    per call), measured with INFO commandstats and a client-side call counter."""
    admin = _server.client_for(url)
    client = CountingRedis(connection_pool=connect(url).connection_pool)
    load_scripts(client)
    queue = Queue(f"bench-tp-lifecycle-{time.time_ns()}", client)
    client.ping()  # connect now: a new connection's handshake stays out of the count

    admin.config_resetstat()
    client.round_trips = 0
    for _ in range(jobs):
        queue.enqueue(PAYLOAD)
    leased = queue.lease(LONG_LEASE_MS)
    while leased:
        _outcome, leased = queue.ack_and_lease(leased[0], lease_ms=LONG_LEASE_MS)
    round_trips = client.round_trips
    commandstats = admin.info("commandstats")
    client.unlink(*queue.keys.all())

    stats = {name.removeprefix("cmdstat_"): stat for name, stat in commandstats.items()}
    calls = {name: int(stat["calls"]) for name, stat in stats.items() if name not in BOOKKEEPING_COMMANDS}
    total = sum(calls.values())
    evalsha = calls.get("evalsha", 0)
    # EVALSHA's usec covers the whole script, the commands it runs included.
    script_usec = int(stats["evalsha"]["usec"]) if "evalsha" in stats else 0
    return {
        "jobs": jobs,
        "commands_per_job": total / jobs,
        "commands_in_lua_per_job": (total - evalsha) / jobs,
        "evalsha_per_job": evalsha / jobs,
        "round_trips_per_job": round_trips / jobs,
        "server_script_us_per_job": script_usec / jobs,
        "per_command_per_job": {k: v / jobs for k, v in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))},
        "targets": {"commands_per_job": 12, "round_trips_per_job": 2},
    }


def run(url: str, jobs: int, repetitions: int, lifecycle_jobs: int) -> dict[str, Any]:
    """All measurements; returns the report as a JSON-able dict."""
    if jobs % BLOCK:
        raise ValueError(f"--jobs must be a multiple of {BLOCK}")
    raw = _server.client_for(url)
    pyqueue_client = connect(url)
    load_scripts(pyqueue_client)
    sha = raw.script_load("return 1")

    samples: dict[str, list[float]] = {name: [] for name in UNITS}
    pairs = {label: (num, den) for label, (num, den, _target) in RATIO_TARGETS.items()} | CONTEXT_RATIOS
    ratio_samples: dict[str, list[float]] = {label: [] for label in pairs}
    for rep in range(repetitions + 1):
        # Repetition 0 warms connections, caches and the server's allocator; discarded.
        one = Repetition(raw, pyqueue_client, sha, jobs if rep else min(jobs, 1000), f"{time.time_ns()}-{rep}")
        one.enqueue_phase()
        one.drain_phase()
        one.check_and_drop()
        if rep == 0:
            continue
        rates = one.rates_per_s()
        for name, rate in rates.items():
            samples[name].append(rate)
        for label, (num, den) in pairs.items():
            ratio_samples[label].append(rates[num] / rates[den])

    ratios = {}
    for label, (_num, _den, target) in RATIO_TARGETS.items():
        median = statistics.median(ratio_samples[label])
        ratios[label] = {"ratio": median, "samples": ratio_samples[label], "target": target, "met": median >= target}
    return {
        "method": "time.perf_counter, interleaved blocks of 100, median of repetitions (not pyperf)",
        "jobs_per_measurement": jobs,
        "repetitions": repetitions,
        "payload_bytes": len(PAYLOAD),
        "rates": {
            name: {"unit": UNITS[name], "median_per_s": statistics.median(s), "samples_per_s": s}
            for name, s in samples.items()
        },
        "ratios": ratios,
        "context_ratios": {label: statistics.median(ratio_samples[label]) for label in CONTEXT_RATIOS},
        "lifecycle": lifecycle_cost(url, lifecycle_jobs),
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    lines = [
        f"throughput: {report['jobs_per_measurement']} items per measurement, median of "
        f"{report['repetitions']} repetitions ({report['method']})"
    ]
    for name, rate in report["rates"].items():
        lines.append(f"  {name:<28} {rate['median_per_s']:>10,.0f} {rate['unit']}")
    lines.append("ratios (pyqueue / raw limit, same phase of the same repetition; median):")
    for label, r in report["ratios"].items():
        verdict = "met" if r["met"] else "NOT met"
        lines.append(f"  {label:<52} {r['ratio']:7.3f}  target >= {r['target']:.2f}  {verdict}")
    for label, value in report["context_ratios"].items():
        lines.append(f"  {label:<52} {value:7.3f}  (context, no target)")
    life = report["lifecycle"]
    lines.append(
        f"lifecycle (enqueue + ack_and_lease, {life['jobs']} jobs): {life['commands_per_job']:.2f} commands/job "
        f"({life['evalsha_per_job']:.2f} EVALSHA + {life['commands_in_lua_per_job']:.2f} inside Lua; target <= 12), "
        f"{life['round_trips_per_job']:.3f} round trips/job (target <= 2), "
        f"{life['server_script_us_per_job']:.0f} us of script time/job"
    )
    for name, per_job in life["per_command_per_job"].items():
        lines.append(f"  {name:<20} {per_job:6.3f}/job")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--jobs", type=int, default=5000, help=f"items per measurement (multiple of {BLOCK})")
    parser.add_argument("--repetitions", type=int, default=5, help="repetitions; the median is reported")
    parser.add_argument("--lifecycle-jobs", type=int, default=1000, help="jobs for the commands-per-job count")
    parser.add_argument("--json-out", default=None, help="also write the report as JSON here")
    args = parser.parse_args()
    if not (BLOCK <= args.jobs <= 100_000 and 1 <= args.repetitions <= 50):
        parser.error(f"--jobs must be in [{BLOCK}, 100000] and --repetitions in [1, 50]")

    server: _server.LoopbackRedis | None = None
    if args.redis_url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
    _server.require_loopback(args.redis_url)
    try:
        report = run(args.redis_url, args.jobs, args.repetitions, args.lifecycle_jobs)
    finally:
        if server is not None:
            server.stop()
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
    print(format_report(report))


if __name__ == "__main__":
    main()
