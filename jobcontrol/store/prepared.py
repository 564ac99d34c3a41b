"""Statements on every task's path, compiled once and run straight on SQLite's driver.

SQLAlchemy Core spends more Python per statement (the execution context, the
compiled-cache lookup, result wrapping) than SQLite spends running it; on the
per-task path (a worker recording an end, the dispatcher reacting to it) that
was most of the engine's cost per task (bench/README.md). A ``Prepared`` keeps
the statement written in Core, compiles it once for SQLite, and applies the
same bind processors Core would. On PostgreSQL it is plain ``conn.execute``.

Only for statements whose every parameter is given (no column defaults filled
in at execution, no expanding ``IN``) and whose result needs no processing.
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

    def fetchall(self) -> list[Any]:
        return self.rows


class _Compiled(NamedTuple):
    sql: str
    order: tuple[str, ...]
    bind: dict[str, Callable[[Any], Any]]
    fixed: dict[str, Any]
    results: list[tuple[str, Callable[[Any], Any] | None]]


class Prepared:
    """``stmt`` ready to run; ``returns``: the columns of its RETURNING (or SELECT), to
    read one row as a mapping with each column's result processing applied."""

    def __init__(
        self, stmt: Insert | Update | Select[Any], returns: Sequence[ColumnElement[Any]] = ()
    ) -> None:
        self.stmt = stmt
        self.returns = list(returns)
        self._sqlite: _Compiled | None = None

    def _for_sqlite(self, conn: Connection) -> _Compiled:
        if self._sqlite is None:
            dialect = conn.dialect
            compiled = self.stmt.compile(dialect=dialect)
            self._sqlite = _Compiled(
                compiled.string,
                tuple(compiled.positiontup or ()),
                {k: v for k, v in compiled._bind_processors.items() if callable(v)},
                dict(compiled.construct_params(_check=False)),
                [
                    (str(col.key), col.type._cached_result_processor(dialect, None))
                    for col in self.returns
                ],
            )
        return self._sqlite

    def execute(self, conn: Connection, params: Mapping[str, Any]) -> Rows:
        if conn.dialect.name != "sqlite":
            result: Rows = conn.execute(self.stmt, dict(params))
            return result
        c = self._for_sqlite(conn)
        try:
            cursor = _driver(conn).execute(c.sql, _values(c, params))
            # Every row now: a statement with RETURNING is done only once stepped to its end.
            return _Fetched(cursor.rowcount, cursor.fetchall())
        except sqlite3.Error as exc:
            raise wrap_error(exc) from exc

    def execute_many(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> None:
        """The statement once per parameter set (no RETURNING)."""
        if not params:
            return
        if conn.dialect.name != "sqlite":
            conn.execute(self.stmt, [dict(p) for p in params])
            return
        c = self._for_sqlite(conn)
        try:
            _driver(conn).executemany(c.sql, [_values(c, p) for p in params])
        except sqlite3.Error as exc:
            raise wrap_error(exc) from exc

    def first(self, conn: Connection, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first row the statement returns, as {column: value}, or None."""
        if conn.dialect.name != "sqlite":
            row = conn.execute(self.stmt, dict(params)).first()
            return dict(row._mapping) if row is not None else None
        fetched = self.execute(conn, params).fetchall()
        return self._row(conn, fetched[0]) if fetched else None

    def all(self, conn: Connection, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every row the statement returns, each as {column: value}."""
        if conn.dialect.name != "sqlite":
            return [dict(row._mapping) for row in conn.execute(self.stmt, dict(params))]
        return [self._row(conn, raw) for raw in self.execute(conn, params).fetchall()]

    def _row(self, conn: Connection, raw: Sequence[Any]) -> dict[str, Any]:
        results = self._for_sqlite(conn).results
        return {
            key: value if process is None else process(value)
            for (key, process), value in zip(results, raw, strict=True)
        }


def _values(c: _Compiled, params: Mapping[str, Any]) -> list[Any]:
    values = []
    for name in c.order:
        value = params[name] if name in params else c.fixed[name]
        process = c.bind.get(name)
        values.append(value if process is None else process(value))
    return values


def _driver(conn: Connection) -> sqlite3.Connection:
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw
