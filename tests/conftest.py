"""Fixtures of the cross-package tests."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def load_tool():
    """A script of ``tools/`` loaded as a module, by name (``load_tool("stress_check")``): the scripts are
    run as files, not installed."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
