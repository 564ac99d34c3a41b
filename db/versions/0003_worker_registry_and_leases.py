"""worker registry, run leases, runs queued ahead

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 16:00:00

Hand-written and self-contained (no imports from jobcontrol): a migration
describes the schema as it was at this revision, whatever the code says later.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("proc_start", sa.BigInteger(), nullable=True),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("queues", sa.Text(), nullable=True),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("started", sa.DateTime(), nullable=False),
        sa.Column("heartbeat", sa.DateTime(), nullable=False),
        sa.Column("stopped", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_worker"),
    )
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("lease_until", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("after_run_id", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("after_ok_only", sa.Boolean(), nullable=True))
    op.create_index("ix_run_worker", "run", ["worker", "state"], unique=False)
    op.create_index("ix_run_after", "run", ["after_run_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_run_after", table_name="run")
    op.drop_index("ix_run_worker", table_name="run")
    with op.batch_alter_table("run") as batch:
        batch.drop_column("after_ok_only")
        batch.drop_column("after_run_id")
        batch.drop_column("lease_until")
    op.drop_table("worker")
