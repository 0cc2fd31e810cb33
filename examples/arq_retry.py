# arq's retry, deferred and job-results examples (docs/examples/retry.py, deferred.py,
# job_results.py), ported: a task downloads a page with the HTTP session its worker opened
# at start (and closes at stop), retries with a growing delay while the server answers an
# error, and returns the page's length, which the sender reads; one run is deferred.
#
#     python examples/arq_retry.py
#
# The site is a local server started here (so it runs offline): /flaky answers 503 twice,
# then 200. The worker runs in a thread of this process; in production it is a process
# of its own, ``pyqueue worker examples.arq_retry:tasks``.
#
# Code lines (non-blank, not only a comment): 48; arq's three examples: 23 + 15 + 18 = 56
# (job_results.py's strings of pasted output not counted; the issue counted 58).

import threading
import urllib.error
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyqueue

tasks = pyqueue.Tasks()
ctx: dict[str, urllib.request.OpenerDirector] = {}  # what the worker opened at start


@tasks.task(name="download_content", keep_result=3600)
def download_content(url: str) -> int:
    job = pyqueue.current_job()
    try:
        with ctx["session"].open(url, timeout=10) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        # Retry with a growing delay: 0.2 s, 0.4 s, 0.6 s... (arq's: 5 s, 10 s, 15 s...);
        # after max_attempts (5 by default) the job is dead, with this error as its last.
        raise pyqueue.Retry(delay=job.attempt * 0.2) from error
    assert job.enqueued_at is not None
    print(f"{url}: attempt {job.attempt}, {datetime.now(timezone.utc) - job.enqueued_at} after it was sent")
    return len(text)


@tasks.on_worker_start
def startup() -> None:
    ctx["session"] = urllib.request.build_opener()


@tasks.on_worker_stop
def shutdown() -> None:
    ctx["session"].close()
    print("worker stopped, session closed")


class Site(BaseHTTPRequestHandler):
    calls: dict[str, int] = {}

    def do_GET(self) -> None:
        self.calls[self.path] = self.calls.get(self.path, 0) + 1
        self.send_response(503 if self.path == "/flaky" and self.calls[self.path] <= 2 else 200)
        self.end_headers()
        self.wfile.write(b"<p>Hello from the local site.</p>" * 10)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    site = f"http://127.0.0.1:{server.server_port}"
    worker = tasks.worker()
    thread = threading.Thread(target=tasks.run_worker, args=[worker], daemon=True)
    thread.start()
    flaky = download_content.send(f"{site}/flaky")
    deferred = download_content.send_in(1, f"{site}/deferred")  # arq: _defer_by=10
    print(f"sent {flaky.id} and {deferred.id}: {tasks.queue(deferred.queue).get(deferred.id).state}")  # arq: job.status()
    print(f"results: {flaky.result(timeout=10)} and {deferred.result(timeout=10)}")
    worker.stop()
    thread.join()


if __name__ == "__main__":
    main()
