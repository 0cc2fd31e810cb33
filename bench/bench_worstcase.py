"""Worst-case server-side script time of every transition on a big queue, from SLOWLOG.

Each scenario starts from a freshly built queue holding 100,000 READY jobs and 10,000
current leases (plus, where the scenario needs them, DEAD jobs or leases on a last
attempt), then runs one transition a few hundred times. With
``slowlog-log-slower-than 0`` Redis logs every command with its execution time in
microseconds; an EVALSHA entry's time covers the whole script, including the commands
it runs (which Redis 7 also logs, separately; they are ignored here). The report gives,
per scenario, the number of calls and the max, p99 and median script time.

This is server time only: no round trip, no client. While a script runs, Redis serves
nobody else, so the max is the longest stall one call can impose on every client.

The "1000 expired + 1000 due" scenarios repeat a round: lease 1000 jobs with a 1 ms
lease and enqueue 1000 jobs with a 1 ms delay, wait 60 ms (past both, and past
lease.lua's 50 ms maintenance interval), then run promote (or lease, which maintains
by itself) with maintenance limit 100 or 1000 until everything has moved. Reclaimed
jobs go back to the head of READY and are leased again next round, so every fifth round
their leases expire on the last of 5 attempts and they go to DEAD: the dead-letter
path is part of the measurement.

Run::

    python bench/bench_worstcase.py [--calls 300] [--rounds 10] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import _server

_server.use_checkout()

from pyqueue import Job, NewJob, Queue, connect  # noqa: E402
from pyqueue.drivers.scripts import SCRIPT_KEYS, lua_source  # noqa: E402

PAYLOAD = b"p" * 64
LONG_LEASE_MS = 3_600_000
BUILD_BATCH = 1000
#: Large enough that one scenario's entries (each script call logs itself and every
#: command it runs) never push the oldest out; checked after every read.
SLOWLOG_MAX_LEN = 200_000
#: Everything a due/expired round moves must be due before the measured calls start,
#: and lease.lua only maintains once its 50 ms interval has passed.
MAINTENANCE_WAIT_S = 0.06


@dataclass(frozen=True)
class Backlog:
    """What a scenario's queue holds before the measured calls."""

    ready: int = 100_000
    leased: int = 10_000
    #: Jobs moved to DEAD (by letting 1-attempt leases expire) before the rest is built.
    dead: int = 0
    #: Current leases of 1-attempt jobs: a nack sends them to DEAD.
    last_attempt_leases: int = 0


@dataclass
class Row:
    """The result of one scenario."""

    scenario: str
    script: str
    calls: int
    max_us: int
    p99_us: int
    median_us: float


@dataclass
class State:
    """A built queue and the leases the scenario may use."""

    queue: Queue
    leases: list[Job]
    last_attempt: list[Job]


def script_shas() -> dict[str, str]:
    """sha1 hex (as EVALSHA sends it) -> script name."""
    return {hashlib.sha1(lua_source(name).encode("utf-8")).hexdigest(): name for name in SCRIPT_KEYS}


def percentile(sorted_values: list[int], pct: float) -> int:
    """Nearest-rank percentile of an ascending list."""
    return sorted_values[max(0, math.ceil(pct / 100 * len(sorted_values)) - 1)]


class WorstCase:
    """Builds backlogs and reads script times from SLOWLOG on one server."""

    def __init__(self, url: str, calls: int, rounds: int, backlog: Backlog) -> None:
        self.admin = _server.client_for(url)
        self.client = connect(url)
        for name in SCRIPT_KEYS:  # loaded up front: no NOSCRIPT detour in any measurement
            self.client.script_load(lua_source(name))
        self.shas = script_shas()
        #: Every (sha -> script) measured; the report names the versions it timed.
        self.seen_shas: dict[str, str] = {}
        self.calls = calls
        self.rounds = rounds
        self.backlog = backlog
        self.rows: list[Row] = []
        self._seq = 0
        self._saved_config: dict[str, str] = {}

    # -- slowlog --------------------------------------------------------------------------------

    def configure_slowlog(self) -> None:
        """Log every command; remember the previous settings to restore them."""
        for key in ("slowlog-log-slower-than", "slowlog-max-len"):
            self._saved_config.update({str(k): str(v) for k, v in self.admin.config_get(key).items()})
        self.admin.config_set("slowlog-max-len", SLOWLOG_MAX_LEN)
        self.admin.config_set("slowlog-log-slower-than", 0)

    def restore_slowlog(self) -> None:
        for key, value in self._saved_config.items():
            self.admin.config_set(key, value)
        self.admin.slowlog_reset()

    def script_times_us(self, script: str) -> list[int]:
        """Durations of the EVALSHA calls of ``script`` logged since the last reset."""
        entries = self.admin.slowlog_get(-1)
        if len(entries) >= SLOWLOG_MAX_LEN:
            raise RuntimeError("slowlog overflowed; raise SLOWLOG_MAX_LEN or lower --calls")
        out = []
        for entry in entries:
            words = entry["command"].split(b" ")
            if words[0].upper() == b"EVALSHA" and self.shas.get(words[1].decode()) == script:
                out.append(int(entry["duration"]))
        return out

    def measure(self, scenario: str, script: str, run: Callable[[], int]) -> list[int]:
        """Reset the slowlog, run the calls (``run`` returns how many it made), and return
        their script times; checks that every call was logged."""
        self.admin.slowlog_reset()
        made = run()
        times = self.script_times_us(script)
        if len(times) != made:
            raise RuntimeError(f"{scenario}: {made} calls but {len(times)} {script} entries in SLOWLOG")
        return times

    def record(self, scenario: str, script: str, times_us: list[int]) -> None:
        ordered = sorted(times_us)
        self.rows.append(
            Row(
                scenario=scenario,
                script=script,
                calls=len(ordered),
                max_us=ordered[-1],
                p99_us=percentile(ordered, 99),
                median_us=statistics.median(ordered),
            )
        )

    # -- backlog ----------------------------------------------------------------------------------

    def build(self, backlog: Backlog | None = None) -> State:
        """A fresh queue holding ``backlog`` (not logged: slowlog is reset before measuring)."""
        b = backlog or self.backlog
        self._seq += 1
        # Other people edit lua/ while this runs: map EVALSHA entries to script names
        # with the SHAs of exactly the sources this queue registered.
        while True:
            before = script_shas()
            queue = Queue(f"bench-wc-{self._seq}-{time.time_ns()}", self.client)
            self.shas = script_shas()
            if self.shas == before:
                break
        self.seen_shas.update(self.shas)
        if b.dead:
            self._enqueue(queue, b.dead, max_attempts=1)
            for _ in range(0, b.dead, BUILD_BATCH):
                queue.lease(1, count=BUILD_BATCH)
            time.sleep(0.01)  # let the 1 ms leases expire
            while queue.promote(BUILD_BATCH).more:
                pass
        last_attempt: list[Job] = []
        if b.last_attempt_leases:
            self._enqueue(queue, b.last_attempt_leases, max_attempts=1)
            last_attempt = self._lease(queue, b.last_attempt_leases)
        self._enqueue(queue, b.ready + b.leased)
        leases = self._lease(queue, b.leased)
        stats = queue.stats()
        if (stats.ready, stats.leased, stats.dead) != (b.ready, b.leased + b.last_attempt_leases, b.dead):
            raise RuntimeError(f"backlog not as planned: {stats}")
        return State(queue, leases, last_attempt)

    @staticmethod
    def _enqueue(queue: Queue, jobs: int, *, max_attempts: int | None = None, delay_ms: int = 0) -> None:
        for start in range(0, jobs, BUILD_BATCH):
            size = min(BUILD_BATCH, jobs - start)
            queue.enqueue_many([NewJob(PAYLOAD, delay_ms=delay_ms, max_attempts=max_attempts)] * size)

    @staticmethod
    def _lease(queue: Queue, jobs: int, lease_ms: int = LONG_LEASE_MS) -> list[Job]:
        leased: list[Job] = []
        while len(leased) < jobs:
            batch = queue.lease(lease_ms, count=min(BUILD_BATCH, jobs - len(leased)))
            if not batch:
                raise RuntimeError("ran out of ready jobs while building")
            leased += batch
        return leased

    def drop(self, state: State) -> None:
        self.client.unlink(*state.queue.spec.keys.all())

    # -- scenarios --------------------------------------------------------------------------------

    def simple(self, scenario: str, script: str, op: Callable[[State, int], object], calls: int | None = None,
               backlog: Backlog | None = None) -> None:
        """Build a backlog, run ``op(state, i)`` for i in range(calls), record the times."""
        n = calls or self.calls
        state = self.build(backlog)

        def run() -> int:
            for i in range(n):
                op(state, i)
            return n

        self.record(scenario, script, self.measure(scenario, script, run))
        self.drop(state)

    def due_and_expired(self, script: str, limit: int) -> None:
        """Rounds of 1000 expired leases + 1000 due scheduled jobs, moved by ``promote``
        or by ``lease`` (count 1) with maintenance limit ``limit``."""
        scenario = f"{script} limit={limit}: 1000 expired + 1000 due"
        state = self.build()
        queue = state.queue
        times: list[int] = []
        for _ in range(self.rounds):
            self._lease(queue, 1000, lease_ms=1)
            self._enqueue(queue, 1000, delay_ms=1)
            time.sleep(MAINTENANCE_WAIT_S)
            leased: list[Job] = []

            def run() -> int:
                made = 0
                if script == "promote":
                    while True:
                        made += 1
                        if not queue.promote(limit).more:
                            return made
                while True:  # lease maintains at most once per 50 ms while READY is busy
                    made += 1
                    # Queue.lease has no maintenance-limit parameter; lease_call does.
                    leased.extend(queue.lease_call(count=1, lease_ms=LONG_LEASE_MS, limit=limit).jobs)
                    stats = queue.stats()
                    if stats.expired == 0 and stats.due == 0:
                        return made
                    time.sleep(MAINTENANCE_WAIT_S)

            times += self.measure(scenario, script, run)
            if leased:
                queue.ack_many(leased)
            stats = queue.stats()
            if stats.expired or stats.due:
                raise RuntimeError(f"{scenario}: round left work behind: {stats}")
        self.record(scenario, script, times)
        self.drop(state)

    def run_all(self) -> list[Row]:
        calls = self.calls
        b = self.backlog
        batch = [PAYLOAD] * 100
        batch_1000 = [PAYLOAD] * 1000

        self.simple("enqueue x1", "enqueue", lambda s, i: s.queue.enqueue(PAYLOAD))
        self.simple("enqueue_many x100", "enqueue", lambda s, i: s.queue.enqueue_many(batch))
        # x1000 adds 1000 jobs per call: fewer calls keep the backlog growth bounded.
        self.simple("enqueue_many x1000", "enqueue", lambda s, i: s.queue.enqueue_many(batch_1000),
                    calls=max(20, calls // 5))
        self.simple("lease count=1", "lease", lambda s, i: s.queue.lease(LONG_LEASE_MS, count=1))
        self.simple("lease count=100", "lease", lambda s, i: s.queue.lease(LONG_LEASE_MS, count=100))
        self.simple("ack x1", "ack", lambda s, i: s.queue.ack(s.leases[i]))
        self.simple("ack_and_lease", "lease",
                    lambda s, i: s.queue.ack_and_lease(s.leases[i], lease_ms=LONG_LEASE_MS))
        self.simple("nack -> scheduled", "nack",
                    lambda s, i: s.queue.nack(s.leases[i], "bench", delay_ms=LONG_LEASE_MS))
        self.simple("nack -> dead (last attempt)", "nack",
                    lambda s, i: s.queue.nack(s.last_attempt[i], "bench"),
                    backlog=Backlog(b.ready, b.leased, last_attempt_leases=calls))
        self.simple("extend x10", "extend",
                    lambda s, i: s.queue.extend(s.leases[10 * i: 10 * i + 10], LONG_LEASE_MS),
                    calls=min(calls, b.leased // 10))
        self.simple("release x1", "release", lambda s, i: s.queue.release([s.leases[i]]))
        self.simple("promote (nothing due)", "promote", lambda s, i: s.queue.promote())
        for limit in (100, 1000):
            self.due_and_expired("promote", limit)
        for limit in (100, 1000):
            self.due_and_expired("lease", limit)
        self.simple("stats", "stats", lambda s, i: s.queue.stats())

        dead = Backlog(b.ready, b.leased, dead=20_000)
        dead_calls = min(calls, dead.dead // 100 // 2)  # replay/purge move 100 per call
        self.simple("dead_list offset=0 limit=100", "dead_list", lambda s, i: s.queue.dead_list(0, 100),
                    backlog=dead)
        self.simple("dead_list offset=19900 limit=100", "dead_list",
                    lambda s, i: s.queue.dead_list(dead.dead - 100, 100), backlog=dead)
        self.simple("dead_replay limit=100", "dead_replay", lambda s, i: s.queue.dead_replay(limit=100),
                    calls=dead_calls, backlog=dead)
        self.simple("dead_purge limit=100", "dead_purge", lambda s, i: s.queue.dead_purge(limit=100),
                    calls=dead_calls, backlog=dead)
        return self.rows


def format_rows(rows: list[Row], backlog: Backlog) -> str:
    lines = [
        f"worst-case script time (SLOWLOG, server side, us) with {backlog.ready:,} ready + "
        f"{backlog.leased:,} leased jobs",
        f"  {'scenario':<44} {'script':<12} {'calls':>6} {'max_us':>8} {'p99_us':>8} {'median_us':>9}",
    ]
    for r in rows:
        lines.append(
            f"  {r.scenario:<44} {r.script:<12} {r.calls:>6} {r.max_us:>8} {r.p99_us:>8} {r.median_us:>9.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--calls", type=int, default=300, help="calls per scenario")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the 1000 expired + 1000 due scenarios")
    parser.add_argument("--json-out", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    if not 1 <= args.calls <= 10_000:
        parser.error("--calls must be in [1, 10000]")

    server: _server.LoopbackRedis | None = None
    if args.redis_url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
    _server.require_loopback(args.redis_url)
    backlog = Backlog()
    bench = WorstCase(args.redis_url, args.calls, args.rounds, backlog)
    try:
        bench.configure_slowlog()
        try:
            rows = bench.run_all()
        finally:
            bench.restore_slowlog()
    finally:
        if server is not None:
            server.stop()
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            report = {
                "backlog": asdict(backlog),
                "rows": [asdict(r) for r in rows],
                "script_sha1": {name: sha for sha, name in sorted(bench.seen_shas.items(), key=lambda kv: kv[1])},
            }
            json.dump(report, out, indent=2)
    print(format_rows(rows, backlog))


if __name__ == "__main__":
    main()
