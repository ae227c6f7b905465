"""KernelLab's pytest setup, a pytest plugin (entry point ``pytest11``) so that every package's tests get
it wherever they run: in the monorepo, and from an unpacked sdist with the packages installed.

- hypothesis profiles: ``ci`` (default: quick and derandomized, so CI is repeatable) and ``thorough``
  (random, many examples); pick one with HYPOTHESIS_PROFILE.
- tests that use hypothesis get the ``property`` marker, so ``pytest -m property`` runs them all.
- tests marked ``gpu`` skip with "skipped: no CUDA device" where torch sees none.
"""


import os

import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # a package's tests without hypothesis installed
    settings = None

if settings is not None:
    settings.register_profile("ci", max_examples=25, deadline=None, print_blob=True, derandomize=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("thorough", max_examples=400, deadline=None, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with 'no CUDA device' where none")
    config.addinivalue_line("markers", "property: a hypothesis property test (added automatically)")


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    has_cuda = _cuda()
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="skipped: no CUDA device"))
