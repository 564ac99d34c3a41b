"""The worker registry says how often each worker beats

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-29 10:00:00

Hand-written and self-contained (no imports from jobcontrol).

An idle worker (no run in hand, so no lease to renew) beats less often than a busy one:
a wake-up after a spell asleep is most of what an idle daemon costs. Whoever judges
whether a worker still lives (health's unserved queues, a worker starting under a
name already registered) goes by the interval the worker itself stated at its last
beat, ``beat_s``; rows without one are judged by the lease, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        batch.add_column(sa.Column("beat_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("beat_s")
