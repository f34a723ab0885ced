"""Fixtures for image tests: the debootstrap base image in the real engine."""

from __future__ import annotations

import pytest

from tests.fixtures.images import docker_available, ensure_base_image


@pytest.fixture(scope="session")
def docker_base_image() -> str:
    """``thaw-test-base:bookworm`` (built once with debootstrap, cached between runs)."""
    if not docker_available():
        pytest.skip("no Docker engine (make system-deps installs and starts one)")
    return ensure_base_image()
