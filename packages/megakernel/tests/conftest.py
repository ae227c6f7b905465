"""The ``gpu`` marker: GPU tests skip, saying "no CUDA device", where torch sees none. (The repo's
root conftest does the same for the whole monorepo; this keeps the package's tests self-contained
when run from an sdist.)"""

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with 'no CUDA device' where none")


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if not _cuda():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # CuTe DSL compiles without a GPU for this target


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="skipped: no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
