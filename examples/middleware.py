# Middleware: a request id that travels from the code that sends a task to the worker
# that runs it, each run logged with its attempt, how it ended and how long it took, and
# a send refused when there is no request id. (README.md, "Middleware and tracing".)
#
#     python examples/middleware.py
#
# The worker runs in a thread of this process; in production it is a process of its
# own, ``pyqueue worker examples.middleware:tasks``.

import contextvars
import threading
import time

import pyqueue

tasks = pyqueue.Tasks()
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


class RequestLog(pyqueue.Middleware):
    def around_send(self, message):                 # fn.send, send_many, asend, options(...).send
        if request_id.get() is None:
            raise LookupError("send tasks from inside a request")   # nothing is sent
        message.meta["request_id"] = request_id.get()   # travels in the envelope's meta
        yield

    def around_run(self, run):                       # run: what current_job() returns
        started = time.perf_counter()
        outcome = yield                              # the task runs here (sync or async def)
        took = time.perf_counter() - started
        print(f"{run.task} attempt {run.attempt}: {outcome.ending} (request {run.meta['request_id']}, {took:.3f}s)")


tasks.middleware(RequestLog())


@tasks.task(name="resize", backoff=0.05, keep_result=60)
def resize(image_id: int) -> str:
    if pyqueue.current_job().attempt == 1:
        raise ConnectionError("storage busy")        # retried after 0.05 s
    return f"images/{image_id}.webp"


def main() -> None:
    worker = tasks.worker()
    thread = threading.Thread(target=tasks.run_worker, args=[worker], daemon=True)
    thread.start()
    request_id.set("req-42")
    print(f"result: {resize.send(7).result(timeout=10)}")
    request_id.set(None)
    try:
        resize.send(8)
    except pyqueue.MiddlewareError as error:
        print(f"refused: {error}")
    worker.stop()
    thread.join()


if __name__ == "__main__":
    main()
