"""The tables. Schema changes go through Alembic (``db/``); this is the source for both."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    false,
    text,
)
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

# SQLite only auto-increments an INTEGER PRIMARY KEY, PostgreSQL wants BIGINT for ids.
Id = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC (both stores), always returned timezone-aware."""

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to the store")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # raw SQLite text, e.g. from a hand-written query
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC)

    # On SQLite each direction is one function: the conversion above plus the dialect's
    # text format ("YYYY-MM-DD HH:MM:SS.ffffff", which ``isoformat`` writes too), in place
    # of SQLite's own processor chained after it, which builds a dict per value (about a
    # twentieth of the daemon's CPU with many short tree runs, bench_many_trees).
    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)
        to_utc = self.process_bind_param

        def process(value: datetime | None) -> str | None:
            naive = to_utc(value, dialect)
            return None if naive is None else naive.isoformat(" ", "microseconds")

        return process

    def result_processor(self, dialect: Dialect, coltype: object) -> Callable[[Any], Any] | None:
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)
        from_text = self.process_result_value
        return lambda value: from_text(value, dialect)  # SQLite gives the text as it is


job = Table(
    "job",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("description", Text),
    Column("parent_id", Id, ForeignKey("job.id", ondelete="CASCADE"), index=True),
    Column("kind", String(8), nullable=False),
    Column("job_order", Integer, nullable=False, default=0),
    Column("command", Text),
    Column("timer", Text),
    Column("active", Boolean, nullable=False, default=False),
    Column("on_error", String(16), nullable=False, default="continue"),
    Column("box_type", String(16), nullable=False, default="sequence"),
    Column("exit_status", Integer, nullable=False, default=0),
    Column("last_ran", UTCDateTime),
    Column("next_runs", UTCDateTime),
    Column("last_duration_ms", BigInteger),
    Column("last_updated", UTCDateTime),
    Column("updated_by", String(64)),
    Column("version", Integer, nullable=False, default=1),
    Column("queue", String(64), nullable=False, default="default"),
    Column("priority", Integer, nullable=False, default=0),
    Column("timeout_s", Float),
    Column("max_log_files", Integer),
    Column("misfire", String(16), nullable=False, default="run-once"),
    # How many more times a task whose run failed or was lost may be run again (0: never).
    Column("retries", Integer, nullable=False, server_default="0"),
    Column("cwd", Text),
    Column("env", Text),
)

run = Table(
    "run",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    # No foreign key: history outlives the job it describes.
    Column("job_id", BigInteger),
    Column("job_name", String(200), nullable=False),
    Column("kind", String(8), nullable=False),
    Column("trigger", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("parent_run_id", BigInteger),
    Column("root_run_id", BigInteger),
    Column("queue", String(64), nullable=False, default="default"),
    Column("priority", Integer, nullable=False, default=0),
    # Set by an operator (``reprioritize``): an edit of the task's priority leaves it.
    Column("priority_by_hand", Boolean, nullable=False, default=False, server_default=false()),
    Column("exit_status", Integer),
    Column("signal", Integer),
    Column("created", UTCDateTime, nullable=False),
    Column("started", UTCDateTime),
    Column("ended", UTCDateTime),
    Column("duration_ms", BigInteger),
    Column("pid", Integer),
    Column("host", String(255)),
    Column("worker", String(255)),
    Column("log_path", Text),
    Column("requested_by", String(64)),
    Column("reason", Text),
    Column("command", Text),
    Column("cwd", Text),
    Column("env", Text),
    Column("timeout_s", Float),
    Column("max_log_files", Integer),
    Column("kill_requested", Boolean, nullable=False, default=False),
    # Until when the worker holding a running task run vouches for it (renewed by heartbeats).
    Column("lease_until", UTCDateTime),
    # A run queued ahead (state pending) becomes claimable when this run ends, and
    # with ``after_ok_only`` only when it ends with status 0.
    Column("after_run_id", BigInteger),
    Column("after_ok_only", Boolean),
    # What the task run used, from its cgroup (null without one): CPU time, peak memory.
    Column("cpu_us", BigInteger),
    Column("mem_peak_bytes", BigInteger),
    # Which attempt of its job in its tree run this run is (1-based): a retry is a new row.
    Column("attempt", Integer, nullable=False, default=1, server_default="1"),
    Index("ix_run_job_history", "job_id", "id"),
    Index("ix_run_claim", "state", "queue", "priority", "id"),
    Index("ix_run_parent", "parent_run_id"),
    Index("ix_run_worker", "worker", "state"),
    Index("ix_run_after", "after_run_id"),
    # The queued runs in claim order: on PostgreSQL a partial index of them alone
    # (migration 0008); on SQLite the ``state = 'queued'`` range of a whole index, since a
    # partial index on ``state`` made SQLite prepare again, at every execution, each
    # statement that binds a state (migration 0010).
    Index(
        "ix_run_queued", text("priority DESC"), "id", postgresql_where=text("state = 'queued'")
    ).ddl_if(dialect="postgresql"),
    Index("ix_run_state_order", "state", text("priority DESC"), "id").ddl_if(dialect="sqlite"),
)

# The output of task runs whose worker keeps it in the database (``log_path`` = ``db:``,
# a remote worker's): in chunks, each starting at byte ``pos`` of the log. No foreign
# key, as for the run's own history; pruning (``max_log_files``) deletes a run's chunks.
run_log = Table(
    "run_log",
    metadata,
    Column("run_id", BigInteger, primary_key=True, autoincrement=False),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("pos", BigInteger, nullable=False),
    Column("size", Integer, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("data", LargeBinary, nullable=False),
)

# Every worker that ever joined: the embedded one of each daemon start, and remote ones.
worker = Table(
    "worker",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    # The process's start time (clock ticks since boot, /proc/PID/stat field 22): a pid
    # alone could have been reused by now.
    Column("proc_start", BigInteger),
    Column("slots", Integer, nullable=False),
    # JSON: the slot groups, [{"queues": [...], "slots": n, "runs": [ids]}, ...]; rows from
    # before slot groups: a list of the queues served, or null (every queue).
    Column("queues", Text),
    Column("version", String(64), nullable=False),
    Column("started", UTCDateTime, nullable=False),
    Column("heartbeat", UTCDateTime, nullable=False),
    # The longest it means to go until its next beat, as it said at this one: a busy
    # worker renews leases every third of one, an idle one beats less (migration 0011).
    Column("beat_s", Float),
    Column("stopped", UTCDateTime),
    # How it contains its task runs: a cgroup, or the fallback and why (cgroups.py).
    Column("containment", Text),
    # Runs whose output met a problem on its way to the database (a spool that could not
    # be written, bytes lost), and the last such problem: said with each heartbeat.
    Column("log_problems", Integer, nullable=False, default=0, server_default="0"),
    Column("log_problem", Text),
    # The database role that registered it (PostgreSQL): a worker login may change only
    # rows of its own login and the runs their workers hold (row-level security, 0013).
    Column("login", String(63)),
)

# A run's lane is the lane row named by its queue; a queue without one is in ``default``.
lane = Table(
    "lane",
    metadata,
    Column("name", String(64), primary_key=True),  # as long as run.queue
    Column("max_slots", Integer),  # running runs of the lane across every worker; null: no cap
    Column("poll_interval_s", Float, nullable=False, default=2.0),
    # The lease of the lane's runs: a worker that stops renewing it that long loses them.
    Column("stale_timeout_s", Float, nullable=False, default=30.0),
    Column("enabled", Boolean, nullable=False, default=True),  # false: drained
    Column("stopped_at", UTCDateTime),  # STOPPED (no claims) until an operator resumes it
    Column("stopped_reason", Text),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("updated_by", String(128), nullable=False),
    CheckConstraint("max_slots IS NULL OR max_slots >= 1", name="ck_lane_max_slots"),
    CheckConstraint("poll_interval_s > 0", name="ck_lane_poll_interval_s"),
    CheckConstraint("stale_timeout_s > 0", name="ck_lane_stale_timeout_s"),
)

# A worker found dead (its runs' leases expired, or gone at start-up recovery), once per
# lane it held runs in: the dispatcher counts them to STOP a lane (README "Lanes").
worker_end = Table(
    "worker_end",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("lane", String(64), nullable=False),
    Column("worker", String(255), nullable=False),
    # The registry's start time of the worker that died (tells two lives of one name apart).
    Column("worker_started", UTCDateTime),
    Column("at", UTCDateTime, nullable=False),
    Column("runs", Text, nullable=False),  # JSON list of the run ids settled
    Index("ix_worker_end_lane_at", "lane", "at"),
)

meta = Table(
    "jc_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

app_user = Table(
    "app_user",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("role", String(16), nullable=False),
    # sha256 hex of the token; the token itself is never stored.
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("created", UTCDateTime, nullable=False),
    Column("token_created", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime),
)

audit = Table(
    "audit",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    # Longer than a user name: CLI entries are 'local:<login name>'.
    Column("user_name", String(128), nullable=False),
    # A refused request is recorded as its method and path (cut past 500 characters).
    Column("operation", Text, nullable=False),
    Column("jobs", Text, nullable=False),  # a JSON list of job names
    Column("result", String(8), nullable=False),
    Column("detail", Text, nullable=False),
    Index("ix_audit_at", "at"),
    Index("ix_audit_user", "user_name", "id"),
)
