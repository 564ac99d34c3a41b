"""One edit batch of 1,000 jobs with the dispatcher running, against a bare executemany UPDATE.

Set-up: 10,000 jobs in 100 trees (``_common.tree_rows``), bulk-inserted; the
dispatcher started on them with the production defaults. The batch: 1,000
tasks across 20 trees (the 50 tasks of each tree's ``seq-a`` and ``inner``
boxes), through ``Engine.modify_jobs`` (one transaction, one turn of the
tree-state protocol). It returns after the commit AND the dispatcher's
reaction (reload of the changed rows, re-evaluation and re-arming of every
affected tree), so its wall time is what is measured. Two kinds of batch,
3 rounds each (each round really changes every job):

* ``description + timer``: a new description and a ``daily HH:MM`` timer;
* ``active toggle``: ``active`` flipped.

Baseline (same run): a bare SQLAlchemy executemany ``UPDATE job SET ...
WHERE id = ?`` of the same 1,000 rows and columns (plus ``last_updated``,
``updated_by``, ``version``) in one transaction, on an identical database that
no dispatcher watches.

Target: the engine's batch < 0.5 s (median of the rounds; the max is shown).

    .venv/bin/python bench/bench_batch_edit.py [--pg] [--json]
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
from sqlalchemy import bindparam, select, update

from jobcontrol import DispatcherConfig, Engine, JobChange, Store
from jobcontrol.runtime import Runtime
from jobcontrol.store.schema import job

TARGET_S = 0.5
TREES = 100
EDITED_TREES = 20
ROUNDS = 3


def edited_names() -> list[str]:
    names = []
    for t in range(0, TREES, TREES // EDITED_TREES):
        names += [f"t{t:05d}-seq-a-{i:02d}" for i in range(30)]
        names += [f"t{t:05d}-inner-{i:02d}" for i in range(20)]
    assert len(names) == 1000
    return names


def round_fields(kind: str, r: int, i: int) -> dict[str, Any]:
    if kind == "description + timer":
        return {"description": f"round {r} job {i}", "timer": f"daily {(r + i) % 24:02d}:{r:02d}"}
    return {"active": r % 2 == 1}  # rows start active: round 0 deactivates


def engine_rounds(url: str, logs: Path, names: list[str]) -> dict[str, list[float]]:
    store = Store(url)
    runtime = Runtime(store, DispatcherConfig(log_root=logs))
    dispatcher = runtime.dispatcher
    engine = Engine(store, dispatcher)
    runtime.start()
    times: dict[str, list[float]] = {}
    try:
        for kind in ("description + timer", "active toggle"):
            for r in range(ROUNDS):
                changes = [JobChange(n, round_fields(kind, r, i)) for i, n in enumerate(names)]
                reactions = dispatcher.stats.reactions
                t0 = time.perf_counter()
                modified = engine.modify_jobs(changes, user="bench")
                times.setdefault(kind, []).append(time.perf_counter() - t0)
                if len(modified) != len(names) or dispatcher.stats.reactions != reactions + 1:
                    raise SystemExit(f"{kind} round {r}: {len(modified)} modified")
        # The dispatcher's tree saw the last round.
        last = engine.get_job(names[-1])
        if last.active is not (ROUNDS % 2 == 0) or dispatcher.tree.by_name[names[-1]].job != last:
            raise SystemExit("the dispatcher's tree does not match the database")
    finally:
        runtime.stop(timeout=30)
        store.dispose()
    return times


def bare_rounds(url: str, names: list[str]) -> dict[str, list[float]]:
    store = Store(url)
    with store.read() as conn:
        ids = {r.name: r.id for r in conn.execute(select(job.c.id, job.c.name))}
    times: dict[str, list[float]] = {}
    try:
        for kind in ("description + timer", "active toggle"):
            columns = list(round_fields(kind, 0, 0))
            stmt = (
                update(job)
                .where(job.c.id == bindparam("b_id"))
                .values(
                    {
                        **{col: bindparam(f"b_{col}") for col in columns},
                        "last_updated": bindparam("b_now"),
                        "updated_by": "bench",
                        "version": job.c.version + 1,
                    }
                )
            )
            for r in range(ROUNDS):
                now = datetime.now(UTC)
                t0 = time.perf_counter()
                rows = [
                    {
                        "b_id": ids[n],
                        "b_now": now,
                        **{f"b_{k}": v for k, v in round_fields(kind, r, i).items()},
                    }
                    for i, n in enumerate(names)
                ]
                with store.write() as conn:
                    if conn.execute(stmt, rows).rowcount != len(rows):
                        raise SystemExit("bare update missed rows")
                times.setdefault(kind, []).append(time.perf_counter() - t0)
    finally:
        store.dispose()
    return times


def bench(store_name: str, urls: tuple[str, str], logs: Path) -> c.Report:
    names = edited_names()
    print(f"[{store_name}] two databases of {TREES * c.JOBS_PER_TREE:,} jobs ...", flush=True)
    c.bulk_load(urls[0], TREES)
    c.bulk_load(urls[1], TREES)
    print(f"[{store_name}] baseline: bare executemany UPDATE of {len(names)} rows ...", flush=True)
    bare = bare_rounds(urls[1], names)
    print(
        f"[{store_name}] engine: modify_jobs of {len(names)} jobs, dispatcher running ...",
        flush=True,
    )
    ours = engine_rounds(urls[0], logs, names)
    rep = c.Report("bench_batch_edit", store_name)
    rep.add("jobs in the database", TREES * c.JOBS_PER_TREE, "")
    rep.add("jobs per batch", len(names), "")
    for kind in ours:
        rep.add(f"{kind}: engine median", c.median(ours[kind]), "s")
        rep.add(f"{kind}: engine max", max(ours[kind]), "s")
        rep.add(f"{kind}: bare UPDATE median", c.median(bare[kind]), "s")
        rep.ratios[f"{kind}: engine / bare"] = c.ratio(c.median(ours[kind]), c.median(bare[kind]))
        rep.checks.append(c.Check(f"{kind} batch (median)", c.median(ours[kind]), TARGET_S, "s"))
    return rep


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    args = p.parse_args()
    reports = []
    with c.temp_dir("batch") as tmp:
        urls = (c.sqlite_url(tmp, "engine.db"), c.sqlite_url(tmp, "bare.db"))
        reports.append(bench("sqlite", urls, tmp / "logs"))
        if args.pg:
            with c.postgres("bench_batch_engine") as url:
                bare_url = url.rsplit("/", 1)[0] + "/bench_batch_bare"
                _create_database(url, "bench_batch_bare")
                reports.append(bench("postgresql", (url, bare_url), tmp / "pg-logs"))
    for rep in reports:
        rep.print(as_json=args.json)
    return 0


def _create_database(url: str, name: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
