"""Each package's ``__version__`` is the version it is installed as (its pyproject's): reports record the
installed version in provenance, and a module that says otherwise misleads whoever reads it."""

import importlib
import importlib.metadata
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["harness", "kernels", "megakernel", "audit"])
def test_module_version_matches_the_pyproject(package):
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
    module = importlib.import_module(f"kernellab.{package}")
    assert module.__version__ == project["version"], package
    assert importlib.metadata.version(project["name"]) == project["version"], package
