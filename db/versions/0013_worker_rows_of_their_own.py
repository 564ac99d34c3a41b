"""A worker login may change only its own registry rows and the runs it holds (PostgreSQL)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-31 10:00:00

Hand-written and self-contained (no imports from jobcontrol).

Worker logins (``jcw_NAME``, made by ``jobcontrol worker-credentials add``) are granted
per table and per column (``service/credentials.py``); rows were not limited. Tried from
outside, one worker host could forge the outcome of another's settled run, take runs
over, mark another worker stopped or lock it out of its name, and delete every stored
task log. Now:

* ``worker.login`` says which database role registered the row (``CURRENT_USER``);
* with row-level security, a worker login (a role named ``jcw_...``) inserts only rows of
  its own login and updates only those (a row from before this revision, with no login,
  once: its next registration takes it); it never deletes one;
* it updates only runs queued, queued ahead or running that are unclaimed or held by one
  of its own workers, and leaves them unclaimed or its own; a settled run is final but
  for its log being forgotten by its job's pruning (a trigger: ``jc_worker_run_guard``);
* it stores output only for its own workers' runs, and deletes only what pruning drops
  (settled runs' output past their job's newest ``max_log_files``).

Every other role is as before: the daemon's (the tables' owner) is not subject to
row-level security at all, and the policies let any role not named ``jcw_...`` through.
SQLite has no roles: only the column is added there.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# Every role credentials.role_name makes is jcw_<name>.
IS_WORKER = r"(current_user LIKE 'jcw\_%')"
OWN = "(SELECT w.name FROM worker w WHERE w.login = current_user)"
LIVE = "('pending', 'queued', 'running')"
# A run whose stored output its job's pruning drops: settled, older than its job's newest
# max_log_files (5 unless set) with a log (or running: the run whose finish prunes may
# not have said its log yet). A worker's finish prunes no more; where it would (a default
# above 5 elsewhere), the rows stay: nothing is deleted that should not be.
PRUNABLE = (
    f"(SELECT p.id FROM run p WHERE p.state NOT IN {LIVE} AND p.log_path IS NOT NULL"
    " AND (SELECT count(*) FROM run n WHERE n.job_id = p.job_id AND n.id > p.id"
    f" AND (n.log_path IS NOT NULL OR n.state IN {LIVE})) >= coalesce(p.max_log_files, 5))"
)

POLICIES = {
    "worker": [
        ("jc_read", "SELECT", "true", None),
        ("jc_insert", "INSERT", None, f"NOT {IS_WORKER} OR login = current_user"),
        (
            "jc_update",
            "UPDATE",
            f"NOT {IS_WORKER} OR login = current_user OR login IS NULL",
            f"NOT {IS_WORKER} OR login = current_user",
        ),
        ("jc_delete", "DELETE", f"NOT {IS_WORKER}", None),
    ],
    "run_log": [
        ("jc_read", "SELECT", "true", None),
        (
            "jc_insert",
            "INSERT",
            None,
            f"NOT {IS_WORKER} OR run_id IN (SELECT r.id FROM run r WHERE r.worker IN {OWN})",
        ),
        ("jc_update", "UPDATE", f"NOT {IS_WORKER}", f"NOT {IS_WORKER}"),
        ("jc_delete", "DELETE", f"NOT {IS_WORKER} OR run_id IN {PRUNABLE}", None),
    ],
}

# A row-level policy cannot compare a row before and after: a trigger says what a
# worker login may change of a run.
RUN_GUARD = f"""
CREATE FUNCTION jc_worker_run_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state NOT IN {LIVE} THEN
        -- Settled: final. Its job's pruning may forget its log, and nothing else.
        IF NEW.log_path IS NOT NULL
           OR to_jsonb(NEW) - 'log_path' <> to_jsonb(OLD) - 'log_path' THEN
            RAISE EXCEPTION 'run % is settled (%): a worker cannot change it', OLD.id, OLD.state
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSIF (OLD.worker IS NOT NULL AND OLD.worker NOT IN {OWN})
       OR (NEW.worker IS NOT NULL AND NEW.worker NOT IN {OWN}) THEN
        RAISE EXCEPTION 'run % is not held by a worker of login %', OLD.id, current_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
$$
"""


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table("worker") as batch:
        batch.add_column(
            sa.Column(
                "login",
                sa.String(63),
                nullable=True,
                server_default=sa.text("CURRENT_USER") if postgresql else None,
            )
        )
    if not postgresql:
        return
    op.execute(RUN_GUARD)
    op.execute(
        "CREATE TRIGGER jc_worker_run_guard BEFORE UPDATE ON run FOR EACH ROW "
        f"WHEN {IS_WORKER} EXECUTE FUNCTION jc_worker_run_guard()"
    )
    for table, policies in POLICIES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        for name, command, using, check in policies:
            clauses = f" USING ({using})" if using else ""
            clauses += f" WITH CHECK ({check})" if check else ""
            op.execute(f"CREATE POLICY {name} ON {table} FOR {command}{clauses}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS jc_worker_run_guard ON run")
        op.execute("DROP FUNCTION IF EXISTS jc_worker_run_guard()")
        for table, policies in POLICIES.items():
            for name, *_ in policies:
                op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("login")
