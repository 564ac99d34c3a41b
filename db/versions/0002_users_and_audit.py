"""users and the audit trail

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:00:00

Hand-written and self-contained (no imports from jobcontrol): a migration
describes the schema as it was at this revision, whatever the code says later.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "app_user",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.Column("token_created", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_app_user"),
        sa.UniqueConstraint("name", name="uq_app_user_name"),
        sa.UniqueConstraint("token_hash", name="uq_app_user_token_hash"),
    )
    op.create_table(
        "audit",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("user_name", sa.String(length=128), nullable=False),
        sa.Column("operation", sa.String(length=32), nullable=False),
        sa.Column("jobs", sa.Text(), nullable=False),
        sa.Column("result", sa.String(length=8), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
    )
    op.create_index("ix_audit_at", "audit", ["at"], unique=False)
    op.create_index("ix_audit_user", "audit", ["user_name", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_audit_user", table_name="audit")
    op.drop_index("ix_audit_at", table_name="audit")
    op.drop_table("audit")
    op.drop_table("app_user")
