"""Queries, one module per resource; keyword-only functions that take a connection."""
