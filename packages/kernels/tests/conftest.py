"""Pytest setup of the kernels tests. The repository's conftest.py registers the same marker (and the
hypothesis profiles); registering it here too keeps ``pytest packages/kernels/tests`` warning-free
when run from this directory alone."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with 'skipped: no CUDA device' where none")
