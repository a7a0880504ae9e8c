"""Shared test fixtures."""

from pathlib import Path

import pytest

#: The shared data sets live next to the repository, never inside it.
SHARED_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir():
    """Path of ``<repo>/../shared/data``; skips the test when it is missing."""
    if not SHARED_DATA_DIR.is_dir():
        pytest.skip(f"../shared/data not found: {SHARED_DATA_DIR}")
    return SHARED_DATA_DIR
