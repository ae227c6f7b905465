"""Every unmeasured change kept as a patch on main (``packages/*/patches/*.patch``) still applies to main's files:
a change to a file a patch touches must rebase the patch in the same commit, so none rots unnoticed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCHES = sorted(ROOT.glob("packages/*/patches/*.patch"))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_patch_applies_to_main(patch):
    got = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert got.returncode == 0, f"{patch.relative_to(ROOT)} no longer applies: {got.stderr}"


def test_each_patch_is_listed_in_its_folder_readme():
    for patch in PATCHES:
        assert f"`{patch.name}`" in (patch.parent / "README.md").read_text(), patch
