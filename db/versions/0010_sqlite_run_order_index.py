"""SQLite: the queued runs' claim order from a whole index, not a partial one

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-22 10:00:00

Hand-written and self-contained (no imports from jobcontrol).

A partial index whose ``WHERE`` names a column makes SQLite prepare every statement
on that table again, at each execution, when the statement compares that column with
a bound parameter: the value might let the partial index serve it. ``ix_run_queued``
(``WHERE state = 'queued'``, 0008) did that to every statement of the run queue that
binds a state (a claim, a finish, the next task's take, the dispatcher's reads and
writes): 3,000 executions of ``... WHERE after_run_id = ? AND state = ?`` were prepared
3,000 times, 6.7 us each against 2.0 us, and the take-next rule's read, with its
lane subqueries, 41 us each.

On SQLite it is replaced by ``ix_run_state_order (state, priority DESC, id)``: the
queued runs are the ``state = 'queued'`` range of it, in claim order, so a claim reads
them as it did, and no statement is prepared again. It indexes every run (like
``ix_run_claim``) rather than only the queued ones. PostgreSQL keeps the partial
index: it plans a prepared statement once for every value.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_QUEUED = sa.text("state = 'queued'")


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.drop_index("ix_run_queued", table_name="run")
    op.create_index("ix_run_state_order", "run", ["state", sa.text("priority DESC"), "id"])


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.drop_index("ix_run_state_order", table_name="run")
    op.create_index("ix_run_queued", "run", [sa.text("priority DESC"), "id"], sqlite_where=_QUEUED)
