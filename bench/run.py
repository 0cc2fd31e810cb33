"""Run every pyqueue benchmark against one private redis-server and print a summary.

One command::

    python bench/run.py            # results in bench/results/, summary on stdout

Starts a redis-server on a free 127.0.0.1 port (``--save '' --appendonly no``), runs

1. ``bench_transitions.py`` (pyperf ``--fast``): per-transition latency and raw limits,
2. ``bench_throughput.py``: end-to-end jobs/s, ratios to raw limits, commands,
   round trips and Redis CPU per job,
3. ``bench_worstcase.py``: SLOWLOG max/p99 script time on a 100,000-job backlog,

against that one server, stops it by PID, and prints one summary with every figure and
ratio. The optional step ``--only cluster`` (never run by default) runs
``bench_cluster.py``, which starts and stops a Redis Cluster of its own. Each step's own
output goes to ``bench/results/<step>.log``; its data to ``bench/results/<step>.json``;
the summary also to ``bench/results/summary.txt``.
Every step runs under a timeout, so a hang cannot keep the machine busy.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

import pyperf  # type: ignore[import-untyped]  # noqa: E402  (pyperf ships no type hints)
import redis  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
STEP_TIMEOUT_S = 420

#: pyqueue benchmark -> (raw benchmark it is compared with, how many raw calls one
#: pyqueue iteration corresponds to, context benchmarks). The ratio is
#: raw time x calls / pyqueue time: the share of the raw rate pyqueue reaches.
TRANSITION_REFERENCES: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "bare_enqueue_script": ("raw_evalsha_return1", 1, ()),
    "enqueue": ("raw_evalsha_return1", 1, ("raw_lpush", "bare_enqueue_script")),
    "enqueue_many_x100": ("raw_evalsha_return1_pipelined_x100", 1, ()),
    "lease_ack": ("raw_evalsha_return1", 2, ("raw_lmove_lrem",)),
    "ack_and_lease": ("raw_evalsha_return1", 1, ("raw_lmove_lrem",)),
    "nack": ("raw_evalsha_return1", 1, ()),
    "extend_x10": ("raw_evalsha_return1", 1, ()),
    "promote_x10": ("raw_evalsha_return1", 1, ()),
    "promote_idle": ("raw_evalsha_return1", 1, ()),
    "stats": ("raw_evalsha_return1", 1, ()),
}


def run_step(name: str, argv: list[str], out_dir: Path) -> None:
    """Run one benchmark script, its output to ``<out_dir>/<name>.log``."""
    log_path = out_dir / f"{name}.log"
    print(f"[run] {name}: {' '.join(argv)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        result = subprocess.run(
            [sys.executable, str(BENCH_DIR / argv[0]), *argv[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
    print(f"[run] {name}: exit {result.returncode} after {time.monotonic() - started:.0f} s", file=sys.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed; see {log_path}")


def git_version() -> str:
    """HEAD and whether the checkout has uncommitted changes (figures belong to a version)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(_server.REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(_server.REPO_ROOT), "status", "--porcelain", "--", "pyqueue", "lua"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" + uncommitted changes in pyqueue/ or lua/" if dirty else "")


def transitions_section(path: Path) -> list[str]:
    suite = pyperf.BenchmarkSuite.load(str(path))
    median_s = {b.get_name(): b.median() for b in suite.get_benchmarks()}
    stdev_s = {b.get_name(): (b.stdev() if b.get_nvalue() > 1 else 0.0) for b in suite.get_benchmarks()}
    lines = [
        "1. Per-transition latency (pyperf --fast; median per iteration, client-observed, loopback TCP)",
        f"   {'benchmark':<36} {'median_us':>10} {'stdev_us':>9} {'per_s':>9}  ratio to raw limit",
    ]
    for name in median_s:
        if name.startswith("raw_"):
            lines.append(
                f"   {name:<36} {median_s[name] * 1e6:>10.1f} {stdev_s[name] * 1e6:>9.1f} "
                f"{1 / median_s[name]:>9,.0f}  (raw limit)"
            )
    for name, (raw, calls, contexts) in TRANSITION_REFERENCES.items():
        if name not in median_s:
            continue
        ratio = median_s[raw] * calls / median_s[name]
        note = f"{ratio:5.2f} of {raw}" + (f" x{calls}" if calls > 1 else "")
        for context_name in contexts:
            if context_name in median_s:
                note += f"; {median_s[context_name] / median_s[name]:.2f} of {context_name}"
        lines.append(
            f"   {name:<36} {median_s[name] * 1e6:>10.1f} {stdev_s[name] * 1e6:>9.1f} "
            f"{1 / median_s[name]:>9,.0f}  {note}"
        )
    lines.append("   per_s = iterations per second; enqueue_many_x100 iteration = 100 jobs, lease_ack = 2 calls,")
    lines.append("   raw_lmove_lrem = 2 calls, extend_x10 = 10 leases, promote_x10 = 10 jobs moved.")
    return lines


def throughput_section(path: Path) -> list[str]:
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    lines = [
        f"2. End-to-end throughput, one process ({report['jobs_per_measurement']} items per measurement, "
        f"median of {report['repetitions']} repetitions; {report['method']})",
    ]
    for name, rate in report["rates"].items():
        lines.append(f"   {name:<36} {rate['median_per_s']:>10,.0f} {rate['unit']}")
    lines.append("   ratios (same phase of the same repetition; median over repetitions):")
    for label, r in report["ratios"].items():
        verdict = "met" if r["met"] else "NOT MET"
        lines.append(f"   {label:<52} {r['ratio']:7.3f}   target >= {r['target']:.2f}   {verdict}")
    for label, value in report["context_ratios"].items():
        lines.append(f"   {label:<52} {value:7.3f}   (context)")
    life = report["lifecycle"]
    cmd_verdict = "met" if life["commands_per_job"] <= life["targets"]["commands_per_job"] else "NOT MET"
    rt_verdict = "met" if life["round_trips_per_job"] <= life["targets"]["round_trips_per_job"] + 0.01 else "NOT MET"
    lines += [
        "",
        f"3. Lifecycle cost per job (enqueue one per call + ack_and_lease one per call, {life['jobs']} jobs)",
        f"   Redis commands per job   {life['commands_per_job']:6.2f}  target <= {life['targets']['commands_per_job']}"
        f"  {cmd_verdict}  ({life['evalsha_per_job']:.2f} EVALSHA + {life['commands_in_lua_per_job']:.2f} run inside Lua)",
        f"   round trips per job      {life['round_trips_per_job']:6.3f}  target <= {life['targets']['round_trips_per_job']}"
        f"  {rt_verdict}  (client calls / jobs; the +1 lease that starts the drain is amortised)",
        f"   server script time/job   {life['server_script_us_per_job']:6.0f} us  (EVALSHA usec in INFO commandstats)",
        "   per-command breakdown (calls per job, INFO commandstats):",
    ]
    breakdown = list(life["per_command_per_job"].items())
    for i in range(0, len(breakdown), 4):
        lines.append("     " + "  ".join(f"{k:<14}{v:6.3f}" for k, v in breakdown[i : i + 4]))
    if "lifecycles" in life:  # Redis CPU per job (reports from before it was measured lack it)
        lines += [
            "",
            f"3a. Redis CPU per job over the lifecycle (INFO cpu; {life['jobs_per_repetition']} jobs each x "
            f"{life['repetitions']} repetitions, interleaved blocks; median over blocks)",
            f"   {'lifecycle':<24} {'cpu us/job':>10} {'cmds/job':>9} {'TYPE/job':>9} {'TIME/job':>9} "
            f"{'trips/job':>9}  what",
        ]
        for name, fig in life["lifecycles"].items():
            cmds = fig["per_command_per_job"]
            lines.append(
                f"   {name:<24} {fig['cpu_us_per_job']:>10.1f} {fig['commands_per_job']:>9.2f} "
                f"{cmds.get('type', 0):>9.2f} {cmds.get('time', 0):>9.2f} {fig['round_trips_per_job']:>9.3f}  "
                f"{fig['label']}"
            )
        for label, r in life["cpu_ratios"].items():
            if r["target"] is None:
                lines.append(f"   {label:<44} {r['ratio']:7.3f}   (context)")
            else:
                verdict = "met" if r["met"] else "NOT MET"
                lines.append(f"   {label:<44} {r['ratio']:7.3f}   target <= {r['target']:.2f}   {verdict}")
    return lines


def worstcase_section(path: Path) -> list[str]:
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    backlog = report["backlog"]
    lines = [
        f"4. Worst-case script time (SLOWLOG, server side, microseconds; {backlog['ready']:,} ready + "
        f"{backlog['leased']:,} leased)",
        f"   {'scenario':<44} {'script':<12} {'calls':>6} {'max_us':>8} {'p99_us':>8} {'median_us':>9}",
    ]
    for r in report["rows"]:
        lines.append(
            f"   {r['scenario']:<44} {r['script']:<12} {r['calls']:>6} {r['max_us']:>8} {r['p99_us']:>8} "
            f"{r['median_us']:>9.0f}"
        )
    return lines


def worker_section(path: Path) -> list[str]:
    """The worker figures (bench_worker.py) against their targets."""
    report = json.loads(path.read_text())
    lat, late, rec, idle = report["latency"], report["lateness"], report["recovery"], report["idle"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT MET"

    lines = [
        "Worker (one `pyqueue worker` process against the same server)",
        f"   enqueue -> handler start, idle worker: p50 {lat['p50_us'] / 1000:.2f} ms, p99 {lat['p99_us'] / 1000:.2f} ms "
        f"({lat['samples']} jobs)   target <= 1 / <= 5 ms: "
        f"{verdict(lat['p50_us'] <= 1000)} / {verdict(lat['p99_us'] <= 5000)}",
        f"   delayed job start lateness: p50 {late['p50_ms']} ms, p99 {late['p99_ms']} ms, max {late['max_ms']} ms, "
        f"early {late['early']} ({late['samples']} jobs)   target p99 <= 50 ms: {verdict(late['p99_ms'] <= 50)}",
        f"   SIGKILL -> its jobs running elsewhere (renew {rec['renew_ms']} ms, expire {rec['expire_ms']} ms, lease "
        f"{rec['lease_ms'] // 1000} s): max {rec['max_kill_to_running_s']:.2f} s; of which after the registration "
        f"expired: max {rec['max_expiry_to_running_s']:.2f} s   target <= scrub interval + 1 s: "
        f"{verdict(rec['max_expiry_to_running_s'] <= rec['renew_ms'] / 1000 + 1)}",
        f"   idle worker: {idle['sent_per_s']:.3f} commands/s sent ({idle['all_per_s']:.3f}/s counting inside Lua) "
        f"over {idle['window_s']:.0f} s   target <= 0.5: {verdict(idle['sent_per_s'] <= 0.5)}",
    ]
    for drain in report["drain"]:
        lines.append(
            f"   drain, no-op handler, concurrency {drain['concurrency']}: {drain['jobs_per_s']:,.0f} jobs/s "
            f"({drain['jobs']} jobs)   target >= 5,000: {verdict(drain['jobs_per_s'] >= 5000)}"
        )
    return lines


def cluster_section(path: Path) -> list[str]:
    """The Redis Cluster figures (bench_cluster.py), as it prints them."""
    import bench_cluster

    return bench_cluster.summary(json.loads(path.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--out", default=str(BENCH_DIR / "results"), help="directory for results")
    parser.add_argument("--pyperf-args", default="--fast", help="options for bench_transitions.py (pyperf)")
    parser.add_argument("--jobs", type=int, default=5000, help="items per throughput measurement")
    parser.add_argument("--repetitions", type=int, default=5, help="throughput repetitions")
    parser.add_argument("--calls", type=int, default=300, help="calls per worst-case scenario")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the expired+due worst-case scenarios")
    parser.add_argument(
        "--only", choices=("transitions", "throughput", "worstcase", "worker", "cluster"), action="append",
        help="run only these steps (repeatable); the summary covers the results present. 'cluster' "
        "(bench_cluster.py, on a 3+3 Redis Cluster it starts itself) runs only when named here",
    )
    args = parser.parse_args()
    steps = args.only or ["transitions", "throughput", "worstcase", "worker"]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    server: _server.LoopbackRedis | None = None
    if args.redis_url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        args.redis_url = server.url
        print(f"[run] redis-server pid {server.pid} on {server.url}", file=sys.stderr)
    _server.require_loopback(args.redis_url)
    url_args = ["--redis-url", args.redis_url]
    try:
        server_version = redis.Redis.from_url(args.redis_url).info("server")["redis_version"]
        if "transitions" in steps:
            target = out_dir / "transitions.json"
            target.unlink(missing_ok=True)  # pyperf refuses to overwrite
            run_step(
                "transitions",
                ["bench_transitions.py", *args.pyperf_args.split(), "--quiet", "-o", str(target), *url_args],
                out_dir,
            )
        if "throughput" in steps:
            (out_dir / "throughput.json").unlink(missing_ok=True)
            run_step(
                "throughput",
                ["bench_throughput.py", "--jobs", str(args.jobs), "--repetitions", str(args.repetitions),
                 "--json-out", str(out_dir / "throughput.json"), *url_args],
                out_dir,
            )
        if "worstcase" in steps:
            (out_dir / "worstcase.json").unlink(missing_ok=True)
            run_step(
                "worstcase",
                ["bench_worstcase.py", "--calls", str(args.calls), "--rounds", str(args.rounds),
                 "--json-out", str(out_dir / "worstcase.json"), *url_args],
                out_dir,
            )
        if "worker" in steps:
            (out_dir / "worker.json").unlink(missing_ok=True)
            run_step("worker", ["bench_worker.py", "--json-out", str(out_dir / "worker.json"), *url_args], out_dir)
        if "cluster" in steps:
            # Its own cluster (and stamp server): the shared server is not used.
            (out_dir / "cluster.json").unlink(missing_ok=True)
            server_args = ["--redis-server", args.redis_server] if args.redis_server else []
            run_step("cluster", ["bench_cluster.py", "--json-out", str(out_dir / "cluster.json"), *server_args],
                     out_dir)
    finally:
        if server is not None:
            server.stop()

    lines = [
        "pyqueue benchmark summary",
        f"   redis-server {server_version} on loopback TCP; Python {platform.python_version()}, "
        f"redis-py {redis.__version__}, pyperf {pyperf.__version__}; pyqueue checkout {git_version()}",
        "",
    ]
    sections = (
        ("transitions.json", transitions_section),
        ("throughput.json", throughput_section),
        ("worstcase.json", worstcase_section),
        ("worker.json", worker_section),
        ("cluster.json", cluster_section),
    )
    for filename, section in sections:
        path = out_dir / filename
        if path.exists():
            lines += section(path) + [""]
    summary = "\n".join(lines)
    (out_dir / "summary.txt").write_text(summary + "\n", encoding="utf-8")
    print(summary)


if __name__ == "__main__":
    main()
