"""Workers: claim task runs from the run queue, run their processes, record their ends.

A worker imports the store's run-queue interface and the domain, never the dispatcher.
"""

from __future__ import annotations

from jobcontrol.worker.local import TaskOutcome, Worker

__all__ = ["TaskOutcome", "Worker"]
