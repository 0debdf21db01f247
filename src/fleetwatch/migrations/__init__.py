"""Alembic environment and revisions, shipped in the wheel: `fleetwatch db upgrade` anywhere."""
