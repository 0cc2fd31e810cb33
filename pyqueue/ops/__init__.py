"""Operations over queues, above the drivers: the service registry
(:mod:`~pyqueue.ops.service`), periodic schedules (:mod:`~pyqueue.ops.schedules`),
finding queues in Redis (:mod:`~pyqueue.ops.discovery`) and the Prometheus exporter
(:mod:`~pyqueue.ops.metrics`)."""
