"""Users, roles, tokens and the audit trail's store, on SQLite and PostgreSQL.

Issue 3, "Who may do what": three roles, tokens stored hashed and shown once,
the first-start admin token file, every refusal named and nothing written,
the audit listing newest first, and the migration that brings the tables.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from jobcontrol import places
from jobcontrol.errors import (
    BadRoleError,
    BadUserNameError,
    DuplicateUserError,
    UnknownUserError,
    UserError,
)
from jobcontrol.service import audit, users
from jobcontrol.service.dbcopy import head_revision
from jobcontrol.service.users import Action, Role
from jobcontrol.store import Store, alembic_config, queries, schema

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.upgrade()
    yield s
    s.dispose()


def table(store: Store, t: sa.Table) -> list[dict[str, Any]]:
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(t).order_by(t.c.id))]


# ---------------------------------------------------------------- roles

# workers:view: a viewer sees workers, lanes and the queue; workers:manage: an operator
# drains and resumes lanes and reprioritizes queued runs; an admin configures lanes.
READ_ONLY = {Action.READ, Action.VIEW_WORKERS}
OPERATE = {
    Action.RUN,
    Action.KILL,
    Action.RESTART,
    Action.ACTIVATE,
    Action.PAUSE,
    Action.MANAGE_WORKERS,
}
ADMINISTER = {
    Action.CREATE,
    Action.MODIFY,
    Action.DELETE,
    Action.MANAGE_USERS,
    Action.CONFIGURE_LANES,
}
ALLOWED = {
    Role.VIEWER: READ_ONLY,
    Role.OPERATOR: READ_ONLY | OPERATE,
    Role.ADMIN: READ_ONLY | OPERATE | ADMINISTER,
}


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("action", list(Action))
def test_each_role_may_do_exactly_what_the_issue_says(role: Role, action: Action) -> None:
    assert role.can(action) is (action in ALLOWED[role])


def test_a_change_of_active_alone_is_activate_anything_else_is_modify() -> None:
    assert Action.for_fields(["active"]) is Action.ACTIVATE
    assert Action.for_fields(["active", "timer"]) is Action.MODIFY
    assert Action.for_fields(["on_error"]) is Action.MODIFY
    assert Role.OPERATOR.can(Action.for_fields(["active"]))
    assert not Role.OPERATOR.can(Action.for_fields(["description"]))


# ---------------------------------------------------------------- tokens


def test_tokens_are_stored_hashed_and_only_the_current_one_works(store: Store) -> None:
    alice, token = users.add_user(store, "alice", "operator")
    assert token.startswith("jc_")
    assert len(token) > 40
    assert alice.role is Role.OPERATOR

    rows = table(store, schema.app_user)
    assert len(rows) == 1
    assert rows[0]["token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(rows)  # the plaintext is nowhere in the table
    assert token not in repr(table(store, schema.audit))

    found = users.authenticate(store, token)
    assert found is not None
    assert found.name == "alice"
    assert found.role is Role.OPERATOR

    fresh = users.new_token(store, "alice")
    assert fresh != token
    assert users.authenticate(store, token) is None  # the old one stops working at once
    assert users.authenticate(store, fresh) is not None
    for wrong in ("", "jc_", "jc_" + "x" * 43, fresh[:-1], fresh + "x", token.upper()):
        assert users.authenticate(store, wrong) is None, wrong


def test_last_seen_is_written_at_most_once_a_minute(store: Store) -> None:
    _, token = users.add_user(store, "bob", "viewer")
    assert users.get_user(store, "bob").last_seen is None
    users.authenticate(store, token, now=T0)
    assert users.get_user(store, "bob").last_seen == T0
    users.authenticate(store, token, now=T0 + timedelta(seconds=59))
    assert users.get_user(store, "bob").last_seen == T0
    users.authenticate(store, token, now=T0 + timedelta(seconds=61))
    assert users.get_user(store, "bob").last_seen == T0 + timedelta(seconds=61)


@pytest.mark.timeout(20)  # the store's busy timeout (30 s) would fail it: it must not wait
def test_a_token_is_accepted_at_once_while_another_process_holds_the_write_lock(
    sqlite_url: str,
) -> None:
    store = Store(sqlite_url)  # the daemon's busy timeout, 30 s
    store.upgrade()
    try:
        _, token = users.add_user(store, "bob", "viewer")
        users.authenticate(store, token, now=T0)
        blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=10)
        blocker.execute("BEGIN IMMEDIATE")  # a backup or a long maintenance transaction
        try:
            # Its last use is due to be recorded, and cannot be now: it is not, and the
            # request goes on (a status read during an outage) without waiting for the lock.
            later = T0 + timedelta(seconds=61)
            bob = users.authenticate(store, token, now=later)
            assert bob is not None
            assert bob.name == "bob"
        finally:
            blocker.rollback()
            blocker.close()
        assert users.get_user(store, "bob").last_seen == T0
        users.authenticate(store, token, now=later)  # the next request records it
        assert users.get_user(store, "bob").last_seen == later
    finally:
        store.dispose()


def test_first_start_writes_an_admin_token_0600_once(store: Store, tmp_path: Path) -> None:
    config = tmp_path / "xdg" / "jobcontrol"
    old_umask = os.umask(0)  # even a permissive umask must not make it readable
    try:
        path = users.ensure_admin_token(store, config)
    finally:
        os.umask(old_umask)
    assert path == places.token_file(config, store.url)  # this database's own file
    assert path.name.startswith("token-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    assert [p.name for p in config.iterdir()] == [path.name]  # no temporary file left
    token = places.read_token_file(path)
    assert token is not None
    admin = users.authenticate(store, token)
    assert admin is not None
    assert admin.name == "admin"
    assert admin.role is Role.ADMIN

    # Users exist: nothing is made, the file is left alone.
    assert users.ensure_admin_token(store, config) is None
    assert places.read_token_file(path) == token
    assert [u.name for u in users.list_users(store)] == ["admin"]


def test_no_admin_token_when_users_already_exist(store: Store, tmp_path: Path) -> None:
    users.add_user(store, "carol", "admin")
    assert users.ensure_admin_token(store, tmp_path / "cfg") is None
    assert not (tmp_path / "cfg").exists()


def test_default_config_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "conf"))
    assert places.default_config_dir() == tmp_path / "conf" / "jobcontrol"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert places.default_config_dir() == tmp_path / "home" / ".config" / "jobcontrol"


# ---------------------------------------------------------------- bad input

BAD = [
    ("duplicate", lambda s: users.add_user(s, "alice", "viewer", by="root"), DuplicateUserError,
     "user 'alice': a user with this name already exists", "user.add"),
    ("same name in another case", lambda s: users.add_user(s, "ALICE", "admin", by="root"),
     UserError, "user 'ALICE': user 'alice' has the same name in another case", "user.add"),
    ("unknown role", lambda s: users.add_user(s, "dave", "boss", by="root"), BadRoleError,
     "user 'dave': unknown role 'boss' (one of viewer, operator, admin)", "user.add"),
    ("empty name", lambda s: users.add_user(s, "", "viewer", by="root"), BadUserNameError,
     "user '': a user name cannot be empty", "user.add"),
    ("long name", lambda s: users.add_user(s, "x" * 65, "viewer", by="root"), BadUserNameError,
     "at most 64 characters", "user.add"),
    ("colon", lambda s: users.add_user(s, "local:eve", "viewer", by="root"), BadUserNameError,
     "user 'local:eve': a user name has letters, digits", "user.add"),
    ("remove unknown", lambda s: users.remove_user(s, "zed", by="root"), UnknownUserError,
     "user 'zed': no such user", "user.remove"),
    ("token unknown", lambda s: users.new_token(s, "zed", by="root"), UnknownUserError,
     "user 'zed': no such user", "user.token"),
    ("last admin", lambda s: users.remove_user(s, "root-admin", by="root"), UserError,
     "user 'root-admin': the last admin cannot be removed", "user.remove"),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_user_requests_are_refused_named_and_audited(store: Store, case: Any) -> None:
    _, request, error, words, operation = case
    users.add_user(store, "alice", "operator")
    users.add_user(store, "root-admin", "admin")
    before = table(store, schema.app_user)

    with pytest.raises(error) as refused:
        request(store)

    assert words in str(refused.value)
    assert table(store, schema.app_user) == before  # nothing written
    [entry] = audit.list_entries(store)
    assert (entry.user, entry.operation, entry.result) == ("root", operation, "refused")
    assert entry.detail == str(refused.value)


def test_user_management_is_audited_without_tokens(store: Store) -> None:
    _, token = users.add_user(store, "alice", "viewer", by="local:root")
    token2 = users.new_token(store, "alice", by="local:root")
    users.add_user(store, "boss", "admin", by="local:root")
    users.remove_user(store, "alice", by="boss")
    entries = audit.list_entries(store)
    assert [(e.user, e.operation, e.result) for e in entries] == [
        ("boss", "user.remove", "ok"),
        ("local:root", "user.add", "ok"),
        ("local:root", "user.token", "ok"),
        ("local:root", "user.add", "ok"),
    ]
    assert "'alice'" in entries[0].detail
    assert "viewer" in entries[-1].detail
    raw = repr(table(store, schema.audit))
    assert token not in raw
    assert token2 not in raw
    assert users.authenticate(store, token2) is None  # removed: its token is dead


def test_two_removals_at_once_cannot_remove_the_last_two_admins(store: Store) -> None:
    """Both removals start while a slow transaction holds the user table: each counted two
    admins before a lock, so both deleted and no admin was left (PostgreSQL)."""
    users.add_user(store, "alice", "admin")
    users.add_user(store, "bob", "admin")
    if store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's write transaction holds the whole database: nothing to race")
    outcomes: dict[str, str] = {}

    def remove(name: str) -> None:
        try:
            users.remove_user(store, name, by="root")
            outcomes[name] = "removed"
        except UserError as exc:
            outcomes[name] = str(exc)

    holder = store.engine.connect()
    try:
        held = holder.begin()
        holder.exec_driver_sql("LOCK TABLE app_user IN SHARE ROW EXCLUSIVE MODE")
        threads = [threading.Thread(target=remove, args=(n,)) for n in ("alice", "bob")]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        waiting = 0
        while waiting < 2 and time.monotonic() < deadline:  # both held up by a lock
            with store.engine.connect() as look:
                waiting = look.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).scalar_one()
            threading.Event().wait(0.02)
        assert waiting == 2, "both removals should wait on the held table"
        held.commit()
    finally:
        holder.close()
    for t in threads:
        t.join(timeout=20)

    assert sorted(outcomes.values())[0] == "removed"
    assert "the last admin cannot be removed" in sorted(outcomes.values())[1]
    assert [u.name for u in users.list_users(store) if u.role == Role.ADMIN] != []


def test_a_long_refused_request_and_odd_text_are_audited_and_read_back(store: Store) -> None:
    """A refusal is recorded as its path, which the column once cut at 32 characters
    (PostgreSQL refused the entry); a job name with a lone half of a surrogate pair made
    every page that held it fail to encode."""
    path = "POST /api/v1/jobs/nightly-backup-of-the-warehouse/run"
    audit.record(store, "vic", path, ["nightly-backup-of-the-warehouse"], "refused", "no")
    audit.record(store, "vic", "POST /api/v1/jobs", ["\ud800x"], "refused", "bad \udfff")
    audit.record(store, "vic", "POST /api/v1/jobs/" + "n" * 2000 + "/run", [], "refused", "")

    longest, odd, first = audit.list_entries(store)
    assert first.operation == path
    assert odd.jobs == ["\\ud800x"]
    assert odd.detail == "bad \\udfff"
    assert json.loads(json.dumps(odd.as_dict(), ensure_ascii=False).encode("utf-8"))
    assert longest.operation.startswith("POST /api/v1/jobs/nnn")
    assert longest.operation.endswith("(1522 more characters)")


# ---------------------------------------------------------------- audit listing


def test_audit_lists_newest_first_in_pages_and_filters(store: Store) -> None:
    odd = "50%_off\\"  # LIKE wildcards and a backslash are matched literally
    for i in range(7):
        jobs = ["a", odd] if i == 3 else [f"job{i}"]
        audit.record(store, "ann" if i % 2 else "ben", "jobs.modify", jobs, "ok", f"entry {i}")

    first = audit.list_entries(store, limit=3)
    assert [e.detail for e in first] == ["entry 6", "entry 5", "entry 4"]
    second = audit.list_entries(store, limit=3, before_id=first[-1].id)
    assert [e.detail for e in second] == ["entry 3", "entry 2", "entry 1"]
    last = audit.list_entries(store, limit=3, before_id=second[-1].id)
    assert [e.detail for e in last] == ["entry 0"]
    assert audit.list_entries(store, limit=3, before_id=last[-1].id) == []

    assert [e.detail for e in audit.list_entries(store, user="ann")] == [
        "entry 5",
        "entry 3",
        "entry 1",
    ]
    [hit] = audit.list_entries(store, job=odd)
    assert hit.jobs == ["a", odd]
    assert hit.detail == "entry 3"
    assert audit.list_entries(store, job="50") == []
    assert audit.list_entries(store, job="50%") == []
    assert [e.detail for e in audit.list_entries(store, job="job2")] == ["entry 2"]
    assert first[0].at.tzinfo is not None
    assert first[0].as_dict()["jobs"] == ["job6"]


# ---------------------------------------------------------------- migration


def test_upgrade_from_0001_keeps_the_jobs_and_adds_the_tables(db_url: str) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(db_url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0001")
        with engine.begin() as conn:
            tables = set(sa.inspect(conn).get_table_names())
            assert {"job", "run"} <= tables
            assert "audit" not in tables
            job_id = queries.insert_job(
                conn, {"name": "kept", "kind": "task", "command": "true", "version": 1}
            )
    finally:
        engine.dispose()

    store = Store(db_url)
    try:
        assert store.current_revision() == "0001"
        store.upgrade()
        assert store.current_revision() == head_revision()
        with store.read() as conn:
            kept = queries.get_job(conn, job_id)
        assert kept is not None
        assert kept.name == "kept"
        assert kept.command == "true"
        users.add_user(store, "after", "viewer", by="tester")
        assert [e.operation for e in audit.list_entries(store)] == ["user.add"]
        store.upgrade()  # idempotent
        assert store.current_revision() == head_revision()
    finally:
        store.dispose()
