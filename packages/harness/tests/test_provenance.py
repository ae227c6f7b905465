"""Which commit a report names: git's, or the sender's for a copied tree (no .git, or a stale one)."""

import subprocess

import pytest

from kernellab.harness import provenance


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                   check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def test_clean_checkout_names_its_own_commit_whatever_the_environment_says(checkout, monkeypatch):
    monkeypatch.setenv("KERNELLAB_GIT_COMMIT", "f" * 40)
    state = provenance.git_state(checkout)
    assert state["dirty"] is False and state["commit"] != "f" * 40 and "from_environment" not in state


def test_stale_git_of_a_copied_tree_gives_way_to_the_stated_commit(checkout, monkeypatch):
    local = provenance.git_state(checkout)["commit"]
    (checkout / "a.py").write_text("x = 2\n")  # the copy brought newer files over an old .git
    monkeypatch.setenv("KERNELLAB_GIT_COMMIT", "e" * 40)
    monkeypatch.setenv("KERNELLAB_GIT_DIRTY", "0")
    state = provenance.git_state(checkout)
    assert state["commit"] == "e" * 40 and state["dirty"] is False and state["from_environment"]
    assert state["local_git"] == {"commit": local, "dirty": True}


def test_without_a_stated_commit_a_dirty_checkout_says_so(checkout, monkeypatch):
    monkeypatch.delenv("KERNELLAB_GIT_COMMIT", raising=False)
    (checkout / "a.py").write_text("x = 3\n")
    state = provenance.git_state(checkout)
    assert state["dirty"] is True and "from_environment" not in state


def test_tree_without_git_takes_the_stated_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELLAB_GIT_COMMIT", "d" * 40)
    monkeypatch.delenv("KERNELLAB_GIT_DIRTY", raising=False)
    state = provenance.git_state(tmp_path)
    assert state["commit"] == "d" * 40 and state["dirty"] is None
