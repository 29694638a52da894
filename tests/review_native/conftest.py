"""Reuse the native suite's fixtures (the in-process fake, per-test isolation)."""

from __future__ import annotations

from tests.native.conftest import NATIVE, _native_isolation, _stop_fake_at_exit, fake  # noqa: F401

if not NATIVE:
    collect_ignore_glob = ["test_*.py"]
