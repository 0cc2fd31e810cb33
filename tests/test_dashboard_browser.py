"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright, against a dashboard served by uvicorn on 127.0.0.1 and a real redis-server.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium``
(``PYQUEUE_CHROMIUM`` names another). Without it, or without playwright, these tests
skip locally and fail under ``CI=true`` (tests/run.sh installs both).

The first test also saves the README's screenshot, ``docs/dashboard.png``.
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import IN_CI, RedisServer

from pyqueue import NewJob, Queue
from pyqueue.ops.service import Services

CHROMIUM = os.environ.get("PYQUEUE_CHROMIUM", "/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "dashboard.png"
TOKEN = "correct-horse-battery-staple"
#: The figures the page shows that must equal ``stats()`` (lag moves with the clock).
FIELDS = ("ready", "scheduled", "leased", "dead", "done", "enqueued", "acked", "nacked", "reclaimed", "scrubbed")
#: What a stopped dashboard's event loop left to the garbage collector is collected after
#: each test (conftest.collected_garbage), not reported in a later one.
pytestmark = pytest.mark.usefixtures("collected_garbage")


def _require_browser() -> None:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as exc:
        missing.append(f"{exc.name} (pip install -e '.[test]')")
    if not os.path.exists(CHROMIUM):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        if IN_CI:
            pytest.fail(f"CI=true and the browser tests cannot run: missing {', '.join(missing)}")
        pytest.skip(f"missing {', '.join(missing)}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: the tests may run as root (CI containers), where Chromium's
        # sandbox refuses to start.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[Any]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def serve(browser: Any, r: Any, redis_server: RedisServer) -> Iterator[Callable[..., Any]]:
    """``serve(**config)`` -> a RunningDashboard on 127.0.0.1 (a free port) reading ``r``;
    stopped at the end of the test, after the test's pages are closed."""
    from pyqueue.dashboard.app import DashboardConfig
    from pyqueue.dashboard.server import RunningDashboard

    running: list[RunningDashboard] = []
    redis_url = redis_server.url()

    def start(**kwargs: Any) -> RunningDashboard:
        config = DashboardConfig(r, **{"fresh_s": 0, "label": redis_url, **kwargs})
        running.append(RunningDashboard(config, "127.0.0.1", 0))
        return running[-1]

    yield start
    # The pages first: a page that polls could open a connection while the server shuts
    # down, which asyncio accepts after uvicorn stopped tracking connections; its socket
    # then reaches the garbage collector unclosed, in whatever test runs next (CI saw it).
    for context in browser.contexts:
        context.close()
    for dashboard in running:
        dashboard.stop()


class Console:
    """Errors the page logged or threw."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))


def expect(locator: Any) -> Any:
    """Playwright's auto-waiting assertions (they poll without eval, which the page's
    Content-Security-Policy forbids)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def open_page(browser: Any, url: str, **context: Any) -> tuple[Any, Console]:
    page = browser.new_context(viewport={"width": 1280, "height": 900}, **context).new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # the purge confirmations
    console = Console(page)
    page.goto(url)
    page.wait_for_selector("body[data-ready]")
    return page, console


def kill(q: Queue, ids: list[str], error: str) -> None:
    """Make ``ids`` dead letters of ``q`` (call before other jobs are ready)."""
    q.enqueue_many([NewJob(f'{{"user": "{i}@example.com"}}', job_id=i, max_attempts=1) for i in ids])
    left = set(ids)
    while left:
        for job in q.lease(count=len(left)):
            q.nack(job, error.format(id=job.id))
            left.discard(job.id)


def shown(page: Any, queue: str) -> dict[str, int]:
    """The numbers of a queue's row as the page shows them."""
    row = page.locator(f'#queues tr[data-queue="{queue}"]')
    return {field: int(row.locator(f'td[data-field="{field}"]').get_attribute("data-value")) for field in FIELDS}


# -- what a person sees ------------------------------------------------------------------


def drain(r: Any, seconds: float) -> None:
    """Work through part of the backlog at rates that rise and fall, so the charts have
    something to show: every 50 ms, lease and ack a number of jobs that follows a wave
    per queue, and now and then enqueue a burst."""
    queues = [Queue("emails", r), Queue("reports", r), Queue("orders", r, partitions=3)]
    started = time.monotonic()
    tick = 0
    while (elapsed := time.monotonic() - started) < seconds:
        tick += 1
        for n, q in enumerate(queues):
            count = round((6 - 2 * n) * (1 + math.sin(2 * math.pi * elapsed / seconds * (n + 1) + n)))
            if count:
                q.ack_many(q.lease(count=count))
        if tick % 15 == 0:
            queues[0].enqueue_many([NewJob(b"{}") for _ in range(60)])
        time.sleep(0.05)


def test_the_page_loads_without_console_errors_and_its_numbers_match_stats(
    browser: Any, r: Any, serve: Callable[..., Any]
) -> None:
    emails, reports, orders = Queue("emails", r), Queue("reports", r), Queue("orders", r, partitions=3)
    webhooks = Queue("webhooks", r)
    kill(emails, ["welcome-7731", "reset-2209"], "SMTPRecipientsRefused: 550 5.1.1 <{id}@example.com>: no such user")
    kill(webhooks, [f"hook-{i}" for i in range(5)],
         "HTTPError: 503 Service Unavailable from https://hooks.example.net/{id}\n  after 3 retries in 12.4 s")
    emails.enqueue_many([NewJob(b"{}") for _ in range(700)])
    reports.enqueue_many([NewJob(b"{}") for _ in range(300)])
    reports.enqueue(b"{}", delay_ms=3_600_000)
    orders.enqueue_many([NewJob(b"{}") for _ in range(450)])
    task_jobs(reports, "reports.export_pdf", 8, delay_ms=3_600_000)  # a task no worker serves yet
    services = Services(r)
    services.register(["emails", "webhooks"], host="app-1.internal", pid=2311,
                      tasks=["emails.send_welcome", "emails.reset_password", "webhooks.deliver"])
    services.register(["reports", "orders"], host="app-2.internal", pid=1874,
                      tasks=["reports.build", "orders.ship", "orders.refund", "orders.invoice"])
    stopping = services.register(["emails"], host="app-3.internal", pid=4410, tasks=["emails.send_welcome"])
    services.stop(stopping.id)
    webhooks.pause()  # its endpoint is down: a paused row on the screenshot

    dashboard = serve(every_s=0.25, history_s=60)
    drain(r, 3.0)
    held = emails.lease(count=3)  # a few leased jobs on screen
    page, console = open_page(browser, dashboard.url)
    page.wait_for_timeout(600)  # a poll has come and gone

    for q in (emails, reports, orders, webhooks):
        stats = q.stats()
        assert shown(page, q.name) == {field: getattr(stats, field) for field in FIELDS}, q.name
    assert page.locator("#queues tbody tr").count() == 4  # orders once, not per partition
    for q in (emails, reports, orders, webhooks):
        cell = page.locator(f'#queues tr[data-queue="{q.name}"] td[data-field="state"]')
        assert cell.get_attribute("data-value") == ("paused" if q.stats().paused else "running"), q.name
    expect(page.locator('#queues tr[data-queue="webhooks"]')).to_have_class(re.compile(r"\bpaused\b"))
    assert page.locator("#queues tr.paused").count() == 1
    assert page.locator("#workers tbody tr").count() == 3
    badges = page.locator('#queues [data-field="unserved_tasks"]')
    expect(badges).to_have_count(1)
    expect(badges).to_have_text("no worker for: reports.export_pdf (8)")
    assert page.locator("#dead-table tbody tr").count() == 2  # emails: the first queue with dead letters
    assert "no such user" in page.locator("#dead-table").inner_text()
    assert "@example.com\"}" not in page.content()  # payloads hidden without --show-payloads
    assert page.locator("figure.chart path.line").count() >= 3
    assert console.errors == []

    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    emails.release(held)


def task_jobs(q: Queue, task: str, count: int, **enqueue: Any) -> None:
    """``count`` jobs of the task ``task`` in ``q`` (task envelopes, as Tasks sends them)."""
    from pyqueue.tasks import envelope

    for i in range(count):
        q.enqueue(envelope.encode(task, [i], {}, {"enqueued_ms": 0}), **enqueue)


def test_a_queue_with_jobs_of_a_task_no_live_worker_serves_shows_a_warning_badge(
    browser: Any, r: Any, serve: Callable[..., Any]
) -> None:
    billing, emails = Queue("billing", r), Queue("emails", r)
    task_jobs(billing, "billing.charge", 12)
    task_jobs(billing, "billing.refund", 3)
    emails.enqueue_many([NewJob(b"{}") for _ in range(4)])  # raw jobs: no badge
    services = Services(r)
    refunds = services.register(["billing"], host="app-1.internal", tasks=["billing.refund"])
    many = services.register(["emails"], host="app-2.internal", tasks=[f"emails.t{i}" for i in range(5)])
    page, console = open_page(browser, serve(poll_s=0.5).url)

    badge = page.locator('#queues tr[data-queue="billing"] [data-field="unserved_tasks"]')
    expect(badge).to_have_text("no worker for: billing.charge (12)")
    expect(badge).to_have_attribute("title", re.compile(r"no live worker of the queue advertises them.*\n"
                                                        r"billing\.charge \(12\)\n", re.S))
    expect(badge).to_be_visible()
    expect(page.locator('#queues tr[data-queue="billing"]')).to_have_class(re.compile(r"\bunserved\b"))
    expect(page.locator('#queues tr[data-queue="emails"] [data-field="unserved_tasks"]')).to_have_count(0)
    # The workers table: a short list as it is, a long one as a count with the names in its title.
    expect(page.locator(f'#workers tr[data-worker="workers.{refunds.id}"] td[data-field="tasks"]')) \
        .to_have_text("billing.refund")
    long_list = page.locator(f'#workers tr[data-worker="workers.{many.id}"] td[data-field="tasks"] span')
    expect(long_list).to_have_text("5 tasks")
    expect(long_list).to_have_attribute("title", "\n".join(f"emails.t{i}" for i in range(5)))

    # A worker that serves it registers: the badge goes at the next poll.
    services.register(["billing"], host="app-3.internal", tasks=["billing.charge", "billing.refund"])
    expect(badge).to_have_count(0)
    expect(page.locator("#workers tbody tr")).to_have_count(3)
    assert console.errors == []


def test_replaying_a_dead_job_from_the_page_moves_it_to_ready(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    q = Queue("emails", r)
    kill(q, ["d1", "d2", "d3"], "boom {id}")
    page, console = open_page(browser, serve().url)
    page.locator('#dead-table tr[data-job="d2"] button', has_text="replay").click()
    expect(page.locator("#dead-message")).to_have_text("1 replayed")
    assert [job.id for job in q.dead_list().jobs] == ["d1", "d3"]
    assert q.stats().ready == 1 and [job.id for job in q.lease()] == ["d2"]
    expect(page.locator("#dead-table tbody tr")).to_have_count(2)
    expect(page.locator('#queues tr[data-queue="emails"] td[data-field="dead"]')).to_have_text("2")
    assert console.errors == []


def test_purging_selected_dead_jobs_then_replaying_all_from_the_page(
    browser: Any, r: Any, serve: Callable[..., Any]
) -> None:
    q = Queue("emails", r)
    kill(q, ["d1", "d2", "d3", "d4"], "boom {id}")
    page, console = open_page(browser, serve().url)
    for job_id in ("d1", "d3"):
        page.locator(f'#dead-table tr[data-job="{job_id}"] input[type=checkbox]').check()
    page.get_by_role("button", name="Purge selected").click()
    expect(page.locator("#dead-message")).to_have_text("2 purged")
    assert [job.id for job in q.dead_list().jobs] == ["d2", "d4"]
    page.get_by_role("button", name="Replay all").click()
    expect(page.locator("#dead-message")).to_have_text("2 replayed")
    stats = q.stats()
    assert (stats.dead, stats.ready, stats.purged, stats.replayed) == (0, 2, 2, 2)
    assert console.errors == []


def test_without_the_token_the_page_and_its_actions_are_refused(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    q = Queue("emails", r)
    kill(q, ["d1", "d2"], "boom {id}")
    dashboard = serve(token=TOKEN)
    action = dashboard.url + "api/queues/emails/actions/dead_purge"

    from playwright.sync_api import Error as PlaywrightError

    stranger = browser.new_context()
    with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
        stranger.new_page().goto(dashboard.url)  # the browser is asked for credentials it has not got
    assert stranger.request.get(dashboard.url).status == 401
    refused = stranger.request.post(action, data='{"all": true}',
                                    headers={"content-type": "application/json", "x-csrf-token": "x.y"})
    assert refused.status == 401
    stranger.close()

    # With the token the page works; a request it did not make (no CSRF header) is
    # still refused, as a forged cross-site request would be.
    page, console = open_page(browser, dashboard.url,
                              http_credentials={"username": "ops", "password": TOKEN, "send": "always"})
    status = page.evaluate(
        """() => fetch('api/queues/emails/actions/dead_purge', {method: 'POST', credentials: 'same-origin',
                 headers: {'content-type': 'application/json'}, body: '{"all": true}'}).then(r => r.status)"""
    )
    assert status == 403
    assert q.stats().dead == 2
    page.locator('#dead-table tr[data-job="d1"] button', has_text="purge").click()
    expect(page.locator("#dead-message")).to_have_text("1 purged")
    assert [job.id for job in q.dead_list().jobs] == ["d2"]
    # The fetch refused above logged its 403; nothing else went wrong.
    assert [e for e in console.errors if "403" not in e] == []


def test_pausing_from_the_page_stops_leasing_until_resume(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    q, other = Queue("emails", r), Queue("reports", r)
    q.enqueue_many([NewJob(b"{}") for _ in range(3)])
    other.enqueue_many([NewJob(b"{}") for _ in range(3)])
    page, console = open_page(browser, serve().url)
    row = page.locator('#queues tr[data-queue="emails"]')
    expect(row.locator('td[data-field="state"]')).to_have_text(re.compile(r"^running"))
    row.get_by_role("button", name="Pause").click()
    expect(page.locator("#queue-message")).to_have_text("emails paused")
    assert q.stats().paused and q.lease() == []
    assert len(other.lease()) == 1  # the other queue goes on
    expect(row.locator('td[data-field="state"] span')).to_have_text("paused")
    expect(row).to_have_class(re.compile(r"\bpaused\b"))
    row.get_by_role("button", name="Resume").click()
    expect(page.locator("#queue-message")).to_have_text("emails resumed")
    assert not q.stats().paused and len(q.lease()) == 1
    expect(row.locator('td[data-field="state"] span')).to_have_text("running")
    assert console.errors == []


def test_looking_a_job_up_from_the_page_shows_its_state(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    q = Queue("emails", r)
    kill(q, ["d1"], "boom {id}")
    q.enqueue(b"{}", job_id="l1")
    (running,) = q.lease()
    assert running.id == "l1" and q.progress(running, '{"done": 40, "of": 100}')
    q.enqueue(b"{}", job_id="r1")
    page, console = open_page(browser, serve().url)
    result = page.locator("#lookup-result")
    for job_id, state in (("d1", "dead"), ("l1", "leased"), ("r1", "ready"), ("no/such id", "unknown")):
        page.locator("#lookup-id").fill(job_id)
        page.get_by_role("button", name="Look up").click()
        expect(result.locator('tr[data-field="id"] td')).to_have_text(job_id)
        expect(result.locator('tr[data-field="state"] td')).to_have_text(state)
        assert q.get(job_id).state == state
        if state == "dead":
            expect(result.locator('tr[data-field="error"] td')).to_have_text("boom d1")
            assert "example.com" not in result.inner_text()  # payloads hidden without --show-payloads
        if state == "leased":
            expect(result.locator('tr[data-field="deadline_ms"] td')).to_have_text(re.compile(r"^in "))
            expect(result.locator('tr[data-field="progress"] td pre')).to_have_text('{"done": 40, "of": 100}')
        else:
            expect(result.locator('tr[data-field="progress"]')).to_have_count(0)
    assert console.errors == []


def test_a_looked_up_job_lists_its_durable_steps_and_its_wait(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    q = Queue("emails", r)
    q.enqueue(b"{}", job_id="w1")
    (job,) = q.lease(lease_ms=60_000)
    q.step(job, "charge", b'j{"id": 7}', lease_ms=60_000)
    q.park(job, "wait", "approved", 3_600_000, lease_ms=60_000)
    page, console = open_page(browser, serve().url)
    result = page.locator("#lookup-result")
    page.locator("#lookup-id").fill("w1")
    page.get_by_role("button", name="Look up").click()
    expect(result.locator('tr[data-field="state"] td')).to_have_text("waiting")
    steps = result.locator('tr[data-field="step"]')
    expect(steps).to_have_count(2)
    expect(steps.nth(0).locator("th")).to_have_text("step charge")
    expect(steps.nth(0).locator("td")).to_have_text("committed")  # values hidden without --show-payloads
    expect(steps.nth(1).locator("th")).to_have_text("waiting for approved")
    expect(steps.nth(1).locator("td")).to_have_text(re.compile(r"in "))
    assert console.errors == []


def test_browsing_jobs_by_state_from_the_page_a_page_at_a_time(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    q = Queue("emails", r)
    kill(q, ["d1"], "boom {id}")
    q.enqueue_many([NewJob(b'{"user": "ada@example.com"}', job_id=f"r{i:02}") for i in range(60)])
    q.enqueue(b"{}", job_id="later", delay_ms=3_600_000)
    running, finished = q.lease(count=2)
    q.ack_result(finished, {"sent": True})
    page, console = open_page(browser, serve().url)
    jobs = page.locator("#jobs")
    rows = jobs.locator("#jobs-table tbody tr")
    tab = lambda state: jobs.locator(f'#jobs-tabs button[data-state="{state}"]')  # noqa: E731
    # ready: 58 jobs, 50 a page (the server pages), the counts on the tabs
    expect(tab("ready")).to_have_attribute("aria-selected", "true")
    expect(tab("ready")).to_have_attribute("data-count", "58")
    expect(tab("dead")).to_have_attribute("data-count", "1")
    expect(rows).to_have_count(50)
    expect(jobs.locator("#jobs-range")).to_have_text("1–50 of 58")
    expect(rows.first).to_have_attribute("data-job", "r02")
    jobs.locator("#jobs-next").click()
    expect(rows).to_have_count(8)
    expect(rows.first).to_have_attribute("data-job", "r52")
    expect(jobs.locator("#jobs-range")).to_have_text("51–58 of 58")
    expect(jobs.locator("#jobs-next")).to_be_disabled()
    jobs.locator("#jobs-prev").click()
    expect(rows).to_have_count(50)
    assert "example.com" not in jobs.inner_text()  # never a payload
    # the other states, each a tab
    tab("scheduled").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-job", "later")
    expect(rows.first.locator("td").nth(1)).to_have_text(re.compile(r"^in "))
    tab("running").click()
    expect(rows.first).to_have_attribute("data-job", running.id)
    expect(rows.first.locator("td").nth(1)).to_have_text(q.spec.owner)
    tab("done").click()
    expect(rows.first).to_have_attribute("data-job", finished.id)
    rows.first.get_by_role("button", name="show").click()
    expect(jobs.locator(f'tr.result-row[data-result="{finished.id}"] pre')).to_have_text('{"sent": true}')
    tab("dead").click()
    expect(rows).to_have_count(1)
    expect(rows.first.locator("pre.error")).to_have_text("boom d1")
    # an id opens the job lookup's view of it
    rows.first.get_by_role("button", name="d1").click()
    result = page.locator("#lookup-result")
    expect(result.locator('tr[data-field="id"] td')).to_have_text("d1")
    expect(result.locator('tr[data-field="state"] td')).to_have_text("dead")
    assert console.errors == []


def test_cancelling_a_looked_up_job_from_the_page(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    q = Queue("emails", r)
    q.enqueue(b"{}", job_id="l1")
    (running,) = q.lease()
    q.enqueue(b"{}", job_id="r1")
    page, console = open_page(browser, serve().url)
    page.on("dialog", lambda dialog: dialog.accept())  # the confirm() before a cancel
    result = page.locator("#lookup-result")
    for job_id, state in (("r1", "ready"), ("l1", "leased")):
        page.locator("#lookup-id").fill(job_id)
        page.get_by_role("button", name="Look up").click()
        expect(result.locator('tr[data-field="state"] td')).to_have_text(state)
        page.get_by_role("button", name="Cancel job").click()
        expect(page.locator("#lookup-message")).to_have_text("1 cancelled")
        expect(result.locator('tr[data-field="state"] td')).to_have_text("done")
        expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)  # nothing left to cancel
    s = q.stats()
    assert (s.cancelled, s.ready, s.leased) == (2, 0, 0)
    assert q.ack(running).value == "gone"  # the running job's lease ended with the cancel
    assert console.errors == []


def test_showing_a_flow_from_the_page_draws_its_tree_with_each_steps_state(
    browser: Any, r: Any, serve: Callable[..., Any]
) -> None:
    from tasks_support import Serving

    from pyqueue.tasks import Tasks, chord

    app = Tasks(client=r)

    @app.task(name="add", queue="math")
    def add(x: int, y: int = 0) -> int:
        return x + y

    @app.task(name="total", queue="sums")
    def total(xs: list[int]) -> int:
        return sum(xs)

    flow = chord([add.s(1, 1), add.s(2, 2)], total.s()).send()
    page, console = open_page(browser, serve().url)
    tree, counts = page.locator("#flow-tree"), page.locator("#flow-counts")
    show = page.get_by_role("button", name="Show", exact=True)

    # Not in the queue of its last step: the server's reason, and no tree.
    page.locator("#flow-queue").select_option("sums")
    page.locator("#flow-id").fill(flow.id)
    show.click()
    expect(page.locator("#flow-message")).to_have_text(re.compile(rf"^no record of flow {flow.id} in sums: "))
    expect(page.locator("#flow-message")).to_have_class(re.compile(r"\bbad\b"))
    expect(page.locator("#flow-result")).to_be_hidden()

    # In the queue of its first step: a chain of a group of two steps, then the callback.
    page.locator("#flow-queue").select_option("math")
    show.click()
    expect(page.locator("#flow-result")).to_be_visible()
    expect(page.locator("#flow-message")).to_have_text("")
    expect(page.locator("#flow-summary")).to_contain_text(f"flow {flow.id} in math: 3 steps, sent ")
    chain = tree.locator(':scope > li[data-kind="chain"]')
    expect(chain.locator(":scope > .flow-kind")).to_have_text("chain")
    group = chain.locator(':scope > ol > li[data-kind="group"]')
    expect(group.locator(":scope > ul > li.flow-step")).to_have_count(2)
    for n, task, queue, state in ((0, "add", "math", "ready"), (1, "add", "math", "ready"), (2, "total", "sums", "waiting")):
        step = tree.locator(f'li[data-step="{n}"]')
        expect(step).to_have_attribute("data-state", state)
        expect(step.locator(".job-state")).to_have_text(state)
        expect(step.locator(".task")).to_have_text(task)
        expect(step.locator("button.id")).to_have_text(f"{flow.id}.{n}")
        expect(step.locator("small")).to_have_text(queue)
    expect(chain.locator(':scope > ol > li[data-step="2"]')).to_have_count(1)  # after the group, in the chain
    expect(counts.locator("[data-state]")).to_have_text(["1 waiting", "2 ready"])  # in the order a step goes

    # Run it; Show reads the states anew.
    serving = Serving(app, concurrency=2, block_ms=50)
    try:
        assert flow.result(timeout=20) == 2 + 4
    finally:
        serving.stop()
    show.click()
    expect(counts.locator("[data-state]")).to_have_text(["3 done"])
    expect(tree.locator('li.flow-step[data-state="done"]')).to_have_count(3)

    # A step's job id fills the job lookup, in the queue that holds it.
    tree.locator('li[data-step="2"] button.id').click()
    result = page.locator("#lookup-result")
    expect(result.locator('tr[data-field="id"] td')).to_have_text(f"{flow.id}.2")
    expect(result.locator('tr[data-field="queue"] td')).to_have_text("sums")
    expect(result.locator('tr[data-field="state"] td')).to_have_text("done")
    expect(page.locator("#lookup-queue")).to_have_value("sums")
    # The flow asked of the wrong queue logged its 404; nothing else went wrong.
    assert [e for e in console.errors if "404" not in e] == []


def test_a_rate_limited_queue_shows_its_limit(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    Queue("emails", r).limit(50, 1000)
    Queue("reports", r).enqueue(b"{}")
    page, console = open_page(browser, serve().url)
    expect(page.locator('#queues tr[data-queue="emails"] [data-field="rate_limit"]')).to_have_text("50/s")
    expect(page.locator('#queues tr[data-queue="reports"] [data-field="rate_limit"]')).to_have_count(0)
    assert console.errors == []


def test_a_queue_that_used_flow_control_shows_its_counts(browser: Any, r: Any, serve: Callable[..., Any]) -> None:
    emails = Queue("emails", r)
    emails.enqueue(b"{}", job_id="late", expires_ms=1, now_ms=1_000)
    emails.lease(now_ms=2_000)  # expires it
    emails.enqueue(b"{}", debounce_ms=60_000, key="u")
    emails.enqueue(b"{}", debounce_ms=60_000, key="u")
    Queue("reports", r).enqueue(b"{}")
    page, console = open_page(browser, serve().url)
    cell = page.locator('#queues tr[data-queue="emails"] [data-field="flow_control"]')
    expect(cell).to_have_text("1 expired, 1 debounced")
    expect(page.locator('#queues tr[data-queue="reports"] [data-field="flow_control"]')).to_have_count(0)
    assert console.errors == []


def test_a_queue_with_a_byte_budget_shows_its_use_and_rate_deferrals_show(browser: Any, r: Any,
                                                                          serve: Callable[..., Any]) -> None:
    emails = Queue("emails", r)
    emails.set_budget(1000)
    emails.enqueue(b"x" * 250)
    reports = Queue("reports", r)
    for _ in range(2):
        reports.enqueue(b"{}", rate_key="acct", rate_limit="1/h")
    reports.lease(count=2)  # one leased, one deferred to its slot
    page, console = open_page(browser, serve().url)
    budget = page.locator('#queues tr[data-queue="emails"] [data-field="budget"]')
    expect(budget).to_have_text("25% of budget")
    expect(budget).to_have_attribute("data-value", "250/1000")
    expect(page.locator('#queues tr[data-queue="reports"] [data-field="budget"]')).to_have_count(0)
    expect(page.locator('#queues tr[data-queue="reports"] [data-field="flow_control"]')).to_have_text("1 deferred")
    assert console.errors == []


def test_setting_a_group_cap_from_the_page_changes_the_groups_table(
    browser: Any, r: Any, serve: Callable[..., Any]
) -> None:
    webhooks, emails = Queue("webhooks", r), Queue("emails", r)
    webhooks.enqueue_many([NewJob(b"{}", group=group) for group, count in (("acme", 4), ("globex", 2))
                           for _ in range(count)])
    emails.enqueue_many([NewJob(b"{}") for _ in range(3)])  # no groups: nothing extra, no groups call
    page, console = open_page(browser, serve(poll_s=0.5).url)
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url) if "/groups" in request.url else None)

    section = page.locator("#groups")
    expect(section).to_be_visible()
    expect(page.locator('#queues tr[data-queue="webhooks"] [data-field="groups"]')).to_have_text("2 groups")
    expect(page.locator('#queues tr[data-queue="emails"] [data-field="groups"]')).to_have_count(0)
    acme = section.locator('tr[data-group="acme"]')
    expect(acme.locator('td[data-field="ready"]')).to_have_text("4")
    expect(acme.locator('td[data-field="cap"]')).to_have_attribute("data-value", "0")
    expect(page.locator("#groups-default")).to_have_text("none")

    # Every group's default cap.
    page.locator("#group-limit-cap").fill("2")
    page.get_by_role("button", name="Set cap").click()
    expect(page.locator("#groups-message")).to_have_text("webhooks: every group: at most 2 running at once")
    expect(page.locator("#groups-default")).to_have_text("2")
    expect(acme.locator('td[data-field="cap"]')).to_have_text("2 default")
    assert webhooks.groups().default_cap == 2

    # One group's own cap: its name in the table fills the form.
    acme.get_by_role("button", name="acme").click()
    expect(page.locator("#group-limit-group")).to_have_value("acme")
    page.locator("#group-limit-cap").fill("1")
    page.get_by_role("button", name="Set cap").click()
    expect(page.locator("#groups-message")).to_have_text("webhooks: group 'acme': at most 1 running at once")
    expect(acme.locator('td[data-field="cap"]')).to_have_text("1 own")
    expect(section.locator('tr[data-group="globex"] td[data-field="cap"]')).to_have_text("2 default")

    # Workers lease: acme parks at its cap, globex runs dry; the next poll shows it.
    assert len(webhooks.lease(count=10)) == 1 + 2
    expect(acme.locator('td[data-field="state"]')).to_have_text("parked at cap")
    expect(acme).to_have_class(re.compile(r"\bparked\b"))
    expect(acme.locator('td[data-field="running"]')).to_have_text("1")
    expect(section.locator('tr[data-group="globex"]')).to_have_count(0)
    expect(page.locator('#queues tr[data-queue="webhooks"] [data-field="groups"]')).to_have_text("1 group, 1 at cap")

    # Bad input is refused with the server's reason, and changes nothing.
    page.locator("#group-limit-cap").fill("-1")
    page.get_by_role("button", name="Set cap").click()
    expect(page.locator("#groups-message")).to_have_text(re.compile(r"^a cap is a number of jobs"))
    expect(page.locator("#groups-message")).to_have_class(re.compile(r"\bbad\b"))
    page_groups = webhooks.groups()
    assert (page_groups.default_cap, [(g.name, g.cap) for g in page_groups.groups]) == (2, [("acme", 1)])

    # A queue without groups: a note, and no groups call for it.
    page.locator("#groups-queue").select_option("emails")
    expect(section.locator(".empty")).to_have_text("No group of emails has ready jobs.")
    expect(section.locator("#groups-table tbody tr")).to_have_count(0)
    page.wait_for_timeout(1200)  # two polls
    assert asked and not [url for url in asked if "/queues/emails/" in url], asked
    # The refused cap logged its 400; nothing else went wrong.
    assert [e for e in console.errors if "400" not in e] == []


def start_metrics_worker(r: Any, redis_server: RedisServer, tmp_path: Path, *options: str) -> tuple[Any, Path]:
    """A real ``pyqueue worker metrics_app:tasks`` (tests/metrics_app.py) on the test's
    server, with ``options``; its process and the file its output goes to."""
    import subprocess
    import sys

    import metrics_app

    metrics_app.tasks.bind(r)
    tests_dir = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=f"{tests_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "pyqueue", "--url", redis_server.url(), "worker", "metrics_app:tasks",
             "--block-ms", "200", *options], env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    return worker, log_path


def test_the_tasks_panel_shows_a_real_workers_runs_failures_and_durations(
    browser: Any, r: Any, serve: Callable[..., Any], redis_server: RedisServer, tmp_path: Path
) -> None:
    import metrics_app
    from conftest import free_ports

    (port,) = free_ports(1)
    worker, log_path = start_metrics_worker(r, redis_server, tmp_path, "--metrics-port", str(port))
    try:
        for n in range(5):
            metrics_app.ok.send(n)
        metrics_app.flaky.send(0)  # fails its first attempt, then runs
        metrics_app.boom.send(0)  # fails at once: to the dead letters
        page, console = open_page(browser, serve(worker_metrics=[f"http://127.0.0.1:{port}/metrics"]).url)
        row = page.locator('#tasks tr[data-task="mx.ok"][data-queue="mx"]')
        expect(row.locator('[data-field="runs"]')).to_have_text("5", timeout=30_000)
        expect(row.locator('[data-field="failures"]')).to_have_text("0")
        expect(row.locator('[data-field="run_p50"]')).not_to_have_text("–")  # a duration, from the buckets
        flaky = page.locator('#tasks tr[data-task="mx.flaky"]')
        expect(flaky.locator('[data-field="runs"]')).to_have_text("2", timeout=30_000)
        expect(flaky.locator('[data-field="ok"]')).to_have_text("1")
        expect(flaky.locator('[data-field="failures"]')).to_have_text("1")
        boom = page.locator('#tasks tr[data-task="mx.boom"]')
        expect(boom.locator('[data-field="failures"]')).to_have_text("1", timeout=30_000)
        expect(page.locator("#tasks-message")).to_have_text("")
        assert console.errors == []
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log_path.read_text()


def test_the_events_panel_shows_the_newest_events_and_new_ones_as_they_come(
    browser: Any, r: Any, serve: Callable[..., Any]
) -> None:
    q = Queue("emails", r)
    q.set_events(1000)
    q.enqueue_many([NewJob(b"{}", job_id=f"e{i}") for i in range(3)])
    (job,) = q.lease()
    q.nack(job, "smtp timeout", final=True)
    page, console = open_page(browser, serve(poll_s=0.3).url)
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(5)
    newest = rows.first  # newest first: the death, with its error
    expect(newest.locator('[data-field="type"]')).to_have_text("dead")
    expect(newest.locator('[data-field="details"]')).to_have_text("error=smtp timeout")
    q.cancel("e1")  # written while the page is open: the next poll shows it on top
    expect(rows.first.locator('[data-field="type"]')).to_have_text("cancelled")
    expect(rows).to_have_count(6)
    rows.first.locator("button.link").click()  # the job id opens the lookup
    expect(page.locator("#lookup-result")).to_contain_text("done")
    assert console.errors == []


def test_the_running_tab_shows_each_jobs_elapsed_time_time_limit_and_progress(
    browser: Any, r: Any, serve: Callable[..., Any], redis_server: RedisServer, tmp_path: Path
) -> None:
    import metrics_app

    # Renewals every 500 ms: the report of what runs follows within that. The expiry is
    # long: a loaded CI machine must not cost the worker its registration.
    worker, _log_path = start_metrics_worker(r, redis_server, tmp_path, "--renew-ms", "500", "--expire-ms", "20000")
    try:
        sent = metrics_app.slow.send(90)  # still running when the page reads it, however slow the machine
        page, console = open_page(browser, serve(poll_s=0.3).url)
        jobs = page.locator("#jobs")
        jobs.locator("#jobs-queue").select_option("mx")
        jobs.locator('#jobs-tabs button[data-state="running"]').click()
        row = jobs.locator(f'#jobs-table tbody tr[data-job="{sent.id}"]')
        expect(row.locator('[data-field="progress"]')).to_have_text('{"step":1}', timeout=60_000)
        expect(row.locator('[data-field="limit"]')).to_have_text(re.compile(r"^in "), timeout=60_000)
        expect(row.locator('[data-field="elapsed"]')).not_to_have_text("–")
        assert console.errors == []
    finally:
        # SIGKILL: the slow job's lease expires on its own. (Two SIGTERMs sent back to
        # back can reach the worker as one, as the kernel merges a pending signal with a
        # new one of its kind: that one drains, which waits for the 90 s job.)
        worker.kill()
        worker.wait(30)


def test_searching_from_the_page_then_cancelling_every_job_found_after_a_confirmation(
    browser: Any, r: Any, serve: Callable[..., Any]
) -> None:
    q = Queue("emails", r)
    q.set_indexes(True)
    q.enqueue_many([NewJob(b'{"user": "ada@example.com"}', job_id=f"inv{i}", task="send_invoice") for i in range(4)])
    q.enqueue_many([NewJob(b"{}", job_id=f"rep{i}", task="report") for i in range(3)])
    q.enqueue(b"{}", job_id="inv-later", task="send_invoice", delay_ms=3_600_000)
    everyone = [f"inv{i}" for i in range(4)] + [f"rep{i}" for i in range(3)] + ["inv-later"]
    before = {job_id: q.get(job_id).state for job_id in everyone}
    page, console = open_page(browser, serve().url)

    # the search box of the dashboard's page: task and state
    box = page.locator("#search-form")
    box.locator("#search-queue").select_option("emails")
    box.locator("#search-state").select_option("ready")
    box.locator("#search-task").fill("send_invoice")
    box.get_by_role("button", name="Search").click()
    rows = page.locator("#search-results tbody tr")
    expect(rows).to_have_count(4)
    assert sorted(rows.nth(i).get_attribute("data-job") for i in range(4)) == [f"inv{i}" for i in range(4)]
    expect(page.locator("#search-results td[data-field=task]").first).to_have_text("send_invoice")
    expect(page.locator("#search-summary")).to_have_text(re.compile(r"^4 jobs shown"))
    expect(page.locator("#search-task")).to_have_value("send_invoice")  # the box keeps the filter
    assert "example.com" not in page.content()  # never a payload

    # a bulk action: a confirmation with the count found now, then the outcome
    page.get_by_role("button", name="Cancel all found…").click()
    expect(page.locator("#bulk-count")).to_have_text("The filter finds 4 jobs of emails now.")
    expect(page.locator("#bulk-filter")).to_have_text("state ready, task send_invoice")
    assert {job_id: q.get(job_id).state for job_id in everyone} == before  # nothing yet
    page.get_by_role("button", name="Cancel 4 jobs").click()
    expect(page.locator("#bulk-result")).to_have_text("cancelled 4 of 4 found")

    # exactly those jobs changed
    after = {job_id: q.get(job_id).state for job_id in everyone}
    assert after == {**before, **{f"inv{i}": "done" for i in range(4)}}
    assert before["inv-later"] == "scheduled" and before["rep0"] == "ready"
    assert q.stats().cancelled == 4

    # back to the search: nothing ready of that task is left; any state finds the
    # scheduled one, whose id opens the job view of the dashboard's page
    page.locator("#bulk-back").click()
    expect(page.locator("#search-summary")).to_have_text(re.compile(r"^0 jobs shown"))
    page.locator("#search-state").select_option("")
    page.get_by_role("button", name="Search").click()
    expect(rows).to_have_count(1)
    rows.first.get_by_role("link", name="inv-later").click()
    page.wait_for_selector("body[data-ready]")
    result = page.locator("#lookup-result")
    expect(result.locator('tr[data-field="id"] td')).to_have_text("inv-later")
    expect(result.locator('tr[data-field="state"] td')).to_have_text("scheduled")
    assert console.errors == []
