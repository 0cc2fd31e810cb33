# dramatiq's examples/composition, ported: fetch each URI in one task, count the words
# of what came back in another, and print the counts.
#
#     python examples/composition.py [URI ...]    # no URI: two pages of this checkout
#
# Without URIs it serves the current directory (run it from the repo root) on a local
# port, so it runs offline. A group of chains, as in dramatiq's example: the fetches run at
# once (a worker of 4 threads), and each count runs when its fetch has ended, given the
# fetched text (a chain passes each result as the next step's first argument).
#
# The worker runs in a thread of this process. In production it is a process of its own,
# ``pyqueue worker examples.composition:tasks``: the tasks are given names, so a worker
# that imports this module knows the jobs a script (whose module is ``__main__``) sent.
#
# Code lines (non-blank, not only a comment): 27; dramatiq's example: 31.

import sys
import threading
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pyqueue

tasks = pyqueue.Tasks()  # PYQUEUE_URL's server, else the embedded one


@tasks.task(name="request")
def request(uri: str) -> str:
    with urllib.request.urlopen(uri, timeout=10) as response:
        return str(response.read(), "utf-8")


@tasks.task(name="count_words")
def count_words(text: str) -> int:
    return len(text.split())


def main(uris: list[str]) -> None:
    worker = tasks.worker(concurrency=4)
    thread = threading.Thread(target=tasks.run_worker, args=[worker], daemon=True)
    thread.start()
    counts = pyqueue.group(request.s(uri) | count_words.s() for uri in uris).send()
    for uri, count in zip(uris, counts.result(timeout=30)):
        print(f" * {uri} has {count} words")
    worker.stop()
    thread.join()


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pages = [f"http://127.0.0.1:{server.server_port}/{page}" for page in ("README.md", "lua/README.md")]
    main(sys.argv[1:] or pages)
