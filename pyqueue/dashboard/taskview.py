"""The dashboard's task view: per task and queue, how many runs ended how, and how long
runs took (p50, p99) and first attempts waited (p50, p99), from the Prometheus metrics
the workers serve (``pyqueue worker --metrics-port``, :mod:`pyqueue.tasks.telemetry`).

The dashboard reads the URLs it is given (``pyqueue dashboard --worker-metrics URL``,
repeatable: one per worker, or one per ``--processes`` supervisor, which serves its
children's sum) and sums them: the counts are since each of those processes started.
A quantile is estimated from the histogram's buckets as Prometheus's
``histogram_quantile`` does: linear within the bucket it falls in, so its precision is
the buckets' (:data:`pyqueue.tasks.telemetry.RUN_BUCKETS`); one that falls in the last,
unbounded bucket is reported as that bucket's lower bound ("at least").

Read-only, and nothing here talks to Redis. Parsing needs ``prometheus_client`` (the
``metrics`` extra); without it the view says so.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyqueue.protocol.errors import InvalidArgument

#: The outcomes of ``pyqueue_task_runs_total`` (pyqueue.tasks.telemetry), in display order.
OUTCOMES = ("ok", "retried", "failed", "dead", "time_limited", "cancelled")
#: Outcomes that are failures of the run (the job went on to a retry or the dead letters).
FAILURES = ("retried", "failed", "dead", "time_limited")
#: How long one URL may take to answer.
FETCH_TIMEOUT_S = 2.0
#: A view is read again after this many seconds (every page polls it).
FRESH_S = 2.0


@dataclass
class Histogram:
    """One histogram's cumulative bucket counts, by upper bound (``inf`` included)."""

    buckets: dict[float, float] = field(default_factory=dict)

    def add(self, upper: float, count: float) -> None:
        self.buckets[upper] = self.buckets.get(upper, 0.0) + count

    @property
    def count(self) -> float:
        return self.buckets.get(math.inf, 0.0)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q < 1), or None without observations."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for upper in sorted(self.buckets):
            cumulative = self.buckets[upper]
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower  # in the unbounded bucket: at least its lower bound
                inside = cumulative - below
                return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = upper, cumulative
        return lower


@dataclass
class TaskFigures:
    """One task on one queue, summed over every source."""

    task: str
    queue: str
    outcomes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0.0))
    run: Histogram = field(default_factory=Histogram)
    wait: Histogram = field(default_factory=Histogram)

    def as_json(self) -> dict[str, Any]:
        runs = sum(self.outcomes.values())
        return {
            "task": self.task,
            "queue": self.queue,
            "runs": int(runs),
            "outcomes": {name: int(self.outcomes[name]) for name in OUTCOMES},
            "failures": int(sum(self.outcomes[name] for name in FAILURES)),
            "run_p50_s": self.run.quantile(0.5),
            "run_p99_s": self.run.quantile(0.99),
            "wait_p50_s": self.wait.quantile(0.5),
            "wait_p99_s": self.wait.quantile(0.99),
        }


@dataclass(frozen=True)
class Source:
    """One URL read: whether it answered, and if not why."""

    url: str
    ok: bool
    error: str = ""


def check_urls(urls: Iterable[str]) -> list[str]:
    """http(s) URLs, else InvalidArgument (``--worker-metrics``)."""
    checked = []
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise InvalidArgument(f"a worker metrics URL is http://HOST:PORT/metrics, got {url!r}")
        checked.append(url)
    return checked


def parse_into(text: str, figures: dict[tuple[str, str], TaskFigures]) -> None:
    """Add one metrics page's task series to ``figures`` (keyed by task and queue)."""
    from prometheus_client.parser import text_string_to_metric_families

    def entry(labels: dict[str, str]) -> TaskFigures | None:
        task, queue = labels.get("task"), labels.get("queue")
        if task is None or queue is None:
            return None
        key = (task, queue)
        if key not in figures:
            figures[key] = TaskFigures(task, queue)
        return figures[key]

    for family in text_string_to_metric_families(text):
        if family.name not in ("pyqueue_task_runs", "pyqueue_task_run_seconds", "pyqueue_task_queue_wait_seconds"):
            continue
        for sample in family.samples:
            figure = entry(sample.labels)
            if figure is None:
                continue
            if sample.name == "pyqueue_task_runs_total" and sample.labels.get("outcome") in figure.outcomes:
                figure.outcomes[sample.labels["outcome"]] += sample.value
            elif sample.name.endswith("_bucket"):
                histogram = figure.run if family.name == "pyqueue_task_run_seconds" else figure.wait
                histogram.add(float(sample.labels["le"]), sample.value)


def fetch(url: str, timeout_s: float = FETCH_TIMEOUT_S) -> str:
    """The metrics page at ``url``."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (http(s) only: check_urls)
        body: bytes = response.read()
    return body.decode("utf-8", "replace")


def read_task_view(urls: Sequence[str], timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, Any]:
    """Every source read and summed: ``{"sources": [...], "tasks": [...], "error": ...}``,
    the tasks sorted by queue, then task name."""
    if not urls:
        return {"sources": [], "tasks": [], "error": ""}
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        return {"sources": [], "tasks": [], "error": 'the task view needs prometheus_client: pip install "pyqueue-redis[metrics]"'}
    def page(url: str) -> str | BaseException:
        try:
            return fetch(url, timeout_s)
        except Exception as exc:  # noqa: BLE001 (one worker down must not hide the others)
            return exc

    # All at once: a view takes the slowest URL's time (at most timeout_s), not their sum.
    with ThreadPoolExecutor(max_workers=min(len(urls), 16)) as pool:
        pages = list(pool.map(page, urls))
    figures: dict[tuple[str, str], TaskFigures] = {}
    sources = []
    for url, text in zip(urls, pages):
        try:
            if isinstance(text, BaseException):
                raise text
            parse_into(text, figures)
            sources.append(Source(url, True))
        except Exception as exc:  # noqa: BLE001 (a page that does not parse is that source's error)
            sources.append(Source(url, False, f"{type(exc).__name__}: {exc}"))
    return {
        "sources": [{"url": s.url, "ok": s.ok, "error": s.error} for s in sources],
        "tasks": [figures[key].as_json() for key in sorted(figures, key=lambda k: (k[1], k[0]))],
        "error": "",
    }


class TaskView:
    """The view of ``urls``, read at most every ``fresh_s`` seconds however many pages ask."""

    def __init__(self, urls: Sequence[str], fresh_s: float = FRESH_S) -> None:
        self.urls = check_urls(urls)
        self.fresh_s = fresh_s
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._view: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.fresh_s:
                self._view = read_task_view(self.urls)
                self._read_at = time.monotonic()
            return self._view
