"""What a new user hit (issue #35's papercuts), each refused loudly or said plainly: the
CLI's shared options after the command, the worker's options saying their defaults,
``pyqueue metrics`` failing in one line, a worker pointed at one task, queue names no
one used, sending a task by name, and the task layer's words (``cancelled``, misspelt
keywords, hooks, results not kept)."""

from __future__ import annotations

import pytest
from conftest import RedisServer

from pyqueue import Queue, connect
from pyqueue.cli import build_parser, main


@pytest.fixture(params=["fake", "real"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "fake":
        return "embedded"
    server: RedisServer = request.getfixturevalue("redis_server")
    server.client().flushall()
    return server.url()


def test_the_shared_options_work_after_the_command_too(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "mail", "hello", "--id", "j1", "--url", url, "--prefix", "after"]) == 0
    assert Queue("mail", connect(url), prefix="after").get("j1").state == "ready"
    assert Queue("mail", connect(url), prefix="pq").get("j1").state == "unknown"  # not the default prefix
    capsys.readouterr()
    assert main(["--url", url, "stats", "mail", "--prefix", "after"]) == 0
    assert "mail" in capsys.readouterr().out


def test_an_option_after_the_command_wins_over_the_one_before() -> None:
    args = build_parser().parse_args(["--url", "redis://a:1", "stats", "--url", "redis://b:2"])
    assert args.url == "redis://b:2"
    args = build_parser().parse_args(["--url", "redis://a:1", "--prefix", "p1", "stats"])
    assert (args.url, args.prefix, args.verbose) == ("redis://a:1", "p1", False)
    args = build_parser().parse_args(["flow", "show", "q", "f1", "-v", "--namespace", "ns"])
    assert (args.verbose, args.namespace) == (True, "ns")


def test_a_bad_url_after_the_command_is_used_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "mail", "--url", "redis://127.0.0.1:1"]) == 2
    assert "Connection refused" in capsys.readouterr().err


@pytest.mark.parametrize("option, default", [
    ("--concurrency", "default 1"), ("--lease-ms", "default 30000"), ("--block-ms", "default 10000"),
    ("--renew-ms", "default 15000"), ("--grace-ms", "default 30000"), ("--burst", "scheduled later stay"),
])
def test_the_worker_options_say_their_defaults(option: str, default: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    entries = {}  # option -> its help text, from the help's entries ("  --name ..." lines and their continuations)
    for entry in ("\n" + capsys.readouterr().out).split("\n  -")[1:]:
        entries["-" + entry.split()[0].rstrip(",")] = " ".join(entry.split())
    assert default in entries[option], entries[option]


def test_metrics_on_a_port_in_use_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["metrics", "--port", str(port), "--bind", "127.0.0.1"]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve metrics on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_metrics_without_its_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "prometheus_client", None)  # import fails as if not installed
    assert main(["metrics", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "pyqueue-redis[metrics]"' in err and "Traceback" not in err


def test_a_worker_of_one_task_instead_of_its_tasks_object_is_refused_with_the_fix(
    tmp_path: __import__("pathlib").Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "resizer_app.py").write_text(
        "from pyqueue import Tasks\n"
        "tasks = Tasks()\n"
        "@tasks.task\n"
        "def resize(width: int) -> int:\n"
        "    return width\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for extra in ([], ["-q", "default"]):
        assert main(["worker", "resizer_app:resize", *extra, "--burst"]) == 2
        err = capsys.readouterr().err
        assert "is the task" in err and "of a pyqueue.Tasks" in err, err
        assert "pyqueue worker resizer_app:" in err


def test_a_tasks_cancelled_is_the_jobs_flag_as_a_job_handler_gets_it() -> None:
    """``current_job().cancelled`` reads as a bool and offers ``is_set``/``wait``, as
    ``job.cancelled`` does for a job handler (README taught the latter)."""
    from pyqueue import Tasks, current_job

    tasks = Tasks()
    seen: list[object] = []

    @tasks.task(name="watch")
    def watch() -> None:
        flag = current_job().cancelled
        seen.extend([bool(flag), flag.is_set(), flag.wait(0)])

    with tasks.testing() as t:
        watch.send()
        t.drain()
    assert seen == [False, False, False]


def test_a_queue_name_no_one_used_is_refused_as_a_typo(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Queue("emails", connect(url)).enqueue(b"x")
    capsys.readouterr()
    for command in (["pause", "emials"], ["resume", "emials"], ["limit", "emials", "5/s"], ["stats", "emials"],
                    ["group-limit", "emials", "3"], ["events", "emials", "--keep", "10"], ["dead", "list", "emials"],
                    ["job", "emials", "j1"]):
        assert main(["--url", url, *command]) == 2, command
        err = capsys.readouterr().err
        assert "no queue 'emials'" in err and "emails" in err, (command, err)
    counters = Queue("emials", connect(url)).spec.keys.counters
    assert not connect(url).exists(counters)  # nothing was created
    # Set up on purpose before the queue's first job: --create.
    assert main(["--url", url, "pause", "reports", "--create"]) == 0
    assert Queue("reports", connect(url)).stats().paused


def test_events_of_a_queue_that_never_opted_in_say_so(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Queue("quiet", connect(url)).enqueue(b"x")
    capsys.readouterr()
    assert main(["--url", url, "events", "quiet"]) == 2
    assert "records no events (it has not opted in)" in capsys.readouterr().err


def test_a_misspelt_keyword_is_named_with_the_parameter_it_may_mean() -> None:
    from pyqueue import Tasks

    tasks = Tasks()

    @tasks.task(name="resize")
    def resize(width: int, height: int = 0) -> int:
        return width

    with pytest.raises(TypeError, match=r"resize: unexpected keyword argument 'widht' \(did you mean 'width'\?\)"):
        resize.s(widht=640)
    with pytest.raises(TypeError, match=r"resize: unexpected keyword argument 'colour'$"):
        resize.s(640, colour=3)
    with pytest.raises(TypeError, match="missing a required argument: 'width'"):
        resize.si(height=3)  # every keyword names a parameter: Python's own word stands


def test_result_of_a_task_that_keeps_none_says_why_it_is_none(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from pyqueue import Tasks

    tasks = Tasks()

    @tasks.task(name="papercuts.no_result")
    def add(a: int, b: int) -> int:
        return a + b

    with tasks.testing() as t, caplog.at_level(logging.WARNING, "pyqueue.tasks"):
        sent = [add.send(1, 2), add.send(3, 4)]
        t.drain()
        assert [s.result(timeout=5) for s in sent] == [None, None]
    told = [r.getMessage() for r in caplog.records if "keeps no result" in r.getMessage()]
    assert len(told) == 1 and "papercuts.no_result" in told[0] and "keep_result=" in told[0]


def test_dead_list_and_job_name_the_task_and_show_times_as_utc(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pyqueue import Tasks

    tasks = Tasks()

    @tasks.task(name="papercuts.boom", queue="papercuts-dead", max_attempts=1)
    def boom() -> None:
        raise ValueError("boom")

    tasks.bind(connect(url))
    sent = boom.send()
    tasks.worker(concurrency=1).run(burst=True, install_signal_handlers=False)
    capsys.readouterr()
    assert main(["--url", url, "dead", "list", "papercuts-dead"]) == 0
    out = capsys.readouterr().out
    header, _, row = out.splitlines()[:3]
    assert "task" in header and "died (UTC)" in header and "dead_ms" not in header
    assert "papercuts.boom" in row and __import__("re").search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", row), row
    assert main(["--url", url, "job", "papercuts-dead", sent.id]) == 0
    assert [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("task")] == [
        ["task", "papercuts.boom"]
    ]


def test_an_arq_style_hook_taking_ctx_is_refused_when_registered() -> None:
    from pyqueue import InvalidArgument, Tasks

    tasks = Tasks()

    def startup(ctx: dict[str, object]) -> None: ...

    with pytest.raises(InvalidArgument, match=r"on_worker_start hook startup takes arguments.*def startup\(\)"):
        tasks.on_worker_start(startup)
    with pytest.raises(InvalidArgument, match="on_worker_stop hook"):
        tasks.on_worker_stop(startup)
    assert tasks.on_worker_start(lambda: None) is not None  # no arguments: taken


def test_send_a_task_by_name_and_refuse_a_raw_job_in_a_task_queue(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading

    from pyqueue import Tasks

    tasks = Tasks()

    @tasks.task(name="papercuts.add", queue="papercuts-tasks", keep_result=60)
    def add(a: int, b: int = 0) -> int:
        return a + b

    client = connect(url)
    tasks.bind(client)
    worker = tasks.worker(concurrency=1, renew_ms=200, expire_ms=2_000, block_ms=200)
    serving = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False}, daemon=True)
    serving.start()
    try:
        while worker.service is None:  # registered: its tasks are advertised
            __import__("time").sleep(0.01)
        capsys.readouterr()
        assert main(["--url", url, "send", "papercuts.add", "--args", "[2]", "--kwargs", '{"b": 3}', "--id", "s1"]) == 0
        assert capsys.readouterr().out.strip() == "sent papercuts.add as job s1 to papercuts-tasks"
        info = Queue("papercuts-tasks", client).wait_result("s1", 10_000)
        assert (info.state, info.value) == ("ok", 5)
        # A typo of the task's name, and a raw job into the task queue, are refused.
        assert main(["--url", url, "send", "papercuts.ad"]) == 2
        assert "no live worker serves task 'papercuts.ad' (tasks served: papercuts.add)" in capsys.readouterr().err
        assert main(["--url", url, "enqueue", "papercuts-tasks", "hello"]) == 2
        assert "served by task workers (tasks: papercuts.add)" in capsys.readouterr().err
        assert Queue("papercuts-tasks", client).stats().enqueued == 1  # nothing was added
    finally:
        worker.stop()
        serving.join(10)


def test_services_show_times_as_utc(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pyqueue.ops.service import Services

    services = Services(connect(url), namespace="papercuts-ns")
    services.register(queues=["q"])
    capsys.readouterr()
    assert main(["--url", url, "--namespace", "papercuts-ns", "services"]) == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    assert "started (UTC)" in header and "started_ms" not in header
    assert __import__("re").search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", row), row
