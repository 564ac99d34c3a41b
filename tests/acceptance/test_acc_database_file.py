"""Which SQLite file the daemon accepts: a file it creates, or one with Job Control's schema.

An existing file without the schema (an empty file, someone else's database) is refused
the way ``load`` refuses it, and nothing is changed: no schema, no WAL switch, no token.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.acceptance.harness import JobControl, describe

pytestmark = pytest.mark.timeout(150)

MakeJC = Callable[[str], JobControl]

# A daemon that wrongly accepts the file runs until the test gives up on it.
REFUSAL_WAIT = 40.0


def token_file(jc: JobControl) -> Path:
    return jc.token_file


def siblings(db: Path) -> list[str]:
    """Files beside the database that SQLite or the daemon would add (-wal, -shm, lock)."""
    return sorted(p.name for p in db.parent.iterdir() if p.name.startswith(db.name + "-"))


def assert_refused_unchanged(jc: JobControl, db: Path, content: bytes, *command: str) -> None:
    result = jc.run(*command, timeout=REFUSAL_WAIT)
    assert result.returncode == 1, describe(result)
    assert "has no Job Control schema" in result.stderr, describe(result)
    assert "run `jobcontrol db upgrade`" in result.stderr, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert db.read_bytes() == content, "the refused file must be left as it was"
    assert siblings(db) == [], siblings(db)
    assert not token_file(jc).exists(), "no admin token may be minted for a refused file"
    assert jc.live_daemons() == []


def test_an_empty_sqlite_file_is_refused_and_left_empty(tmp_path: Path, make_jc: MakeJC) -> None:
    db = tmp_path / "empty.db"
    db.touch()
    jc = make_jc(f"sqlite:///{db}")
    assert_refused_unchanged(jc, db, b"", "daemon", "start")
    assert_refused_unchanged(jc, db, b"", "daemon", "run")
    # The way out the message names: the schema, then the daemon starts and mints a token.
    jc.ok("db", "upgrade")
    jc.ok("daemon", "start")
    assert token_file(jc).exists()


def test_someone_elses_sqlite_database_is_refused_untouched(
    tmp_path: Path, make_jc: MakeJC
) -> None:
    db = tmp_path / "notes.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.close()
    content = db.read_bytes()
    jc = make_jc(f"sqlite:///{db}")
    assert_refused_unchanged(jc, db, content, "daemon", "start")


def test_a_database_file_the_daemon_creates_itself_is_set_up(
    tmp_path: Path, make_jc: MakeJC
) -> None:
    db = tmp_path / "new" / "jobcontrol.db"
    jc = make_jc(f"sqlite:///{db}")
    jc.ok("daemon", "start")
    assert db.stat().st_size > 0
    assert token_file(jc).exists(), "a new database's first start writes the admin token"
    assert jc.json("ls") == []
