"""lane_notify: every write to the lane table is announced on PostgreSQL's ``jobcontrol`` channel

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-20 10:00:00

Hand-written and self-contained (no imports from jobcontrol). Workers follow the lane
table (poll interval, lease, caps, drained or not). A change made through Job Control
is announced by the process that made it (``store.relay``), but one made by anyone else
(an SQL session, a script, a CLI with no daemon running) reached a worker only at its
next re-read of the table, every poll interval, which was most of an idle daemon's
work. A statement-level trigger announces every committed write, whoever made it
(NOTIFY is delivered at commit, and not at all on rollback), so a worker whose listener
is connected re-reads the table when told and otherwise only as a back-up.

PostgreSQL only: SQLite has no notifications (its workers keep polling).
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The payload ``store.relay`` reads: signal ``lane_rows`` (``events.lane_rows_written``),
# no arguments and no origin (every process hears it, the writer's own included).
_FUNCTION = """
CREATE OR REPLACE FUNCTION jobcontrol_lane_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobcontrol', '{"s": "lane_rows", "k": {}}');
    RETURN NULL;
END
$$
"""

_TRIGGER = """
CREATE TRIGGER lane_notify
AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON lane
FOR EACH STATEMENT EXECUTE FUNCTION jobcontrol_lane_notify()
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_FUNCTION)
    op.execute(_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS lane_notify ON lane")
    op.execute("DROP FUNCTION IF EXISTS jobcontrol_lane_notify()")
