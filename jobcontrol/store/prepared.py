"""Statements on every task's path, compiled once and run straight on the driver.

SQLAlchemy Core spends more Python per statement (the execution context, the
compiled-cache lookup, result wrapping) than SQLite spends running it; on the
per-task path (a worker recording an end, the dispatcher reacting to it) that
was most of the engine's cost per task (bench/README.md). On PostgreSQL the same
wrapping, and psycopg's description of every column of a wide RETURNING that
Core reads for each result, were most of a worker's CPU per claim and finish
(bench/bench_claims.py). A ``Prepared`` keeps the statement written in Core,
compiles it once per dialect, applies the same bind and result processors Core
would, and runs it on the driver's connection inside the caller's transaction
(psycopg prepares it server-side once it has been run a few times).

Only for statements whose every parameter is given (no column defaults filled
in at execution). A statement with an expanding ``IN`` (its SQL depends on the
list's length) runs through Core.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from sqlalchemy import Connection, Insert, Select, Update
from sqlalchemy.sql import ColumnElement

from jobcontrol.store import wrap_error


class Rows(Protocol):
    """What both a driver cursor and a ``CursorResult`` give: enough for these statements."""

    @property
    def rowcount(self) -> int: ...

    def fetchall(self) -> Sequence[Sequence[Any]]: ...


class _Fetched(NamedTuple):
    rowcount: int
    rows: list[Any]
    cursor: Any = None  # psycopg's: its description gives the result processors' types

    def fetchall(self) -> list[Any]:
        return self.rows


class _Compiled(NamedTuple):
    sql: str
    positional: bool  # SQLite's qmark: ``slots`` in the statement's order; else by name
    # Each parameter: its name, its value when the caller gives none, its bind processor.
    slots: tuple[tuple[str, Any, Callable[[Any], Any] | None], ...]


def _compiled(compiled: Any) -> _Compiled:
    bind = {k: v for k, v in compiled._bind_processors.items() if callable(v)}
    fixed = compiled.construct_params(_check=False)
    names = compiled.positiontup or list(fixed)
    slots = tuple((name, fixed[name], bind.get(name)) for name in names)
    return _Compiled(compiled.string, compiled.positiontup is not None, slots)


class Prepared:
    """``stmt`` ready to run; ``returns``: the columns of its RETURNING (or SELECT), to
    read one row as a mapping with each column's result processing applied."""

    def __init__(
        self, stmt: Insert | Update | Select[Any], returns: Sequence[ColumnElement[Any]] = ()
    ) -> None:
        self.stmt = stmt
        self.returns = list(returns)
        # Per dialect: the compiled form, or None where it must go through Core.
        self._compiled: dict[str, _Compiled | None] = {}
        # Per dialect: each returned column's key and result processor.
        self._results: dict[str, list[tuple[str, Callable[[Any], Any] | None]]] = {}

    def _for(self, conn: Connection) -> _Compiled | None:
        dialect = conn.dialect
        try:
            return self._compiled[dialect.name]
        except KeyError:
            pass
        compiled = self.stmt.compile(dialect=dialect)
        c: _Compiled | None = None
        if not (compiled.post_compile_params or compiled.escaped_bind_names):
            c = _compiled(compiled)
        self._compiled[dialect.name] = c
        return c

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> Rows:
        c = self._for(conn)
        if c is None:
            result: Rows = conn.execute(self.stmt, dict(params))
            return result
        if c.positional:
            return _on_sqlite(conn, c.sql, _values(c, params))
        return _on_psycopg(conn, c.sql, _named(c, params))

    def execute_many(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> None:
        """The statement once per parameter set (no RETURNING)."""
        if not params:
            return
        c = self._for(conn)
        if c is None or not c.positional:
            # psycopg's executemany pipelines the sets; Core's path to it costs little
            # per set next to that.
            conn.execute(self.stmt, [dict(p) for p in params])
            return
        try:
            _sqlite(conn).executemany(c.sql, [_values(c, p) for p in params])
        except sqlite3.Error as exc:
            raise wrap_error(exc) from exc

    def first(self, conn: Connection, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first row the statement returns, as {column: value}, or None."""
        fetched = self.all(conn, params)
        return fetched[0] if fetched else None

    def all(self, conn: Connection, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every row the statement returns, each as {column: value}."""
        c = self._for(conn)
        if c is None:
            return [dict(row._mapping) for row in conn.execute(self.stmt, dict(params))]
        fetched = self.execute(conn, params)
        assert isinstance(fetched, _Fetched)
        results = self._results.get(conn.dialect.name) or self._processors(conn, fetched)
        return [
            {
                key: value if process is None else process(value)
                for (key, process), value in zip(results, raw, strict=True)
            }
            for raw in fetched.rows
        ]

    def _processors(
        self, conn: Connection, fetched: _Fetched
    ) -> list[tuple[str, Callable[[Any], Any] | None]]:
        """Each returned column's result processor, for the type the driver said it has
        (psycopg's numbers need it); read once."""
        dialect = conn.dialect
        if fetched.cursor is not None and fetched.cursor.description is not None:
            types = [d.type_code for d in fetched.cursor.description]
        else:
            types = [None] * len(self.returns)
        results: list[tuple[str, Callable[[Any], Any] | None]] = [
            (str(col.key), col.type._cached_result_processor(dialect, coltype))
            for col, coltype in zip(self.returns, types, strict=True)
        ]
        self._results[dialect.name] = results
        return results


# One comprehension each: on every statement of the per-task path, the loop that builds
# the parameters cost as much CPU as SQLite running the statement.
def _values(c: _Compiled, params: Mapping[str, Any]) -> list[Any]:
    get = params.get
    return [get(n, d) if p is None else p(get(n, d)) for n, d, p in c.slots]


def _named(c: _Compiled, params: Mapping[str, Any]) -> dict[str, Any]:
    get = params.get
    return {n: get(n, d) if p is None else p(get(n, d)) for n, d, p in c.slots}


def _sqlite(conn: Connection) -> sqlite3.Connection:
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def _on_sqlite(conn: Connection, sql: str, values: list[Any]) -> Rows:
    try:
        cursor = _sqlite(conn).execute(sql, values)
        # Every row now: a statement with RETURNING is done only once stepped to its end.
        return _Fetched(cursor.rowcount, cursor.fetchall())
    except sqlite3.Error as exc:
        raise wrap_error(exc) from exc


def _on_psycopg(conn: Connection, sql: str, values: dict[str, Any]) -> Rows:
    """On the connection's psycopg connection, in whatever transaction (or autocommit)
    the caller's block opened; a connection the error broke is invalidated, so its pool
    never hands it out again."""
    import psycopg
    from psycopg import pq

    raw = conn.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    try:
        cursor = raw.execute(sql, values)
        result = cursor.pgresult
        rows = cursor.fetchall() if result and result.status == pq.ExecStatus.TUPLES_OK else []
        return _Fetched(cursor.rowcount, rows, cursor)
    except psycopg.Error as exc:
        if raw.broken or raw.closed:
            conn.invalidate()
        raise wrap_error(exc) from exc
