"""Alembic migrations, shipped as the package ``jobcontrol.migrations``."""
