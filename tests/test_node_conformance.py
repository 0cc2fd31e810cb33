"""Another language shares queues with Python: a small Node.js client (tests/node),
written from lua/README.md only, loads lua/*.lua byte for byte and works the same
queues as the Python driver on a real redis-server.

* produce: Node enqueues (delays, duplicates, binary payloads); a Python worker runs
  every job exactly once with the exact bytes, and both sides count the same.
* consume: Python enqueues; Node acks a Python receipt, leases, extends, acks,
  acks-and-leases, nacks to DEAD, re-sends a lease, releases; Python sees the states
  Node left and its next fence is larger than every Node fence.
* share: a Python worker and a Node loop (ack-and-lease, BZPOPMIN wait) drain one queue
  together; every job runs and is acked exactly once, and both sides ran some.
* service: a Node *service* (README §7) shares the namespace ``workers`` with Python. It
  registers, scrubs and forgets a dead Python service, is listed by ``pyqueue services``,
  runs Python's jobs, and ``pyqueue stop`` wakes it from its blocking wait: it
  deregisters, exits 0 and leaves only ``seq`` in the namespace. Killed (-9) while it
  holds a lease, a Python worker reports it dead and scrubs its lease, and the job runs
  once more, on the Python side. Paused (SIGSTOP) past its expiry instead, it is
  scrubbed the same way, and on SIGCONT it learns its registration was lost, finishes
  its job (whose fenced ack changes nothing), and exits 75 without writing.
* contract: Node reads the contract version every script states (lua/README.md §10) and
  refuses a script of another version; the calls of the earlier contract (nack with 8
  KEYS, service_register without its registration token) are answered PQ_CONTRACT and
  write nothing.

The produce test also starts its Python worker while delayed jobs are pending: it must
wait for their due times without polling and run each when due.

Tasks (lua/README.md §9, the task envelope; tests/node/tasks.js is written from it):

* task-produce: Node sends task envelopes (tagged datetime, Decimal, bytes, set and the
  other types, a unique id, per-send opts, extra meta) to the ``conf.*`` tasks a Python
  worker runs, and reads each result back: equal to what Python computes from the
  envelope it received.
* task-work: Python sends (``fn.send``); a Node worker leases, decodes, runs its JS
  ``conf.*`` tasks and acks with ``ack_result`` ('j' + JSON), or nacks (an unknown task
  name final, an unknown envelope version with backoff); Python's ``handle.result()``
  reads the values, and ``TaskDead`` with Node's errors.
* the README's worked payload decodes and encodes again to the same bytes in both.

Needs node and ``npm ci`` in tests/node (tests/run.sh does it); skipped without them,
except under CI=true.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta, timezone
from datetime import time as daytime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from conftest import IN_CI, RedisServer, dump_all
from tasks_support import Serving, wait_for

from pyqueue import Job, NewJob, Outcome, Queue, QueueFull
from pyqueue.protocol.core import decode_result, encode_result
from pyqueue.drivers.queue import DEFAULT_LEASE_MS
from pyqueue.drivers.scripts import CONTRACT_VERSION
from pyqueue.ops.service import Services
from pyqueue.tasks import Backoff, EnvelopeError, Task, TaskDead, Tasks, chord, current_job, envelope
from pyqueue.tasks.codec import canonical, from_json, to_json
from pyqueue.worker import Worker

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
NODE_DIR = TESTS / "node"
LUA = TESTS.parent / "lua"
NODE = shutil.which("node")
# Stats fields that depend on when they are read; every other field must agree.
TIME_FIELDS = {"now_ms", "lag_ms"}
#: consume: the delay of the job Node waits for with BZPOPMIN (its block period is 5 s).
LATER_MS = 1_500


def require_node() -> str:
    if NODE is None or not (NODE_DIR / "node_modules" / "ioredis").is_dir():
        why = "node or tests/node/node_modules is missing (run: cd tests/node && npm ci)"
        if IN_CI:
            pytest.fail(f"{why}, and CI=true forbids skipping the Node conformance tests")
        pytest.skip(why)
    return NODE


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    require_node()
    with redis_server.client() as admin:
        admin.flushall()
    return redis_server


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()


def run_node(scenario: str, server: RedisServer, options: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    """Run one scenario to completion; its last stdout line is the JSON result."""
    done = subprocess.run(
        [require_node(), str(NODE_DIR / "conformance.js"), scenario, server.url()],
        input=(json.dumps(options) + "\n").encode(),
        capture_output=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def stats_dict(q: Queue) -> dict[str, int]:
    return {k: v for k, v in dataclasses.asdict(q.stats()).items() if k not in TIME_FIELDS}


def run_worker_burst(worker: Worker, timeout_s: float = 60) -> None:
    kwargs = {"burst": True, "install_signal_handlers": False}
    thread = threading.Thread(target=worker.run, kwargs=kwargs, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        worker.stop("test timed out")
        thread.join(15)
        pytest.fail(f"the burst worker did not drain the queue within {timeout_s} s")


def wait_until(what: str, condition: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)


def command_calls(client: redis.Redis) -> Counter[str]:
    """Commands the server ran so far, by name (INFO commandstats)."""
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def pyqueue_cli(server: RedisServer, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pyqueue --url unix://<sock> ...``, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pyqueue", "--url", server.url(), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )


def parse_table(text: str) -> list[dict[str, str]]:
    """The rows of a table printed by pyqueue.cli.table, cut at its dashed line (a cell
    may be empty: a dead service has no host)."""
    lines = text.splitlines()
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    names = [lines[0][a:b].strip() for a, b in spans]
    return [{name: row[a:b].strip() for name, (a, b) in zip(names, spans)} for row in lines[2:]]


class NodeService:
    """``conformance.js service`` as a subprocess: stdout (JSON lines: events, then the
    result) and stderr go to files; stopped by its PID only."""

    def __init__(self, server: RedisServer, tmp_path: Path, name: str, options: dict[str, Any]) -> None:
        self.out_path, self.err_path = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [require_node(), str(NODE_DIR / "conformance.js"), "service", server.url()],
                stdin=subprocess.PIPE, stdout=out, stderr=err,
            )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(options).encode() + b"\n")
        self.proc.stdin.close()

    def lines(self) -> list[dict[str, Any]]:
        text = self.out_path.read_text()
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("event") == kind]

    def wait_event(self, kind: str, timeout_s: float = 20, count: int = 1) -> dict[str, Any]:
        wait_until(f"{count} Node '{kind}' event(s)",
                   lambda: len(self.events(kind)) >= count or self.proc.poll() is not None, timeout_s)
        found = self.events(kind)
        assert len(found) >= count, f"node exited {self.proc.returncode}: {self.err_path.read_text()}"
        return found[count - 1]

    def result(self) -> dict[str, Any]:
        (last,) = [line for line in self.lines() if "event" not in line]
        return last

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


class Checks:
    """Counts the checks a scenario made, for its report."""

    def __init__(self) -> None:
        self.count = 0

    def equal(self, actual: object, expected: object, what: str) -> None:
        assert actual == expected, f"{what}: got {actual!r}, expected {expected!r}"
        self.count += 1

    def true(self, condition: object, what: str) -> None:
        assert condition, what
        self.count += 1


def test_node_passes_the_keys_each_script_header_lists() -> None:
    done = subprocess.run(
        [require_node(), str(NODE_DIR / "conformance.js"), "keys"], capture_output=True, timeout=30
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    node_keys = json.loads(done.stdout)
    assert node_keys, "the Node client defines no scripts"
    for name, roles in node_keys.items():
        text = (LUA / f"{name}.lua").read_text().split("\n]]\n", 1)[0]
        m = re.search(r"^KEYS \((\d+)\)", text, re.M)
        assert m, name
        block = text[m.end():].split("\n\n", 1)[0]
        header = re.findall(r"^\s+\d+\s+(\w+)\s", block, re.M)
        assert roles == header and len(header) == int(m.group(1)), name


def test_node_produces_and_a_python_worker_runs_each_job_once_with_its_exact_bytes(
    server: RedisServer, client: redis.Redis
) -> None:
    rng = random.Random(20240517)
    special = [
        b"",
        b"\xff\xfe\x00\x80 not utf-8",
        b"a|b||c|",
        b"\x00" * 7,
        "h\u00e9llo \u2713".encode(),
        rng.randbytes(100_000),
    ]
    jobs = []
    for i in range(150):
        payload = special[i] if i < len(special) else b"\xc3\x28" + rng.randbytes(rng.randint(0, 64))
        # Due 0.5-2 s after the enqueue: still pending when the worker starts below.
        delay = rng.randint(500, 2_000) if i % 7 == 3 else 0
        attempts = rng.randint(1, 5)
        jobs.append({"id": f"p{i:03d}", "payload_hex": payload.hex(), "delay_ms": delay, "max_attempts": attempts})
    delayed = sum(1 for j in jobs if j["delay_ms"])
    # One call of 101 (a repeated id inside it), 49 single calls, then 10 re-sends of
    # existing ids with other payloads and delays, which must change nothing.
    repeat = {**jobs[5], "payload_hex": b"second".hex(), "delay_ms": 0}
    resent = (0, 3, 10, 99, 100, 120, 130, 140, 148, 149)
    resends = [{**jobs[k], "payload_hex": b"resent".hex(), "delay_ms": 0} for k in resent]
    calls = [jobs[:100] + [repeat]] + [[j] for j in jobs[101:]] + [[jobs[100]]] + [[r] for r in resends]
    node = run_node("produce", server, {"queue": "from-node", "calls": calls})

    flags = [f for reply in node["replies"] for f in reply["flags"]]
    expected_flags = [1] * 100 + [0] + [1] * 50 + [0] * 10
    assert flags == expected_flags
    assert sum(r["added"] for r in node["replies"]) == 150
    assert sum(r["duplicates"] for r in node["replies"]) == 11

    q = Queue("from-node", client)
    # Python reads what Node wrote, field for field ("due" grows as delays pass).
    before = stats_dict(q)
    assert {k: v for k, v in before.items() if k != "due"} == {
        k: v for k, v in node["stats"].items() if k not in TIME_FIELDS | {"due"}
    }
    assert (before["enqueued"], before["duplicates"]) == (150, 11)
    assert (before["ready"], before["scheduled"]) == (150 - delayed, delayed)

    # The delays held (the jobs are SCHEDULED, above). The worker starts while delayed jobs
    # are still pending: it must wait for each due time without polling (a BZPOPMIN timed
    # to the next due time, never a 0 timeout), and run each job when it is due.
    delayed_ids = [str(j["id"]) for j in jobs if j["delay_ms"]]
    records: Any = client.hmget("pq:{from-node}:jobs", delayed_ids)  # "<attempts>|<max>|<due_ms>:<enqueued_ms>|<payload>" (§2)
    due_ms = {job_id: int(rec.split(b"|", 3)[2].split(b":")[0]) for job_id, rec in zip(delayed_ids, records)}
    at_start = q.stats()
    pending_at_start = at_start.scheduled - at_start.due
    assert pending_at_start >= 1, "every delayed job was due before the worker started: nothing tests its waits"
    commands_before = command_calls(client)
    runs: list[Job] = []
    run_worker_burst(Worker(["from-node"], runs.append, redis=client, block_ms=5_000))
    commands = command_calls(client) - commands_before
    counts = Counter(job.id for job in runs)
    assert set(counts) == {j["id"] for j in jobs} and set(counts.values()) == {1}
    by_id = {j["id"]: j for j in jobs}
    for job in runs:
        assert job.payload == bytes.fromhex(by_id[job.id]["payload_hex"]), job.id
        assert (job.attempt, job.max_attempts) == (1, by_id[job.id]["max_attempts"]), job.id
    after = q.stats()
    assert (after.acked, after.done, after.enqueued, after.duplicates) == (150, 150, 150, 11)
    assert (after.ready, after.scheduled, after.leased, after.dead) == (0, 0, 0, 0)
    # Each delayed job ran when due: never before, and not a block period (5 s) late. Its
    # lease time is deadline_ms - lease_ms, on the server clock like due_ms.
    late = {job.id: job.deadline_ms - DEFAULT_LEASE_MS - due_ms[job.id] for job in runs if job.id in due_ms}
    assert len(late) == delayed and min(late.values()) >= 0, sorted(late.items(), key=lambda kv: kv[1])[:3]
    assert max(late.values()) < 1_000, sorted(late.items(), key=lambda kv: -kv[1])[:3]
    # Without polling: a few timed waits per due time at most (one BZPOPMIN each), and
    # about one lease call per job (ack-and-lease) plus one per wait.
    waits, script_calls = commands["bzpopmin"], commands["evalsha"] + commands["eval"]
    assert 1 <= waits <= delayed + 5, commands
    assert script_calls <= 150 + 3 * delayed + 20, commands
    print(f"produce: node sent {len(flags)} jobs in {len(calls)} calls (150 added, 11 duplicates, "
          f"{delayed} delayed, {pending_at_start} not yet due when the python worker started); python ran "
          f"{len(runs)}, each once; delayed jobs leased {min(late.values())}..{max(late.values())} ms after due; "
          f"{waits} BZPOPMIN, {script_calls} script calls")


def test_node_consumes_what_python_enqueued_and_fences_grow_across_languages(
    server: RedisServer, client: redis.Redis
) -> None:
    q = Queue("from-python", client)
    payloads = {
        "c0": b"\x00\xff|python lease",
        "c1": bytes(range(256)),
        "c2": "\u00fcn\u00efcode \u2713".encode(),
        "c3": b"\xfe\xfe poison",
        "c4": b"",
        "c5": b"left for later",
    }
    sent_from = q.stats().now_ms
    for job_id, payload in payloads.items():
        q.enqueue(payload, job_id=job_id, max_attempts=1 if job_id == "c3" else 5)
    sent_until = q.stats().now_ms
    (py_first,) = q.lease()
    assert py_first.id == "c0"
    error = "node says no \u2717"
    later = Queue("from-python-later", client)
    # Due in 1.5 s: still pending when Node, started below, first leases from that queue
    # (300 ms was not always enough on a loaded machine).
    enqueued_at = later.stats().now_ms  # server clock, just before: the job is due >= this + LATER_MS
    later.enqueue(b"due later", job_id="later", delay_ms=LATER_MS)

    node = run_node(
        "consume",
        server,
        {
            "queue": "from-python",
            "python_receipt_hex": py_first.receipt.encode().hex(),
            "flush_scripts": True,
            "error": error,
            "later_queue": "from-python-later",
        },
    )
    # Node acked the receipt Python leased, and reloaded the scripts SCRIPT FLUSH dropped.
    assert node["python_ack"] == ["ok"]
    assert node["reloads"] >= 1
    leased = node["leased"]
    assert [j["id"] for j in leased] == ["c1", "c2"]
    for j in leased + node["ack_and_lease"]["jobs"] + node["lease_first"]:
        assert bytes.fromhex(j["payload_hex"]) == payloads[j["id"]]
        assert j["attempt"] == 1
        # When Python sent it, on the server's clock (contract v5), as Node reads it.
        assert sent_from <= j["enqueued_ms"] <= sent_until
    assert node["extend"][0]["status"] == "ok" and node["extend"][0]["deadline_ms"] > leased[0]["deadline_ms"]
    assert (node["ack"], node["ack_again"]) == (["ok"], ["gone"])
    assert node["ack_and_lease"]["acks"] == ["ok"]
    (poison,) = node["ack_and_lease"]["jobs"]
    assert (poison["id"], poison["max_attempts"]) == ("c3", 1)
    assert (node["nack"]["status"], node["nack"]["state"]) == ("ok", "dead")
    assert node["lease_resent"] == node["lease_first"] and node["lease_first"][0]["id"] == "c4"
    assert (node["release"], node["release_again"]) == (["ok"], ["stale"])

    # Python sees exactly what Node did.
    st = stats_dict(q)
    assert st == {k: v for k, v in node["stats"].items() if k not in TIME_FIELDS}
    assert (st["acked"], st["nacked"], st["released"], st["dead"], st["dead_total"]) == (3, 1, 1, 1, 1)
    assert (st["leased_total"], st["ready"], st["leased"], st["done"]) == (5, 2, 0, 3)
    (dead,) = q.dead_list().jobs
    assert (dead.id, dead.error, dead.attempts, dead.max_attempts, dead.payload) == ("c3", error, 1, 1, payloads["c3"])

    node_fences = [j["fence"] for j in leased + [poison] + node["lease_first"]]
    assert node_fences == sorted(set(node_fences)) and node_fences[0] > py_first.fence
    (again,) = q.lease()
    # The released job is next, at attempt 1 still, with a fence above every Node fence.
    assert (again.id, again.payload, again.attempt) == ("c4", b"", 1)
    assert again.fence > max(node_fences)
    assert q.ack(again) is Outcome.OK

    # Node's blocking wait ended at the delayed job's due time (the server's hz tick
    # may add up to ~100 ms), long before its 5 s block period.
    assert [j["id"] for j in node["later"]["jobs"]] == ["later"] and node["later"]["ack"] == ["ok"]
    assert "timeout" in node["later"]["waits"]
    assert enqueued_at + LATER_MS <= node["later"]["leased_at_ms"] < enqueued_at + LATER_MS + 1_500
    assert (later.stats().acked, later.stats().promoted) == (1, 1)
    print(f"consume: fences python {py_first.fence}, node {node_fences}, python {again.fence}; "
          f"node waited {node['later']['waits']} for a job due in {LATER_MS} ms, leased it after "
          f"{node['later']['leased_at_ms'] - enqueued_at} ms")


def test_a_python_worker_and_a_node_loop_share_one_queue_each_job_acked_once(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    n = 3000
    q = Queue("shared", client)
    ids = [f"s{i:05d}" for i in range(n)]
    python_ran: list[str] = []
    worker = Worker(["shared"], lambda job: python_ran.append(job.id), redis=client, block_ms=1_000)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    out_path, err_path = tmp_path / "node.out", tmp_path / "node.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [require_node(), str(NODE_DIR / "conformance.js"), "share", server.url()],
            stdin=subprocess.PIPE, stdout=out, stderr=err,
        )
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps({"queue": "shared", "block_ms": 500}).encode() + b"\n")
        proc.stdin.flush()
        wait_until("the Node loop to start", lambda: b"\n" in out_path.read_bytes() or proc.poll() is not None, 20)
        assert proc.poll() is None, err_path.read_text()
        thread.start()
        wait_until("the Python worker to register", lambda: worker.service is not None, 10)
        # Both sides are idle in their blocking waits; enqueue in batches so the wake
        # marker wakes them while work keeps arriving. (Node's wait timed by a due time
        # is checked in the consume test.)
        for start in range(0, n, 100):
            q.enqueue_many([NewJob(job_id.encode(), job_id=job_id) for job_id in ids[start : start + 100]])
            time.sleep(0.005)
        wait_until("every job to be acked", lambda: (s := q.stats()).acked == n and s.ready == s.leased == 0, 90)
    finally:
        worker.stop("test finished")
        if thread.is_alive():
            thread.join(15)
        try:
            proc.stdin.write(b"stop\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not thread.is_alive()
    assert proc.returncode == 0, err_path.read_text()
    node = json.loads(out_path.read_text().strip().splitlines()[-1])
    node_ran: list[str] = node["ran"]

    # The total-queue check: every job ran exactly once, on one side or the other.
    runs = Counter(python_ran) + Counter(node_ran)
    lost = set(ids) - set(runs)
    twice = sorted(job_id for job_id, c in runs.items() if c > 1)
    assert (len(lost), len(twice), sum(runs.values())) == (0, 0, n), (sorted(lost)[:5], twice[:5])
    assert python_ran and node_ran, f"one side ran nothing: python {len(python_ran)}, node {len(node_ran)}"
    assert node["acks"] == {"ok": len(node_ran), "stale": 0, "gone": 0}
    assert sum(node["waits"].values()) >= 1
    st = q.stats()
    assert (st.acked, st.enqueued, st.leased_total, st.done) == (n, n, n, n)
    assert (st.reclaimed, st.nacked, st.released, st.dead) == (0, 0, 0, 0)
    print(f"share: {n} jobs, {sum(runs.values())} executions: "
          f"python {len(python_ran)}, node {len(node_ran)}; "
          f"lost 0, twice 0; node waits {node['waits']}")


def namespace_keys(client: redis.Redis) -> list[str]:
    keys: Any = client.keys("pq:{workers}:*")
    return sorted(k.decode() for k in keys)


def test_a_node_service_shares_the_namespace_is_listed_runs_jobs_and_stops_remotely(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    check = Checks()
    q = Queue("svc", client)
    services = Services(client)
    # A Python service that died holding a lease: registered, leased, never renewed. Node
    # is started once its expiry has passed, so Node's start-up renewal reports it.
    dead = services.register(["svc"], expire_ms=1000)
    q.enqueue(b"orphaned \xff", job_id="orphan")
    (orphan,) = Queue("svc", client, owner=dead.owner).lease()
    (dead_info,) = services.list()
    wait_until("the dead service's expiry to pass", lambda: q.stats().now_ms > dead_info.expires_ms, 5)

    # Defaults of expire_ms/renew_ms (60 s / 15 s) and a 10 s block period: after the
    # start-up renewal, only the private wake key can stop this service promptly. lease_ms
    # 900 with a 1.2 s job: the job is extended while it runs.
    node = NodeService(server, tmp_path, "service", {"queue": "svc", "block_ms": 10_000, "lease_ms": 900})
    try:
        reg = node.wait_event("registered")
        check.equal(reg["id"], dead.id + 1, "node took the next id")
        check.equal(reg["owner"], f"workers.{reg['id']}.{reg['registration']}", "node's lease owner")
        check.true(re.fullmatch(r"[0-9a-f]{8}", reg["registration"]), "an 8-hex-digit registration token")

        # Node scrubbed the dead service's lease (attempt counted), forgot it, ran the job.
        again = node.wait_event("running")
        check.equal((again["id"], again["attempt"]), ("orphan", 2), "node ran the scrubbed job")
        check.true(again["fence"] > orphan.fence, "the new lease's fence is above the dead one's")
        wait_until("the orphan to be acked", lambda: q.stats().acked == 1, 10)
        wait_until("node to forget the dead service", lambda: [i.id for i in services.list()] == [reg["id"]], 10)

        # The operator's view of the namespace: Python lists the Node service.
        listed = pyqueue_cli(server, "services")
        check.equal(listed.returncode, 0, f"pyqueue services: {listed.stderr}")
        rows = parse_table(listed.stdout)
        check.equal(len(rows), 1, f"one service listed:\n{listed.stdout}")
        row = rows[0]
        check.equal((row["id"], row["state"]), (str(reg["id"]), "alive"), "listed id and state")
        check.equal((row["host"], row["pid"]), (socket.gethostname(), str(node.proc.pid)), "listed host and pid")
        check.equal((row["queues"], row["owner"]), ("svc", reg["owner"]), "listed queues and owner")
        started = datetime.fromtimestamp(reg["started_ms"] / 1000, timezone.utc)
        check.equal(row["started (UTC)"], started.strftime("%Y-%m-%d %H:%M:%SZ"), "listed start time")

        # Python enqueues; Node runs each job with its exact bytes.
        payloads = {"b0": bytes(range(256)), "b1": b"", "b2": b"\xff\x00|not utf-8", "b3": "\u00fcn\u00efc\u00f8de".encode()}
        for job_id, payload in payloads.items():
            q.enqueue(payload, job_id=job_id)
        q.enqueue(b"sleep:1200", job_id="slow")
        slow = node.wait_event("running", count=1 + len(payloads) + 1)
        check.equal(slow["id"], "slow", "the jobs ran in order")
        time.sleep(1.0)  # past the first lease's 900 ms: only an extension keeps it unexpired
        during = q.stats()
        check.equal((during.leased, during.expired), (1, 0), "the slow job's lease was extended")
        n = 1 + len(payloads) + 1
        wait_until("node to run every job", lambda: q.stats().acked == n, 15)
        st = q.stats()
        check.equal((st.acked, st.leased_total, st.scrubbed), (n, n + 1, 1), "python stats: acked, leased, scrubbed")
        check.equal((st.ready, st.leased, st.reclaimed, st.nacked, st.dead), (0, 0, 0, 0, 0), "python stats: nothing left")

        # Node is idle in BZPOPMIN (10 s); `pyqueue stop` must wake it at once.
        wait_until("node to block in BZPOPMIN",
                   lambda: any(c["cmd"] == "bzpopmin" and "b" in c["flags"] for c in client.client_list()), 10)
        started = time.monotonic()
        stopped = pyqueue_cli(server, "stop", str(reg["id"]))
        check.equal(stopped.returncode, 0, f"pyqueue stop: {stopped.stderr}")
        node.proc.wait(8)
        stop_s = time.monotonic() - started
    finally:
        node.close()
    check.equal(node.proc.returncode, 0, f"node's exit code; stderr: {node.err_path.read_text()}")
    check.true(stop_s < 5, f"node exited {stop_s:.2f} s after `pyqueue stop` started (block period 10 s)")
    out = node.result()
    check.equal(out["stopped_by"], "wake", "node learned of the stop from its private wake key")
    check.equal(out["waits"]["woken_private"], 1, "one wake-up by the private key")
    check.equal(out["renewals"], {"ok": 1, "stop": 0, "lost": 0, "failed": 0}, "only the start-up renewal ran")
    check.equal([r["id"] for r in out["ran"]], ["orphan", *payloads, "slow"], "node ran every job once, in order")
    for r in out["ran"]:
        expected = {"orphan": b"orphaned \xff", "slow": b"sleep:1200", **payloads}[r["id"]]
        check.equal(bytes.fromhex(r["payload_hex"]), expected, f"payload of {r['id']}")
    check.equal(out["acks"], {"ok": n, "stale": 0, "gone": 0}, "node's acks")
    check.true(out["extends"]["ok"] >= 2 and out["extends"]["stale"] == out["extends"]["gone"] == 0,
               f"node extended the slow job: {out['extends']}")
    check.equal(out["scrubbed"], [{"owner": dead.owner, "queues": ["svc"], "leases": 1, "forgotten": True}],
                "node scrubbed and forgot the dead Python service")
    check.equal(out["deregister"], {"deleted": 1, "removed": 1}, "node deregistered itself")
    check.equal(namespace_keys(client), ["pq:{workers}:service:seq"], "the namespace keeps only seq")
    check.equal(int(client.get("pq:{workers}:service:seq") or 0), reg["id"], "seq")
    print(f"service/stop: {check.count} checks; node service {reg['owner']} scrubbed dead python service "
          f"{dead.owner} (1 lease) and forgot it, was listed by `pyqueue services`, ran {n} jobs "
          f"(extends {out['extends']['ok']}), waits {out['waits']}, exited 0 {stop_s:.2f} s after `pyqueue stop` "
          f"began; namespace left: seq only")


def test_a_python_worker_scrubs_a_killed_node_service_and_runs_its_job_once_more(
    server: RedisServer, client: redis.Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pyqueue.worker")
    check = Checks()
    q = Queue("svc-kill", client)
    services = Services(client)
    node = NodeService(server, tmp_path, "killed", {
        "queue": "svc-kill", "expire_ms": 1000, "renew_ms": 200, "block_ms": 10_000, "lease_ms": 30_000,
    })
    python_ran: list[Job] = []
    worker = Worker(["svc-kill"], python_ran.append, redis=client, renew_ms=200, expire_ms=2000, block_ms=10_000)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    try:
        reg = node.wait_event("registered")
        q.enqueue(b"sleep:60000", job_id="victim")
        running = node.wait_event("running")
        check.equal((running["id"], running["attempt"]), ("victim", 1), "node holds the victim's lease")
        thread.start()
        wait_until("the Python worker to register", lambda: worker.service is not None, 10)
        assert worker.service is not None
        time.sleep(0.5)  # a few renewals on both sides: Node is alive and nobody scrubs it
        check.equal((q.stats().leased, q.stats().scrubbed, python_ran), (1, 0, []), "nothing scrubbed while alive")
        alive = {i.id: i.alive for i in services.list()}
        check.equal(alive, {reg["id"]: True, worker.service.id: True}, "both services alive in one namespace")

        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)
        killed_at = time.monotonic()
        wait_until("the Python worker to run the victim", lambda: python_ran, 15)
        recovered_s = time.monotonic() - killed_at
        wait_until("python to forget the node service", lambda: reg["id"] not in {i.id for i in services.list()}, 10)
        time.sleep(0.5)  # time for a second run, which must not happen
    finally:
        worker.stop("test finished")
        if thread.is_alive():
            thread.join(15)
        node.close()
    check.true(not thread.is_alive(), "the Python worker stopped")
    check.equal(node.proc.returncode, -signal.SIGKILL, "node was killed")
    check.equal([(j.id, j.attempt, j.payload) for j in python_ran], [("victim", 2, b"sleep:60000")],
                "python ran the victim exactly once, as attempt 2")
    check.true(python_ran[0].fence > running["fence"], "python's fence is above node's")
    st = q.stats()
    check.equal((st.leased_total, st.scrubbed, st.acked, st.reclaimed), (2, 1, 1, 0), "scrubbed, not reclaimed")
    check.equal((st.ready, st.leased, st.dead, st.nacked), (0, 0, 0, 0), "nothing left")
    check.true(recovered_s < 5, f"recovered {recovered_s:.2f} s after the kill (expire_ms 1000)")
    reports = [r.getMessage() for r in caplog.records if reg["owner"] in r.getMessage()]
    check.true(len(reports) == 1 and "dead service" in reports[0] and ": 1 lease" in reports[0],
               f"the Python worker reported the dead Node service once with 1 lease: {reports}")
    node_keys = {f"pq:{{workers}}:service:{reg['id']}", f"pq:{{workers}}:service:{reg['id']}:wake"}
    check.equal(node_keys & set(namespace_keys(client)), set(), "no key of the node service is left")
    check.equal(client.zscore("pq:{workers}:service:expiry", reg["id"]), None, "node's expiry entry is gone")
    check.equal(client.hget("pq:{workers}:service:queues", reg["id"]), None, "node's queues entry is gone")
    check.true(str(reg["id"]).encode() not in client.lrange("pq:{workers}:service:ids", 0, -1), "node's id unlisted")
    check.true(not node.lines()[-1:] or "event" in node.lines()[-1], "a killed node wrote no result")
    print(f"service/kill: {check.count} checks; node {reg['owner']} killed -9 holding 'victim'; the python worker "
          f"reported it dead, scrubbed 1 lease and ran the job once more (attempt 2) {recovered_s:.2f} s after "
          f"the kill; node forgotten")


def test_a_paused_node_service_loses_its_registration_its_late_ack_is_fenced_and_it_exits_75(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    check = Checks()
    q = Queue("svc-pause", client)
    services = Services(client)
    node = NodeService(server, tmp_path, "paused", {
        "queue": "svc-pause", "expire_ms": 1000, "renew_ms": 200, "block_ms": 10_000, "lease_ms": 30_000,
    })
    python_ran: list[Job] = []
    worker = Worker(["svc-pause"], python_ran.append, redis=client, renew_ms=200, expire_ms=2000, block_ms=10_000)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    try:
        reg = node.wait_event("registered")
        q.enqueue(b"sleep:3000", job_id="zombie")
        running = node.wait_event("running")
        node.proc.send_signal(signal.SIGSTOP)  # a pause (a VM stall) past expire_ms
        thread.start()
        wait_until("the Python worker to run the paused node's job", lambda: q.stats().acked == 1, 15)
        wait_until("python to forget the node service", lambda: reg["id"] not in {i.id for i in services.list()}, 10)
        node.proc.send_signal(signal.SIGCONT)
        node.proc.wait(15)
    finally:
        worker.stop("test finished")
        if thread.is_alive():
            thread.join(15)
        node.close()
    check.true(not thread.is_alive(), "the Python worker stopped")
    check.equal(node.proc.returncode, 75, f"node exits 75 on a lost registration; stderr: {node.err_path.read_text()}")
    out = node.result()
    check.true(out["lost_by"] in ("renewal", "key") and out["stopped_by"] is None, f"lost, not stopped: {out}")
    check.true(out["renewals"]["lost"] <= 1 and "deregister" not in out, "no renewal or deregistration after the loss")
    # Node finished the job it ran when paused (at least once: it ran twice, fenced); its
    # ack found the job acked by Python and changed nothing.
    check.equal([(r["id"], r["attempt"]) for r in out["ran"]], [("zombie", 1)], "node finished its job")
    check.equal(out["acks"], {"ok": 0, "stale": 0, "gone": 1}, "node's late ack is fenced")
    check.equal([(j.id, j.attempt) for j in python_ran], [("zombie", 2)], "python ran it once more, as attempt 2")
    check.true(python_ran[0].fence > running["fence"], "python's fence is above the zombie's")
    st = q.stats()
    check.equal((st.leased_total, st.scrubbed, st.acked, st.reclaimed, st.leased), (2, 1, 1, 0, 0), "queue stats")
    node_keys = {f"pq:{{workers}}:service:{reg['id']}", f"pq:{{workers}}:service:{reg['id']}:wake"}
    check.equal(node_keys & set(namespace_keys(client)), set(), "the lost node wrote no key back")
    check.equal(client.hget("pq:{workers}:service:queues", reg["id"]), None, "node's queues entry stays gone")
    print(f"service/pause: {check.count} checks; node {reg['owner']} paused past its expiry holding 'zombie': "
          f"python scrubbed it and ran the job (attempt 2); node resumed, lost by {out['lost_by']}, its ack "
          f"answered gone, exit 75")


def test_job_control_from_node_cancel_limit_and_a_result_python_reads(server: RedisServer, client: redis.Redis) -> None:
    q = Queue("control", client)
    q.enqueue_many([NewJob(b"", job_id="held"), NewJob(b"", job_id="waiting"), NewJob(b"", job_id="r1"),
                    NewJob(b"", job_id="r2")])
    (held,) = q.lease()  # Python holds 'held'; Node cancels it under Python's worker
    node = run_node("control", server, {"queue": "control", "ready_id": "waiting", "leased_id": "held"})
    assert (node["cancel_ready"], node["cancel_leased"], node["cancel_again"]) == ("ready", "leased", "done")
    assert node["limit"] == {"count": 1, "periodMs": 60000, "burst": 1, "changed": True}
    # Under the cap Node got one job, and the next permit is a minute away.
    assert [j["id"] for j in node["leased"]] == ["r1"]
    assert node["limited"]["jobs"] == 0 and node["limited"]["next_due_ms"] - node["limited"]["now_ms"] > 50_000
    assert node["ack_result"] == ["ok"] and node["result"]["state"] == "ok"
    # Python reads Node's result with its own decoding; Python's late ack of the
    # cancelled job changes nothing.
    assert q.result("r1").value == {"from": "node", "n": 7}
    assert q.ack(held) is Outcome.GONE
    # Node's final nack sent r2 to DEAD on attempt 1 of 5, with its error.
    assert (node["nack_final"]["status"], node["nack_final"]["state"], node["nack_final"]["id"]) == ("ok", "dead", "r2")
    info = q.get("r2")
    assert (info.state, info.attempts, info.max_attempts, info.error) == ("dead", 1, 5, "node gives up")
    assert q.result("r2").state == "dead"
    s = q.stats()
    assert (s.cancelled, s.rate_limit, s.acked, s.ready, s.dead, s.nacked) == (2, 0, 1, 0, 1, 1)
    assert node["unlimit"]["changed"] is True and node["stats"]["cancelled"] == 2



def test_node_enqueues_grouped_and_prioritized_jobs_and_leases_them_fairly(server: RedisServer, client: redis.Redis) -> None:
    q = Queue("fair", client)
    node = run_node("fair", server, {"queue": "fair"})
    assert node["limit"] == {"changed": True, "unparked": 0}
    assert node["enqueue"]["added"] == 5
    # The ungrouped jobs' turn first (priority 5 before priority 0), then A and B; A's
    # second job waits for A's slot (cap 1), and so does Python's lease.
    assert node["leased"] == ["p1", "a1", "b1", "u1"]
    page = q.groups()
    assert [(g.name, g.ready, g.running, g.parked) for g in page.groups] == [("A", 1, 1, True)]
    assert q.lease(count=5) == []
    receipt = node["receipts"]["a1"]
    _, _, fence, attempt, job_id = receipt.split("|", 4)
    a1 = Job(id=job_id, queue="fair", payload=b"a", fence=int(fence), attempt=int(attempt), max_attempts=5,
             deadline_ms=0, receipt=receipt)
    assert q.ack(a1) is Outcome.OK  # Python acks Node's lease: A gets its slot back
    assert [j.id for j in q.lease(count=5)] == ["a2"]


def test_node_writes_and_reads_the_event_stream_python_reads_the_same_events(
    server: RedisServer, client: redis.Redis
) -> None:
    q = Queue("events", client)
    node = run_node("events", server, {"queue": "events"})
    assert node["set"] == {"previous": 0, "length": 0}
    # Six events were written (2 enqueued, 2 leased, acked, dead); the bound keeps 3, and
    # both readers count the 3 trimmed before them.
    page = q.events(since=0)
    assert (page.missed, page.last) == (3, 6) and node["all"]["missed"] == 3
    assert [(e.seq, e.type, e.job_id) for e in page.events] == [(4, "leased", "e2"), (5, "acked", "e1"), (6, "dead", "e2")]
    assert [(e["seq"], e["type"], e["id"]) for e in node["all"]["events"]] == [(e.seq, e.type, e.job_id) for e in page.events]
    dead = page.events[-1]
    assert (dead.attempt, dead.fields["error"]) == (1, "node says no")
    assert node["all"]["events"][2] == {"seq": 6, "type": "dead", "id": "e2", "ms": str(dead.at_ms), "attempt": "1",
                                        "error": "node says no"}
    assert [e["seq"] for e in node["after"]["events"]] == [5, 6] and node["after"]["missed"] == 0


def test_node_signals_a_python_task_waiting_for_it_and_the_task_gets_the_data(
    server: RedisServer, client: redis.Redis
) -> None:
    tasks = Tasks(client=client)

    @tasks.task(name="await_node", queue="from-node-signal", keep_result=60)
    def await_node() -> Any:
        approved = current_job().wait_signal("approved", timeout=3600)
        current_job().wait_signal("done", timeout=3600)  # still waiting while Node signals again
        return approved

    serving = Serving(tasks, concurrency=1, block_ms=50)
    try:
        sent = await_node.send()
        wait_for(lambda: sent.state() == "waiting", timeout=30, what="the wait")
        node = run_node("signal", server, {"queue": "from-node-signal", "id": sent.id, "name": "approved",
                                           "data": {"by": "node", "n": 1}})
        assert node == {"first": "woke", "again": "duplicate", "nobody": "unknown",
                        "reloads": node["reloads"], "owner": node["owner"]}
        wait_for(lambda: "done" in sent.steps().waits, timeout=30, what="the second wait")
        assert sent.signal("done").status == "woke"
        assert sent.result(timeout=30) == {"by": "node", "n": 1}
    finally:
        serving.stop()


def test_node_debounces_throttles_and_expires_and_python_shares_its_keys(server: RedisServer, client: redis.Redis) -> None:
    node = run_node("keyed", server, {"queue": "from-node-keyed"})
    assert node["debounce"] == {"added": 1, "duplicates": 0, "flags": [1, "d1"]}
    assert node["throttle"]["flags"] == [1] and node["throttled"] == {"added": 0, "duplicates": 0, "flags": ["t1"]}
    q = Queue("from-node-keyed", client)
    info = q.get("d1", with_payload=True)
    assert (info.state, info.payload) == ("scheduled", b"v2")
    # The keys are the queue's, whichever language sent: Python's sends meet Node's jobs.
    again = q.enqueue(b"v3", debounce_ms=60_000, key="user-7")
    assert (again.job_id, again.by_key) == ("d1", "debounced")
    assert q.enqueue(b"c", throttle_ms=60_000, key="acct").job_id == "t1"
    time.sleep(0.01)
    assert [j.id for j in q.lease(count=10)] == ["t1"]  # e1 is past its 1 ms
    assert q.get("e1").state == "expired" and q.stats().expired_total == 1


def test_node_sends_rate_keyed_jobs_defers_and_overrides_the_key_and_python_shares_its_state(
    server: RedisServer, client: redis.Redis
) -> None:
    node = run_node("rates", server, {"queue": "from-node-rates"})
    assert node["sent"] == {"added": 3, "duplicates": 0, "flags": [1, 1, 1]}
    # 1 a minute, burst 1: r1 takes the permit due now; r2 and r9 are deferred to later
    # permits, and the lease answers "call again at once".
    assert node["leased"] == ["r1"] and node["nextDueMs"] == node["nowMs"]
    # defer_key: the key takes no job for 5 s at least (its next permit was later already).
    assert node["deferred"]["status"] == "deferred" and node["deferred"]["afterMs"] >= 5000
    assert node["lost"] == {"status": "lost", "untilMs": -1}
    assert node["override"] == [True, False, True]
    q = Queue("from-node-rates", client)
    assert [q.get(i).state for i in ("r1", "r2", "r9")] == ["leased", "scheduled", "scheduled"]
    assert q.stats().deferred == 2
    # Python's send of the same key and limit meets Node's state: deferred too.
    assert q.enqueue(b"d", job_id="r3", rate_key="api", rate_limit="1/m").added
    assert q.lease(count=10) == [] and q.get("r3").state == "scheduled" and q.stats().deferred == 3
    assert q.set_rate_limit("api", "off") is True and q.set_rate_limit("api", None) is True


def test_node_sets_a_byte_budget_and_is_refused_past_it_and_python_counts_the_same(
    server: RedisServer, client: redis.Redis
) -> None:
    node = run_node("budget", server, {"queue": "from-node-budget"})
    assert node["set"] == [{"changed": True, "bytes": 0}, {"changed": False, "bytes": 0}]
    assert node["sent"] == {"added": 1, "duplicates": 0, "flags": [1]}
    # The batch (5 + 0 bytes) would take the queue past its 10: refused whole, the code
    # first (README §5), with the counts in the text.
    assert node["refused"] == {
        "code": "PQ_FULL",
        "message": "PQ_FULL the queue is at its byte budget: 6 of 10 bytes in use, this call adds 5 "
                   "(pq:{from-node-budget}:counters)",
    }
    assert (node["bytes"], node["budgetBytes"]) == (6, 10)
    # Python reads Node's budget and count, and its sends meet the same cap.
    q = Queue("from-node-budget", client)
    st = q.stats()
    assert (st.bytes, st.budget_bytes, st.enqueued) == (6, 10, 1)
    assert q.get("b2").state == "unknown" and q.get("b3").state == "unknown"  # nothing written
    with pytest.raises(QueueFull):
        q.enqueue(b"fives", job_id="p1")
    assert q.enqueue(b"four", job_id="p2").added and q.stats().bytes == 10
    assert q.set_budget(10) is False
    # An ending takes the size off whoever sent the job.
    (job,) = q.lease()
    assert job.id == "b1" and q.ack(job) is Outcome.OK
    assert q.stats().bytes == 4


def test_node_sets_a_results_budget_its_acks_trim_the_oldest_result_and_python_counts_the_same(
    server: RedisServer, client: redis.Redis
) -> None:
    # Each result as ack_result stores it: "<finished_ms>|" + "b" + 20 bytes (the server
    # clock's ms have 13 digits), so a budget of two results' worth.
    value = "x" * 20
    size = len(f"{int(client.time()[0]) * 1000}|") + 1 + len(value)
    ids = ["r1", "r2", "r3"]
    node = run_node("result-budget", server,
                    {"queue": "from-node-results", "budget": 2 * size, "ids": ids, "value": value})
    assert node["set"] == [{"changed": True, "bytes": 0}, {"changed": False, "bytes": 0}]
    assert node["sent"] == {"added": 3, "duplicates": 0, "flags": [1, 1, 1]}
    assert node["acks"] == ["ok", "ok", "ok"]
    # The third call would have taken the sum past the budget: the oldest-expiring result
    # (r1) was deleted first; the sizes kept are the stored fields' lengths, their sum the
    # counter (README section 2, results).
    assert node["states"] == {"r1": "done", "r2": "ok", "r3": "ok"}
    assert node["sizes"] == {"r2": size, "r3": size} and node["stored"] == node["sizes"]
    assert (node["budget"], node["bytes"], node["rsized"]) == (2 * size, 2 * size, "1")
    # Python reads Node's results, and its own ack_result meets the same budget: r2 goes.
    q = Queue("from-node-results", client)
    assert q.result("r3").value == value.encode()
    assert q.set_result_budget(2 * size) is False
    q.enqueue(b"", job_id="p1")
    (job,) = q.lease()
    assert q.ack_result(job, value.encode(), result_ttl_ms=3_600_000) is Outcome.OK
    assert [q.result(i).state for i in (*ids, "p1")] == ["done", "done", "ok", "ok"]
    keyed = client.hgetall("pq:{from-node-results}:keyed")
    sizes = {k[3:].decode(): int(v) for k, v in keyed.items() if k.startswith(b"rb:")}
    assert sizes == {"r3": size, "p1": size}
    assert int(client.hget("pq:{from-node-results}:counters", "result_bytes")) == sum(sizes.values())


def test_node_sets_a_tombstone_limit_its_acks_keep_the_latest_and_python_keeps_the_same(
    server: RedisServer, client: redis.Redis
) -> None:
    ids = ["t1", "t2", "t3"]
    node = run_node("tombstone-limit", server, {"queue": "from-node-tombstones", "limit": 2, "ids": ids})
    assert node["set"] == [True, False]
    assert node["sent"] == {"added": 3, "duplicates": 0, "flags": [1, 1, 1]}
    assert node["acks"] == ["ok", "ok", "ok"]
    assert node["limit"] == 2
    # The third ack took `done` past the limit: the earliest-expiring tombstone (t1) went
    # (README section 2, tombstones). A re-sent enqueue of t1 is added again; t3's kept
    # tombstone still makes its re-send a duplicate.
    assert node["kept"] == [["t1"], ["t1", "t2"], ["t2", "t3"]]
    assert node["resent"] == {"added": 1, "duplicates": 0, "flags": [1]}
    assert node["duplicate"] == {"added": 0, "duplicates": 1, "flags": [0]}
    # Python reads Node's limit, and its own ack meets it: t1 (sent again) is acked, and
    # the earliest-expiring of Node's, t2, goes.
    q = Queue("from-node-tombstones", client)
    assert q.set_tombstone_limit(2) is False
    (job,) = q.lease()
    assert job.id == "t1" and job.payload == b"again"
    assert q.ack(job) is Outcome.OK
    assert client.zrange("pq:{from-node-tombstones}:done", 0, -1) == [b"t3", b"t1"]
    assert q.enqueue(b"", job_id="t2").added is True
    assert q.enqueue(b"", job_id="t3").added is False


def test_node_reads_the_contract_version_and_calls_of_the_earlier_contract_get_pq_contract(
    server: RedisServer, client: redis.Redis, tmp_path: Path
) -> None:
    q = Queue("contract", client)
    q.enqueue(b"x", job_id="j")
    (job,) = q.lease(lease_ms=600_000)
    Services(client, namespace="workers").register(["contract"])
    other = tmp_path / "lua"
    shutil.copytree(LUA, other)
    nack = other / "nack.lua"
    nack.write_text(nack.read_text().replace(f"\nContract v{CONTRACT_VERSION} ", f"\nContract v{CONTRACT_VERSION + 1} ", 1))
    before = dump_all(client)
    node = run_node("contract", server, {"queue": "contract", "receipt": job.receipt, "namespace": "workers",
                                         "other_dir": str(other)})
    assert dump_all(client) == before, "a call refused with PQ_CONTRACT wrote"
    assert node["client_version"] == CONTRACT_VERSION
    assert node["versions"] and set(node["versions"].values()) == {CONTRACT_VERSION}
    v = f"(contract v{CONTRACT_VERSION})"
    assert node["calls"] == {
        "nack_v1_keys": {"code": "PQ_CONTRACT", "message": f"PQ_CONTRACT nack expects 16 keys {v}, got 8"},
        "nack_extra_argument": {"code": "PQ_CONTRACT", "message": f"PQ_CONTRACT nack expects 6..7 arguments {v}, got 8"},
        "service_register_v1_arguments": {
            "code": "PQ_CONTRACT", "message": f"PQ_CONTRACT service_register expects 10..11 arguments {v}, got 9",
        },
        "stats_no_keys": {"code": "PQ_CONTRACT", "message": f"PQ_CONTRACT stats expects 11 keys {v}, got 0"},
    }
    assert node["version_from_an_answer"] == CONTRACT_VERSION
    assert node["other_dir"] == f"nack.lua states contract v{CONTRACT_VERSION + 1}, this client speaks v{CONTRACT_VERSION}"
    assert q.ack(job) is Outcome.OK  # the lease Node's refused nack named is still Python's

# ---- Tasks (lua/README.md §9) -------------------------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def conf_tasks(client: redis.Redis, queue: str) -> SimpleNamespace:
    """The ``conf.*`` tasks on ``queue``, as tests/node/conformance.js implements them too
    (same names, same keep_result)."""
    tasks = Tasks(client=client, default_queue=queue)
    flaky_runs: list[float] = []
    logged: list[str] = []

    @tasks.task(name="conf.add", keep_result=60)
    def add(a: int, b: int) -> int:
        return a + b

    @tasks.task(name="conf.add_once", keep_result=60, unique=True)
    def add_once(a: int, b: int = 10) -> int:
        return a + b

    @tasks.task(name="conf.invoice", keep_result=60)
    def invoice(when: datetime, amount: Decimal, *, days: int = 30, tags: frozenset[str] = frozenset(),
                pdf: bytes = b"") -> dict[str, Any]:
        return {"due": when + timedelta(days=days), "total": amount * 2, "tags": set(tags) | {"invoiced"},
                "pdf": pdf[::-1]}

    @tasks.task(name="conf.greet", keep_result=60)
    def greet(name: str) -> str:
        return f"hello {name}"

    @tasks.task(name="conf.echo", keep_result=60)
    def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"args": list(args), "kwargs": kwargs, "types": [type(a).__name__ for a in args],
                "kwtypes": {k: type(v).__name__ for k, v in kwargs.items()}}

    @tasks.task(name="conf.context")
    def context() -> dict[str, Any]:
        run = current_job()
        return {"enqueued_ms": run.enqueued_ms, "traceparent": run.meta.get("traceparent"), "attempt": run.attempt,
                "max_attempts": run.max_attempts, "meta_keys": sorted(run.meta)}

    @tasks.task(name="conf.flaky", keep_result=60)
    def flaky() -> int:
        flaky_runs.append(time.monotonic())
        if current_job().attempt == 1:
            raise RuntimeError("the first attempt fails")
        return current_job().attempt

    @tasks.task(name="conf.log")
    def log_message(message: str) -> None:
        logged.append(message)

    @tasks.task(name="conf.fresh", keep_result=60)
    def fresh() -> str:
        return "ran"

    @tasks.task(name="conf.explode", max_attempts=1)
    def explode() -> None:
        raise ValueError("boom")

    @tasks.task(name="conf.python_only", keep_result=60)
    def python_only(x: int) -> int:
        return x

    return SimpleNamespace(
        tasks=tasks, add=add, add_once=add_once, invoice=invoice, greet=greet, echo=echo, context=context,
        flaky=flaky, log=log_message, fresh=fresh, explode=explode, python_only=python_only, flaky_runs=flaky_runs,
        logged=logged,
    )


def stored_result(client: redis.Redis, queue: str, job_id: str) -> bytes:
    """The raw value ack_result stored: ``results[id] = "<finished_ms>|<value>"`` (§2)."""
    raw: Any = client.hget(f"pq:{{{queue}}}:results", job_id)
    assert raw is not None, job_id
    return bytes(raw).split(b"|", 1)[1]


def test_node_sends_tasks_a_python_worker_runs_and_node_reads_their_results(
    server: RedisServer, client: redis.Redis
) -> None:
    check = Checks()
    queue = "tasks-from-node"
    conf = conf_tasks(client, queue)
    before_ms = server_ms(client)
    worker = conf.tasks.worker(block_ms=200)
    exit_code: list[int] = []
    thread = threading.Thread(
        target=lambda: exit_code.append(conf.tasks.run_worker(worker, install_signal_handlers=False)), daemon=True
    )
    thread.start()
    try:
        wait_until("the Python task worker to register", lambda: worker.service is not None, 10)
        # Node sends every call, then waits for each result while the worker runs them.
        node = run_node("task-produce", server, {"queue": queue, "timeout_ms": 20_000})
    finally:
        worker.stop("test finished")
        thread.join(15)
    after_ms = server_ms(client)
    check.equal((thread.is_alive(), exit_code), (False, [0]), "the Python worker stopped cleanly")
    sent = {s["name"]: s for s in node["sent"]}
    results = node["results"]
    check.true(all(s["added"] for s in sent.values()), f"every send added its job: {node['sent']}")

    # Python reads each envelope Node wrote, and computes what the task returns for it.
    envelopes = {name: envelope.decode(bytes.fromhex(s["payload_hex"])) for name, s in sent.items()}
    for name, env in envelopes.items():
        check.equal(env.task, sent[name]["task"], f"{name}: the task name")
        check.true(env.enqueued_ms is not None and before_ms - 20 <= env.enqueued_ms <= after_ms,
                   f"{name}: enqueued_ms {env.enqueued_ms} on the server clock, within [{before_ms}, {after_ms}]")
        info = client.hget(f"pq:{{{queue}}}:jobs", sent[name]["id"])
        check.equal(info, None, f"{name}: the job has ended")
    for name in ("add", "add_once", "invoice", "greet", "echo"):
        env = envelopes[name]
        task: Task[Any, Any] = getattr(conf, name)
        expected = to_json(task.fn(*env.args, **env.kwargs))
        check.equal(results[name]["state"], "ok", f"{name}: its result is there")
        check.equal(results[name]["value"], expected, f"{name}: node read back what python computed")
        check.equal(results[name]["kind"], "s" if name == "greet" else "j", f"{name}: the result's kind byte")

    # The types arrived as types, in Python and back in Node.
    inv = envelopes["invoice"]
    check.equal(inv.args, [datetime(2024, 2, 29, 23, 30, 0, 123000, tzinfo=timezone.utc), Decimal("19.99")],
                "invoice: a Date arrives as an aware datetime, a decimal as a Decimal")
    check.equal(inv.kwargs, {"tags": {"vip", "eu"}, "pdf": b"%PDF\x00\xff"}, "invoice: a Set and a Buffer")
    check.equal(results["invoice"]["types"], {"due": "Tagged:datetime", "total": "Tagged:decimal", "tags": "Set",
                                              "pdf": "Buffer"}, "invoice: node's decoded result types")
    check.equal(results["invoice"]["due_as_date"], "2024-03-30T23:30:00.123Z", "invoice: due as a JS Date")
    echo = envelopes["echo"]
    check.equal(echo.args, [uuid.UUID("1b4e28ba-2fa1-11d2-883f-0016d3cca427"), date(2024, 2, 29),
                            daytime(23, 59, 59, 1), timedelta(seconds=-1.5), Decimal("-0.50"),
                            {(1, 2), (1, "a"), "x"}, b"", 2**53 - 1, None, True, {"nested": [{"deep": "caf\u00e9"}]}],
                "echo: every tagged type arrives as its Python type (set items hashable)")
    check.equal(echo.kwargs, {"when": datetime(2024, 2, 29, 12, 0), "none": None}, "echo: a naive datetime")

    # unique: Node's id is Python's for the same call, so Python's send is a duplicate.
    check.equal(sent["add_once"]["id"], conf.add_once.s(2).job_id(), "node computed python's unique id")
    again = conf.add_once.send(2)
    check.equal((again.id, again.added), (sent["add_once"]["id"], False), "python's send of the same call")
    check.equal(again.result(timeout=5), 12, "python reads the result of node's send")

    # Per-send opts and extra meta: a result kept though the task keeps none, the trace
    # context handed to the task, max_attempts from the enqueue.
    context = results["context"]
    check.equal(context["state"], "ok", "context: kept by opts.keep_result_ms")
    check.equal(context["value"], {"enqueued_ms": envelopes["context"].enqueued_ms, "traceparent": TRACEPARENT,
                                   "attempt": 1, "max_attempts": 7,
                                   "meta_keys": ["enqueued_ms", "opts", "tenant", "traceparent"]},
                "context: what the task saw")
    check.equal(envelopes["context"].opts, {"keep_result_ms": 60_000}, "context: the opts python read")
    # The send's fixed backoff (1.5 s) set the retry's delay: Python's default (the
    # script's, 0.5..1 s for attempt 1) would have retried sooner.
    check.equal(results["flaky"], {"state": "ok", "kind": "j", "value": 2, "type": "number"}, "flaky: attempt 2")
    check.equal(len(conf.flaky_runs), 2, "flaky ran twice")
    gap = conf.flaky_runs[1] - conf.flaky_runs[0]
    check.true(gap >= 1.4, f"flaky's retry waited the send's fixed backoff: {gap:.3f} s")
    st = conf.tasks.queue(queue).stats()
    check.equal((st.acked, st.nacked, st.dead, st.ready, st.leased, st.scheduled), (7, 1, 0, 0, 0, 0), "queue stats")
    print(f"task-produce: {check.count} checks; node sent {len(sent)} tasks (clock offset {node['offset_ms']} ms), "
          f"the python worker ran them, node read every result back as python computed it; "
          f"flaky retried after {gap:.2f} s")


def test_a_node_worker_runs_tasks_python_sent_and_python_reads_results_and_deaths(
    server: RedisServer, client: redis.Redis
) -> None:
    check = Checks()
    queue = "tasks-to-node"
    conf = conf_tasks(client, queue)
    q = conf.tasks.queue(queue)
    when = datetime(2024, 2, 29, 23, 30, 0, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    sent_at = server_ms(client)
    handles = {
        "add": conf.add.send(2, 3),
        "invoice": conf.invoice.options(time_limit=5).send(
            when, Decimal("19.99"), days=1, tags={"vip", "eu"}, pdf=b"%PDF\x00\xff"
        ),
        "greet": conf.greet.send("Zo\u00eb \u2713"),
        "log": conf.log.send("logged by python"),
        "context": conf.context.options(keep_result=60, max_attempts=4).send(),
        "unknown": conf.python_only.send(1),
        "old": conf.fresh.options(max_age=0.001).send(),
        "explode": conf.explode.send(),
    }
    v2 = b'{"v":2,"task":"conf.add","args":[1,2]}'
    q.enqueue(v2, job_id="v2", max_attempts=1)
    node = run_node("task-work", server, {"queue": queue})
    by_id = {h["id"]: h for h in node["handled"]}
    check.equal(len(by_id), len(handles) + 1, f"node handled every job once: {node['handled']}")
    hows = {name: by_id[h.id]["how"] for name, h in handles.items()}
    check.equal(hows, {"add": "ack_result", "invoice": "ack_result", "greet": "ack_result", "log": "ack",
                       "context": "ack_result", "unknown": "nack final", "old": "nack final", "explode": "nack"},
                "how node ended each job")
    check.equal((by_id["v2"]["how"], by_id["v2"]["state"]), ("nack", "dead"), "v2: nacked, dead at max_attempts 1")
    check.true(all(h["status"] == "ok" for h in node["handled"]), "every ending answered ok")

    # Python reads the values Node stored, as what its own task would have returned.
    check.equal(handles["add"].result(timeout=5), 5, "add")
    invoice = handles["invoice"].result(timeout=5)
    expected = conf.invoice.fn(when, Decimal("19.99"), days=1, tags={"vip", "eu"}, pdf=b"%PDF\x00\xff")
    check.equal(invoice, expected, "invoice: node's result equals python's")
    check.equal(invoice["due"].isoformat(), "2024-03-01T23:30:00.123456+05:30", "invoice: wall time and offset kept")
    check.equal(str(invoice["total"]), "39.98", "invoice: the Decimal's exponent kept")
    check.equal(by_id[handles["invoice"].id]["ignored"], ["time_limit_ms"], "node ignored the time limit it cannot apply")
    check.true(any("opts.time_limit_ms" in line for line in node["log"]), f"and said so: {node['log']}")
    check.equal(handles["greet"].result(timeout=5), "hello Zo\u00eb \u2713", "greet")
    check.equal((handles["log"].result(timeout=5), node["logged"]), (None, ["logged by python"]), "log: acked, no value")
    ctx = handles["context"].result(timeout=5)
    check.true(sent_at - 20 <= ctx["enqueued_ms"] <= server_ms(client), f"context: enqueued_ms {ctx['enqueued_ms']}")
    check.equal({k: v for k, v in ctx.items() if k != "enqueued_ms"},
                {"traceparent": None, "attempt": 1, "max_attempts": 4, "meta_keys": ["enqueued_ms", "opts"]},
                "context: what the JS task saw")
    for name in ("add", "invoice", "greet", "context"):
        check.equal(stored_result(client, queue, handles[name].id)[:1], b"j", f"{name}: stored as 'j' + JSON")
    check.equal(decode_result(stored_result(client, queue, handles["greet"].id)), "hello Zo\u00eb \u2713",
                "greet: a JSON string")

    # Deaths, as TaskDead with Node's error texts.
    for name, error in (("unknown", "unknown task 'conf.python_only'"), ("explode", "Error: boom")):
        with pytest.raises(TaskDead) as dead:
            handles[name].result(timeout=5)
        check.equal(dead.value.error, error, f"{name}: the error")
    with pytest.raises(TaskDead) as dead:
        handles["old"].result(timeout=5)
    check.true(re.fullmatch(r"max_age exceeded: sent \d+\.\d{3}s ago, max_age is 0\.001s; not run", dead.value.error),
               f"old: {dead.value.error}")
    info = q.get(handles["unknown"].id)
    check.equal((info.state, info.attempts, info.max_attempts), ("dead", 1, 5), "unknown: final on attempt 1 of 5")
    v2_result = q.result("v2")
    check.equal((v2_result.state, v2_result.error),
                ("dead", "task envelope version 2 is not known to this worker (it reads 1)"), "v2: node's error")
    with pytest.raises(EnvelopeError) as refused:
        envelope.decode(v2)
    check.equal(str(refused.value), v2_result.error, "python refuses the v2 envelope with the same text")
    st = q.stats()
    check.equal((st.acked, st.dead, st.nacked, st.ready, st.leased, st.scheduled), (5, 4, 4, 0, 0, 0), "queue stats")
    print(f"task-work: {check.count} checks; python sent {len(handles) + 1} jobs, the node worker acked 5 "
          f"(4 with results python read), nacked 4 to DEAD (unknown task, max_age, an exception, envelope v2)")


def test_the_readme_task_envelope_example_decodes_in_python_and_node(server: RedisServer, client: redis.Redis) -> None:
    section = (LUA / "README.md").read_text().split("\n## 9. Task envelope\n", 1)[1]
    m = re.search(r"```json\n(.+)\n```", section)
    assert m, "lua/README.md §9 has no ```json payload"
    payload = m.group(1).encode()
    m = re.search(r"^  (j\{.+\})$", section, re.M)
    assert m, "lua/README.md §9 has no stored result"
    stored = m.group(1).encode()
    m = re.search(r"Its job id is `([^`]+)`", section)
    assert m, "lua/README.md §9 names no job id"
    job_id = m.group(1)
    m = re.search(r"^  (\[\"billing\.invoice\",.+\])$", section, re.M)
    assert m, "lua/README.md §9 shows no canonical text"
    canonical_text = m.group(1)

    # The example's Python code, sent as the README says, gives that payload and id.
    tasks = Tasks(client=client)

    @tasks.task(name="billing.invoice", keep_result=3600, max_attempts=3, unique=True)
    def invoice(customer: int, when: datetime, amount: Decimal, *, days: int = 30,
                tags: frozenset[str] = frozenset(), pdf: bytes = b"") -> dict[str, Any]:
        return {"due": when + timedelta(days=days), "total": amount * 2, "tags": set(tags) | {"invoiced"},
                "pdf": pdf[::-1]}

    when = datetime(2024, 2, 29, 23, 30, 0, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    sig = invoice.options(time_limit=5, backoff=Backoff.exponential(0.5, 60), keep_result=86400).s(
        42, when, Decimal("19.99"), tags={"vip", "eu"}, pdf=b"%PDF-"
    )
    job = sig.new_job(1709229600123, 0)
    meta = json.loads(job.payload)["meta"]
    assert envelope.encode("billing.invoice", sig.json_args, sig.json_kwargs, {**meta, "traceparent": TRACEPARENT}) \
        == payload
    assert (job.job_id, job.max_attempts, job.delay_ms) == (job_id, 3, 0)
    call = ["billing.invoice", to_json([42, when, Decimal("19.99")]),
            to_json({"days": 30, "tags": {"vip", "eu"}, "pdf": b"%PDF-"})]  # the call, its default applied
    assert canonical(call) == canonical_text
    assert job_id == "billing.invoice:" + hashlib.sha256(canonical_text.encode()).hexdigest()[:32]
    env = envelope.decode(payload)
    assert env.meta["traceparent"] == TRACEPARENT
    assert encode_result(to_json(invoice.fn(*env.args, **env.kwargs))) == stored
    assert from_json(decode_result(stored)) == invoice.fn(*env.args, **env.kwargs)

    # Node reads and writes the same bytes, and computes the same id.
    node = run_node("task-decode", server, {"payload_hex": payload.hex(), "result": stored.decode(),
                                            "defaults": {"days": 30}})
    assert node["task"] == "billing.invoice"
    assert node["arg_types"] == ["number", "Tagged:datetime", "Tagged:decimal"]
    assert node["kwarg_types"] == {"tags": "Set", "pdf": "Buffer"}
    assert bytes.fromhex(node["reencoded_hex"]) == payload
    assert node["unique_id"] == job_id
    assert node["result_types"] == {"due": "Tagged:datetime", "total": "Tagged:decimal", "tags": "Set", "pdf": "Buffer"}
    assert node["result_reencoded"].encode() == stored


def test_a_node_worker_runs_a_chords_members_reports_them_and_python_runs_the_callback(
    server: RedisServer, client: redis.Redis
) -> None:
    # The members run on Node, which acks them with their results and reports each end
    # to the waiting callback (flow_done, README §2.2); the last report releases it, and
    # a Python worker runs it with the members' results, read by reference.
    check = Checks()
    queue = "flow-to-node"
    conf = conf_tasks(client, queue)

    @conf.tasks.task(name="py.total", queue="py-callbacks", keep_result=60)
    def total(values: list[int]) -> int:
        return sum(values)

    flow = chord([conf.add.s(i, i) for i in range(5)], total.s()).send()
    check.equal(flow.status(), {"ready": 5, "waiting": 1}, "sent: the members ready, the callback waiting")
    node = run_node("task-work", server, {"queue": queue})
    reports = [h for h in node["handled"] if h["how"] == "ack_result"]
    check.equal(len(reports), 5, f"node ran the five members: {node['handled']}")
    states = [r["flow"][0]["state"] for r in reports if r.get("flow")]
    check.equal(states, ["waiting"] * 4 + ["released"], "each member reported once; the last released the callback")
    worker = conf.tasks.worker(["py-callbacks"], block_ms=50)
    thread = threading.Thread(target=conf.tasks.run_worker, args=[worker], kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        check.equal(flow.result(timeout=10), sum(2 * i for i in range(5)), "python's callback got node's results")
    finally:
        worker.stop()
        thread.join(10)
    check.equal(flow.status(), {"done": 6}, "every step done")
    check.equal([k for k in client.keys("*") if k.endswith((b":fwait", b":fpending"))], [], "no flow key left")
    print(f"flow: {check.count} checks; node ran and reported a chord's 5 members, python ran its callback")


def test_node_keeps_indexes_searches_and_promotes_and_python_finds_the_same(
    server: RedisServer, client: redis.Redis
) -> None:
    node = run_node("indexes", server, {"queue": "from-node-indexes"})
    assert node["since"] == [True, True]  # on once: the second call answers the same time
    assert node["sent"] == {"added": 4, "duplicates": 0, "flags": [1, 1, 1, 1]}
    # The members Node's sends wrote (README section 2.8): one per task name and group,
    # the send time in 15 digits; i4, with neither, is not listed.
    (sent_at,) = {at for _, _, at, _ in node["listed"]}
    assert len(sent_at) == 15 and sent_at.isdigit()
    assert [(kind, value, job_id) for kind, value, _, job_id in node["listed"]] == [
        ("g", "acme", "i1"), ("g", "acme", "i3"), ("t", "mail.digest", "i3"), ("t", "mail.send", "i1"),
        ("t", "mail.send", "i2")]
    assert node["byTask"] == {"ids": ["i1", "i2"], "states": ["ready", "ready"], "tasks": ["mail.send", "mail.send"],
                              "groups": ["acme", ""], "cursor": "", "indexed": True}
    assert node["byGroup"] == {"ids": ["i1", "i3"], "states": ["ready", "scheduled"],
                               "tasks": ["mail.send", "mail.digest"], "groups": ["acme", "acme"], "cursor": "",
                               "indexed": True}
    assert node["scheduled"]["ids"] == ["i3"] and node["scheduled"]["tasks"] == ["mail.digest"]
    # The ack unlisted the acked job: its members and its entry are gone.
    acked = node["leased"]
    assert acked in ("i1", "i2") and node["acked"] == ["ok"] and node["entry"] is None
    assert node["afterAck"] == [m for m in node["listed"] if m[3] != acked]
    assert node["promoted"] == [["i3"], []] and node["refused"] == "PQ_BADARG"
    # Python finds what Node listed, in the states the jobs have now, and its own sends
    # and endings keep the same index.
    q = Queue("from-node-indexes", client)
    other = "i1" if acked == "i2" else "i2"
    assert [(j.id, j.state) for j in q.search(task="mail.send").jobs] == [(other, "ready")]
    assert [(j.id, j.state, j.task) for j in q.search(group="acme").jobs if j.id == "i3"] == [
        ("i3", "scheduled", "mail.digest")]
    assert q.get("i3").due_ms < Queue("from-node-indexes", client).stats().now_ms + 1  # due now
    assert q.enqueue(b"p", job_id="p1", task="mail.send").added
    assert [j.id for j in q.search(task="mail.send").jobs] == sorted([other, "p1"])
    jobs = q.lease(count=10)
    assert sorted(j.id for j in jobs) == sorted([other, "i3", "i4", "p1"])
    q.ack_many(jobs)
    assert client.zcard("pq:{from-node-indexes}:index") == 0
    assert [f for f in client.hkeys("pq:{from-node-indexes}:keyed") if f.startswith(b"x:")] == []
