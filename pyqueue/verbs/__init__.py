"""A queue's verbs, written once as plans (no I/O; see :mod:`pyqueue.core`), in groups
that :class:`pyqueue.queue.QueueCore` is made of:

* :mod:`~pyqueue.verbs.produce`: enqueue;
* :mod:`~pyqueue.verbs.consume`: the lease and its endings (ack, ack with a result,
  nack, extend, release), the worker's path;
* :mod:`~pyqueue.verbs.reading`: stats, peek, get, results;
* :mod:`~pyqueue.verbs.control`: maintenance (promote, scrub), job control (cancel, rate
  limit, group caps, pause) and the dead letters.

Each verb is one script call (lua/<verb>.lua) and its parsing; a verb's name is its
script's name.
"""
