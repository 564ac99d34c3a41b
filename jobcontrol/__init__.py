"""Job Control: a workload scheduler of job trees (a port of Inq's Job Control).

The public surface: open a ``Store``, start a ``Runtime`` on it (the dispatcher
and its embedded worker), and make every edit and request through an ``Engine``.
"""

from __future__ import annotations

from jobcontrol.dispatcher import Dispatcher, DispatcherConfig
from jobcontrol.engine import Batch, BatchResult, Engine, JobChange, NewJob
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
from jobcontrol.store import Store

__version__ = "0.1.0"

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
