"""A run says whether its priority was set by hand (``reprioritize``)

Revision ID: 0015
Revises: 0014
Create Date: 2027-01-02 10:00:00

Hand-written and self-contained (no imports from jobcontrol).

A run waiting in the queue follows an edit of its task's priority, unless an operator
set its own with ``reprioritize``: that is kept. Telling the two apart by the run's
priority being the task's old one failed once the task was given the run's priority
and then another: the run followed the second edit. Existing rows: none by hand (no
record of it was kept).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "run",
        sa.Column("priority_by_hand", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("priority_by_hand")
