"""lanes: a cluster-wide slot cap, poll interval, lease length and drain switch per queue

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06 10:00:00

Hand-written and self-contained (no imports from jobcontrol): a migration
describes the schema as it was at this revision, whatever the code says later.
The lane ``default`` is seeded here, so a new database (``upgrade`` runs every
revision in turn) and an upgraded one both have it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    lane = op.create_table(
        "lane",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("max_slots", sa.Integer(), nullable=True),
        sa.Column("poll_interval_s", sa.Float(), nullable=False, server_default="2.0"),
        sa.Column("stale_timeout_s", sa.Float(), nullable=False, server_default="30.0"),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("stopped_at", sa.DateTime(), nullable=True),
        sa.Column("stopped_reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.CheckConstraint("max_slots IS NULL OR max_slots >= 1", name="ck_lane_max_slots"),
        sa.CheckConstraint("poll_interval_s > 0", name="ck_lane_poll_interval_s"),
        sa.CheckConstraint("stale_timeout_s > 0", name="ck_lane_stale_timeout_s"),
        sa.PrimaryKeyConstraint("name", name="pk_lane"),
    )
    op.bulk_insert(
        lane,
        [
            {
                "name": "default",
                "max_slots": None,
                "poll_interval_s": 2.0,
                "stale_timeout_s": 30.0,
                "enabled": True,
                "updated_at": datetime.now(UTC).replace(tzinfo=None),
                "updated_by": "jobcontrol",
            }
        ],
    )


def downgrade() -> None:
    op.drop_table("lane")
