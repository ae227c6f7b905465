"""The end-to-end tests' repository fixture, shared by test_audit.py and test_planted_contenders.py."""

import pytest


@pytest.fixture
def repo(tmp_path):
    """A git repository of the harness, the audit and a planted contender (``test_audit.Repo``)."""
    from test_audit import Repo

    return Repo(tmp_path / "repo")
