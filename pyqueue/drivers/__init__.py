"""The drivers' floor: Redis clients, the blocking transport of plans, and the
blocking queues built on them (:class:`~pyqueue.drivers.queue.Queue`,
:class:`~pyqueue.drivers.partitioned.PartitionedQueue`); coalescing of concurrent
enqueues; waiting on wake markers. The asyncio driver (:mod:`pyqueue.aio`) stands on
this floor's clients and transport tables. Imports only from :mod:`pyqueue.protocol`.
"""
