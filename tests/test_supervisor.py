"""``pyqueue worker --processes N``: the supervisor (pyqueue/worker/supervisor.py) with
real worker processes on a real redis-server (issue #21). Each test runs
``python -m pyqueue worker supervisor_app:tasks --processes N`` and reads what ran from
the run log the tasks write to Redis before their work (tests/supervisor_app.py), so a
SIGKILLed run is still seen.

Covered: a child killed with SIGKILL (replaced; its leases back at once, not at lease
expiry); a crash loop (the cap, exit 70); recycling by jobs and by memory (no job lost
or run twice in the hand-over); SIGHUP (a rolling restart, 0 lost); SIGTERM (a drain,
exit 0) and a second signal (exit 1, leases scrubbed); the hard time limit (a task
stuck in ``time.sleep`` and one spinning in Python, both stopped at their limit, dead
after their attempts, and the worker serving again soon after); a bad target and the
embedded server refused with exit 2.

The embedded fakeredis cannot be shared between processes, so these tests need a real
server (they fail, not skip, under CI=true without one).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisServer

import supervisor_app
from pyqueue import Queue
from pyqueue.worker.supervisor import EXIT_CRASH_LOOP
from pyqueue.ops.service import Services

TESTS = Path(__file__).resolve().parent
#: Bounds every wait of this file: far below the 60 s leases, far above what it takes.
WAIT_S = 30.0


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


class Supervised:
    """One ``pyqueue worker ... --processes N`` under test, in its own prefix and
    namespace, with its log in a file."""

    def __init__(self, server: RedisServer, tmp: Path, *args: str, processes: int = 2) -> None:
        self.server = server
        self.name = "sv" + uuid.uuid4().hex[:8]
        self.prefix, self.namespace, self.runs_key = self.name, self.name, f"{self.name}:runs"
        self.client = server.client()
        supervisor_app.tasks.bind(server.client(), prefix=self.prefix)
        self.queue = Queue("sv", self.client, prefix=self.prefix)
        self.services = Services(self.client, namespace=self.namespace, prefix=self.prefix)
        self.log_path = tmp / f"{self.name}.log"
        self._log = open(self.log_path, "wb")
        env = dict(os.environ, PYQUEUE_URL=server.url(), PQ_SV_RUNS=self.runs_key,
                   PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "--prefix", self.prefix, "--namespace", self.namespace, "worker",
             "supervisor_app:tasks", "--processes", str(processes), "--lease-ms", "60000", *args],
            env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return sorted(int(pid) for pid in out.split())

    def serving(self) -> dict[int, int]:
        """pid -> service id of the live registered services of this supervisor."""
        return {s.pid: s.id for s in self.services.list() if s.alive}

    def wait_serving(self, count: int) -> dict[int, int]:
        return wait_for(f"{count} serving children", lambda: (lambda s: s if len(s) == count else None)(self.serving()))

    def runs(self) -> list[tuple[str, int, int, int]]:
        out = []
        for raw in self.client.lrange(self.runs_key, 0, -1):
            task, n, pid, attempt = raw.decode().split()
            out.append((task, int(n), int(pid), int(attempt)))
        return out

    def settled(self) -> bool:
        s = self.queue.stats()
        return s.ready == 0 and s.leased == 0 and s.scheduled == 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = WAIT_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:  # a failed test: leave nothing running
            for pid in self.children():
                os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def supervised(redis_server: RedisServer, tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    started: list[Supervised] = []

    def start(*args: str, processes: int = 2) -> Supervised:
        s = Supervised(redis_server, tmp_path, *args, processes=processes)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def send_records(count: int, sleep_s: float = 0.0, start: int = 0) -> None:
    for n in range(start, start + count):
        supervisor_app.record.send(n, sleep_s)


def assert_each_ran_once(sv: Supervised, task: str, expected: range) -> collections.Counter[int]:
    counts = collections.Counter(n for t, n, _, _ in sv.runs() if t == task)
    assert sorted(counts) == list(expected), "lost jobs: " + str(sorted(set(expected) - set(counts)))
    twice = {n: c for n, c in counts.items() if c > 1}
    assert not twice, f"ran more than once: {twice}"
    return counts


def test_a_killed_child_is_replaced_and_its_leases_come_back_at_once(supervised: Callable[..., Supervised]) -> None:
    sv = supervised("--concurrency", "2")
    first = sv.wait_serving(2)
    send_records(40, sleep_s=0.3)
    victim = wait_for("a child running two jobs", lambda: next(
        (pid for pid, n in collections.Counter(p for _, _, p, _ in sv.runs()).items() if n >= 2 and pid in first),
        None))
    held = sv.queue.stats().leased
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    # Its jobs run again, elsewhere, long before their 60 s leases could expire.
    ran_by_victim = {n for _, n, p, _ in sv.runs() if p == victim}
    wait_for("the killed child's jobs running again", lambda: any(
        n in ran_by_victim and p != victim and attempt == 2 for _, n, p, attempt in sv.runs()), timeout_s=10)
    back_s = time.monotonic() - killed_at
    after = sv.wait_serving(2)
    assert victim not in after and len(set(after) - set(first)) == 1, (first, after)
    wait_for("the queue settled", sv.settled)
    assert sv.stop() == 0
    counts = collections.Counter(n for t, n, _, _ in sv.runs() if t == "record")
    assert sorted(counts) == list(range(40))  # none lost; the victim's may have run twice
    assert all(c == 1 or n in ran_by_victim for n, c in counts.items())
    assert "killed by SIGKILL" in sv.log() and "back at the head of their queues" in sv.log(), sv.log()
    assert held >= 2 and back_s < 10


def test_a_crash_loop_gives_up_with_its_exit_code(supervised: Callable[..., Supervised]) -> None:
    sv = supervised("--crash-loop", "3")
    sv.wait_serving(2)
    for n in range(10):
        supervisor_app.die.send(n)
    assert sv.proc.wait(WAIT_S) == EXIT_CRASH_LOOP
    assert "fast deaths in a row (crash loop); giving up" in sv.log()
    assert sv.children() == []
    # Every death's leases were scrubbed: nothing is left leased to a dead process.
    assert sv.queue.stats().leased == 0
    sv.close()


def test_with_no_fast_deaths_every_death_is_replaced_at_once_and_the_loop_never_gives_up(
        supervised: Callable[..., Supervised]) -> None:
    """``--fast-death-ms 0`` (what the crash harness runs): a job that kills every child
    that runs it is a poison pill for the queue's attempts to bound, not a crash loop."""
    sv = supervised("--crash-loop", "3", "--fast-death-ms", "0", "--concurrency", "1")
    sv.wait_serving(2)
    job = supervisor_app.die.send(0)
    wait_for("6 children killed by the job and replaced", lambda: sv.log().count("replacing it in") >= 6)
    assert sv.proc.poll() is None, sv.log()
    delays = re.findall(r"replacing it in (\S+)s", sv.log())
    assert len(delays) >= 6 and set(delays) == {"0.00"}, delays
    sv.queue.cancel(job.id)  # it would go on killing children for its 100 attempts
    wait_for("the queue settled", sv.settled)
    assert sv.stop() == 0
    assert "crash loop" not in sv.log()


def test_recycling_by_jobs_hands_over_without_losing_or_repeating(supervised: Callable[..., Supervised]) -> None:
    sv = supervised("--concurrency", "2", "--max-jobs-per-child", "25")
    sv.wait_serving(2)
    send_records(200, sleep_s=0.002)
    wait_for("200 runs", lambda: len(sv.runs()) >= 200)
    wait_for("the queue settled", sv.settled)
    assert sv.stop() == 0
    assert_each_ran_once(sv, "record", range(200))
    per_pid = collections.Counter(pid for _, _, pid, _ in sv.runs())
    assert len(per_pid) >= 200 // 25 - 1, per_pid  # recycled, many times
    retired = [int(line.split("replacing worker process ")[1].split(":")[0])
               for line in sv.log().splitlines() if "replacing worker process" in line]
    # Each recycled child ran its 25 jobs, plus those it had leased, or was leasing, when
    # its 25th job ended: one per slot it was running and one per slot whose lease call
    # was under way (a group commit or a fetch decided just before). CI once saw 28 with
    # 2 slots. These jobs are short, so the default prefetch ("auto") adds 2 slots: 4.
    assert retired and all(25 <= per_pid[pid] <= 25 + 2 * 4 for pid in retired), (retired, per_pid)


def test_recycling_by_memory(supervised: Callable[..., Supervised]) -> None:
    sv = supervised("--max-memory-per-child", "150")
    first = sv.wait_serving(2)
    supervisor_app.hog.send(0, 200)
    wait_for("a replacement above 150 MiB", lambda: "resident (--max-memory-per-child 150)" in sv.log())
    wait_for("the hog's process replaced", lambda: len(set(sv.serving()) - set(first)) == 1 and len(sv.serving()) == 2)
    send_records(50)
    wait_for("the queue settled", lambda: len(sv.runs()) >= 51 and sv.settled())
    assert sv.stop() == 0
    assert_each_ran_once(sv, "record", range(50))
    assert [t for t, *_ in sv.runs()].count("hog") == 1


def test_sighup_restarts_every_child_one_by_one_losing_nothing(supervised: Callable[..., Supervised]) -> None:
    sv = supervised("--concurrency", "2")
    first = sv.wait_serving(2)
    send_records(150, sleep_s=0.02)
    wait_for("work under way", lambda: len(sv.runs()) >= 10)
    sv.proc.send_signal(signal.SIGHUP)
    wait_for("both children replaced", lambda: (lambda s: len(s) == 2 and not set(s) & set(first))(sv.serving()))
    wait_for("the queue settled", lambda: len(sv.runs()) >= 150 and sv.settled())
    assert sv.stop() == 0
    assert_each_ran_once(sv, "record", range(150))
    assert sv.log().count("rolling restart (SIGHUP)") == 2


def test_sigterm_drains_and_a_second_signal_kills(supervised: Callable[..., Supervised]) -> None:
    sv = supervised("--concurrency", "2")
    sv.wait_serving(2)
    send_records(4, sleep_s=1.0)
    wait_for("four jobs running", lambda: len(sv.runs()) >= 4)
    sv.proc.send_signal(signal.SIGTERM)
    assert sv.proc.wait(WAIT_S) == 0
    # The running jobs finished (acked) and the services deregistered.
    assert sv.queue.stats().leased == 0 and sv.queue.stats().ready == 0
    assert_each_ran_once(sv, "record", range(4))
    assert sv.services.list() == []
    sv.close()

    sv = supervised("--concurrency", "2", "--grace-ms", "60000")
    sv.wait_serving(2)
    send_records(4, sleep_s=30)
    wait_for("four jobs running", lambda: len(sv.runs()) >= 4)
    sv.proc.send_signal(signal.SIGTERM)
    wait_for("the drain begun", lambda: sv.log().count("stopping: received SIGTERM") == 2)
    sv.proc.send_signal(signal.SIGTERM)
    assert sv.proc.wait(WAIT_S) == 1
    assert sv.children() == []
    # Killed, but not left to expire: the supervisor scrubbed their leases.
    stats = sv.queue.stats()
    assert stats.leased == 0 and stats.ready == 4, stats
    sv.close()


@pytest.mark.parametrize("task", ["sleep_forever", "spin_forever"])
def test_the_hard_time_limit_stops_the_job_and_the_worker_serves_again(
    supervised: Callable[..., Supervised], task: str
) -> None:
    # --lease-ms 2000: a job still stuck when its child ends is retried a lease length later.
    sv = supervised("--concurrency", "1", "--lease-ms", "2000", processes=1)
    first = sv.wait_serving(1)
    getattr(supervisor_app, task).send(0)
    # Two attempts, each stopped at its 1 s limit: then dead, with the limit as its error.
    wait_for("dead after its attempts", lambda: sv.queue.stats().dead == 1)
    dead = sv.queue.dead_list().jobs
    assert "exceeded its time limit of 1s" in dead[0].error
    limited_at = time.monotonic()
    send_records(1)
    wait_for("the next job run", lambda: any(t == "record" for t, *_ in sv.runs()))
    serving_again_s = time.monotonic() - limited_at
    print(f"{task}: the next job ran {serving_again_s:.2f}s after the job went dead at its limit")
    assert [t for t, *_ in sv.runs()].count(task) == 2
    if task == "sleep_forever":
        # Its thread could only be stopped with its process: each attempt's child was replaced.
        replaced = [line for line in sv.log().splitlines() if "replacing worker process" in line]
        assert len(replaced) == 2 and all("did not stop at its time limit" in line for line in replaced), replaced
        assert not set(sv.serving()) & set(first)
        # The second attempt started once the first one's process was gone: never both at once.
        ledger = [line.decode().split() for line in sv.client.lrange(f"{sv.runs_key}:ledger", 0, -1)]
        assert [(attempt, alive) for attempt, _, alive in ledger] == [("1", "0"), ("2", "0")], ledger
        assert ledger[0][1] != ledger[1][1]
    else:
        assert "did not stop at its time limit" not in sv.log()  # the exception stopped it
        assert sv.serving() == first
    assert sv.stop() == 0
    assert serving_again_s < 10, serving_again_s


def test_refused_configurations_exit_2(redis_server: RedisServer) -> None:
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("PYQUEUE_URL", None)
    url = ["--url", redis_server.url()]
    cases = {
        "embedded fakeredis lives inside one process": ["worker", "supervisor_app:tasks", "--processes", "2"],
        "No module named": [*url, "worker", "no_such_module:tasks", "--processes", "2"],
        "recycle the children of --processes N": [*url, "worker", "supervisor_app:tasks", "--max-jobs-per-child", "5"],
        "--processes must be 1..256": [*url, "worker", "supervisor_app:tasks", "--processes", "0"],
    }
    for expected, args in cases.items():
        done = subprocess.run([sys.executable, "-m", "pyqueue", *args], env=env, capture_output=True,
                              text=True, timeout=WAIT_S)
        assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


def test_a_child_still_starting_stops_when_its_supervisor_is_gone() -> None:
    """Start-up retries (Redis unreachable) end once the supervisor died: the child does
    not retry for ever as an orphan. (Once registered, its heartbeat checks the same.)"""
    import redis

    from pyqueue.worker.lifecycle import Control, StoppedDuringStartUp
    from pyqueue.worker.running import Running

    gone = [False]
    control = Control(Running(1), parent_gone=lambda: gone[0])
    calls = [0]

    def unreachable() -> None:
        calls[0] += 1
        if calls[0] == 3:
            gone[0] = True
        raise redis.ConnectionError("connection refused")

    started = time.monotonic()
    with pytest.raises(StoppedDuringStartUp):
        control.start_up(unreachable, "start-up check")
    assert calls[0] == 3 and time.monotonic() - started < 5
    assert control.exit_reason == "its supervisor is gone (while starting)"
