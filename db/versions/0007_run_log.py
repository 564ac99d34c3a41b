"""run_log: task output kept in the database, in chunks (remote workers' logs); the
worker's problems with it (log_problems, log_problem)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08 10:00:00

Hand-written and self-contained (no imports from jobcontrol): a migration
describes the schema as it was at this revision, whatever the code says later.
A run whose worker streams its output here has ``log_path`` = ``db:``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_log",
        sa.Column("run_id", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("seq", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("pos", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_run_log"),
    )
    with op.batch_alter_table("worker") as batch:
        batch.add_column(
            sa.Column("log_problems", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("log_problem", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("log_problem")
        batch.drop_column("log_problems")
    op.drop_table("run_log")
