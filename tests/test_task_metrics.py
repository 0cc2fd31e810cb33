"""Per-task metrics (pyqueue/tasks/telemetry.py, ``pyqueue worker --metrics-port``): a worker
thread on both backends runs tasks that return, raise and are retried, fail at once,
use up their attempts, pass their time limit, wait in the queue or are sent with a
delay; the registry then holds the exact run counts by outcome, one run-time
observation per run and one queue-wait observation per first attempt, with sums that
fit what the tasks did. Also: the outcome of each ending, the logical queue label, a
batch task's jobs, an async task in an AsyncWorker, why the CLI registers it outermost, the command line on a real
server (a worker scraped over HTTP, then SIGTERMed; ``--processes 2`` summed over the
children, a SIGKILLed child's counts kept), and the refusals (exit 2)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RedisServer, free_ports
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from tasks_support import Serving, burst, serve, wait_for  # noqa: F401 (serve: a fixture)

from pyqueue import Fail, Middleware, Tasks, current_job
from pyqueue.cli import main
from pyqueue.tasks import HookOutcome, TaskRun
from pyqueue.tasks.telemetry import OUTCOMES, TaskMetrics, logical_queue, outcome_of
from pyqueue.tasks.middleware import run_ending
from pyqueue.worker.slots import TimeLimitExceeded

TESTS = Path(__file__).resolve().parent
FAST = {"backoff": 0.01}


@pytest.fixture
def tasks(r: redis.Redis) -> Tasks:
    return Tasks(client=r)


def runs(registry: CollectorRegistry, task: str, queue: str = "default") -> dict[str, float | None]:
    return {o: registry.get_sample_value("pyqueue_task_runs_total", {"task": task, "queue": queue, "outcome": o})
            for o in OUTCOMES}


def histogram(registry: CollectorRegistry, name: str, task: str, queue: str = "default") -> tuple[float, float]:
    """(count, sum) of one histogram's series; (0, 0) if it has none."""
    labels = {"task": task, "queue": queue}
    count = registry.get_sample_value(f"{name}_count", labels)
    total = registry.get_sample_value(f"{name}_sum", labels)
    return (count or 0.0, total or 0.0)


def expect(**counts: int) -> dict[str, float]:
    return {o: float(counts.get(o, 0)) for o in OUTCOMES}


# -- the mapping -------------------------------------------------------------------------


def test_every_run_ending_has_one_outcome() -> None:
    timed = TimeLimitExceeded("late")
    assert run_ending(None, False, False) == "ok" and outcome_of("ok", 1, 5) == "ok"
    assert outcome_of(run_ending(ValueError(), False, False), 1, 5) == "retried"
    assert outcome_of(run_ending(Fail(), True, False), 1, 5) == "failed"
    assert outcome_of(run_ending(ValueError(), True, False), 5, 5) == "dead"
    assert outcome_of(run_ending(Fail(), True, False), 5, 5) == "dead"  # the last attempt: dead, whatever the cause
    assert outcome_of(run_ending(timed, True, True), 5, 5) == "time_limited"
    assert outcome_of(run_ending(None, False, True), 1, 5) == "cancelled"
    with pytest.raises(KeyError):
        outcome_of("sent", 1, 1)  # a send's ending is no run's


def test_a_partition_is_labelled_as_its_logical_queue() -> None:
    assert logical_queue("orders#3") == "orders"
    assert logical_queue("orders") == "orders"
    assert logical_queue("a#b") == "a#b"


# -- a worker thread, both backends --------------------------------------------------------


def test_a_worker_counts_every_outcome_and_times_runs_and_first_waits(
    tasks: Tasks, serve: Callable[..., Serving], r: redis.Redis
) -> None:
    registry = CollectorRegistry()
    tasks.middleware(TaskMetrics(registry))

    @tasks.task(name="ok")
    def ok(n: int) -> int:
        return n

    @tasks.task(name="flaky", max_attempts=3, **FAST)
    def flaky() -> str:
        if current_job().attempt < 3:
            raise ValueError("not yet")
        return "done"

    @tasks.task(name="fails", max_attempts=3)
    def fails() -> None:
        raise Fail("never")

    @tasks.task(name="exhausted", max_attempts=2, **FAST)
    def exhausted() -> None:
        raise RuntimeError("always")

    @tasks.task(name="slow", time_limit=0.2, max_attempts=1)
    def slow() -> None:
        while True:  # Python code: stopped by the asynchronous TimeLimitExceeded
            time.sleep(0.005)

    @tasks.task(name="waited")
    def waited() -> None:
        pass

    @tasks.task(name="delayed")
    def delayed() -> None:
        pass

    waited.send()
    time.sleep(0.4)  # it waits 0.4 s before any worker runs
    serving = serve(tasks, concurrency=2)
    delayed.send_in(0.6)  # due 0.6 s from now: its wait counts from then
    for n in range(3):
        ok.send(n)
    for fn in (flaky, fails, exhausted, slow):
        fn.send()
    queue = tasks.queue("default")
    wait_for(lambda: (lambda s: s.ready + s.leased + s.scheduled == 0 and s.acked == 6 and s.dead_total == 3)(
        queue.stats()), timeout=20, what="every job ended")
    serving.stop()

    assert runs(registry, "ok") == expect(ok=3)
    assert runs(registry, "flaky") == expect(retried=2, ok=1)
    assert runs(registry, "fails") == expect(failed=1)
    assert runs(registry, "exhausted") == expect(retried=1, dead=1)
    assert runs(registry, "slow") == expect(time_limited=1)
    assert runs(registry, "waited") == expect(ok=1) and runs(registry, "delayed") == expect(ok=1)

    # One run-time observation per run; one queue-wait observation per first attempt.
    ran = {"ok": 3, "flaky": 3, "fails": 1, "exhausted": 2, "slow": 1, "waited": 1, "delayed": 1}
    for task, count in ran.items():
        assert histogram(registry, "pyqueue_task_run_seconds", task)[0] == count, task
        assert histogram(registry, "pyqueue_task_queue_wait_seconds", task)[0] == (3 if task == "ok" else 1), task
    slow_count, slow_s = histogram(registry, "pyqueue_task_run_seconds", "slow")
    assert 0.15 <= slow_s < 3.0, slow_s  # stopped at its 0.2 s limit (by the heartbeat's 50 ms tick)
    assert histogram(registry, "pyqueue_task_run_seconds", "ok")[1] < 1.0
    waited_s = histogram(registry, "pyqueue_task_queue_wait_seconds", "waited")[1]
    assert 0.35 <= waited_s < 5.0, waited_s
    # Due 0.6 s after its send: from then, it waited far less than its delay.
    delayed_s = histogram(registry, "pyqueue_task_queue_wait_seconds", "delayed")[1]
    assert 0.0 <= delayed_s < 0.5, delayed_s
    # The buckets are cumulative and end with every observation in +Inf.
    le = {"task": "slow", "queue": "default"}
    assert registry.get_sample_value("pyqueue_task_run_seconds_bucket", {**le, "le": "0.1"}) == 0
    assert registry.get_sample_value("pyqueue_task_run_seconds_bucket", {**le, "le": "+Inf"}) == slow_count


def test_each_job_of_a_batch_task_is_one_run(tasks: Tasks) -> None:
    registry = CollectorRegistry()
    tasks.middleware(TaskMetrics(registry))

    @tasks.task(name="sum", batch=10, max_attempts=1)
    def add_up(items: list[int]) -> list[object]:
        return [ValueError("odd") if item % 2 else item for item in items]

    add_up.send_many(range(6))
    burst(tasks)
    assert runs(registry, "sum") == expect(ok=3, dead=3)
    assert histogram(registry, "pyqueue_task_run_seconds", "sum")[0] == 6
    assert histogram(registry, "pyqueue_task_queue_wait_seconds", "sum")[0] == 6


def test_an_async_task_in_an_async_worker_is_counted_and_timed(tasks: Tasks) -> None:
    registry = CollectorRegistry()
    tasks.middleware(TaskMetrics(registry))

    @tasks.task(name="nap", max_attempts=2, **FAST)
    async def nap(fail: bool) -> None:
        await asyncio.sleep(0.05)
        if fail:
            raise ValueError("no")

    nap.send(False)
    nap.send(True)
    burst(tasks)
    assert runs(registry, "nap") == expect(ok=1, retried=1, dead=1)
    count, total = histogram(registry, "pyqueue_task_run_seconds", "nap")
    assert count == 3 and 0.15 <= total < 3.0, total  # three naps of 50 ms, awaited inside the hook
    assert histogram(registry, "pyqueue_task_queue_wait_seconds", "nap")[0] == 2


class FailsAfter(Middleware):
    """A middleware that fails every run after it returned."""

    def around_run(self, run: TaskRun) -> Generator[None, HookOutcome[object], None]:
        yield
        raise RuntimeError("audit store down")


@pytest.mark.parametrize("outermost", [True, False])
def test_outermost_it_sees_the_ending_the_apps_middleware_makes(tasks: Tasks, outermost: bool) -> None:
    """Why the CLI registers it outermost: registered after a middleware that fails the
    run, inside it, it would count as ok a job that is in fact retried."""
    registry = CollectorRegistry()
    tasks.middleware(FailsAfter())
    tasks.middleware(TaskMetrics(registry), outermost=outermost)

    @tasks.task(name="audited", max_attempts=2, **FAST)
    def audited() -> None:
        pass

    audited.send()
    burst(tasks)
    assert tasks.queue("default").stats().dead_total == 1
    assert runs(registry, "audited") == (expect(retried=1, dead=1) if outermost else expect(ok=2))


def test_outermost_goes_before_every_middleware_on_both_sides(tasks: Tasks) -> None:
    seen: list[str] = []

    class Named(Middleware):
        def __init__(self, name: str) -> None:
            self.name = name

        def around_send(self, message: Any) -> None:
            seen.append(f"send {self.name}")

        def around_run(self, run: TaskRun) -> None:
            seen.append(f"run {self.name}")

        def on_worker_start(self) -> None:
            seen.append(f"start {self.name}")

    tasks.middleware(Named("a"))
    tasks.middleware(Named("b"))
    tasks.middleware(Named("first"), outermost=True)

    @tasks.task(name="t")
    def t() -> None:
        pass

    t.send()
    burst(tasks)
    assert seen == ["send first", "send a", "send b", "start first", "start a", "start b",
                    "run first", "run a", "run b"]


# -- the command line, on a real server ---------------------------------------------------


def scrape_http(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def run_count(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], task: str, queue: str,
              outcome: str) -> float:
    return samples.get(("pyqueue_task_runs_total", (("outcome", outcome), ("queue", queue), ("task", task))), 0.0)


def test_pyqueue_worker_metrics_port_serves_them_over_http(redis_server: RedisServer, tmp_path: Path) -> None:
    import metrics_app

    prefix = "mx" + os.urandom(4).hex()
    metrics_app.tasks.bind(redis_server.client(), prefix=prefix)
    (port,) = free_ports(1)
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "--url", redis_server.url(), "--prefix", prefix, "worker",
             "metrics_app:tasks", "--metrics-port", str(port), "--block-ms", "200"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        for n in range(5):
            metrics_app.ok.send(n)
        metrics_app.flaky.send(0)
        metrics_app.boom.send(0)
        url = f"http://127.0.0.1:{port}/metrics"

        def counted() -> dict[str, float] | None:
            try:
                samples = scrape_http(url)
            except OSError:
                return None  # not listening yet
            got = {"ok": run_count(samples, "mx.ok", "mx", "ok"), "flaky_ok": run_count(samples, "mx.flaky", "mx", "ok"),
                   "failed": run_count(samples, "mx.boom", "mx", "failed")}
            return got if got == {"ok": 5, "flaky_ok": 1, "failed": 1} else None

        wait_for(counted, timeout=30, what=f"the counts over HTTP (log: {log_path})")
        samples = scrape_http(url)
        assert run_count(samples, "mx.flaky", "mx", "retried") == 1
        assert run_count(samples, "mx.ok", "mx", "dead") == 0
        assert samples[("pyqueue_task_run_seconds_count", (("queue", "mx"), ("task", "mx.flaky")))] == 2
        assert samples[("pyqueue_task_queue_wait_seconds_count", (("queue", "mx"), ("task", "mx.ok")))] == 5
        assert "serving task metrics on http://127.0.0.1:" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log_path.read_text()


def test_processes_2_serves_the_sum_over_children_and_keeps_a_killed_childs_counts(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    from test_supervisor import Supervised, send_records
    from test_supervisor import wait_for as wait_until

    (port,) = free_ports(1)
    sv = Supervised(redis_server, tmp_path, "--metrics-port", str(port), processes=2)
    url = f"http://127.0.0.1:{port}/metrics"
    task = "supervisor_app.record"
    try:
        serving = sv.wait_serving(2)
        directories = set()
        for pid in serving:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            directories |= {v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")}
        (directory,) = directories  # one directory, the supervisor's, given to every child
        assert os.path.isdir(directory)

        send_records(20, sleep_s=0.05)  # 50 ms each: both children take some
        wait_until("20 runs", lambda: sv.settled() and len(sv.runs()) == 20)
        by_pid = {pid: sum(1 for _, _, p, _ in sv.runs() if p == pid) for pid in serving}
        assert all(by_pid.values()), f"one child ran every job: {by_pid}"
        wait_until("20 ok over HTTP", lambda: run_count(scrape_http(url), task, "sv", "ok") == 20)
        samples = scrape_http(url)
        assert samples[("pyqueue_task_run_seconds_count", (("queue", "sv"), ("task", task)))] == 20
        assert samples[("pyqueue_task_queue_wait_seconds_count", (("queue", "sv"), ("task", task)))] == 20

        killed = min(serving)
        os.kill(killed, signal.SIGKILL)
        wait_until("the replacement serving", lambda: (lambda s: len(s) == 2 and killed not in s)(sv.serving()))
        assert run_count(scrape_http(url), task, "sv", "ok") == 20  # the killed child's counts stay

        send_records(10, sleep_s=0.05, start=20)
        wait_until("30 runs", lambda: sv.settled() and len(sv.runs()) == 30)
        wait_until("30 ok over HTTP", lambda: run_count(scrape_http(url), task, "sv", "ok") == 30)
        assert scrape_http(url)[("pyqueue_task_run_seconds_count", (("queue", "sv"), ("task", task)))] == 30
        assert sv.stop() == 0, sv.log()
        assert not os.path.exists(directory), "the supervisor left its metrics directory"
    finally:
        sv.close()


# -- refusals ------------------------------------------------------------------------------


def test_refusals_exit_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*argv: str) -> str:
        assert main(list(argv)) == 2
        return capsys.readouterr().err

    assert "the worker's target must be a pyqueue.Tasks" in refused(
        "worker", "json:loads", "-q", "x", "--metrics-port", "0")
    assert "the worker's target must be a pyqueue.Tasks" in refused(
        "--url", "redis://127.0.0.1:1", "worker", "json:loads", "-q", "x", "--processes", "2", "--metrics-port", "0")
    assert "give --metrics-port too" in refused("worker", "json:loads", "-q", "x", "--metrics-host", "0.0.0.0")
    assert "must be 0..65535" in refused("worker", "json:loads", "-q", "x", "--metrics-port", "70000")
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed: its import fails
    assert 'pip install "pyqueue-redis[metrics]"' in refused("worker", "metrics_app:tasks", "--metrics-port", "0")


def test_a_port_in_use_is_refused_and_registers_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    import metrics_app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["worker", "metrics_app:tasks", "--metrics-port", str(port)]) == 2
    assert "cannot serve metrics on 127.0.0.1:" in capsys.readouterr().err
    assert metrics_app.tasks.dispatcher().run_hooks == ()
