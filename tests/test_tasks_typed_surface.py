"""The task layer's typed surface (issue #34, item 4): the task options as one TypedDict
(``pyqueue.tasks.TaskOptionsDict``) that ``@tasks.task``, ``Tasks(...)`` and
``fn.options(...)`` take as ``**options: Unpack[...]``, so that ``mypy --strict`` refuses
a misspelt option, while a misspelt option passed through ``**dict`` is still refused at
run time; task-wide defaults (``Tasks(max_attempts=7)``); a send's own job id
(``fn.options(job_id=...)``); and one home per public name.
"""

from __future__ import annotations

import asyncio
import importlib
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import async_client

import pyqueue
import pyqueue.tasks
from pyqueue import InvalidArgument
from pyqueue.protocol.core import DEFAULT_MAX_ATTEMPTS
from pyqueue.tasks import Backoff, Tasks, TaskOptions, chain


@pytest.fixture
def tasks(r: redis.Redis) -> Tasks:
    """A Tasks object on the test's server (fakeredis or the real redis-server)."""
    return Tasks(client=r)


# -- typed options: a misspelt option is a type error ----------------------------------


def _mypy(tmp_path: Path, name: str, source: str) -> tuple[str, int]:
    """``mypy --strict`` on a module of ``source``: its report and exit status. pyqueue
    is analysed for its types but not reported on (``--follow-imports=silent``): its own
    strict check is ``python -m mypy pyqueue``."""
    from mypy import api

    module = tmp_path / f"{name}.py"
    module.write_text(textwrap.dedent(source))
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    stdout, stderr, status = api.run([
        "--strict", "--follow-imports=silent", "--no-error-summary", "--show-error-codes",
        "--config-file", str(config), "--cache-dir", str(tmp_path / "mypy_cache"), str(module),
    ])
    return stdout + stderr, status


def test_a_misspelt_option_is_a_mypy_strict_error_and_the_right_spelling_passes(tmp_path: Path) -> None:
    misspelt, status = _mypy(tmp_path, "misspelt", """
        from pyqueue import Tasks

        tasks = Tasks(max_attemps=7)

        @tasks.task(time_limt=5)
        def resize(image_id: int) -> str:
            return str(image_id)

        @tasks.task(batch=10, keep_reslt=60)
        def index(items: list[int]) -> list[int]:
            return items

        @tasks.task
        def plain(n: int) -> int:
            return n

        plain.options(job_idd="order-42").send(1)
        plain.options(max_attempts="5").send(1)

        @tasks.task(job_id="order-42")  # one send's option, not a task's
        def every_send_the_same_job() -> None:
            pass
    """)
    assert status == 1, misspelt
    for wrong in ("max_attemps", "time_limt", "keep_reslt", "job_idd"):
        assert any(f'"{wrong}"' in line and "error" in line for line in misspelt.splitlines()), (wrong, misspelt)
    assert 'Argument "max_attempts"' in misspelt and '"str"' in misspelt, misspelt  # a wrong type too
    assert any('"job_id"' in line and '"task"' in line for line in misspelt.splitlines()), misspelt

    right, status = _mypy(tmp_path, "right", """
        from datetime import timedelta

        from pyqueue import Backoff, Tasks
        from pyqueue.tasks import SentTask, Task

        tasks = Tasks(max_attempts=7, backoff=Backoff.exponential(1, 600), time_limit=timedelta(seconds=30))

        @tasks.task(time_limit=5, retry_on=(ConnectionError,), fail_on=ValueError, unique=True, priority=2)
        def resize(image_id: int) -> str:
            return str(image_id)

        @tasks.task(batch=10, batch_wait=0.05, keep_result=60)
        def index(items: list[int]) -> list[int]:
            return items

        @tasks.task(group=lambda account_id, **_: str(account_id), backoff=lambda attempt: 2 * attempt)
        def charge(account_id: int) -> None:
            pass

        checked: Task[[int], str] = resize
        sent: SentTask[str] = resize.options(job_id="order-42", max_attempts=None).options(queue="slow").send(7)
        index.options(job_id="batch-1").send(3)
    """)
    assert status == 0, right


def test_a_misspelt_option_given_through_a_dict_is_refused_at_run_time(tasks: Tasks, r: Any) -> None:
    misspelt: dict[str, Any] = {"time_limt": 5}
    with pytest.raises(InvalidArgument, match="unknown task option 'time_limt'"):
        tasks.task(name="t", **misspelt)
    with pytest.raises(InvalidArgument, match="unknown task option 'time_limt'"):
        Tasks(client=r, **misspelt)

    @tasks.task(name="plain")
    def plain(n: int) -> None:
        pass

    with pytest.raises(InvalidArgument, match="unknown task option 'time_limt'"):
        plain.options(**misspelt)
    with pytest.raises(InvalidArgument, match="unknown task option 'time_limt'"):
        plain.options(queue="other").options(**misspelt)
    assert "t" not in tasks.tasks
    assert tasks.queue("default").stats().enqueued == 0


# -- task-wide defaults ----------------------------------------------------------------


def test_the_options_of_tasks_are_the_defaults_of_its_tasks(r: Any) -> None:
    tasks = Tasks(client=r, max_attempts=7, priority=2, time_limit=30, keep_result=60, queue="work")

    @tasks.task(name="defaults")
    def defaults(n: int) -> None:
        pass

    @tasks.task(name="own", max_attempts=3, priority=-1, queue="other")
    def own(n: int) -> None:
        pass

    @tasks.task(name="engine_default", max_attempts=None, time_limit=None)
    def engine_default(n: int) -> None:
        pass

    assert tasks.default_queue == "work" and tasks.defaults.max_attempts == 7
    assert defaults.policy == TaskOptions(queue="work", max_attempts=7, priority=2, time_limit_ms=30_000,
                                          keep_result_ms=60_000)
    assert (own.policy.queue, own.policy.max_attempts, own.policy.priority, own.policy.time_limit_ms) == (
        "other", 3, -1, 30_000)
    assert (engine_default.policy.max_attempts, engine_default.policy.time_limit_ms) == (None, None)

    # Through the real queue: the jobs' records carry them.
    def record(sent: Any) -> Any:
        return tasks.queue(sent.queue).get(sent.id)

    by_default, by_own, by_engine = defaults.send(1), own.send(1), engine_default.send(1)
    assert (by_default.queue, record(by_default).max_attempts) == ("work", 7)
    assert (by_own.queue, record(by_own).max_attempts) == ("other", 3)
    assert record(by_engine).max_attempts == DEFAULT_MAX_ATTEMPTS
    assert by_default.keeps_result and by_own.keeps_result
    # A send's options override both.
    per_send = defaults.options(max_attempts=2).send(2)
    assert record(per_send).max_attempts == 2
    per_send_own = own.options(max_attempts=9, queue="work").send(2)
    assert (per_send_own.queue, record(per_send_own).max_attempts) == ("work", 9)
    assert tasks.queue("work").stats().enqueued == 4 and tasks.queue("other").stats().enqueued == 1


def test_a_worker_applies_the_defaults_as_the_tasks_own() -> None:
    # keep_result outlasts the hour of backoff the drain jumps the clock over.
    tasks = Tasks(fail_on=ValueError, backoff=Backoff.fixed(3600), max_attempts=2, keep_result=timedelta(hours=2))
    runs: list[str] = []

    @tasks.task(name="fails")
    def fails(error: str) -> str:
        runs.append(error)
        raise ValueError(error) if error == "value" else ConnectionError(error)

    @tasks.task(name="works", keep_result=None)
    def works() -> str:
        return "done"

    @tasks.task(name="kept")
    def kept() -> str:
        return "kept"

    with tasks.testing() as t:
        dead_at_once, retried = fails.send("value"), fails.send("connection")
        not_kept, kept_sent = works.send(), kept.send()
        start_ms = t.now_ms()
        t.drain(raise_errors=False)
        # fail_on: dead on its first run; the other retried once after the default
        # backoff (an hour of the test server's clock), then dead at max_attempts=2.
        assert runs.count("value") == 1 and runs.count("connection") == 2
        assert t.now_ms() - start_ms >= 3_600_000
        for sent in (dead_at_once, retried):
            assert tasks.queue("default").get(sent.id).state == "dead"
        # keep_result: the default kept the result; the task's own None kept none.
        assert kept_sent.result(timeout=1) == "kept" and kept_sent.keeps_result and not not_kept.keeps_result


def test_tasks_refuses_bad_defaults_and_the_queue_given_twice(r: Any) -> None:
    with pytest.raises(InvalidArgument, match="max_attempts"):
        Tasks(client=r, max_attempts=0)
    with pytest.raises(InvalidArgument, match="give one of them"):
        Tasks(client=r, default_queue="a", queue="b")
    job_id: dict[str, Any] = {"job_id": "order-42"}
    with pytest.raises(InvalidArgument, match=r"Tasks\(\) does not take job_id"):
        Tasks(client=r, **job_id)
    tasks = Tasks(client=r)
    with pytest.raises(InvalidArgument, match=r"@tasks.task\(\) does not take job_id"):
        tasks.task(name="t", **job_id)
    assert tasks.tasks == {} and tasks.default_queue == "default"
    assert Tasks(client=r, default_queue="a").default_queue == "a" == Tasks(client=r, queue="a").default_queue
    # Set later, it applies to the tasks registered after (as the attribute always did).
    tasks.default_queue = "later"

    @tasks.task(name="later")
    def later() -> None:
        pass

    assert later.policy.queue == "later"
    with pytest.raises(InvalidArgument, match="queue"):
        tasks.default_queue = ""


# -- a send's job id ---------------------------------------------------------------------


def test_a_sends_job_id_names_its_job_and_a_second_send_under_it_is_a_duplicate(tasks: Tasks) -> None:
    @tasks.task(name="charge")
    def charge(order: int, *, amount: int = 0) -> None:
        pass

    first = charge.options(job_id="order-42").send(42, amount=10)
    again = charge.options(job_id="order-42").send(42, amount=99)  # the same id: whatever else differs
    other = charge.options(job_id="order-43").send(43)
    assert (first.id, first.added) == ("order-42", True)
    assert (again.id, again.added, again.queue, again.task) == ("order-42", False, "default", "charge")
    assert (other.id, other.added) == ("order-43", True)
    stats = tasks.queue("default").stats()
    assert (stats.enqueued, stats.duplicates) == (2, 1)
    assert tasks.queue("default").get("order-42").state == "ready"
    # A plain send still gets a random id; job_id travels with further options.
    assert charge.send(44).id not in ("order-42", "order-43")
    moved = charge.options(job_id="order-44").options(queue="slow", max_attempts=2).send(44)
    assert (moved.id, moved.added, moved.queue) == ("order-44", True, "slow")
    assert tasks.queue("slow").get("order-44").max_attempts == 2
    # Many sends under one id are one job, as many sends of one unique call are.
    many = charge.options(job_id="order-45").send_many([(45,), (46,)])
    assert [(h.id, h.added) for h in many] == [("order-45", True), ("order-45", False)]


def test_a_sends_job_id_takes_the_place_of_unique_and_works_for_send_in_and_batch_tasks(tasks: Tasks) -> None:
    @tasks.task(name="report", unique=True)
    def report(day: str) -> None:
        pass

    hashed = report.send("monday")
    named = report.options(job_id="report-monday").send("monday")
    assert hashed.id.startswith("report:") and (named.id, named.added) == ("report-monday", True)
    later = report.options(job_id="report-later").send_in(60, "tuesday")
    assert tasks.queue("default").get("report-later").state == "scheduled" and later.added

    @tasks.task(name="index", batch=10, queue="index")
    def index(items: list[int]) -> list[int]:
        return items

    one = index.options(job_id="item-1").send(1)
    dup = index.options(job_id="item-1").send(2)
    assert (one.id, one.added, dup.id, dup.added) == ("item-1", True, "item-1", False)


def test_a_sends_job_id_from_asyncio(r: Any) -> None:
    aclient = async_client(r)
    tasks = Tasks(client=aclient)

    @tasks.task(name="report")
    def report(day: str) -> None:
        pass

    async def main() -> tuple[Any, Any]:
        try:
            first = await report.options(job_id="report-async").asend("friday")
            second = await report.options(job_id="report-async").asend_in(60, "saturday")
            return first, second
        finally:
            await aclient.aclose()

    first, second = asyncio.run(main())
    assert (first.id, first.added, second.id, second.added) == ("report-async", True, "report-async", False)


def test_a_send_under_the_job_id_of_a_job_that_ended_is_a_duplicate_while_its_tombstone_lasts() -> None:
    tasks = Tasks()
    ran: list[int] = []

    @tasks.task(name="once")
    def once(n: int) -> None:
        ran.append(n)

    with tasks.testing() as t:
        assert once.options(job_id="once-1").send(1).added
        assert t.drain() == 1 and ran == [1]
        assert tasks.queue("default").get("once-1").state == "done"
        again = once.options(job_id="once-1").send(1)
        assert (again.id, again.added) == ("once-1", False)
        assert t.drain() == 0 and ran == [1]


@pytest.mark.parametrize("bad", ["", "x" * 257, "é" * 129, "line\nbreak", "nul\x00", 42, b"bytes"])
def test_a_bad_job_id_is_refused_before_anything_is_sent(tasks: Tasks, bad: Any) -> None:
    @tasks.task(name="t")
    def t_(n: int) -> None:
        pass

    with pytest.raises(InvalidArgument, match="job id must be"):
        t_.options(job_id=bad)
    assert tasks.queue("default").stats().enqueued == 0
    assert t_.options(job_id="x" * 256).send(1).id == "x" * 256  # the longest


def test_a_flow_step_takes_no_job_id(tasks: Tasks) -> None:
    @tasks.task(name="a")
    def a() -> int:
        return 1

    @tasks.task(name="b")
    def b(n: int) -> int:
        return n

    with pytest.raises(InvalidArgument, match="a flow names its steps' jobs"):
        chain(a.s(), b.options(job_id="mine").s()).send()
    assert tasks.queue("default").stats().enqueued == 0


# -- one home per name ---------------------------------------------------------------


@pytest.mark.parametrize("module", ["pyqueue", "pyqueue.tasks"])
def test_every_exported_name_is_importable(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        namespace: dict[str, Any] = {}
        exec(f"from {module} import {name}", namespace)
        assert namespace[name] is getattr(mod, name), name


def test_each_exported_name_is_one_object_wherever_it_is_exported() -> None:
    from pyqueue.worker import endings
    from pyqueue.tasks import policy
    from pyqueue import worker

    assert pyqueue.Fail is pyqueue.tasks.Fail is worker.Fail is endings.Fail
    assert pyqueue.Retry is pyqueue.tasks.Retry is worker.Retry is endings.Retry
    assert pyqueue.Backoff is pyqueue.tasks.Backoff is policy.Backoff
    assert pyqueue.Worker is worker.Worker
    # Every name both packages export is the same object in both.
    for name in set(pyqueue.__all__) & set(pyqueue.tasks.__all__):
        assert getattr(pyqueue, name) is getattr(pyqueue.tasks, name), name
