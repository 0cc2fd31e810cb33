"""A queue's verbs, written once as plans (no I/O; see :mod:`pyqueue.protocol.core`), in groups
that :class:`pyqueue.drivers.queue.QueueCore` is made of:

* :mod:`~pyqueue.protocol.verbs.produce`: enqueue;
* :mod:`~pyqueue.protocol.verbs.consume`: the lease and its endings (ack, ack with a result,
  nack, extend, release), the worker's path;
* :mod:`~pyqueue.protocol.verbs.reading`: stats, peek, get, results;
* :mod:`~pyqueue.protocol.verbs.control`: maintenance (promote, scrub), job control (cancel, rate
  limit, group caps, pause) and the dead letters.

Each verb is one script call (lua/<verb>.lua) and its parsing; a verb's name is its
script's name.
"""
