"""A whole database into another (``jobcontrol db copy``), and a SQLite online backup.

The copy takes every table of the schema (``schema.metadata``: jobs, runs, workers,
users with their token hashes, the audit trail), keeping every id, from
one read snapshot of the source into one transaction on the target, so the target ends
with all of it or nothing. The target must be empty: a new SQLite file, a database with
no tables (made by ``createdb``), or one that ``jobcontrol db upgrade`` just prepared.
On PostgreSQL the id sequences are then set past the copied ids. Keeping a daemon off
both databases meanwhile is the caller's (``DatabaseLease``): this module is below it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Table, func, select, text, update

from jobcontrol.errors import JobControlError
from jobcontrol.store import Store, redact, schema

BATCH = 2000  # rows read and written at a time


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from jobcontrol.store import alembic_config

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def check_source(source: Store) -> None:
    """The source has the newest schema (older ones would need their columns mapped)."""
    revision = source.current_revision()
    if revision is None:
        raise JobControlError(f"{redact(source.url)} has no Job Control schema: nothing to copy")
    if revision != head_revision():
        raise JobControlError(
            f"{redact(source.url)} is at schema revision {revision}, not {head_revision()}: "
            "run `jobcontrol db upgrade` on it first (nothing was copied)"
        )


def target_problem(target: Store) -> str | None:
    """Why ``target`` cannot receive a copy, or None when it is empty. Read-only: a
    SQLite file is looked at through a read-only connection, so even its journal mode
    stays as it was."""
    where = redact(target.url)
    path = target.sqlite_file
    if path is not None:
        if os.path.islink(path):  # the copy would be written wherever it points
            return f"{path} is a symbolic link: give the database file itself"
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            return None
        uri = f"{Path(path).resolve().as_uri()}?mode=ro"
        try:
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as raw:
                return _contents_problem(where, lambda sql: raw.execute(sql).fetchall(), _TABLES)
        except sqlite3.DatabaseError as exc:
            return f"{path} is not a usable SQLite database ({exc})"
    with target.engine.connect() as conn:
        return _contents_problem(where, lambda sql: list(conn.execute(text(sql))), _PG_TABLES)


def _contents_problem(where: str, query: Callable[[str], list[Any]], tables_sql: str) -> str | None:
    tables = {str(row[0]) for row in query(tables_sql)}
    if not tables:
        return None
    ours = {t.name for t in schema.metadata.sorted_tables} | {"alembic_version"}
    others = sorted(tables - ours)
    if others:
        return f"{where} holds tables that are not Job Control's ({', '.join(others[:5])})"
    found = query("SELECT version_num FROM alembic_version") if "alembic_version" in tables else []
    revision = str(found[0][0]) if found else None
    if revision != head_revision() or tables != ours:
        return (
            f"{where} is at schema revision {revision}, not {head_revision()}: "
            "give an empty database, or run `jobcontrol db upgrade` on it"
        )
    held = {
        t.name: int(query(f"SELECT COUNT(*) FROM {t.name}{_NOT_SEEDED.get(t.name, '')}")[0][0])
        for t in schema.metadata.sorted_tables
        if t is not schema.meta
    }
    rows = {name: count for name, count in held.items() if count}
    if rows:
        listed = ", ".join(f"{count} in {name}" for name, count in rows.items())
        return f"{where} is not empty ({listed}): the copy goes only into an empty database"
    return None


# Rows `db upgrade` itself puts in an empty database: they do not make it "not empty",
# and the copy replaces them with the source's (the instance id, the default lane).
_NOT_SEEDED = {"lane": " WHERE name <> 'default'"}
_REPLACED = {schema.meta.name, schema.lane.name}

_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
_PG_TABLES = (
    "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = ANY(current_schemas(false))"
)


def copy_database(source: Store, target: Store) -> dict[str, int]:
    """Copy every row of ``source`` into the empty ``target``; returns rows per table.

    Raises JobControlError, with the target unchanged, when the source is not at the
    newest schema or the target is not empty.
    """
    if source.url == target.url:
        raise JobControlError(f"--from and --to are the same database ({redact(source.url)})")
    check_source(source)
    problem = target_problem(target)
    if problem is not None:
        raise JobControlError(f"{problem} (nothing was copied)")
    target.upgrade()  # a new file or a database without tables; a no-op when prepared
    copied: dict[str, int] = {}
    with source.read() as src, target.write() as dst:
        for table in schema.metadata.sorted_tables:
            if table.name in _REPLACED:
                dst.execute(table.delete())  # the target's instance id and seeded lane give way
            copied[table.name] = _copy_table(src, dst, table)
        for table in schema.metadata.sorted_tables:
            found = dst.execute(select(func.count()).select_from(table)).scalar_one()
            if found != copied[table.name]:
                raise JobControlError(
                    f"copy of {table.name}: {copied[table.name]} rows written, {found} found "
                    "(nothing was copied)"
                )
        if dst.dialect.name == "postgresql":
            _reset_sequences(dst)
        # The copy is a database of its own: its id marks its task processes and names
        # their cgroup, so a daemon on one must never take the other's tasks for its own
        # leftovers (and kill them at its start).
        instance = schema.meta.c.key == "instance"
        dst.execute(update(schema.meta).where(instance).values(value=uuid.uuid4().hex))
    return copied


def _copy_table(src: Connection, dst: Connection, table: Table) -> int:
    if table is schema.job:
        return _copy_jobs(src, dst)
    pk = list(table.primary_key.columns)
    result = src.execution_options(stream_results=True).execute(select(table).order_by(*pk))
    count = 0
    for rows in result.mappings().partitions(BATCH):
        dst.execute(table.insert(), [dict(row) for row in rows])
        count += len(rows)
    return count


def _copy_jobs(src: Connection, dst: Connection) -> int:
    """Jobs parents first (a job can be moved under a box made after it), so the
    parent foreign key holds at every insert."""
    rows = [dict(row) for row in src.execute(select(schema.job)).mappings()]
    children: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        children[row["parent_id"]].append(row)
    ordered: list[dict[str, Any]] = []
    level = children[None]
    while level:
        ordered += level
        level = [child for row in level for child in children[row["id"]]]
    if len(ordered) != len(rows):
        raise JobControlError(
            f"{len(rows) - len(ordered)} jobs of the source are not under a top-level job "
            "(nothing was copied)"
        )
    for start in range(0, len(ordered), BATCH):
        dst.execute(schema.job.insert(), ordered[start : start + BATCH])
    return len(ordered)


# Ids used elsewhere that a new row must not take: a deleted job's, which its runs keep.
_ALSO_USED = {"job": "(SELECT MAX(job_id) FROM run)"}


def _reset_sequences(conn: Connection) -> None:
    """Each id sequence past the largest copied id, so new rows do not collide."""
    for table in schema.metadata.sorted_tables:
        for column in table.primary_key.columns:
            if not column.autoincrement or column.type.python_type is not int:
                continue
            also = _ALSO_USED.get(table.name, "0")
            conn.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence(:table, :column), "
                    f"GREATEST(COALESCE((SELECT MAX({column.name}) FROM {table.name}), 0), "
                    f"COALESCE({also}, 0)) + 1, false)"
                ),
                {"table": table.name, "column": column.name},
            )


def backup_sqlite(store: Store, dest: Path) -> int:
    """A consistent copy of the SQLite database ``store`` at ``dest`` (made mode 0600),
    safe while a daemon writes to it (SQLite's online backup); returns its pages."""
    path = store.sqlite_file
    if path is None:
        raise JobControlError(
            f"{redact(store.url)} is not a SQLite file: back up PostgreSQL with pg_dump "
            "(pg_dump -Fc DBNAME > FILE), which is safe while the daemon runs"
        )
    if os.path.lexists(dest):  # a symbolic link too, even one that points nowhere
        kind = "is a symbolic link" if dest.is_symlink() else "exists"
        raise JobControlError(f"{dest} {kind}: give a new file (nothing was written)")
    if not dest.parent.is_dir():
        raise JobControlError(f"{dest.parent} is not a directory (nothing was written)")
    if (problem := _others_could_redirect(dest.parent)) is not None:
        raise JobControlError(f"{problem} (nothing was written)")
    # Made here, never through a link; and whatever SQLite makes beside it (a journal)
    # is the caller's alone too.
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise JobControlError(f"{dest}: {exc.strerror} (nothing was written)") from exc
    os.close(fd)
    umask = os.umask(0o077)
    try:
        source = sqlite3.connect(path)
        with contextlib.closing(source), contextlib.closing(sqlite3.connect(dest)) as copy:
            source.execute(f"PRAGMA busy_timeout={int(store.busy_timeout * 1000)}")
            source.backup(copy)
            checked = copy.execute("PRAGMA quick_check").fetchone()[0]
            if checked != "ok":
                raise JobControlError(f"the backup at {dest} fails its check: {checked}")
            pages = int(copy.execute("PRAGMA page_count").fetchone()[0])
    except (sqlite3.Error, JobControlError) as exc:
        with contextlib.suppress(OSError):
            dest.unlink()
        if isinstance(exc, JobControlError):
            raise
        raise JobControlError(f"backup of {path} to {dest} failed: {exc}") from exc
    finally:
        os.umask(umask)
    return pages


def _others_could_redirect(directory: Path) -> str | None:
    """Why another user could swap a file made in ``directory`` for a link of theirs
    (a backup would then be written where they read it), or None. A directory of this
    user's or root's that nobody else may write to is safe; so is one with the sticky
    bit (``/tmp``), where only a file's owner may rename or remove it."""
    st = directory.stat()
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return f"{directory} belongs to another user (uid {st.st_uid}), who could redirect the file"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (
            f"{directory} may be written by others (mode {stat.S_IMODE(st.st_mode):04o}) and "
            "has no sticky bit: another user could redirect the file"
        )
    return None
