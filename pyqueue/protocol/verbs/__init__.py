"""A queue's verbs, written once as plan functions (no I/O; see :mod:`pyqueue.protocol.core`)
over a frozen :class:`~pyqueue.protocol.spec.QueueSpec` and the queue object's
:class:`~pyqueue.protocol.spec.QueueMemory`, in groups:

* :mod:`~pyqueue.protocol.verbs.produce`: enqueue;
* :mod:`~pyqueue.protocol.verbs.consume`: the lease and its endings (ack, ack with a result,
  nack, extend, release), the worker's path;
* :mod:`~pyqueue.protocol.verbs.reading`: stats, peek, get, browse, results;
* :mod:`~pyqueue.protocol.verbs.control`: maintenance (promote, scrub), job control (cancel, rate
  limit, group caps, pause) and the dead letters;
* :mod:`~pyqueue.protocol.verbs.flows`, :mod:`~pyqueue.protocol.verbs.progress`,
  :mod:`~pyqueue.protocol.verbs.events`: waiting jobs, progress, the event stream;
* :mod:`~pyqueue.protocol.verbs.base`: the partition-count guard every call goes through.

Each verb is one script call (lua/<verb>.lua) and its parsing; a verb's name is its
script's name. :class:`~pyqueue.protocol.plans.SingleQueue` binds them to one queue;
:class:`~pyqueue.drivers.partitioned.PartitionedQueue` routes them over K.
"""
