"""What durable steps cost (lua/step.lua, park.lua, signal.lua; issue #37), against a real
redis-server (its own, on a free loopback port, unless ``--redis-url``).

* **commit**: a step commit (``Queue.step``) against a plain ack of one job
  (``Queue.ack``), each on a job leased for it: the server's time per call (``INFO
  commandstats``, µs) and the commands it ran (``usec``/``calls`` of every command).
* **plain queue**: an ack on a queue that has never had step data, and one on a queue
  that has (its ``steps`` flag set): what a job without steps pays once its queue has
  step jobs (one HMGET per ack call), and that a queue without pays nothing.
* **parked**: the memory of N jobs parked by a sleep and by a wait (``used_memory``
  before and after, per job, beside the memory of N plain scheduled jobs).

    python bench/bench_steps.py [--jobs 2000]
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from typing import Any

import _server

_server.use_checkout()

from pyqueue import NewJob, Queue  # noqa: E402

LEASE_MS = 600_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per measure")
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if args.redis_url:
        run(args.redis_url, args.jobs)
    else:
        with _server.LoopbackRedis() as server:
            run(server.url, args.jobs)


def fresh(client: Any, label: str) -> Queue:
    return Queue(f"bench-steps-{label}-{uuid.uuid4().hex[:8]}", client)


def leased(queue: Queue, n: int) -> list[Any]:
    for start in range(0, n, 1000):
        queue.enqueue_many([NewJob(b"p" * 64) for _ in range(min(1000, n - start))])
    jobs: list[Any] = []
    while len(jobs) < n:
        jobs += queue.lease(count=min(1000, n - len(jobs)), lease_ms=LEASE_MS)
    return jobs


def measured(client: Any, calls: Callable[[], None], n: int) -> tuple[float, float, float]:
    """Server µs per call of EVALSHA, and the commands per call (EVALSHA's own and every
    command the scripts ran), over ``n`` calls."""
    client.config_resetstat()
    calls()
    stats = client.info("commandstats")
    evalsha = stats["cmdstat_evalsha"]
    inner = sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config"))
    return evalsha["usec"] / evalsha["calls"], inner / n, evalsha["calls"] / n


def run(url: str, n: int) -> None:
    client = _server.client_for(url)
    print(f"redis-server {client.info('server')['redis_version']}, {n} jobs per measure")

    # commit vs ack
    q = fresh(client, "commit")
    q.step(leased(q, 1)[0], "warm", b"j0", lease_ms=LEASE_MS)  # the queue's steps flag set
    jobs = leased(q, n)
    commit = measured(client, lambda: [q.step(j, "charge", b'j{"id": 1}', lease_ms=LEASE_MS) for j in jobs], n)
    plain = fresh(client, "plain")
    jobs = leased(plain, n)
    ack_plain = measured(client, lambda: [plain.ack(j) for j in jobs], n)
    jobs = leased(q, n)
    ack_flagged = measured(client, lambda: [q.ack(j) for j in jobs], n)
    stepped = leased(q, n)
    for j in stepped:
        q.step(j, "one", b"j1", lease_ms=LEASE_MS)
    ack_stepped = measured(client, lambda: [q.ack(j) for j in stepped], n)
    print("\nper call                          server us  commands")
    for label, (us, commands, _) in [
        ("step commit", commit),
        ("ack, plain queue", ack_plain),
        ("ack, queue with step data", ack_flagged),
        ("ack of a job with one step", ack_stepped),
    ]:
        print(f"{label:32} {us:9.1f}  {commands:8.2f}")
    print(f"step commit / plain ack: {commit[0] / ack_plain[0]:.2f}x server time, "
          f"{commit[1] / ack_plain[1]:.2f}x commands")
    print(f"ack on a queue with step data / on a plain one: {ack_flagged[0] / ack_plain[0]:.2f}x server time, "
          f"+{ack_flagged[1] - ack_plain[1]:.2f} commands")

    # memory of parked jobs
    print("\nmemory per job (used_memory delta)")
    for label, park in [("scheduled (enqueue delay)", None), ("sleeping (park sleep)", "sleep"),
                        ("waiting (park wait)", "wait")]:
        pq = fresh(client, "mem")
        before = client.info("memory")["used_memory"]
        if park is None:
            for start in range(0, n, 1000):
                pq.enqueue_many([NewJob(b"p" * 64, delay_ms=3_600_000) for _ in range(min(1000, n - start))])
        else:
            for j in leased(pq, n):
                assert pq.park(j, park, "pause", 3_600_000, lease_ms=LEASE_MS).status == "parked"  # type: ignore[arg-type]
        after = client.info("memory")["used_memory"]
        print(f"{label:28} {(after - before) / n:8.0f} bytes")
    for key in client.scan_iter("pq:{bench-steps-*"):
        client.delete(key)


if __name__ == "__main__":
    main()
