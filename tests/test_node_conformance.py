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

Needs node and ``npm ci`` in tests/node (tests/run.sh does it); skipped without them,
except under CI=true.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import IN_CI, RedisServer

from pyqueue import Job, NewJob, Outcome, Queue
from pyqueue.worker import Worker

TESTS = Path(__file__).resolve().parent
NODE_DIR = TESTS / "node"
LUA = TESTS.parent / "lua"
NODE = shutil.which("node")
# Stats fields that depend on when they are read; every other field must agree.
TIME_FIELDS = {"now_ms", "lag_ms"}


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
        delay = rng.randint(200, 500) if i % 7 == 3 else 0
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

    # The delays held (the jobs are SCHEDULED, above). Start the worker once they are all
    # due, so this test of what Node wrote does not lean on the Python worker's timed
    # waits (those are test_worker.py's business).
    wait_until("every delayed job to be due", lambda: q.stats().due == delayed, 10)
    runs: list[Job] = []
    run_worker_burst(Worker(["from-node"], runs.append, redis=client, block_ms=2_000))

    counts = Counter(job.id for job in runs)
    assert set(counts) == {j["id"] for j in jobs} and set(counts.values()) == {1}
    by_id = {j["id"]: j for j in jobs}
    for job in runs:
        assert job.payload == bytes.fromhex(by_id[job.id]["payload_hex"]), job.id
        assert (job.attempt, job.max_attempts) == (1, by_id[job.id]["max_attempts"]), job.id
    after = q.stats()
    assert (after.acked, after.done, after.enqueued, after.duplicates) == (150, 150, 150, 11)
    assert (after.ready, after.scheduled, after.leased, after.dead) == (0, 0, 0, 0)
    print(f"produce: node sent {len(flags)} jobs in {len(calls)} calls (150 added, 11 duplicates, "
          f"{delayed} delayed); python ran {len(runs)}, each once")


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
    for job_id, payload in payloads.items():
        q.enqueue(payload, job_id=job_id, max_attempts=1 if job_id == "c3" else 5)
    (py_first,) = q.lease()
    assert py_first.id == "c0"
    error = "node says no \u2717"
    later = Queue("from-python-later", client)
    enqueued_at = later.stats().now_ms  # server clock, just before: the job is due >= this + 300
    later.enqueue(b"due in 300 ms", job_id="later", delay_ms=300)

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
    assert enqueued_at + 300 <= node["later"]["leased_at_ms"] < enqueued_at + 2_000
    assert (later.stats().acked, later.stats().promoted) == (1, 1)
    print(f"consume: fences python {py_first.fence}, node {node_fences}, python {again.fence}; "
          f"node waited {node['later']['waits']} for a job due in 300 ms, leased it after "
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
