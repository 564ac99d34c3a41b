"""retries: a job's retries, a run's attempt, and the worker ends that STOP a lane

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10 10:00:00

Hand-written and self-contained (no imports from jobcontrol): a migration
describes the schema as it was at this revision, whatever the code says later.

* ``job.retries``: how many more times a task whose run failed or was lost may be
  run again before its tree sees the failure (0: never).
* ``run.attempt``: which attempt of its job in its tree run a run is (1-based);
  every run before this revision was a first attempt.
* ``worker_end``: one row per worker found dead (its runs' leases expired, or it
  was gone at start-up recovery) per lane it held runs in; the dispatcher counts
  them to put a lane in STOPPED after repeated unexpected ends (README "Lanes").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
    op.create_table(
        "worker_end",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("lane", sa.String(length=64), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("worker_started", sa.DateTime(), nullable=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("runs", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_worker_end"),
    )
    op.create_index("ix_worker_end_lane_at", "worker_end", ["lane", "at"])


def downgrade() -> None:
    op.drop_index("ix_worker_end_lane_at", table_name="worker_end")
    op.drop_table("worker_end")
    with op.batch_alter_table("run") as batch:
        batch.drop_column("attempt")
    with op.batch_alter_table("job") as batch:
        batch.drop_column("retries")
