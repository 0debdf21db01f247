"""Database schema (SQLAlchemy Core tables), engine set-up and migrations glue."""
