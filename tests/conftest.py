"""Shared fixtures. Helpers used by many tests live in gfhelpers.py (importable)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


@pytest.fixture
def shared_model():
    """Path to a model in ../shared/models; skips when that folder is absent."""

    def get(name: str) -> Path:
        path = SHARED_MODELS / name
        if not path.exists():
            pytest.skip(f"{path} is not available")
        return path

    return get
