"""Shared pytest setup: hypothesis profiles and the CUDA skip.

Profiles: ``dev`` (default), ``ci`` (loaded automatically when ``CI=true``),
``nightly`` (``KVSTATE_HYPOTHESIS_PROFILE=nightly``: thousands of examples,
long step counts).  Tests never depend on the hypothesis example database.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=60, stateful_step_count=40, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci", max_examples=40, stateful_step_count=30, deadline=None, database=None,
    derandomize=True, print_blob=True, suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly", max_examples=5000, stateful_step_count=200, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_profile = os.environ.get("KVSTATE_HYPOTHESIS_PROFILE")
if _profile is None:
    _profile = "ci" if os.environ.get("CI", "").lower() == "true" else "dev"
settings.load_profile(_profile)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
