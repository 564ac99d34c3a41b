"""initial schema: jobs, runs, meta

Revision ID: 0001
Revises: 
Create Date: 2026-11-22 02:03:17.511576
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    
    op.create_table('jc_meta',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_jc_meta'))
    )
    op.create_table('job',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=True),
    sa.Column('parent_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('job_order', sa.Integer(), nullable=False),
    sa.Column('command', sa.Text(), nullable=True),
    sa.Column('timer', sa.Text(), nullable=True),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('on_error', sa.String(length=16), nullable=False),
    sa.Column('box_type', sa.String(length=16), nullable=False),
    sa.Column('exit_status', sa.Integer(), nullable=False),
    sa.Column('last_ran', sa.DateTime(), nullable=True),
    sa.Column('next_runs', sa.DateTime(), nullable=True),
    sa.Column('last_duration_ms', sa.BigInteger(), nullable=True),
    sa.Column('last_updated', sa.DateTime(), nullable=True),
    sa.Column('updated_by', sa.String(length=64), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('queue', sa.String(length=64), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('timeout_s', sa.Float(), nullable=True),
    sa.Column('max_log_files', sa.Integer(), nullable=True),
    sa.Column('misfire', sa.String(length=16), nullable=False),
    sa.Column('cwd', sa.Text(), nullable=True),
    sa.Column('env', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['parent_id'], ['job.id'], name=op.f('fk_job_parent_id_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job')),
    sa.UniqueConstraint('name', name=op.f('uq_job_name'))
    )
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_parent_id'), ['parent_id'], unique=False)

    op.create_table('run',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=True),
    sa.Column('job_name', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('parent_run_id', sa.BigInteger(), nullable=True),
    sa.Column('root_run_id', sa.BigInteger(), nullable=True),
    sa.Column('queue', sa.String(length=64), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('exit_status', sa.Integer(), nullable=True),
    sa.Column('signal', sa.Integer(), nullable=True),
    sa.Column('created', sa.DateTime(), nullable=False),
    sa.Column('started', sa.DateTime(), nullable=True),
    sa.Column('ended', sa.DateTime(), nullable=True),
    sa.Column('duration_ms', sa.BigInteger(), nullable=True),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('worker', sa.String(length=255), nullable=True),
    sa.Column('log_path', sa.Text(), nullable=True),
    sa.Column('requested_by', sa.String(length=64), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('command', sa.Text(), nullable=True),
    sa.Column('cwd', sa.Text(), nullable=True),
    sa.Column('env', sa.Text(), nullable=True),
    sa.Column('timeout_s', sa.Float(), nullable=True),
    sa.Column('max_log_files', sa.Integer(), nullable=True),
    sa.Column('kill_requested', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_run'))
    )
    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.create_index('ix_run_claim', ['state', 'queue', 'priority', 'id'], unique=False)
        batch_op.create_index('ix_run_job_history', ['job_id', 'id'], unique=False)
        batch_op.create_index('ix_run_parent', ['parent_run_id'], unique=False)

    


def downgrade() -> None:
    
    with op.batch_alter_table('run', schema=None) as batch_op:
        batch_op.drop_index('ix_run_parent')
        batch_op.drop_index('ix_run_job_history')
        batch_op.drop_index('ix_run_claim')

    op.drop_table('run')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_parent_id'))

    op.drop_table('job')
    op.drop_table('jc_meta')
    
