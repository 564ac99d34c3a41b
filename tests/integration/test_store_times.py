"""Times in the store: written as naive UTC, read back aware, on both stores.

On SQLite the conversion and the text format run as one function
(``UTCDateTime.bind_processor``); its rows must read the same through Core, through
a ``Prepared`` statement and as the raw text SQLite holds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import bindparam, select, text, update
from sqlalchemy.dialects import sqlite

from jobcontrol.store import Store, queries
from jobcontrol.store.prepared import Prepared
from jobcontrol.store.schema import UTCDateTime, job

EST = timezone(timedelta(hours=-5))


def _job(store: Store) -> int:
    with store.write() as conn:
        result = conn.execute(job.insert().values(name="t", kind="task").returning(job.c.id))
        job_id: int = result.scalar_one()
        return job_id


def test_an_aware_time_is_stored_as_utc_and_read_back_aware(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    try:
        job_id = _job(store)
        when = datetime(2026, 11, 24, 3, 40, 50, 123, tzinfo=EST)  # 08:40:50.000123 UTC
        stmt = Prepared(
            update(job).where(job.c.id == bindparam("w_id")).values(last_ran=bindparam("v_when"))
        )
        with store.write() as conn:
            assert stmt.execute(conn, {"w_id": job_id, "v_when": when}).rowcount == 1
        with store.read() as conn:
            read = conn.execute(select(job.c.last_ran).where(job.c.id == job_id)).scalar_one()
            raw = conn.execute(text("SELECT CAST(last_ran AS TEXT) FROM job")).scalar_one()
            by_prepared = Prepared(
                select(job.c.last_ran).where(job.c.id == bindparam("w_id")), [job.c.last_ran]
            ).first(conn, {"w_id": job_id})
        assert read == when
        assert read.utcoffset() == timedelta(0)
        assert by_prepared == {"last_ran": read}
        assert raw.startswith("2026-11-24 08:40:50.000123"), raw
    finally:
        store.dispose()


def test_a_naive_time_is_refused_and_nothing_is_written(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    try:
        job_id = _job(store)
        stmt = Prepared(
            update(job).where(job.c.id == bindparam("w_id")).values(last_ran=bindparam("v_when"))
        )
        with pytest.raises(Exception, match="naive datetime"), store.write() as conn:
            stmt.execute(conn, {"w_id": job_id, "v_when": datetime(2026, 11, 24, 8, 0)})
        with store.read() as conn:
            assert conn.execute(select(job.c.last_ran)).scalar_one() is None
    finally:
        store.dispose()


def test_midnight_of_year_one_and_whole_seconds_keep_their_form() -> None:
    dialect = sqlite.dialect()
    impl = UTCDateTime().dialect_impl(dialect)
    bind = impl.bind_processor(dialect)
    result = impl.result_processor(dialect, None)
    assert bind is not None
    assert result is not None
    assert bind(datetime(5, 1, 1, tzinfo=UTC)) == "0005-01-01 00:00:00.000000"
    assert bind(datetime(2026, 1, 1, 12, tzinfo=UTC)) == "2026-01-01 12:00:00.000000"
    assert bind(None) is None
    assert result(None) is None
    assert result("2026-01-01 12:00:00") == datetime(2026, 1, 1, 12, tzinfo=UTC)


def _jobs(store: Store, count: int) -> list[int]:
    """``count`` tasks, each at order 0 with no next run."""
    with store.write() as conn:
        return [
            conn.execute(
                job.insert().values(name=f"j{i}", kind="task", job_order=0).returning(job.c.id)
            ).scalar_one()
            for i in range(count)
        ]


@pytest.mark.parametrize("count", [3, 200], ids=["a-tree's-re-arm", "a-first-start's-batch"])
def test_a_schedule_write_stores_each_jobs_next_run_and_order_and_nothing_else(
    db_url: str, count: int
) -> None:
    """Small writes go one row at a time; on PostgreSQL a large one goes as one
    statement over arrays (``queries.write_schedule``). Both store the same."""
    store = Store(db_url)
    store.upgrade()
    try:
        ids = _jobs(store, count + 1)
        written, untouched = ids[:count], ids[count]
        base = datetime(2026, 11, 24, 3, 40, 50, 123, tzinfo=EST)
        rows = [
            (job_id, None if i % 7 == 3 else base + timedelta(minutes=i), count - i)
            for i, job_id in enumerate(written)
        ]
        with store.write() as conn:
            queries.write_schedule(conn, rows)
        with store.read() as conn:
            got = {
                r.id: (r.next_runs, r.job_order)
                for r in conn.execute(select(job.c.id, job.c.next_runs, job.c.job_order))
            }
        assert got == {i: (n, o) for i, n, o in rows} | {untouched: (None, 0)}
        assert all(n is None or n.utcoffset() == timedelta(0) for n, _o in got.values())
    finally:
        store.dispose()


@pytest.mark.parametrize("count", [3, 200], ids=["a-tree's-re-arm", "a-first-start's-batch"])
def test_a_schedule_write_with_a_naive_time_is_refused_and_writes_nothing(
    db_url: str, count: int
) -> None:
    store = Store(db_url)
    store.upgrade()
    try:
        ids = _jobs(store, count)
        aware = datetime(2026, 11, 24, 8, 0, tzinfo=UTC)
        rows = [(job_id, aware, 5) for job_id in ids]
        rows[-1] = (ids[-1], datetime(2026, 11, 24, 8, 0), 5)  # naive: refused
        with pytest.raises(Exception, match="naive datetime"), store.write() as conn:
            queries.write_schedule(conn, rows)
        with store.read() as conn:
            left = set(conn.execute(select(job.c.next_runs, job.c.job_order)).all())
        assert left == {(None, 0)}
    finally:
        store.dispose()
