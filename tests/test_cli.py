"""The pyqueue command: every subcommand, on the embedded server, a real one and a real
cluster."""

from __future__ import annotations

import re

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import RedisClusterProcesses, RedisServer

from pyqueue import NewJob, Queue, connect
from pyqueue.cli import main, table
from pyqueue.ops.service import Services

#: Clients these tests open by URL are left to the garbage collector: collected after
#: each test (conftest.collected_garbage), not in a later one.
pytestmark = pytest.mark.usefixtures("collected_garbage")


@pytest.fixture(params=["real", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    """The URL of an empty real server, or of one node of the cluster (found to be a
    cluster by asking it)."""
    if request.param == "cluster":
        cluster: RedisClusterProcesses = request.getfixturevalue("redis_cluster")
        cluster.flushall()
        return f"redis://127.0.0.1:{cluster.ports[0]}/0"
    server: RedisServer = request.getfixturevalue("redis_server")
    server.client().flushall()
    return server.url()


def test_enqueue_stats_and_dead_commands(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", url, "enqueue", "emails", "hello", "--id", "j1", "--max-attempts", "1"]) == 0
    assert main(["--url", url, "enqueue", "emails", "hello", "--id", "j1"]) == 0
    assert capsys.readouterr().out.split() == ["added", "j1", "duplicate", "j1"]
    q = Queue.from_url(url, "emails")
    (job,) = q.lease()
    q.nack(job, "broken")
    assert main(["--url", url, "stats"]) == 0
    out = capsys.readouterr().out
    assert "emails" in out and "dead_total" in out
    assert main(["--url", url, "dead", "list", "emails"]) == 0
    assert "broken" in capsys.readouterr().out
    assert main(["--url", url, "dead", "replay", "emails"]) == 0
    assert capsys.readouterr().out.strip() == "replayed 1"
    (job,) = q.lease()
    q.nack(job, "again")
    assert main(["--url", url, "dead", "purge", "emails", "--id", "j1"]) == 0
    assert capsys.readouterr().out.strip() == "purged 1"


def test_job_command_says_where_a_job_is(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue(b"secret", job_id="j1", max_attempts=1)
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    out = capsys.readouterr().out
    assert "ready" in out and "6 bytes" in out and "secret" not in out  # the payload only when asked
    (job,) = q.lease()
    q.nack(job, "broken")
    assert main(["--url", url, "job", "emails", "j1", "--payload"]) == 0
    out = capsys.readouterr().out
    assert "dead" in out and "broken" in out and "secret" in out
    assert main(["--url", url, "job", "emails", "nope"]) == 1
    assert "unknown" in capsys.readouterr().out


def job_rows(out: str) -> dict[str, str]:
    """The field/value rows of ``pyqueue job``'s table (columns apart by 2+ spaces: a
    field may hold one, as ``step charge``)."""
    rows = [re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines()[2:]]
    return {row[0]: row[1] for row in rows if len(row) == 2}


def test_job_command_counts_attempts_from_1_and_tells_a_cancelled_job_where_the_engine_recorded_it(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue(b"x", job_id="j1", max_attempts=5)
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    assert job_rows(capsys.readouterr().out)["attempts"] == "0/5"  # none made yet
    (job,) = q.lease()
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert (rows["state"], rows["attempts"]) == ("leased", "1/5 (attempt 1 running)")  # not 0/5
    q.nack(job, "once", delay_ms=60_000)
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    assert job_rows(capsys.readouterr().out)["attempts"] == "1/5"  # one made, ended
    # Without events, a cancel and an ack leave the same tombstone: said, not guessed.
    q.cancel("j1")
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert rows["state"] == "done" and rows["ended"].startswith("acked, or cancelled")
    # With the queue's events kept, the event tells.
    q.set_events(100)
    q.enqueue(b"x", job_id="j2")
    q.enqueue(b"x", job_id="j3")
    (leased,) = q.lease()
    q.cancel("j2")  # while it runs
    assert main(["--url", url, "job", "emails", "j2"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert (rows["state"], rows["ended"].split(" (")[0]) == ("cancelled", "cancelled while leased")
    (other,) = q.lease()
    q.ack(other)
    assert main(["--url", url, "job", "emails", "j3"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert (rows["state"], rows["ended"].split(" (")[0]) == ("done", "acked")
    # A kept result says acked, events or not.
    q.set_events(0)
    q.enqueue(b"x", job_id="j4")
    (last,) = q.lease()
    q.ack_result(last, "value")
    assert main(["--url", url, "job", "emails", "j4"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert (rows["state"], rows["ended"]) == ("done", "acked; its result is kept")


def test_job_command_shows_a_running_jobs_progress(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue(b"x", job_id="j1")
    (job,) = q.lease()
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    assert "progress" not in capsys.readouterr().out
    q.progress(job, '{"done": 40}')
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    assert '{"done": 40}' in capsys.readouterr().out


def test_events_command_opts_in_prints_reads_on_and_reports_trimmed_events(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    q = Queue.from_url(url, "emails")
    assert main(["--url", url, "events", "emails", "--keep", "3"]) == 2  # no queue emails yet: a typo?
    assert main(["--url", url, "events", "emails", "--keep", "3", "--create"]) == 0
    assert "keeps the newest 3 events" in capsys.readouterr().out
    q.enqueue(b"x", job_id="j1")
    (job,) = q.lease()
    q.nack(job, "it broke", final=True)
    assert main(["--url", url, "events", "emails"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0::2][:2] for line in lines] == [["#1", "enqueued"], ["#2", "leased"], ["#3", "dead"]]
    assert lines[2].endswith('j1 attempt=1 error="it broke"')
    q.enqueue(b"x", job_id="j2")  # the bound (3) trims event 1
    assert main(["--url", url, "events", "emails", "--since", "0", "--json"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["seq"] for line in captured.out.splitlines()] == [2, 3, 4]
    assert "1 events were trimmed" in captured.err
    assert main(["--url", url, "events", "emails", "--since", "3", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {"seq": 4, "type": "enqueued", "id": "j2", "at_ms": json.loads(line)["at_ms"]}
    assert main(["--url", url, "events", "emails", "--keep", "0"]) == 0
    assert "writes no more events" in capsys.readouterr().out
    assert main(["--url", url, "events", "emails", "--since", "soon"]) == 2


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_events_follow_prints_events_as_they_are_written(url: str, stop_signal: signal.Signals) -> None:
    q = Queue.from_url(url, "emails")
    q.set_events(100)
    q.enqueue(b"x", job_id="before")
    command = [sys.executable, "-m", "pyqueue", "--url", url, "events", "emails", "--since", "1", "--follow"]
    # Started with SIGINT ignored, as a non-interactive shell starts a background job
    # (and pytest-xdist its workers): Python then has no KeyboardInterrupt of its own,
    # and the follow must still end on Ctrl-C.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) as follower:
        try:
            assert follower.stdout is not None
            for job_id in ("second", "third"):  # the third is written once the follower has printed the second
                time.sleep(0.5)
                q.enqueue(b"x", job_id=job_id)
                line = follower.stdout.readline()
                assert line.split()[2:4] == ["enqueued", job_id]
        finally:
            follower.send_signal(stop_signal)
            try:
                assert follower.wait(timeout=20) == 0
            finally:
                follower.kill()  # (a no-op once it has exited)


def test_pause_and_resume_commands(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue(b"x")
    assert main(["--url", url, "pause", "emails"]) == 0
    assert "paused" in capsys.readouterr().out and q.stats().paused and q.lease() == []
    assert main(["--url", url, "stats"]) == 0
    assert "paused" in capsys.readouterr().out
    assert main(["--url", url, "resume", "emails"]) == 0
    assert "resumed" in capsys.readouterr().out and len(q.lease()) == 1


def test_limit_command(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue_many([b"x"] * 5)
    assert main(["--url", url, "limit", "emails", "2/h"]) == 0
    assert "at most 2 leases per 3600 s" in capsys.readouterr().out
    assert (q.stats().rate_limit, q.stats().rate_period_ms) == (2, 3_600_000)
    assert len(q.lease(count=5)) == 1 and q.lease(count=5) == []
    assert main(["--url", url, "limit", "emails", "20/500ms", "--burst", "3"]) == 0
    assert (q.stats().rate_limit, q.stats().rate_period_ms, q.stats().rate_burst) == (20, 500, 3)
    assert main(["--url", url, "limit", "emails", "off"]) == 0
    assert "lifted" in capsys.readouterr().out and q.stats().rate_limit == 0
    for bad in ("0/s", "5", "5/fortnight", "x/s", "5/0.5s"):
        assert main(["--url", url, "limit", "emails", bad]) == 2
    assert q.stats().rate_limit == 0


def test_result_command(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue_many([b"x", b"y"])
    first, second = q.lease(count=2)
    q.ack_result(first, {"sent": 1})
    assert main(["--url", url, "result", "emails", first.id]) == 0
    assert capsys.readouterr().out.strip() == '{"sent": 1}'
    assert main(["--url", url, "result", "emails", second.id, "--wait-ms", "50"]) == 1
    assert "pending" in capsys.readouterr().out


def test_cancel_command(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue(b"x", job_id="j1")
    assert main(["--url", url, "cancel", "emails", "j1"]) == 0
    assert "cancelled (it was ready)" in capsys.readouterr().out and q.stats().ready == 0
    assert main(["--url", url, "cancel", "emails", "j1"]) == 1
    assert "ended already" in capsys.readouterr().out
    assert main(["--url", url, "cancel", "emails", "nope"]) == 1
    assert "no such job" in capsys.readouterr().out


def test_signal_command_and_the_job_command_shows_durable_steps(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    q = Queue.from_url(url, "emails")
    q.enqueue(b"x", job_id="j1")
    (job,) = q.lease(lease_ms=60_000)
    q.step(job, "charge", b'j{"id": 7}', lease_ms=60_000)
    q.park(job, "wait", "approved", 3_600_000, lease_ms=60_000)
    assert main(["--url", url, "job", "emails", "j1"]) == 0
    rows = job_rows(capsys.readouterr().out)
    assert rows["state"] == "waiting" and rows["step charge"] == '{"id": 7}'
    assert rows["wait approved"].startswith("until ")
    assert main(["--url", url, "signal", "emails", "j1", "approved", '{"by": "ops"}']) == 0
    assert "the job was waiting for it and is due now" in capsys.readouterr().out
    assert q.steps("j1").signals == {"approved": b'j{"by":"ops"}'}
    assert main(["--url", url, "signal", "emails", "j1", "approved"]) == 1
    assert "refused: a signal of that name was sent before" in capsys.readouterr().out
    assert main(["--url", url, "signal", "emails", "nope", "approved"]) == 1
    assert "refused: no such job" in capsys.readouterr().out
    assert main(["--url", url, "signal", "emails", "j1", "other", "{not json"]) == 2
    assert "must be JSON" in capsys.readouterr().err


def test_services_and_stop_commands(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    services = Services(connect(url))
    service = services.register(["emails", "sms"], host="box", pid=99)
    assert main(["--url", url, "services"]) == 0
    out = capsys.readouterr().out
    assert "box" in out and "99" in out and "emails,sms" in out and "alive" in out
    assert main(["--url", url, "stop", str(service.id)]) == 0
    assert services.check(service) == "stop"
    assert main(["--url", url, "services"]) == 0
    assert "stopping" in capsys.readouterr().out
    assert main(["--url", url, "stop", "12345"]) == 1


def test_bad_input_is_a_clear_error_with_exit_code_2(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", url, "enqueue", "bad{name", "x"]) == 2
    assert "InvalidArgument" in capsys.readouterr().err


def test_demo_on_the_embedded_server_checks_its_invariants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--jobs", "300"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and out.count("[ok]") == 6
    assert "killed worker" in out and "scrubbed back to ready" in out


def test_python_dash_m_pyqueue_runs_the_command(url: str) -> None:
    Queue.from_url(url, "something").enqueue(b"x")
    done = subprocess.run([sys.executable, "-m", "pyqueue", "--url", url, "stats", "something"],
                          capture_output=True, timeout=60)
    assert done.returncode == 0 and b"something" in done.stdout
    # A name no one used is refused as a typo, naming the queues there.
    done = subprocess.run([sys.executable, "-m", "pyqueue", "--url", url, "stats", "somethng"],
                          capture_output=True, timeout=60)
    assert done.returncode == 2 and b"no queue 'somethng'" in done.stderr and b"something" in done.stderr


def test_table_aligns_columns() -> None:
    assert table([["a", 1], ["bbb", 22]], ["name", "n"]).splitlines() == ["name  n", "----  --", "a      1", "bbb   22"]


def test_flow_show_command_draws_a_flows_tree_with_each_steps_state(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pyqueue.tasks import Tasks, chord

    app = Tasks(client=connect(url))

    @app.task(name="add", queue="math")
    def add(x: int, y: int = 0) -> int:
        return x + y

    @app.task(name="total", queue="sums")
    def total(xs: list[int]) -> int:
        return sum(xs)

    flow = chord([add.s(1, 1), add.s(2, 2)], total.s()).send()
    assert main(["--url", url, "flow", "show", "math", flow.id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"flow {flow.id} (record in math): 3 steps: 2 ready, 1 waiting"
    assert lines[1] == "chain" and lines[2] == "├─ group"
    assert lines[3].startswith("│  ├─   0 add  ") and lines[3].endswith(f"{flow.id}.0  math  ready")
    assert lines[5].startswith("└─   2 total") and lines[5].endswith("sums  waiting")
    assert main(["--url", url, "flow", "show", "math", flow.id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["counts"] == {"ready": 2, "waiting": 1} and shown["tree"] == {"chain": [{"group": [0, 1]}, 2]}
    assert main(["--url", url, "flow", "show", "sums", flow.id]) == 1  # its record is in its first step's queue
    assert "no record of flow" in capsys.readouterr().out


def test_enqueue_with_flow_control_and_stats_shows_expired_jobs(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", url, "enqueue", "cliq", "a", "--debounce-ms", "60000", "--key", "k"]) == 0
    assert main(["--url", url, "enqueue", "cliq", "b", "--debounce-ms", "60000", "--key", "k"]) == 0
    assert main(["--url", url, "enqueue", "cliq", "c", "--expires-ms", "1", "--id", "gone"]) == 0
    first, second, third = capsys.readouterr().out.split("\n")[:3]
    assert first.startswith("added ") and second == "debounced " + first.split()[1] and third == "added gone"
    q = Queue.from_url(url, "cliq")
    time.sleep(0.01)  # past `gone`'s deadline on the server's clock
    assert q.lease() == []
    assert q.get("gone").state == "expired"
    assert main(["--url", url, "stats", "cliq"]) == 0
    header, _rule, row = capsys.readouterr().out.split("\n")[:3]
    assert header.split()[-2:] == ["expired", "deferred"] and row.split()[-2:] == ["1", "0"]
    assert main(["--url", url, "enqueue", "cliq", "d", "--key", "k"]) == 2  # a key without a window: refused


def test_enqueue_with_a_rate_key_and_limit_sets_a_keys_limit_at_run_time(url: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        assert main(["--url", url, "enqueue", "rateq", str(i), "--id", f"r{i}", "--rate-key", "acct",
                     "--rate-limit", "1/h"]) == 0
    q = Queue.from_url(url, "rateq")
    assert [j.id for j in q.lease(count=3)] == ["r0"]
    assert q.stats().deferred == 2
    capsys.readouterr()
    assert main(["--url", url, "limit", "rateq", "100/s", "--key", "acct", "--burst", "5"]) == 0
    assert capsys.readouterr().out == "rateq: rate key 'acct': at most 100 leases per 1000 ms, 5 at once\n"
    assert main(["--url", url, "limit", "rateq", "100/s", "--key", "acct", "--burst", "5"]) == 0
    assert capsys.readouterr().out.endswith("(unchanged)\n")
    assert main(["--url", url, "limit", "rateq", "off", "--key", "acct"]) == 0
    assert "its jobs pass unchecked" in capsys.readouterr().out
    assert main(["--url", url, "limit", "rateq", "default", "--key", "acct"]) == 0
    assert "the limit its jobs carry" in capsys.readouterr().out
    assert main(["--url", url, "limit", "rateq", "default"]) == 2  # default is a rate key's
    assert main(["--url", url, "limit", "nosuchq", "1/s", "--key", "acct"]) == 2  # a typo creates nothing
    assert main(["--url", url, "enqueue", "rateq", "x", "--rate-key", "acct", "--rate-limit", "1/week"]) == 2
    assert main(["--url", url, "enqueue", "rateq", "x", "--rate-key", "acct"]) == 2  # no limit: refused
    assert main(["--url", url, "stats", "rateq"]) == 0
    header, _rule, row = capsys.readouterr().out.split("\n")[:3]
    assert header.split()[-1] == "deferred" and row.split()[-1] == "2"


def test_sequence_skip_lets_a_blocked_sequence_go_on(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(2):
        assert main(["--url", url, "enqueue", "seqq", str(i), "--id", f"s{i}", "--sequence", "order-9",
                     "--max-attempts", "1"]) == 0
    q = Queue.from_url(url, "seqq")
    assert q.get("s1").state == "sequenced"
    assert main(["--url", url, "sequence", "skip", "seqq", "order-9"]) == 1  # its head is not dead
    (job,) = q.lease()
    q.nack(job, "boom")
    capsys.readouterr()
    assert main(["--url", url, "sequence", "skip", "seqq", "order-9"]) == 0
    assert "s1 runs next" in capsys.readouterr().out
    assert [j.id for j in q.lease()] == ["s1"]


def test_budget_caps_a_queues_payload_bytes_and_memory_reports_them(url: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", url, "budget", "budq", "1KiB"]) == 2  # no such queue: a typo creates nothing
    assert main(["--url", url, "budget", "budq", "1KiB", "--create"]) == 0
    assert "at most 1.0 KiB of payloads (1024 bytes; 0 B in use)" in capsys.readouterr().out
    assert main(["--url", url, "enqueue", "budq", "x" * 1000]) == 0
    assert main(["--url", url, "enqueue", "budq", "x" * 100]) == 2  # past the budget: refused
    assert "QueueFull" in capsys.readouterr().err
    assert Queue.from_url(url, "budq").stats().enqueued == 1
    assert main(["--url", url, "budget", "budq", "lots"]) == 2
    assert main(["--url", url, "memory", "budq"]) == 0
    header, _rule, row = capsys.readouterr().out.split("\n")[:3]
    assert header.split()[:3] == ["queue", "jobs", "results"] and header.split()[-3:] == ["total", "payloads", "budget"]
    assert row.split()[0] == "budq" and row.split()[-4:] == ["1000", "B", "1.0", "KiB"]
    assert main(["--url", url, "memory", "nosuchq"]) == 2
    assert main(["--url", url, "budget", "budq", "off"]) == 0
    assert "byte budget lifted" in capsys.readouterr().out


def test_dead_replay_and_purge_by_task_error_and_time_with_a_dry_run(url: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from pyqueue.tasks import Tasks

    app = Tasks(client=connect(url))

    @app.task(name="send_invoice", queue="deadq", max_attempts=1)
    def send_invoice(n: int) -> None:
        pass

    @app.task(name="other", queue="deadq", max_attempts=1)
    def other() -> None:
        pass

    for n in range(3):
        send_invoice.send(n)
    other.send()
    q = Queue.from_url(url, "deadq")
    for job in q.lease(count=10):  # each fails as its task would, and is dead at once
        q.nack(job, "TimeoutError: slow", final=True)
    capsys.readouterr()
    base = ["--url", url, "dead"]
    assert main([*base, "list", "deadq", "--task", "send_invoice", "--error", "TimeoutError", "--since", "00:00"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("3 found")
    assert main([*base, "replay", "deadq", "--task", "send_invoice", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would have replayed 3 (a dry run: nothing changed)")
    assert q.stats().dead == 4
    assert main([*base, "replay", "deadq", "--task", "send_invoice", "--error", "TimeoutError"]) == 0
    assert capsys.readouterr().out == "replayed 3 of 3 found\n"
    assert main([*base, "purge", "deadq", "--error", "ValueError"]) == 0
    assert capsys.readouterr().out == "purged 0 of 0 found\n"
    assert (q.stats().dead, q.stats().ready) == (1, 3)
    assert main([*base, "replay", "deadq", "--dry-run"]) == 2  # a dry run needs a filter
    assert main([*base, "replay", "deadq", "--id", "x", "--task", "other"]) == 2  # ids or a filter
    assert main([*base, "list", "deadq", "--since", "yesterday"]) == 2


def test_search_finds_by_task_and_state_and_acts_on_what_it_finds(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pyqueue.tasks import Tasks

    base = ["--url", url]
    assert main([*base, "indexes", "shop", "on"]) == 2  # no queue shop yet: a typo?
    assert main([*base, "indexes", "shop", "on", "--create"]) == 0
    assert "keeps indexes since" in capsys.readouterr().out
    app = Tasks(client=connect(url))

    @app.task(name="send_invoice", queue="shop", max_attempts=1)
    def send_invoice(n: int) -> None:
        pass

    @app.task(name="resize", queue="shop")
    def resize() -> None:
        pass

    for n in range(3):
        send_invoice.send(n)
    resize.send()
    q = Queue.from_url(url, "shop")
    for job in [j for j in q.lease(count=10) if j.json()["task"] == "send_invoice"][:2]:
        q.nack(job, "TimeoutError: slow", final=True)
    capsys.readouterr()
    assert main([*base, "search", "shop", "--task", "send_invoice"]) == 0
    out = capsys.readouterr().out
    assert out.count(" dead ") == 2 and "3 shown" in out and "resize" not in out
    assert main([*base, "search", "shop", "--state", "dead", "--error", "TimeoutError", "--since", "00:00"]) == 0
    assert "2 shown" in capsys.readouterr().out
    # pyqueue dead goes by the indexes too.
    assert main([*base, "dead", "list", "shop", "--task", "send_invoice"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("2 found")
    assert main([*base, "search", "shop", "--task", "send_invoice", "--replay", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would have replayed 2 (a dry run: nothing changed)")
    assert main([*base, "search", "shop", "--task", "send_invoice", "--replay"]) == 0
    assert capsys.readouterr().out == "replayed 2 of 2 found\n"
    assert main([*base, "search", "shop", "--task", "send_invoice", "--cancel"]) == 0
    assert capsys.readouterr().out == "cancelled 3 of 3 found\n"
    assert q.stats().cancelled == 3
    # Refused loudly, nothing changed.
    assert main([*base, "search", "shop", "--state", "ready", "--replay"]) == 2
    assert main([*base, "search", "shop", "--cancel", "--purge"]) == 2
    assert main([*base, "search", "shop", "--dry-run"]) == 2
    assert main([*base, "search", "nosuch", "--task", "x"]) == 2
    assert main([*base, "indexes", "shop", "off"]) == 0
    assert main([*base, "search", "shop", "--task", "resize"]) == 2
    assert "no indexes" in capsys.readouterr().err


def test_search_as_json_lines_every_page_with_all(url: str, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import pyqueue.cli as cli

    base = ["--url", url]
    q = Queue.from_url(url, "shop")
    q.set_indexes(True)
    q.enqueue_many([NewJob(b"x" * n, job_id=f"j{n}", task="resize", group="acme") for n in range(5)])
    q.enqueue_many([NewJob(b"", job_id="other", task="send_invoice")])
    capsys.readouterr()
    assert main([*base, "search", "shop", "--task", "resize", "--limit", "2", "--json"]) == 0
    captured = capsys.readouterr()
    first = [json.loads(line) for line in captured.out.splitlines()]
    assert len(first) == 2 and captured.err.startswith("2 shown, 2 read; more: --cursor '")
    assert {(j["task"], j["group"], j["state"]) for j in first} == {("resize", "acme", "ready")}
    monkeypatch.setattr(cli, "SEARCH_PAGE", 2)  # --all follows three pages' cursors
    assert main([*base, "search", "shop", "--task", "resize", "--all", "--json"]) == 0
    captured = capsys.readouterr()
    every = [json.loads(line) for line in captured.out.splitlines()]
    assert sorted(j["id"] for j in every) == [f"j{n}" for n in range(5)]
    assert sorted(j["payload_bytes"] for j in every) == [0, 1, 2, 3, 4]
    assert captured.err.startswith("5 shown, 5 read\n")
    assert main([*base, "search", "shop", "--task", "resize", "--all"]) == 0
    assert capsys.readouterr().out.count(" resize ") == 5
    assert main([*base, "search", "shop", "--task", "resize", "--cancel", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"action": "cancel", "dry_run": True, "found": 5, "done": 0,
                                                   "sample": ["j0", "j1", "j2", "j3", "j4"]}
    assert main([*base, "search", "shop", "--all", "--cursor", "x"]) == 2  # refused loudly


def test_a_reader_that_goes_away_stops_the_output_quietly(url: str) -> None:
    """`pyqueue search ... --json | head -1`: no traceback when head closes the pipe."""
    q = Queue.from_url(url, "shop")
    q.set_indexes(True)
    q.enqueue_many([NewJob(b"", task="resize") for _ in range(1000)])
    q.enqueue_many([NewJob(b"", task="resize") for _ in range(1000)])
    with subprocess.Popen([sys.executable, "-m", "pyqueue", "--url", url, "search", "shop", "--task", "resize", "--all",
                           "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as reader:
        assert reader.stdout is not None and reader.stderr is not None
        assert json.loads(reader.stdout.readline())["task"] == "resize"
        reader.stdout.close()  # 2000 lines of some 400 bytes: far more than a pipe holds
        err = reader.stderr.read().decode()
        assert reader.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
