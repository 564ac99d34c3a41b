"""An audit entry's operation holds a refused request's whole path (PostgreSQL)

Revision ID: 0014
Revises: 0013
Create Date: 2027-01-01 10:00:00

Hand-written and self-contained (no imports from jobcontrol).

A refused request is audited as its method and path (``POST /api/v1/jobs/<name>/run``),
which ``audit.operation`` (``varchar(32)``) could not hold for a job name of ten
characters or more, a lane route, or a run id from 1000 on: PostgreSQL refused the
entry and the refusal went unaudited (SQLite does not enforce the length). The column
is ``text`` now; the engine cuts a path past 500 characters, saying how much. On SQLite
the declared type changes with a copy of the table (its rows kept, ids included).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.alter_column(
            "operation", existing_type=sa.String(length=32), type_=sa.Text(), existing_nullable=False
        )


def downgrade() -> None:
    # Entries longer than the old column are cut to it, as the old column would have.
    op.execute("UPDATE audit SET operation = substr(operation, 1, 32)")
    with op.batch_alter_table("audit") as batch:
        batch.alter_column(
            "operation", existing_type=sa.Text(), type_=sa.String(length=32), existing_nullable=False
        )
