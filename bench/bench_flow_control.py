"""What flow control costs (debounce, throttle, expiry, sequences and rate keys; lua/enqueue.lua and lease.lua,
issue #38), on and off, against a real redis-server (its own, on a free loopback port,
unless ``--redis-url``).

* **enqueue**, one job per call: plain; with an expiry; a debounced send that adds the
  key's job (a new key each time); one debounced into a pending job (the same key); a
  throttled send that opens a window (a new key) and one dropped in it (the same key).
* **enqueue** of a sequence's head (a new key each time), and of a job behind a head.
* **lease**, one job per call, ack-and-lease as a busy worker does: on a queue that
  has never had an expiry, and on one that has (the same jobs without one), and jobs
  sent with an expiry leased in time: what a queue pays once it uses expiries, and that
  one that does not pays nothing; and heads of sequences, each ack handing its key on
  to the job behind it (half the leased jobs are heads, half the jobs handed the key).
* **rate keys**: enqueue of a job with a rate key; ack-and-lease on a queue that has
  had one (plain jobs), and of jobs with rate keys under a limit they never reach (each
  lease checks and spends a permit), 100 keys in turn; and a lease call that defers
  its one job (every job of the key over its limit: scheduled at its slot instead).

Each line: the server's time per EVALSHA (``INFO commandstats``, µs), the commands a
call ran, and the ratio to the plain call measured in the same run.

    python bench/bench_flow_control.py [--jobs 2000]
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from typing import Any

import _server

_server.use_checkout()

from pyqueue import NewJob, Queue, RateLimit  # noqa: E402

LEASE_MS = 600_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="calls per measure")
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if args.redis_url:
        run(args.redis_url, args.jobs)
    else:
        with _server.LoopbackRedis() as server:
            run(server.url, args.jobs)


def fresh(client: Any, label: str) -> Queue:
    return Queue(f"bench-flow-{label}-{uuid.uuid4().hex[:8]}", client)


def measured(client: Any, calls: Callable[[], None], n: int) -> tuple[float, float]:
    """Server µs per EVALSHA, and commands per call (every command the scripts ran)."""
    client.config_resetstat()
    calls()
    stats = client.info("commandstats")
    evalsha = stats["cmdstat_evalsha"]
    inner = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config"))
    return evalsha["usec"] / evalsha["calls"], inner / n


def enqueues(client: Any, n: int, label: str, **options: Any) -> tuple[float, float]:
    q = fresh(client, label)
    q.enqueue(b"warm", **({**options, "key": "warm"} if "key" in options else options))  # scripts loaded, keys made
    same_key = options.get("key") == "same"
    if same_key:  # the key's job exists before the measure: every call finds it
        q.enqueue(b"p" * 64, **options)

    def calls() -> None:
        for i in range(n):
            opts = dict(options)
            if "key" in opts and not same_key:
                opts["key"] = f"k{i}"
            q.enqueue(b"p" * 64, **opts)

    return measured(client, calls, n)


def busy_worker(q: Queue, n: int) -> Callable[[], None]:
    """n calls of ack-and-lease, one job each, as a busy worker makes them."""
    (job,) = q.lease(lease_ms=LEASE_MS)
    held = [job]

    def calls() -> None:
        for _ in range(n):
            _outcome, jobs = q.ack_and_lease(held[0], lease_ms=LEASE_MS)
            held[0] = jobs[0]

    return calls


def leases(client: Any, n: int, label: str, had_expiry: bool, expires_ms: int | None) -> tuple[float, float]:
    q = fresh(client, label)
    if had_expiry:
        q.enqueue(b"marker", expires_ms=LEASE_MS)  # sets the queue's `expiry` flag
        q.ack(q.lease()[0])
    for start in range(0, n + 1, 1000):
        q.enqueue_many([NewJob(b"p" * 64, expires_ms=expires_ms) for _ in range(min(1000, n + 1 - start))])
    return measured(client, busy_worker(q, n), n)


def sequences(client: Any, n: int) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """Enqueue of a sequence's head (a new key each time) and of jobs behind one head; then
    the ack-and-lease of heads each with one job behind (the ack hands the key on)."""
    q = fresh(client, "seq")
    q.enqueue(b"warm", sequence="warm")
    heads = measured(client, lambda: [q.enqueue(b"p" * 64, sequence=f"k{i}") for i in range(n)], n)
    line = fresh(client, "line")
    line.enqueue(b"head", sequence="one")
    behind = measured(client, lambda: [line.enqueue(b"p" * 64, sequence="one") for _ in range(n)], n)
    for i in range(n):  # each head k<i> gets one job behind it
        q.enqueue(b"p" * 64, sequence=f"k{i}")
    return heads, behind, measured(client, busy_worker(q, n), n)


#: A limit the jobs never reach: every lease passes its check and spends a permit.
LOOSE = RateLimit(1_000_000, 1000, burst=1_000_000)


def rate_leases(client: Any, n: int, label: str, rated: bool) -> tuple[float, float]:
    q = fresh(client, label)
    q.enqueue(b"marker", rate_key="marker", rate_limit=LOOSE)  # sets the queue's `rates` flag
    q.ack(q.lease()[0])
    for start in range(0, n + 1, 1000):
        q.enqueue_many([NewJob(b"p" * 64, **({"rate_key": f"k{(start + i) % 100}", "rate_limit": LOOSE} if rated else {}))
                        for i in range(min(1000, n + 1 - start))])
    return measured(client, busy_worker(q, n), n)


def rate_deferrals(client: Any, n: int) -> tuple[float, float]:
    """A lease call whose one job is over its key's limit (1/h): deferred to its slot."""
    q = fresh(client, "rdefer")
    for start in range(0, n + 1, 1000):
        q.enqueue_many([NewJob(b"p" * 64, rate_key="one", rate_limit="1/h") for _ in range(min(1000, n + 1 - start))])
    assert len(q.lease(lease_ms=LEASE_MS)) == 1  # the key's one permit: the rest are deferred

    def calls() -> None:
        for _ in range(n):
            assert q.lease(lease_ms=LEASE_MS) == []

    return measured(client, calls, n)


def run(url: str, n: int) -> None:
    client = _server.client_for(url)
    print(f"redis-server {client.info('server')['redis_version']}, {n} calls per measure")
    rows = [
        ("enqueue, plain", enqueues(client, n, "plain")),
        ("enqueue, with an expiry", enqueues(client, n, "exp", expires_ms=60_000)),
        ("enqueue, debounce: adds", enqueues(client, n, "dnew", debounce_ms=60_000, key="new")),
        ("enqueue, debounce: merged", enqueues(client, n, "dsame", debounce_ms=60_000, key="same")),
        ("enqueue, throttle: adds", enqueues(client, n, "tnew", throttle_ms=60_000, key="new")),
        ("enqueue, throttle: dropped", enqueues(client, n, "tsame", throttle_ms=60_000, key="same")),
    ]
    head, behind, hand_on = sequences(client, n)
    rows += [("enqueue, sequence: head", head), ("enqueue, sequence: behind", behind),
             ("enqueue, rate key", enqueues(client, n, "rate", rate_key="acct", rate_limit=LOOSE))]
    lease_rows = [
        ("ack+lease, plain queue", leases(client, n, "lplain", False, None)),
        ("ack+lease, queue with expiries", leases(client, n, "lflag", True, None)),
        ("ack+lease, jobs with an expiry", leases(client, n, "lexp", True, 3_600_000)),
        ("ack+lease, sequence heads", hand_on),
        ("ack+lease, queue with rate keys", rate_leases(client, n, "rflag", False)),
        ("ack+lease, jobs with a rate key", rate_leases(client, n, "rjobs", True)),
        ("lease, deferred by its rate key", rate_deferrals(client, n)),
    ]
    print("\nper call                          server us  commands  vs plain (time)")
    for group in (rows, lease_rows):
        base = group[0][1][0]
        for label, (us, commands) in group:
            print(f"{label:32} {us:9.1f}  {commands:8.2f}  {us / base:8.2f}x")
    for key in client.scan_iter("pq:{bench-flow-*"):
        client.delete(key)


if __name__ == "__main__":
    main()
