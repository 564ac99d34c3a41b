"""The procrastinate side of ``bench_claims.py``, run by the benchmark's own virtualenv.

This file imports procrastinate and nothing of ``jobcontrol``: it runs under the
interpreter of ``bench/.venv-procrastinate`` (or ``--procrastinate-venv``), never the
project's. Two roles, each given a libpq connection string in ``$BENCH_PG_CONNINFO``
(not on the command line):

    python _procrastinate_child.py setup N        apply the schema, defer N no-op jobs
                                                   in bulk (``batch_defer``)
    python _procrastinate_child.py worker NAME C  a worker of concurrency C: prints
                                                   "ready", waits for a line on stdin,
                                                   drains the queue (``wait=False``),
                                                   prints one JSON line with its CPU
"""

from __future__ import annotations

import json
import os
import sys
import time

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ["BENCH_PG_CONNINFO"])
)


@app.task(name="noop", queue="default")
async def noop() -> None:
    """The no-op: the benchmark measures the queue, not the work."""


def setup(count: int) -> None:
    with app.open():
        app.schema_manager.apply_schema()
        batch = 1000
        for start in range(0, count, batch):
            noop.batch_defer(*({} for _ in range(min(batch, count - start))))
    print(json.dumps({"deferred": count, "version": procrastinate.__version__}), flush=True)


def worker(name: str, concurrency: int) -> None:
    print("ready", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("no go line on stdin")
    cpu0, wall0 = time.process_time(), time.monotonic()
    app.run_worker(
        name=name,
        concurrency=concurrency,
        wait=False,  # stop once the queue is drained
        install_signal_handlers=False,
    )
    cpu = time.process_time() - cpu0
    print(json.dumps({"name": name, "cpu_s": cpu, "wall_s": time.monotonic() - wall0}), flush=True)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "setup":
        setup(int(sys.argv[2]))
    elif role == "worker":
        worker(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown role {role!r}: setup or worker")
