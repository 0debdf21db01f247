"""Shared fixtures for agent tests: real third-party data read from ``../shared/fixtures``."""

from __future__ import annotations

from pathlib import Path

import pytest

# The fixtures are third-party data that must not be committed here; they sit next to the repo.
REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURES_DIR = REPO_ROOT.parent / "shared" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """``<repo>/../shared/fixtures``; skips (with the path it looked in) when it is missing."""
    if not FIXTURES_DIR.is_dir():
        pytest.skip(
            f"shared fixtures not found at {FIXTURES_DIR}; check out ../shared next to the repo"
        )
    return FIXTURES_DIR
