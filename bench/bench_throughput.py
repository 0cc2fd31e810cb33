"""End-to-end throughput of one process, against raw limits measured in the same run,
and the Redis commands and round trips one job costs over its whole life.

Method: plain ``time.perf_counter`` loops, not pyperf. A throughput figure here is one
long pass over N jobs ("enqueue N, then drain N with one process"), which does not fit
pyperf's model of many short, independent loop iterations: a drain depends on the
enqueue before it. Each repetition runs every measurement once, in the same order
(raw limits first), so slow drift of the machine touches all figures alike; the report
gives the median of the repetitions and every sample.

Measurements (each over N items; rates in items per second):

* ``raw_lpush``                   LPUSH, one item per call.
* ``raw_lmove_lrem``              LMOVE src->processing + LREM, per item (2 calls).
* ``raw_evalsha``                 EVALSHA of ``return 1``, one call per round trip.
* ``raw_evalsha_pipelined_x100``  the same, 100 calls pipelined per round trip.
* ``enqueue_one``                 Queue.enqueue, one job per call.
* ``enqueue_batched_x100``        Queue.enqueue_many, 100 jobs per call.
* ``drain_one``                   lease once, then Queue.ack_and_lease per job.
* ``drain_batched_x100``          Queue.lease(count=100), then Queue.ack_many, repeated.

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
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import _server

_server.use_checkout()

import redis  # noqa: E402

from pyqueue import Queue, connect  # noqa: E402
from pyqueue.scripts import SCRIPT_KEYS, lua_source  # noqa: E402

PAYLOAD = b"p" * 64
LONG_LEASE_MS = 3_600_000
BATCH = 100
#: Commands the measurement itself sends; excluded from the per-job command count.
BOOKKEEPING_COMMANDS = frozenset({"config|resetstat", "info", "ping"})

#: label -> (numerator, denominator, target): each ratio must be at least its target.
RATIO_TARGETS: dict[str, tuple[str, str, float]] = {
    "enqueue_one / raw_evalsha": ("enqueue_one", "raw_evalsha", 0.70),
    "enqueue_batched_x100 / raw_evalsha_pipelined_x100": ("enqueue_batched_x100", "raw_evalsha_pipelined_x100", 0.60),
    "drain_one / raw_evalsha": ("drain_one", "raw_evalsha", 0.60),
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


@dataclass
class Rate:
    """Samples of one measurement, in items per second."""

    unit: str
    samples_per_s: list[float] = field(default_factory=list)

    @property
    def median_per_s(self) -> float:
        return statistics.median(self.samples_per_s)


def load_scripts(client: redis.Redis) -> None:
    """SCRIPT LOAD every pyqueue script so no timed call pays the NOSCRIPT detour."""
    for name in SCRIPT_KEYS:
        client.script_load(lua_source(name))


class Throughput:
    """The measurements of one run, on one server, with one client per kind."""

    def __init__(self, url: str, jobs: int) -> None:
        if jobs % BATCH:
            raise ValueError(f"--jobs must be a multiple of {BATCH}")
        self.url = url
        self.jobs = jobs
        self.raw = _server.client_for(url)
        self.pyqueue_client = connect(url)
        load_scripts(self.pyqueue_client)
        self.sha_return1 = self.raw.script_load("return 1")
        self.seq = 0

    def _queue(self, label: str) -> Queue:
        self.seq += 1
        return Queue(f"bench-tp-{label}-{self.seq}", self.pyqueue_client)

    @staticmethod
    def _timed(fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    # -- raw limits ---------------------------------------------------------------------------

    def raw_lpush(self) -> float:
        key = f"bench-tp-lpush-{self.seq}"
        lpush, n = self.raw.lpush, self.jobs

        def run() -> None:
            for _ in range(n):
                lpush(key, PAYLOAD)

        elapsed = self._timed(run)
        self.raw.unlink(key)
        return elapsed

    def raw_lmove_lrem(self) -> float:
        src, processing = f"bench-tp-src-{self.seq}", f"bench-tp-proc-{self.seq}"
        for start in range(0, self.jobs, 1000):
            self.raw.rpush(src, *[b"%d:" % i + PAYLOAD for i in range(start, min(self.jobs, start + 1000))])
        lmove, lrem, n = self.raw.lmove, self.raw.lrem, self.jobs

        def run() -> None:
            for _ in range(n):
                item = lmove(src, processing, "LEFT", "RIGHT")
                lrem(processing, 1, item)  # type: ignore[arg-type]  # redis-py types values as str; bytes work

        elapsed = self._timed(run)
        self.raw.unlink(src, processing)
        return elapsed

    def raw_evalsha(self) -> float:
        evalsha, sha, n = self.raw.evalsha, self.sha_return1, self.jobs

        def run() -> None:
            for _ in range(n):
                evalsha(sha, 0)

        return self._timed(run)

    def raw_evalsha_pipelined_x100(self) -> float:
        client, sha, rounds = self.raw, self.sha_return1, self.jobs // BATCH

        def run() -> None:
            for _ in range(rounds):
                pipe = client.pipeline(transaction=False)
                for _ in range(BATCH):
                    pipe.evalsha(sha, 0)
                pipe.execute()

        return self._timed(run)

    # -- pyqueue: enqueue N, then drain N with one process ----------------------------------

    def one_at_a_time(self) -> tuple[float, float]:
        """(enqueue_one seconds, drain_one seconds) over the same N jobs."""
        queue = self._queue("one")
        enqueue, ack_and_lease, n = queue.enqueue, queue.ack_and_lease, self.jobs

        def produce() -> None:
            for _ in range(n):
                enqueue(PAYLOAD)

        drained = 0

        def drain() -> None:
            nonlocal drained
            jobs = queue.lease(LONG_LEASE_MS)
            while jobs:
                drained += 1
                _outcome, jobs = ack_and_lease(jobs[0], lease_ms=LONG_LEASE_MS)

        enqueue_s = self._timed(produce)
        drain_s = self._timed(drain)
        self._check_drained(queue, drained)
        return enqueue_s, drain_s

    def batched(self) -> tuple[float, float]:
        """(enqueue_batched_x100 seconds, drain_batched_x100 seconds) over N jobs."""
        queue = self._queue("batched")
        batch, rounds = [PAYLOAD] * BATCH, self.jobs // BATCH
        enqueue_many, lease, ack_many = queue.enqueue_many, queue.lease, queue.ack_many

        def produce() -> None:
            for _ in range(rounds):
                enqueue_many(batch)

        drained = 0

        def drain() -> None:
            nonlocal drained
            while jobs := lease(LONG_LEASE_MS, count=BATCH):
                drained += len(jobs)
                ack_many(jobs)

        enqueue_s = self._timed(produce)
        drain_s = self._timed(drain)
        self._check_drained(queue, drained)
        return enqueue_s, drain_s

    def _check_drained(self, queue: Queue, drained: int) -> None:
        stats = queue.stats()
        if drained != self.jobs or stats.ready or stats.leased or stats.acked != self.jobs:
            raise RuntimeError(f"drain incomplete: drained {drained} of {self.jobs}, {stats}")
        queue.redis.unlink(*queue.keys.all())

    # -- one repetition ---------------------------------------------------------------------------

    def repetition(self, rates: dict[str, Rate]) -> None:
        n = self.jobs
        rates["raw_lpush"].samples_per_s.append(n / self.raw_lpush())
        rates["raw_lmove_lrem"].samples_per_s.append(n / self.raw_lmove_lrem())
        rates["raw_evalsha"].samples_per_s.append(n / self.raw_evalsha())
        rates["raw_evalsha_pipelined_x100"].samples_per_s.append(n / self.raw_evalsha_pipelined_x100())
        enqueue_s, drain_s = self.one_at_a_time()
        rates["enqueue_one"].samples_per_s.append(n / enqueue_s)
        rates["drain_one"].samples_per_s.append(n / drain_s)
        enqueue_s, drain_s = self.batched()
        rates["enqueue_batched_x100"].samples_per_s.append(n / enqueue_s)
        rates["drain_batched_x100"].samples_per_s.append(n / drain_s)


def lifecycle_cost(url: str, jobs: int) -> dict[str, Any]:
    """Commands and round trips per job for enqueue (one per call) + ack_and_lease (one
    per call), measured with INFO commandstats and a client-side call counter."""
    admin = _server.client_for(url)
    client = CountingRedis(connection_pool=connect(url).connection_pool)
    load_scripts(client)
    queue = Queue(f"bench-tp-lifecycle-{time.time_ns()}", client)
    client.ping()  # connect now: a new connection's handshake commands stay out of the count

    admin.config_resetstat()
    client.round_trips = 0
    for _ in range(jobs):
        queue.enqueue(PAYLOAD)
    leased = queue.lease(LONG_LEASE_MS)
    while leased:
        _outcome, leased = queue.ack_and_lease(leased[0], lease_ms=LONG_LEASE_MS)
    round_trips = client.round_trips
    commandstats = admin.info("commandstats")

    calls = {
        name.removeprefix("cmdstat_"): int(stat["calls"])
        for name, stat in commandstats.items()
        if name.removeprefix("cmdstat_") not in BOOKKEEPING_COMMANDS
    }
    total = sum(calls.values())
    evalsha = calls.get("evalsha", 0)
    client.unlink(*queue.keys.all())
    return {
        "jobs": jobs,
        "commands_per_job": total / jobs,
        "commands_in_lua_per_job": (total - evalsha) / jobs,
        "evalsha_per_job": evalsha / jobs,
        "round_trips_per_job": round_trips / jobs,
        "per_command_per_job": {k: v / jobs for k, v in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))},
        "targets": {"commands_per_job": 12, "round_trips_per_job": 2},
    }


def run(url: str, jobs: int, repetitions: int, lifecycle_jobs: int) -> dict[str, Any]:
    """All measurements; returns the report as a JSON-able dict."""
    bench = Throughput(url, jobs)
    rates = {
        "raw_lpush": Rate("items/s"),
        "raw_lmove_lrem": Rate("items/s"),
        "raw_evalsha": Rate("calls/s"),
        "raw_evalsha_pipelined_x100": Rate("calls/s"),
        "enqueue_one": Rate("jobs/s"),
        "enqueue_batched_x100": Rate("jobs/s"),
        "drain_one": Rate("jobs/s"),
        "drain_batched_x100": Rate("jobs/s"),
    }
    bench.repetition({name: Rate(r.unit) for name, r in rates.items()})  # warm-up, discarded
    for _ in range(repetitions):
        bench.repetition(rates)

    medians = {name: r.median_per_s for name, r in rates.items()}
    ratios = {
        label: {"ratio": medians[num] / medians[den], "target": target, "met": medians[num] / medians[den] >= target}
        for label, (num, den, target) in RATIO_TARGETS.items()
    }
    context = {label: medians[num] / medians[den] for label, (num, den) in CONTEXT_RATIOS.items()}
    return {
        "method": "time.perf_counter loops, median of repetitions (not pyperf)",
        "jobs_per_measurement": jobs,
        "repetitions": repetitions,
        "payload_bytes": len(PAYLOAD),
        "rates": {name: {"median_per_s": r.median_per_s, **asdict(r)} for name, r in rates.items()},
        "ratios": ratios,
        "context_ratios": context,
        "lifecycle": lifecycle_cost(url, lifecycle_jobs),
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    lines = [f"throughput: {report['jobs_per_measurement']} items per measurement, median of {report['repetitions']}"]
    for name, rate in report["rates"].items():
        lines.append(f"  {name:<28} {rate['median_per_s']:>10,.0f} {rate['unit']}")
    lines.append("ratios (pyqueue / raw limit, same run):")
    for label, r in report["ratios"].items():
        verdict = "met" if r["met"] else "NOT met"
        lines.append(f"  {label:<52} {r['ratio']:7.3f}  target >= {r['target']:.2f}  {verdict}")
    for label, value in report["context_ratios"].items():
        lines.append(f"  {label:<52} {value:7.3f}  (context, no target)")
    life = report["lifecycle"]
    lines.append(
        f"lifecycle (enqueue + ack_and_lease, {life['jobs']} jobs): {life['commands_per_job']:.2f} commands/job "
        f"({life['evalsha_per_job']:.2f} EVALSHA + {life['commands_in_lua_per_job']:.2f} inside Lua; target <= 12), "
        f"{life['round_trips_per_job']:.3f} round trips/job (target <= 2)"
    )
    for name, per_job in life["per_command_per_job"].items():
        lines.append(f"  {name:<20} {per_job:6.3f}/job")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--jobs", type=int, default=5000, help="items per measurement (multiple of 100)")
    parser.add_argument("--repetitions", type=int, default=5, help="repetitions; the median is reported")
    parser.add_argument("--lifecycle-jobs", type=int, default=1000, help="jobs for the commands-per-job count")
    parser.add_argument("--json-out", default=None, help="also write the report as JSON here")
    args = parser.parse_args()

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
