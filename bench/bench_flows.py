"""Flows (DESIGN section 14) against a real redis-server: what a chord costs per member,
in round trips and Redis CPU, beside the same tasks sent without a flow.

For each repetition, on one server, interleaved:

* **chord**: ``--chords`` chords of ``--members`` members (``member(i)``, then a
  ``total`` callback), sent and then run to their results by one in-process task
  worker (``--concurrency`` threads);
* **plain**: the same number of ``member`` jobs plus one ``total`` job per chord, sent
  with ``send_many`` and run by the same kind of worker, results kept as a flow keeps
  them.

Measured from ``INFO commandstats`` (calls and usec of every command, EVALSHA being the
scripts; commands inside scripts count too) and ``INFO cpu`` of the server over the send
and the run, divided per member (the callback's own job counted in the plain run too):
script calls per member are what a flow adds (a member's ``flow_done`` report, one
``result`` read per member by the callback, pipelined per queue, and the callback's
``flow_wait``); script time per member is what those transitions cost the server. Also
reported: the wall time of send plus drain (until every job is acked, read from stats
every 20 ms). Medians over ``--repetitions``.

Run::

    python bench/bench_flows.py [--chords 20 --members 100 --repetitions 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from _server import LoopbackRedis, add_server_arguments, client_for, use_checkout

use_checkout()

from pyqueue import Tasks, chord  # noqa: E402


def command_stats(r: Any) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec) from INFO commandstats."""
    out = {}
    for key, value in r.info("commandstats").items():
        out[key.removeprefix("cmdstat_")] = (int(value["calls"]), int(value["usec"]))
    return out


def server_cpu_s(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def make_tasks(r: Any) -> Tasks:
    tasks = Tasks(client=r)

    @tasks.task(name="member", queue="members", keep_result=86_400)
    def member(i: int) -> int:
        return i

    @tasks.task(name="total", queue="callbacks", keep_result=86_400)
    def total(xs: list[int]) -> int:
        return sum(xs)

    return tasks


def one_run(url: str, kind: str, chords: int, members: int, concurrency: int) -> dict[str, float]:
    r = client_for(url)
    r.flushall()
    tasks = make_tasks(r)
    member, total = tasks.tasks["member"], tasks.tasks["total"]
    worker = tasks.worker(concurrency=concurrency, block_ms=50)
    thread = threading.Thread(target=tasks.run_worker, args=[worker], kwargs={"install_signal_handlers": False},
                              daemon=True)
    before, cpu0, t0 = command_stats(r), server_cpu_s(r), time.perf_counter()
    thread.start()
    if kind == "chord":
        flows = [chord([member.s(c * members + i) for i in range(members)], total.s()).send() for c in range(chords)]
    else:
        sent = member.send_many([(c * members + i,) for c in range(chords) for i in range(members)])
        sent += total.send_many([([c * members + i for i in range(members)],) for c in range(chords)])
    # Done when every job is acked: two stats reads per 20 ms (reading each result
    # would measure the waiting, not the flow).
    queues = tasks.queue("members"), tasks.queue("callbacks")
    deadline = time.monotonic() + 300
    while queues[0].stats().acked < chords * members or queues[1].stats().acked < chords:
        assert time.monotonic() < deadline, "the drain did not end"
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    after, cpu1 = command_stats(r), server_cpu_s(r)
    worker.stop()
    thread.join(30)
    results = [f.result(timeout=10) for f in flows] if kind == "chord" else [s.result(timeout=10) for s in sent[-chords:]]
    assert results == [sum(range(c * members, (c + 1) * members)) for c in range(chords)], "wrong results"
    n = chords * members
    calls = sum(after[k][0] - before.get(k, (0, 0))[0] for k in after if k not in ("info",))
    evalsha = after.get("evalsha", (0, 0))
    evalsha0 = before.get("evalsha", (0, 0))
    r.close()
    return {
        "commands_per_member": calls / n,
        "script_calls_per_member": (evalsha[0] - evalsha0[0]) / n,
        "script_us_per_member": (evalsha[1] - evalsha0[1]) / n,
        "server_cpu_us_per_member": (cpu1 - cpu0) * 1e6 / n,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(ap)
    ap.add_argument("--chords", type=int, default=20)
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    server = None
    url = args.redis_url
    if url is None:
        server = LoopbackRedis(args.redis_server).start()
        url = server.url
    try:
        runs: dict[str, list[dict[str, float]]] = {"chord": [], "plain": []}
        one_run(url, "chord", 2, args.members, args.concurrency)  # warm-up
        for _ in range(args.repetitions):
            for kind in ("plain", "chord"):
                runs[kind].append(one_run(url, kind, args.chords, args.members, args.concurrency))
        med = {kind: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for kind, rs in runs.items()}
        print(f"bench_flows: {args.chords} chords of {args.members} members x {args.repetitions} repetitions, "
              f"worker concurrency {args.concurrency} (medians)")
        for metric in med["chord"]:
            c, p = med["chord"][metric], med["plain"][metric]
            print(f"  {metric:28s} chord {c:10.2f}   plain {p:10.2f}   chord - plain {c - p:+9.2f}")
        if args.json_out:
            with open(args.json_out, "w") as fh:
                json.dump({"config": vars(args), "median": med, "runs": runs}, fh, indent=1)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
