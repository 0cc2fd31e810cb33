"""The state a worker's parts share, made once by the worker and handed to each part.

Each member is one part's whole job (see :mod:`pyqueue.worker`): what the worker holds
(:class:`~pyqueue.worker.running.Running`), whether and how it stops
(:class:`~pyqueue.worker.lifecycle.Control`), its service registration
(:class:`~pyqueue.worker.registration.Registration`), the named crash points of the
fault tests (:class:`~pyqueue.worker.crash.Crasher`) and how a call that met a
connection error or a full server is waited out (:class:`~pyqueue.worker.retries.Retrying`).
No part holds the worker itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyqueue.worker.crash import Crasher
from pyqueue.worker.lifecycle import Control
from pyqueue.worker.registration import Registration
from pyqueue.worker.retries import Retrying
from pyqueue.worker.running import Running

__all__ = ["Shared"]


@dataclass(frozen=True)
class Shared:
    """What a worker's parts share (see the module docstring)."""

    running: Running
    control: Control
    registration: Registration
    crash: Crasher
    retrying: Retrying
