"""The ground floor: what every other floor speaks, with no I/O.

* :mod:`~pyqueue.protocol.errors` — the error tree every verb raises.
* :mod:`~pyqueue.protocol.models` — the values verbs return (``Job``, ``Stats``, …).
* :mod:`~pyqueue.protocol.keys` — the key schema ``<prefix>:{<queue>}:<role>``.
* :mod:`~pyqueue.protocol.core` — limits, argument checks, the script ABI (KEYS and
  ARGV of every ``lua/*.lua``), plans and their steps (DESIGN §10).
* :mod:`~pyqueue.protocol.verbs` — a queue's verbs as plans, grouped by family.
* :mod:`~pyqueue.protocol.unconfirmed` — acks whose replicas did not confirm.

Nothing here imports from a floor above (``tests/test_layers.py``).
"""
