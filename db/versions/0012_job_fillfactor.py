"""The job table leaves room in its pages for updates in place (PostgreSQL)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-30 10:00:00

Hand-written and self-contained (no imports from jobcontrol).

Every run writes its job's row (the last result, the next run), and a daemon's first
start writes the schedule of every tree. None of those columns is indexed, so
PostgreSQL can keep the new row version on the same page and leave the indexes alone
(a heap-only tuple update), but only when the page has room: a table filled by a load
has none. A fill factor of 80 keeps a fifth of each new page free. Rows already
written keep their pages until the table is rewritten (``VACUUM FULL job``). SQLite has
no such setting: nothing changes there.
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job SET (fillfactor = 80)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job RESET (fillfactor)")
