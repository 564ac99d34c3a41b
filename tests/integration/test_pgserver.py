"""The test PostgreSQL server and the per-test database fixtures of tests/conftest.py."""

from __future__ import annotations

import uuid

import psycopg
import pytest
import sqlalchemy as sa

from tests.pgserver import PostgresServer


def _libpq_url(sqlalchemy_url: str) -> str:
    """postgresql+psycopg://... (SQLAlchemy) -> postgresql://... (libpq, psycopg)."""
    assert sqlalchemy_url.startswith("postgresql+psycopg://")
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)


_databases_seen: set[str] = set()


@pytest.mark.postgres
def test_server_is_postgresql(postgres_url: str) -> None:
    with psycopg.connect(_libpq_url(postgres_url)) as conn:
        row = conn.execute("SELECT version(), current_database()").fetchone()
    assert row is not None
    version, database = row
    assert version.startswith("PostgreSQL "), version
    assert int(version.split()[1].split(".")[0]) >= 13, version
    assert postgres_url.endswith(f"/{database}")


@pytest.mark.postgres
@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_database(postgres_url: str, run: int) -> None:
    # Both runs expect an empty database and leave a table behind: were the
    # database shared between tests, whichever ran second would see the table.
    with psycopg.connect(_libpq_url(postgres_url)) as conn:
        database = conn.execute("SELECT current_database()").fetchone()
        assert database is not None
        assert database[0] not in _databases_seen
        _databases_seen.add(database[0])
        exists = conn.execute("SELECT to_regclass('public.isolation_probe')").fetchone()
        assert exists == (None,)
        conn.execute("CREATE TABLE isolation_probe (run integer)")
        conn.execute("INSERT INTO isolation_probe VALUES (%s)", (run,))


@pytest.mark.postgres
def test_drop_database_terminates_open_connections(postgres_server: PostgresServer) -> None:
    name = f"drop_me_{uuid.uuid4().hex[:10]}"
    postgres_server.create_database(name)
    leftover = psycopg.connect(postgres_server.conninfo(name))
    try:
        postgres_server.drop_database(name)
        with postgres_server.connect() as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchall()
        assert found == []
        assert leftover.closed or leftover.broken or not _alive(leftover)
    finally:
        leftover.close()


def _alive(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def test_db_url_contract(db_url: str) -> None:
    """The same test runs against SQLite and PostgreSQL through SQLAlchemy."""
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE probe (id integer PRIMARY KEY, name varchar(20))"))
            conn.execute(sa.text("INSERT INTO probe VALUES (1, 'job')"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT name FROM probe")).scalar_one() == "job"
        assert engine.dialect.name in {"sqlite", "postgresql"}
    finally:
        engine.dispose()
