"""Helpers shared by the benchmarks: temp dirs, PostgreSQL, statistics, the report.

Every benchmark measures its own baseline in the same run and ends with a
``Report``: the absolute figures, the baseline, the ratio and whether the
target holds. With ``--json`` the report is also printed as one line starting
with ``BENCH-JSON `` (``run_all.py`` reads it); nothing is written to the repo.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # so that ``tests.pgserver`` imports when run as a script
    sys.path.insert(0, str(ROOT))

JSON_PREFIX = "BENCH-JSON "


def parser(description: str, *, pg: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="also print the report as one JSON line")
    if pg:
        p.add_argument(
            "--pg",
            action="store_true",
            help="also run on a throwaway PostgreSQL server (tests/pgserver.py)",
        )
    return p


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"jc-bench-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def postgres(dbname: str) -> Iterator[str]:
    """A throwaway PostgreSQL server with one fresh database; yields its SQLAlchemy URL."""
    from tests.pgserver import PostgresServer

    bindir = PostgresServer.available()
    if bindir is None:
        raise SystemExit("--pg: no PostgreSQL server binaries found")
    with PostgresServer(bindir) as server:
        server.create_database(dbname)
        yield server.url(dbname)


def sqlite_url(directory: Path, name: str = "jobcontrol.db") -> str:
    return f"sqlite:///{directory / name}"


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of 200 values is the 198th smallest)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio(ours: float, base: float) -> float:
    return ours / base if base > 0 else math.inf


def machine() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


@dataclass
class Check:
    """One target: ``value`` (the engine's figure) against ``limit`` (``<`` or ``<=``;
    ``>=`` with ``at_least``, for a figure that must reach the limit, like a throughput)."""

    name: str
    value: float
    limit: float
    unit: str
    inclusive: bool = False
    at_least: bool = False

    @property
    def holds(self) -> bool:
        if self.at_least:
            return self.value >= self.limit
        return self.value <= self.limit if self.inclusive else self.value < self.limit

    @property
    def op(self) -> str:
        return ">=" if self.at_least else "<=" if self.inclusive else "<"

    def text(self) -> str:
        op = self.op
        verdict = "HOLDS" if self.holds else "MISSED"
        return f"{self.name}: {fmt(self.value)} {self.unit} (target {op} {fmt(self.limit)} {self.unit}) {verdict}"


@dataclass
class Report:
    bench: str
    store: str
    figures: dict[str, float] = field(default_factory=dict)  # name -> value
    units: dict[str, str] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, value: float, unit: str) -> None:
        self.figures[name] = value
        self.units[name] = unit

    @property
    def holds(self) -> bool:
        return all(c.holds for c in self.checks)

    def print(self, *, as_json: bool = False) -> None:
        print(f"\n== {self.bench} [{self.store}] ({machine()})")
        width = max((len(k) for k in [*self.figures, *self.ratios]), default=10)
        for name, value in self.figures.items():
            print(f"  {name:<{width}}  {fmt(value):>12} {self.units[name]}")
        for name, value in self.ratios.items():
            print(f"  {name:<{width}}  {fmt(value):>12} x")
        for note in self.notes:
            print(f"  note: {note}")
        for check in self.checks:
            print(f"  target {check.text()}")
        print(f"  => {'all targets hold' if self.holds else 'TARGET MISSED'}")
        if as_json:
            print(JSON_PREFIX + json.dumps(self.as_dict()), flush=True)

    def as_dict(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "store": self.store,
            "figures": {k: {"value": v, "unit": self.units[k]} for k, v in self.figures.items()},
            "ratios": self.ratios,
            "checks": [
                {
                    "name": c.name,
                    "value": c.value,
                    "limit": c.limit,
                    "unit": c.unit,
                    "op": c.op,
                    "holds": c.holds,
                }
                for c in self.checks
            ],
            "holds": self.holds,
            "notes": self.notes,
        }


def fmt(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and value >= 100):
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.3f}"
    return f"{value:.4f}"


# ---------------------------------------------------------------- bulk job trees

JOBS_PER_TREE = 100


def tree_rows(tree: int, first_id: int, now: Any) -> list[dict[str, Any]]:
    """The 100 job rows of one tree, ids ``first_id .. first_id + 99``, parents before children.

    top box (timer ``every 1h`` or ``cron 0 * * * *``, active)
      seq-a (sequence box)     30 tasks
      outer (sequence box)
        inner (sequence box)   20 tasks
      timed (TIMED box)        20 tasks, every 4th with its own ``daily HH:MM`` timer
      25 tasks
    """
    rows: list[dict[str, Any]] = []
    order: dict[int | None, int] = {}

    def add(name: str, kind: str, parent: int | None, **extra: Any) -> int:
        job_id = first_id + len(rows)
        position = order.get(parent, 0)
        order[parent] = position + 1
        row = {
            "id": job_id,
            "name": f"t{tree:05d}-{name}",
            "description": None,
            "parent_id": parent,
            "kind": kind,
            "job_order": position,
            "command": "true" if kind == "task" else None,
            "timer": None,
            "active": True,
            "on_error": "continue",
            "box_type": "sequence",
            "exit_status": 0,
            "last_updated": now,
            "updated_by": "bench",
            "version": 1,
            "queue": "default",
            "priority": 0,
            "misfire": "run-once",
        }
        row.update(extra)
        rows.append(row)
        return job_id

    timer = "every 1h" if tree % 2 == 0 else "cron 0 * * * *"
    top = add("top", "box", None, timer=timer)
    seq = add("seq-a", "box", top)
    for i in range(30):
        add(f"seq-a-{i:02d}", "task", seq)
    outer = add("outer", "box", top)
    inner = add("inner", "box", outer)
    for i in range(20):
        add(f"inner-{i:02d}", "task", inner)
    timed = add("timed", "box", top, box_type="timed")
    for i in range(20):
        own = f"daily {(tree + i) % 24:02d}:{(7 * i) % 60:02d}" if i % 4 == 0 else None
        add(f"timed-{i:02d}", "task", timed, timer=own)
    for i in range(25):
        add(f"task-{i:02d}", "task", top)
    assert len(rows) == JOBS_PER_TREE
    return rows


def bulk_load(url: str, trees: int) -> float:
    """A fresh schema with ``trees`` x 100 jobs, inserted with executemany in one transaction.

    Returns the seconds the insert took.
    """
    import time
    from datetime import UTC, datetime

    from sqlalchemy import insert

    from jobcontrol import Store
    from jobcontrol.store.schema import job

    store = Store(url)
    store.upgrade()
    now = datetime.now(UTC)
    t0 = time.perf_counter()
    with store.write() as conn:
        batch: list[dict[str, Any]] = []
        for t in range(trees):
            batch += tree_rows(t, 1 + t * JOBS_PER_TREE, now)
            if len(batch) >= 20_000:
                conn.execute(insert(job), batch)
                batch = []
        if batch:
            conn.execute(insert(job), batch)
    elapsed = time.perf_counter() - t0
    if not store.is_sqlite:  # explicit ids: move the sequence past them
        with store.write() as conn:
            conn.exec_driver_sql(
                "SELECT setval(pg_get_serial_sequence('job', 'id'), max(id)) FROM job"
            )
    store.dispose()
    return elapsed
