"""megatron-core in the tests: an autouse fixture that skips a test module without it, or fails under ``CI=true``
(CI installs it with scripts/setup.sh, so a missing package there is a defect, not a skip)."""

from __future__ import annotations

import os

import pytest


def require_megatron_core() -> None:
    """Skip (fail under CI) unless megatron-core and its released hybrid-CP scheduler import."""
    from dynacp.integration import megatron_core as mc

    try:
        mc.released_scheduler_class()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture(autouse=True)
def megatron_core_installed() -> None:
    """Import this fixture into a test module to apply :func:`require_megatron_core` to each of its tests."""
    require_megatron_core()
