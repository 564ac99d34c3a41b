"""Job Control: a workload scheduler of job trees (a port of Inq's Job Control).

The public surface: open a ``Store``, start the dispatcher and its embedded worker on it
(``jobcontrol.runtime.Runtime``, as the daemon does), and make every edit and request
through an ``Engine``.

The package is laid out by layer, each importing only those below it (the
import-linter contract in ``pyproject.toml`` keeps it so):

- ``cli``, ``daemon``, ``api``: the ways in;
- ``service``: the one door they use (edits, runs, views, users, audit, events, metrics);
- ``runtime``: the dispatcher and its embedded worker, wired the way the daemon runs them;
- ``dispatch`` and ``worker``: the two sides of the run queue, neither importing the other;
- ``store``: the database, with the run queue (``store.runqueue``) as the seam;
- ``definitions``, ``timerexpr``: job definitions and the timer language;
- ``client``: the admin API's client (light: no engine, no SQLAlchemy);
- leaves: ``places``, ``views``, ``outage``, ``procs``, ``events``, ``clock``, ``filemodes``,
  ``taskenv``, ``cgroups``, ``slotgroups``, ``logbatch``, ``gcpause``, then ``diskspace``,
  ``cpupin``, ``model``, ``errors``.

The names below are loaded on first use, so ``import jobcontrol.client`` (the
Qt client's only door) loads no engine, store or SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobcontrol.dispatch.dispatcher import Dispatcher, DispatcherConfig
    from jobcontrol.errors import JobControlError
    from jobcontrol.model import (
        BoxType,
        JobRecord,
        JobState,
        Kind,
        OnError,
        RunRecord,
        RunState,
        Trigger,
    )
    from jobcontrol.service.engine import Batch, BatchResult, Engine, JobChange, NewJob
    from jobcontrol.store import Store

__version__ = "0.1.0"

_WHERE = {
    "Dispatcher": "jobcontrol.dispatch.dispatcher",
    "DispatcherConfig": "jobcontrol.dispatch.dispatcher",
    "Batch": "jobcontrol.service.engine",
    "BatchResult": "jobcontrol.service.engine",
    "Engine": "jobcontrol.service.engine",
    "JobChange": "jobcontrol.service.engine",
    "NewJob": "jobcontrol.service.engine",
    "JobControlError": "jobcontrol.errors",
    "BoxType": "jobcontrol.model",
    "JobRecord": "jobcontrol.model",
    "JobState": "jobcontrol.model",
    "Kind": "jobcontrol.model",
    "OnError": "jobcontrol.model",
    "RunRecord": "jobcontrol.model",
    "RunState": "jobcontrol.model",
    "Trigger": "jobcontrol.model",
    "Store": "jobcontrol.store",
}

__all__ = [
    "Batch",
    "BatchResult",
    "BoxType",
    "Dispatcher",
    "DispatcherConfig",
    "Engine",
    "JobChange",
    "JobControlError",
    "JobRecord",
    "JobState",
    "Kind",
    "NewJob",
    "OnError",
    "RunRecord",
    "RunState",
    "Store",
    "Trigger",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'jobcontrol' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
