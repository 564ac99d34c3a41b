"""ix_run_queued: the queued runs in claim order (priority, then oldest), and no others

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-15 10:00:00

Hand-written and self-contained (no imports from jobcontrol). A claim that serves every
queue reads the queued runs by ``priority DESC, id``; ``ix_run_claim`` leads with
``state, queue`` and cannot give that order, so without this index every claim sorted
every queued run. Partial (``state = 'queued'``): it holds only what is waiting, so it
stays small however long the history grows, on PostgreSQL and on SQLite alike.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_QUEUED = sa.text("state = 'queued'")


def upgrade() -> None:
    op.create_index(
        "ix_run_queued",
        "run",
        [sa.text("priority DESC"), "id"],
        postgresql_where=_QUEUED,
        sqlite_where=_QUEUED,
    )


def downgrade() -> None:
    op.drop_index("ix_run_queued", table_name="run")
