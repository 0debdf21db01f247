"""The Prometheus text format (0.0.4), as the hand-written renderers of /metrics write it."""

from __future__ import annotations

__all__ = ["escape_label", "family_header"]


def escape_label(value: str) -> str:
    """A Prometheus label value as the text format wants it (backslash, newline, quote)."""
    if '"' not in value and "\\" not in value and "\n" not in value:
        return value  # nearly always: names, UUIDs, models
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def family_header(name: str, kind: str, help_text: str) -> str:
    """The ``# HELP`` and ``# TYPE`` lines that open a family (each family once per page)."""
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
