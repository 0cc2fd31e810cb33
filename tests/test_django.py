"""pyqueue.contrib.django with real Django from PyPI, on the example project
(``examples/django_app``, README.md's "Django"), a SQLite database file in a temp dir
(transactions are real) and the session's real redis-server. Every Django step runs as
a process of its own (``manage.py shell -c``, ``manage.py pyqueue_worker --burst``,
``manage.py check``), the way a site and its worker run.

Two lanes run the same scenario: Django 5.x with the ``django-tasks`` backport on this
interpreter (the ``test`` extra installs them), and Django 6 with ``django.tasks`` on
Python 3.12, in a venv this test makes (under ``~/.cache/pyqueue-tests``, kept between
runs) and fills from PyPI. Without redis-server or Python 3.12 they skip, except under
``CI=true``, where that is a failure."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from conftest import IN_CI, RedisServer

from pyqueue import Queue

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "django_app"


class Project:
    """The example project run by ``python`` against ``server``, its database in ``tmp``."""

    def __init__(self, python: str, tmp: Path, server: RedisServer) -> None:
        self.python, self.tmp = python, tmp
        self.env = dict(os.environ, SHOP_DB=str(tmp / "shop.sqlite3"), PYQUEUE_URL=server.url(),
                        PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp)]))
        self.env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.python, "manage.py", *args], cwd=EXAMPLE, env=self.env, capture_output=True,
                              text=True, timeout=90)
        if check:
            assert done.returncode == 0, f"manage.py {args[0]}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def shell(self, code: str) -> dict[str, object]:
        """Run ``code`` in ``manage.py shell``; what it printed last, as JSON."""
        out = self.manage("shell", "-c", textwrap.dedent(code)).stdout
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


PLACE_ORDERS = """
    import importlib, json
    from django.db import transaction
    from django.test import Client
    from pyqueue.contrib.django.backend import framework
    from shop.tasks import send_receipt

    backend = importlib.import_module(framework().name).default_task_backend
    emails = backend.pyqueue().queue("emails")
    client = Client(raise_request_exception=False)
    rolled_back = client.post("/orders", {"email": "a@example.com", "total_cents": "0"}).status_code
    after_rollback = emails.stats().enqueued
    placed = client.post("/orders", {"email": "b@example.com", "total_cents": "1250"}).json()
    after_commit = emails.stats().enqueued
    with transaction.atomic():
        inside = send_receipt.enqueue(999)   # an order that does not exist: the task fails
        in_transaction = emails.stats().enqueued
    print(json.dumps({
        "rolled_back": rolled_back, "after_rollback": after_rollback, "placed": placed,
        "after_commit": after_commit, "in_transaction": in_transaction, "after_block": emails.stats().enqueued,
        "failing": inside.id, "status": str(backend.get_result(placed["task"]).status),
    }))
"""

READ_RESULTS = """
    import json
    from shop.tasks import send_receipt

    done = send_receipt.get_result({ok!r})
    failed = send_receipt.get_result({failed!r})
    print(json.dumps({{
        "status": str(done.status), "value": done.return_value, "args": done.args, "attempts": done.attempts,
        "finished": done.finished_at is not None and done.started_at <= done.finished_at,
        "failed": str(failed.status), "failed_attempts": failed.attempts,
        "error": failed.errors[-1].exception_class_path, "traceback": failed.errors[-1].traceback,
    }}))
"""

NO_COMMIT_WAIT = """
    import importlib, json
    from django.db import transaction
    from django.test.utils import override_settings
    from django.conf import settings
    from pyqueue.contrib.django.backend import framework
    from shop.tasks import send_receipt

    tasks = importlib.import_module(framework().name)
    config = {"default": {**settings.TASKS["default"], "OPTIONS": {**settings.TASKS["default"]["OPTIONS"],
                                                                    "on_commit": False}}}
    with override_settings(TASKS=config):
        emails = tasks.default_task_backend.pyqueue().queue("emails")
        before = emails.stats().enqueued
        with transaction.atomic():
            send_receipt.enqueue(1)
            in_transaction = emails.stats().enqueued - before
    print(json.dumps({"in_transaction": in_transaction}))
"""

BAD_SETTINGS = """
from mysite.settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "pyqueue.contrib.django.PyQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"max_attempts": 0, "colour": "blue"},
    },
    "other": {
        "BACKEND": "pyqueue.contrib.django.PyQueueBackend",
        "OPTIONS": {"url": "http://127.0.0.1:6379"},
    },
}
"""


def run_scenario(python: str, tmp: Path, server: RedisServer) -> None:
    client = server.client()
    client.flushall()
    project = Project(python, tmp, server)
    project.manage("migrate", "--run-syncdb")

    placed = project.shell(PLACE_ORDERS)
    assert placed["rolled_back"] == 500  # the view raised inside atomic(): rolled back
    assert placed["after_rollback"] == 0  # ... and its enqueue sent nothing
    assert placed["after_commit"] == 1
    assert placed["in_transaction"] == 1 and placed["after_block"] == 2  # sent on commit, not before
    assert placed["status"] == "READY"
    ok = placed["placed"]["task"]  # type: ignore[index]

    worker = project.manage("pyqueue_worker", "--burst", "--block-ms", "200")
    emails = Queue("emails", client).stats()
    # max_attempts=3 (the example's OPTIONS): the failing task ran three times.
    assert (emails.enqueued, emails.acked, emails.nacked, emails.dead) == (2, 1, 3, 1), worker.stderr
    # Its start and its stop are logged, as `pyqueue worker` logs them.
    assert " started: queues " in worker.stderr and " ended: burst: every queue is drained" in worker.stderr, worker.stderr

    results = project.shell(READ_RESULTS.format(ok=ok, failed=placed["failing"]))
    assert results["status"] == "SUCCESSFUL"
    assert results["value"] == f"receipt for order {placed['placed']['order']} sent to b@example.com: 12.50"  # type: ignore[index]
    assert results["args"] == [placed["placed"]["order"]]  # type: ignore[index]
    assert results["attempts"] == 1 and results["finished"] is True
    assert (results["failed"], results["failed_attempts"]) == ("FAILED", 3)
    assert results["error"] == "shop.models.Order.DoesNotExist"
    assert "Traceback (most recent call last)" in str(results["traceback"])
    assert "Order matching query does not exist" in str(results["traceback"])

    # on_commit=False: sent inside the transaction, at once.
    assert project.shell(NO_COMMIT_WAIT) == {"in_transaction": 1}

    # A bad configuration is Django's system check errors, each backend's own.
    (tmp / "bad_settings.py").write_text(BAD_SETTINGS)
    check = project.manage("check", "--settings", "bad_settings", check=False)
    assert check.returncode == 1, check.stdout + check.stderr
    report = check.stderr
    for expected in ("TASKS['default']: (pyqueue.E001) OPTIONS has no 'url'",
                     "TASKS['default']: (pyqueue.E003) unknown OPTIONS ['colour']",
                     "TASKS['default']: (pyqueue.E004) OPTIONS 'max_attempts' must be an int >= 1, got 0",
                     "TASKS['other']: (pyqueue.E002) OPTIONS 'url' is invalid"):
        assert expected in report, report
    assert project.manage("check").returncode == 0  # the example's own settings pass


def test_django_5_with_the_django_tasks_backport(tmp_path: Path, redis_server: RedisServer) -> None:
    try:
        import django
        import django_tasks
    except ImportError:
        if IN_CI:
            raise  # the test extra installs both
        pytest.skip("django and django-tasks are not installed")
    assert django.VERSION[0] == 5 and django_tasks.__version__, django.VERSION  # the lane of the backport (Django 6 has django.tasks)
    run_scenario(sys.executable, tmp_path, redis_server)


def python312() -> str | None:
    """A Python 3.12 interpreter that runs: $PYQUEUE_PYTHON312, pyenv's, or python3.12
    on the PATH (which may be a pyenv shim that refuses to run)."""
    for candidate in (os.environ.get("PYQUEUE_PYTHON312"),
                      *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python"))),
                      shutil.which("python3.12")):
        if candidate and subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                        capture_output=True, timeout=30).returncode == 0:
            return candidate
    return None


def django6_venv() -> str:
    """A Python 3.12 venv with Django 6 and pyqueue's dependencies (pyqueue itself comes
    from this checkout, on PYTHONPATH), made once and kept under the cache dir."""
    python = python312()
    if python is None:
        if IN_CI:
            pytest.fail("Python 3.12 is not installed, and CI=true forbids skipping the Django 6 lane")
        pytest.skip("Python 3.12 is not installed (Django 6 needs it)")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = [*project["dependencies"], "django>=6,<7"]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyqueue-tests"
    venv = cache / "django6-py312"
    stamp = venv / "requirements.json"
    if stamp.exists() and json.loads(stamp.read_text()) == requirements:
        return str(venv / "bin" / "python")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *requirements], check=True, timeout=300)
    stamp.write_text(json.dumps(requirements))
    return str(venv / "bin" / "python")


def test_django_6_with_django_tasks_on_python_312(tmp_path: Path, redis_server: RedisServer) -> None:
    python = django6_venv()
    version = subprocess.run([python, "-c", "import django; print(django.VERSION[0])"], capture_output=True,
                             text=True, check=True, timeout=60).stdout.strip()
    assert version == "6"
    run_scenario(python, tmp_path, redis_server)


def test_the_readmes_django_code_is_the_examples() -> None:
    """docs/how-to/django.md (once README.md's "Django") shows the example project's files:
    each of its Python blocks names its file in a first comment line and is part of that file."""
    section = (ROOT / "docs" / "how-to" / "django.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) >= 3
    for block in blocks:
        first, _, body = block.partition("\n")
        assert first.startswith("# "), block
        path = EXAMPLE / first[2:].strip()
        assert body in path.read_text(encoding="utf-8"), path
