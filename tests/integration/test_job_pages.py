"""On PostgreSQL the job table keeps room in its pages (migration 0012), so the writes
every run and every first start make to a job's row (next run, order, last result)
are updated in place: no new index entries, no bloat of the indexes over a daemon's
life."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import text

from jobcontrol.store import Store, alembic_config, queries

pytestmark = pytest.mark.postgres

_HOT = text("SELECT pg_stat_get_xact_tuples_hot_updated('job'::regclass)")
_UPDATED = text("SELECT pg_stat_get_xact_tuples_updated('job'::regclass)")


@pytest.fixture
def store(postgres_url: str) -> Iterator[Store]:
    store = Store(postgres_url)
    store.upgrade()
    yield store
    store.dispose()


def _load(store: Store, count: int) -> list[int]:
    """``count`` tasks written as a load writes them: one after another, pages full."""
    with store.write() as conn:
        conn.execute(
            text(
                "INSERT INTO job (name, kind, job_order, active, on_error, box_type,"
                " exit_status, version, queue, priority, misfire, retries, command)"
                " SELECT 'task-' || g, 'task', 0, true, 'continue', 'sequence', 0, 1,"
                " 'default', 0, 'run-once', 0, 'echo the report of task ' || g"
                " FROM generate_series(1, :count) AS g"
            ),
            {"count": count},
        )
        return [r[0] for r in conn.execute(text("SELECT id FROM job ORDER BY id"))]


def _fillfactor(store: Store) -> list[str]:
    with store.read() as conn:
        options = conn.execute(
            text("SELECT reloptions FROM pg_class WHERE relname = 'job'")
        ).scalar_one()
    return [o for o in options or [] if o.startswith("fillfactor=")]


@pytest.mark.parametrize("rows", [20, 400], ids=["re-arms", "a-first-start's-schedule"])
def test_schedule_writes_on_a_loaded_table_leave_the_indexes_alone(store: Store, rows: int) -> None:
    assert _fillfactor(store) == ["fillfactor=80"]
    ids = _load(store, 4_000)
    base = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
    # Rows spread evenly over the table's pages, in one transaction as a first start's
    # evaluation writes them (at most one in ten: a fifth of a page is free).
    chosen = ids[:: len(ids) // rows][:rows]
    with store.write() as conn:
        queries.write_schedule(
            conn, [(i, base + timedelta(seconds=k), k) for k, i in enumerate(chosen)]
        )
        updated, hot = conn.execute(_UPDATED).scalar_one(), conn.execute(_HOT).scalar_one()
    assert updated == rows
    assert hot == rows, f"{rows - hot} of {rows} updates made new index entries"


def test_the_fill_factor_comes_and_goes_with_its_migration(store: Store, postgres_url: str) -> None:
    cfg = alembic_config(postgres_url)
    command.downgrade(cfg, "0011")
    assert _fillfactor(store) == []
    command.upgrade(cfg, "head")
    assert _fillfactor(store) == ["fillfactor=80"]
