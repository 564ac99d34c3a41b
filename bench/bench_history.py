"""History stays fast with millions of runs.

Builds two SQLite databases with the same 1,000 jobs: one with 60,000 runs
(the baseline) and one with 2,000,000. Times ``Engine.history`` for the first
page (newest 50 runs of a job) and for a deep page (keyset pagination with
``before_id``), median over many queries, and prints large / small: with the
(job_id, id) index the ratio stays near 1 however many runs there are.

    .venv/bin/python bench/bench_history.py [--runs 2000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert

from jobcontrol.service.engine import Engine
from jobcontrol.store import Store
from jobcontrol.store.schema import job, run

JOBS = 1_000
QUERIES = 300
SMALL_RUNS = 60 * JOBS  # enough for a full page of every job


def build(path: Path, runs: int) -> Store:
    store = Store(str(path))
    store.upgrade()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with store.write() as conn:
        conn.execute(
            insert(job),
            [
                {"id": i, "name": f"job-{i}", "kind": "task", "command": "true"}
                for i in range(1, JOBS + 1)
            ],
        )
        batch = []
        for i in range(runs):
            started = t0 + timedelta(seconds=i)
            batch.append(
                {
                    "job_id": (i % JOBS) + 1,
                    "job_name": f"job-{(i % JOBS) + 1}",
                    "kind": "task",
                    "trigger": "timer",
                    "state": "succeeded",
                    "exit_status": 0,
                    "created": started,
                    "started": started,
                    "ended": started + timedelta(milliseconds=5),
                    "duration_ms": 5,
                }
            )
            if len(batch) == 50_000:
                conn.execute(insert(run), batch)
                batch.clear()
        if batch:
            conn.execute(insert(run), batch)
    return store


def measure(store: Store) -> dict[str, float]:
    engine = Engine(store)
    rng = random.Random(7)
    first, deep = [], []
    for _ in range(QUERIES):
        name = f"job-{rng.randint(1, JOBS)}"
        t = time.perf_counter()
        page = engine.history(name, limit=50)
        first.append(time.perf_counter() - t)
        assert len(page) == 50
        assert page[0].id > page[-1].id
        middle = page[-1].id - rng.randint(0, max(1, page[-1].id // 2))
        t = time.perf_counter()
        engine.history(name, limit=50, before_id=middle)
        deep.append(time.perf_counter() - t)
    return {
        "first_page_ms": statistics.median(first) * 1000,
        "deep_page_ms": statistics.median(deep) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jc-bench-history-") as tmp:
        t = time.perf_counter()
        small = build(Path(tmp) / "small.db", SMALL_RUNS)
        large = build(Path(tmp) / "large.db", args.runs)
        built = time.perf_counter() - t
        base, big = measure(small), measure(large)
        small.dispose()
        large.dispose()
    result = {
        "runs_large": args.runs,
        "runs_small": SMALL_RUNS,
        "baseline": base,
        "large": big,
        "ratio_first_page": big["first_page_ms"] / base["first_page_ms"],
        "ratio_deep_page": big["deep_page_ms"] / base["deep_page_ms"],
        "build_s": built,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"history of one job, 50 runs a page (median of {QUERIES} queries)")
    print(
        f"  {result['runs_small']:>9,} runs: first page {base['first_page_ms']:.3f} ms, deep page {base['deep_page_ms']:.3f} ms  (baseline)"
    )
    print(
        f"  {args.runs:>9,} runs: first page {big['first_page_ms']:.3f} ms, deep page {big['deep_page_ms']:.3f} ms"
    )
    print(
        f"  ratio large/baseline: first page {result['ratio_first_page']:.2f}x, deep page {result['ratio_deep_page']:.2f}x"
    )


if __name__ == "__main__":
    main()
