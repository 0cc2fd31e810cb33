"""Observability costs against a real redis-server (bench/_server.py): the Prometheus
scrape and the dashboard.

Figures:

* **Prometheus scrape time** for 1, 100 and 1,000 queues: ``generate_latest`` of a
  registry holding :class:`pyqueue.ops.metrics.PyQueueCollector`, i.e. what one scrape of
  ``/metrics`` costs the exporter (one ``stats`` call per queue, the service list, the
  text format), without HTTP. Both with discovery (the default: a SCAN of every
  primary at each scrape) and with the queues named (``queues=[...]``: no SCAN).
* **The dashboard's sample time** for the same counts: one ``Sampler`` snapshot (one
  ``stats`` call per queue and the worker list), what every history point costs.
* **The dashboard page with 100 queues** and a full history (121 points per queue, as
  10 minutes at the default 5 s): bytes transferred for the page and its assets
  (Playwright's ``request.sizes()``: headers plus the encoded -- gzipped -- body), the
  decoded size, and the time to first render: from navigation start to the
  ``pyqueue-first-render`` mark the page sets once its tables and charts are drawn,
  plus First Contentful Paint, each load in a fresh browser context (cold cache).
  Headless Debian chromium, driven by Playwright (``--chromium`` names another).

Every load is bounded: at most 1,000 queues of one job each, a fixed number of
repetitions, a history filled in about 7 seconds.

    python bench/bench_dashboard.py                    # starts its own redis-server
    python bench/bench_dashboard.py --repetitions 20 --loads 10 -o /tmp/dashboard.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _server

_server.use_checkout()

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from pyqueue import NewJob, Queue, connect  # noqa: E402
from pyqueue.dashboard.app import DashboardConfig  # noqa: E402
from pyqueue.dashboard.history import Sampler  # noqa: E402
from pyqueue.dashboard.server import RunningDashboard  # noqa: E402
from pyqueue.ops.metrics import PyQueueCollector  # noqa: E402
from pyqueue.ops.service import Services  # noqa: E402

COUNTS = (1, 100, 1000)


def make_queues(url: str, count: int) -> list[str]:
    """``count`` queues q0000.. with one job each (and one registered worker), on an
    emptied server."""
    client = _server.client_for(url)
    client.flushall()
    names = [f"q{i:04d}" for i in range(count)]
    pyq = connect(url)
    for name in names:
        Queue(name, pyq).enqueue_many([NewJob(b"x" * 64)])
    Services(pyq).register(names[:3], host="bench", pid=1)
    return names


def timed(fn: Any, repetitions: int) -> dict[str, float]:
    """Median and min of ``fn()`` in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return {"median_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3)}


def bench_scrapes(url: str, repetitions: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for count in COUNTS:
        names = make_queues(url, count)
        client = connect(url)
        discovered = CollectorRegistry()
        discovered.register(PyQueueCollector(client))
        named = CollectorRegistry()
        named.register(PyQueueCollector(client, queues=names))
        sampler = Sampler(client, fresh_s=0)
        body = generate_latest(discovered)
        out[str(count)] = {
            "scrape_discovery": timed(lambda: generate_latest(discovered), repetitions),
            "scrape_named": timed(lambda: generate_latest(named), repetitions),
            "scrape_bytes": len(body),
            "dashboard_sample": timed(lambda: sampler.snapshot(), repetitions),
        }
        print(f"  {count:>5} queues: scrape {out[str(count)]['scrape_discovery']['median_ms']:.1f} ms "
              f"(named: {out[str(count)]['scrape_named']['median_ms']:.1f} ms, {len(body):,} bytes); "
              f"dashboard sample {out[str(count)]['dashboard_sample']['median_ms']:.1f} ms", flush=True)
    return out


def bench_page(url: str, chromium: str, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    names = make_queues(url, 100)
    client = connect(url)
    # A full ring buffer: 121 points, as 10 minutes at the default 5 s, with the
    # counters moving between points.
    sampler = Sampler(client, every_s=0.05, history_s=6.0, fresh_s=1.0)
    assert sampler.points.maxlen == 121
    queues = [Queue(name, client) for name in names]
    deadline = time.monotonic() + 30
    while len(sampler.points) < 121 and time.monotonic() < deadline:
        for q in queues[:10]:
            q.enqueue_many([NewJob(b"x")])
            q.ack_many(q.lease(count=1))
        time.sleep(0.05)
        sampler.snapshot(max_age_s=0)
    config = DashboardConfig(client, every_s=0.05, history_s=6.0, label=url)
    dashboard = RunningDashboard(config, "127.0.0.1", 0, sampler=sampler)
    runs = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for _ in range(loads + 1):  # the first load warms the server and the browser up
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                responses: list[Any] = []
                page.on("requestfinished", lambda request: responses.append(request))
                page.goto(dashboard.url)
                page.wait_for_selector("body[data-ready]")
                timing = page.evaluate(
                    """() => ({
                        render: performance.getEntriesByName("pyqueue-first-render")[0].startTime,
                        fcp: (performance.getEntriesByName("first-contentful-paint")[0] || {}).startTime,
                        rows: document.querySelectorAll("#queues tbody tr").length,
                        resources: performance.getEntriesByType("resource").map(r => [r.name, r.decodedBodySize]),
                        page: performance.getEntriesByType("navigation")[0].decodedBodySize,
                    })"""
                )
                assert timing["rows"] == 100, timing["rows"]
                page.wait_for_load_state("networkidle")
                transferred = 0
                for request in responses:
                    sizes = request.sizes()
                    transferred += sizes["responseBodySize"] + sizes["responseHeadersSize"]
                decoded = timing["page"] + sum(size for _, size in timing["resources"])
                runs.append({"transferred": transferred, "decoded": decoded, "requests": len(responses),
                             "render_ms": timing["render"], "fcp_ms": timing["fcp"]})
                context.close()
            browser.close()
    finally:
        dashboard.stop()
    runs = runs[1:]
    result = {
        "queues": 100,
        "history_points": len(sampler.points),
        "requests": runs[0]["requests"],
        "bytes_transferred": int(statistics.median(r["transferred"] for r in runs)),
        "bytes_decoded": int(statistics.median(r["decoded"] for r in runs)),
        "first_render_ms": round(statistics.median(r["render_ms"] for r in runs), 1),
        "first_contentful_paint_ms": round(statistics.median(r["fcp_ms"] for r in runs if r["fcp_ms"]), 1),
        "loads": loads,
    }
    print(f"  page with 100 queues: {result['bytes_transferred']:,} bytes transferred in {result['requests']} "
          f"requests ({result['bytes_decoded']:,} decoded); first render {result['first_render_ms']} ms, "
          f"first contentful paint {result['first_contentful_paint_ms']} ms (median of {loads} cold loads)",
          flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _server.add_server_arguments(parser)
    parser.add_argument("--repetitions", type=int, default=10, help="timed scrapes and samples per count")
    parser.add_argument("--loads", type=int, default=5, help="cold page loads (after one warm-up)")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("-o", "--output", type=Path, default=_server.REPO_ROOT / "bench" / "results" / "dashboard.json")
    args = parser.parse_args()

    server = None
    url = args.redis_url
    if url is None:
        server = _server.LoopbackRedis(args.redis_server).start()
        url = server.url
    _server.require_loopback(url)
    try:
        print(f"bench_dashboard on {url}", flush=True)
        results = {"scrapes": bench_scrapes(url, args.repetitions), "page": bench_page(url, args.chromium, args.loads)}
    finally:
        if server is not None:
            server.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
