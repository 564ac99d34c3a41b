"""The ``run_log`` table on both stores: chunks appended once, read by range, pruned,
and carried by ``db copy`` and ``db backup``."""

from __future__ import annotations

import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from jobcontrol.service.dbcopy import backup_sqlite, copy_database
from jobcontrol.store import Store, runlogs
from jobcontrol.store.schema import run_log

AT = datetime(2026, 12, 8, 10, 0, tzinfo=UTC)
DATA = bytes(range(256)) * 300 + b"\xc3\x28 not utf-8"


def _store(url: str) -> Store:
    store = Store(url)
    store.upgrade()
    return store


def _put(store: Store, run_id: int, data: bytes, size: int = 1000) -> None:
    for seq, pos in enumerate(range(0, len(data), size)):
        runlogs.append(store, run_id, seq, pos, data[pos : pos + size], AT)


def test_chunks_read_back_by_any_range(db_url: str) -> None:
    store = _store(db_url)
    try:
        _put(store, 7, DATA)
        runlogs.append(store, 7, 3, 3000, DATA[3000:4000], AT)  # a retried chunk: no double
        with store.read() as conn:
            assert runlogs.size(conn, 7) == len(DATA)
            assert runlogs.size(conn, 8) == 0
            assert runlogs.read(conn, 7, 0, 10**7) == DATA
            for start, length in ((0, 1), (999, 2), (1500, 3000), (len(DATA) - 5, 100)):
                assert runlogs.read(conn, 7, start, length) == DATA[start : start + length]
            assert runlogs.read(conn, 7, len(DATA), 10) == b""
        with pytest.raises(RuntimeError, match="run 7 log chunk 3: stored at byte 3000, given 5"):
            runlogs.append(store, 7, 3, 5, b"x", AT)
        with store.read() as conn:
            assert runlogs.read(conn, 7, 0, 10**7) == DATA  # the refusal changed nothing
    finally:
        store.dispose()


def test_db_copy_and_backup_carry_the_stored_logs(db_url: str, tmp_path: Path) -> None:
    source = _store(f"sqlite:///{tmp_path}/source.db")
    target = Store(db_url)
    try:
        _put(source, 1, DATA)
        _put(source, 2, b"second run\n")
        copied = copy_database(source, target)
        assert copied["run_log"] == len(range(0, len(DATA), 1000)) + 1
        with target.read() as conn:
            assert runlogs.read(conn, 1, 0, 10**7) == DATA
            assert runlogs.read(conn, 2, 0, 100) == b"second run\n"
            rows = conn.execute(select(run_log.c.at).where(run_log.c.run_id == 2)).all()
            assert [r.at for r in rows] == [AT]
        dest = tmp_path / "backup.db"
        backup_sqlite(source, dest)
        assert os.stat(dest).st_mode & 0o777 == 0o600
        with sqlite3.connect(dest) as raw:
            chunks = raw.execute("SELECT data FROM run_log WHERE run_id = 1 ORDER BY seq")
            assert b"".join(row[0] for row in chunks) == DATA
    finally:
        source.dispose()
        target.dispose()
