"""run CPU time and peak memory (from its cgroup), worker containment

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 10:00:00

Hand-written and self-contained (no imports from jobcontrol): a migration
describes the schema as it was at this revision, whatever the code says later.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("cpu_us", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("mem_peak_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("worker") as batch:
        batch.add_column(sa.Column("containment", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("containment")
    with op.batch_alter_table("run") as batch:
        batch.drop_column("mem_peak_bytes")
        batch.drop_column("cpu_us")
