"""Where a single enqueue's time goes: the round trip, the script, pyqueue's Python.

Three loops, interleaved round by round on one connection to a real redis-server (its own,
on a free loopback port, unless ``--redis-url``):

* ``return1``: ``EVALSHA`` of ``return 1`` (no keys): the round trip's floor;
* ``script``: ``EVALSHA`` of lua/enqueue.lua with one job's keys and arguments, made by
  hand (no pyqueue code on the client): the floor plus the script's server time and the
  cost of its 19 arguments;
* ``enqueue``: ``Queue.enqueue(payload)``: the same call, through pyqueue.

Each figure is the median over rounds of µs per call. The differences are the split the
lean-scripts issue (#33, item 6) asks for; its goal is ``return1 / enqueue >= 0.9``.
The server time of one enqueue script (``INFO commandstats``) is printed too.

    python bench/bench_enqueue.py [--calls 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import _server

_server.use_checkout()

from pyqueue import Queue  # noqa: E402
from pyqueue.drivers.scripts import lua_source  # noqa: E402

PAYLOAD = b"p" * 64
ROLES = "jobs ready scheduled counters wake done meta gready ring groups events".split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per loop per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if args.redis_url:
        run(args.redis_url, args.calls, args.rounds)
    else:
        with _server.LoopbackRedis() as server:
            run(server.url, args.calls, args.rounds)


def run(url: str, calls: int, rounds: int) -> None:
    client = _server.client_for(url)
    name = "bench-enqueue-" + uuid.uuid4().hex[:8]
    queue = Queue(name, client)
    queue.enqueue(b"warm-up")
    keys = [queue.spec.keys.role(role) for role in ROLES]
    return1 = client.script_load("return 1")
    enqueue_sha = client.script_load(lua_source("enqueue"))

    def loop_return1() -> None:
        for _ in range(calls):
            client.evalsha(return1, 0)

    def loop_script() -> None:
        for _ in range(calls):
            client.evalsha(enqueue_sha, len(keys), *keys, "", 1, uuid.uuid4().hex, PAYLOAD, 0, 5, "", "")

    def loop_enqueue() -> None:
        for _ in range(calls):
            queue.enqueue(PAYLOAD)

    loops = {"return1": loop_return1, "script": loop_script, "enqueue": loop_enqueue}
    times: dict[str, list[float]] = {label: [] for label in loops}
    for _ in range(rounds):
        for label, loop in loops.items():
            started = time.perf_counter()
            loop()
            times[label].append((time.perf_counter() - started) / calls * 1e6)
    median = {label: statistics.median(values) for label, values in times.items()}
    client.config_resetstat()
    loop_script()
    server_us = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    for label, us in median.items():
        print(f"{label:8} {us:7.1f} us/call  (rounds: {', '.join(f'{t:.1f}' for t in times[label])})")
    print(f"script - return1:  {median['script'] - median['return1']:5.1f} us (the script's server time "
          f"{server_us:.1f} us, and its arguments)")
    print(f"enqueue - script:  {median['enqueue'] - median['script']:5.1f} us (pyqueue's Python)")
    print(f"return1 / enqueue: {median['return1'] / median['enqueue']:.3f} (goal >= 0.9)")
    for key in client.scan_iter(f"pq:{{{name}}}:*"):
        client.delete(key)


if __name__ == "__main__":
    main()
