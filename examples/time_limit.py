# dramatiq's examples/time_limit, ported: two tasks that would sleep forever, stopped
# at their time limit; the second catches TimeLimitExceeded, cleans up and returns.
#
#     python examples/time_limit.py
#
# As in dramatiq: at the limit the task gets TimeLimitExceeded in its thread (the worker
# keeps its lease meanwhile). long_running lets it through: retried, then dead.
# long_running_with_catch catches it and returns: the job succeeded, acked once.
# (Within time_limit_grace, 5 s by default; past it the job ends as TimeLimitExceeded.)
#
# Code lines (non-blank, not only a comment): 28, as dramatiq's example.

import threading
import time

import pyqueue.tasks  # pyqueue, and pyqueue.tasks for TaskDead

tasks = pyqueue.Tasks()


@tasks.task(name="long_running", time_limit=0.5, max_attempts=2, backoff=0.1)
def long_running() -> None:
    while True:
        print(f"{pyqueue.current_job().task}, attempt {pyqueue.current_job().attempt}: sleeping...")
        time.sleep(0.1)


@tasks.task(name="long_running_with_catch", time_limit=0.5, max_attempts=1, keep_result=60)
def long_running_with_catch() -> None:
    try:
        long_running()  # calling a task runs its function here, in this job
    except pyqueue.TimeLimitExceeded:
        print("long_running_with_catch: time limit exceeded, aborting...")


def main() -> None:
    worker = tasks.worker(concurrency=2)
    thread = threading.Thread(target=tasks.run_worker, args=[worker], daemon=True)
    thread.start()
    for sent in [long_running.send(), long_running_with_catch.send()]:
        try:
            print(f"{sent.task} is done: {sent.result(timeout=10)}")
        except pyqueue.tasks.TaskDead as dead:
            print(f"{sent.task} is dead: {dead.error}")
    worker.stop()
    thread.join()


if __name__ == "__main__":
    main()
