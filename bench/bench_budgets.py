"""What a byte budget costs (lua/set_budget.lua, issue #39), on and off, against a real
redis-server (its own, on a free loopback port, unless ``--redis-url``).

* **enqueue**, one job of 64 bytes per call: on a queue without a budget, and on one
  with a budget it never reaches (each job's size kept, the sum counted).
* **ack+lease**, one job per call as a busy worker makes them: plain jobs, and jobs
  sized under a budget (each ack takes the job's size off).

Each line: the server's time per EVALSHA (``INFO commandstats``, µs), the commands a
call ran, and the ratio to the plain call measured in the same run.

    python bench/bench_budgets.py [--jobs 2000]
"""

from __future__ import annotations

import argparse
from typing import Any

import _server

_server.use_checkout()

from bench_flow_control import LEASE_MS, busy_worker, fresh, measured  # noqa: E402

from pyqueue import NewJob  # noqa: E402


def enqueues(client: Any, n: int, budget: bool) -> tuple[float, float]:
    q = fresh(client, "benq" if budget else "enq")
    if budget:
        q.set_budget(1 << 40)
    q.enqueue(b"warm")
    return measured(client, lambda: [q.enqueue(b"p" * 64) for _ in range(n)], n)


def acks(client: Any, n: int, budget: bool) -> tuple[float, float]:
    q = fresh(client, "back" if budget else "ack")
    if budget:
        q.set_budget(1 << 40)
    for start in range(0, n + 1, 1000):
        q.enqueue_many([NewJob(b"p" * 64) for _ in range(min(1000, n + 1 - start))])
    return measured(client, busy_worker(q, n), n)


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


def run(url: str, n: int) -> None:
    client = _server.client_for(url)
    print(f"redis-server {client.info('server')['redis_version']}, {n} calls per measure (lease_ms {LEASE_MS})")
    groups = [
        [("enqueue, no budget", enqueues(client, n, False)), ("enqueue, under a budget", enqueues(client, n, True))],
        [("ack+lease, no budget", acks(client, n, False)), ("ack+lease, sized jobs", acks(client, n, True))],
    ]
    print("\nper call                          server us  commands  vs plain (time)")
    for group in groups:
        base = group[0][1][0]
        for label, (us, commands) in group:
            print(f"{label:32} {us:9.1f}  {commands:8.2f}  {us / base:8.2f}x")
    for key in client.scan_iter("pq:{bench-flow-*"):
        client.delete(key)


if __name__ == "__main__":
    main()
