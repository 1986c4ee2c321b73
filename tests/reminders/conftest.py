"""Fixtures for the reminder tests: engines on the ``store`` fixture (SQLite and PostgreSQL)."""

from __future__ import annotations

from tests.engine.conftest import make_engine, other_store

__all__ = ["make_engine", "other_store"]
