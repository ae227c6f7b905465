"""Where a report's code is now, and whether it is still the code the report measured."""

from __future__ import annotations

from pathlib import Path

from kernellab.harness import provenance
from kernellab.harness.revision import materialize


def locate(report: dict, repo: Path, workdir: Path) -> dict:
    """The tree whose files a report is checked against: the checkout itself when the report came
    from its HEAD (or names no commit), else the report's commit materialized from the repository."""
    commit = report["provenance"].get("git", {}).get("commit")
    head = provenance.git_state(repo)["commit"]
    if commit is None or commit == head:
        return {"root": str(repo), "source": "working tree", "commit": head}
    info = materialize(commit, repo, workdir)
    return {"root": info["root"], "source": f"commit {commit}", "commit": commit}


def source_changes(report: dict, root: str | Path) -> dict[str, list[str]]:
    """Files of the measured packages whose sha256 differs from the report's record, or that are
    missing, or new in a package the report measured."""
    recorded: dict[str, str] = report["provenance"].get("sources_sha256", {})
    present = provenance.source_hashes(provenance.tree_roots(root))
    measured_packages = {key.split("/", 1)[0] for key in recorded}
    return {
        "changed": sorted(k for k in recorded if k in present and present[k] != recorded[k]),
        "missing": sorted(k for k in recorded if k not in present),
        "added": sorted(k for k in present if k not in recorded and k.split("/", 1)[0] in measured_packages),
    }


def artifact_changes(recorded: dict[str, str], current: dict[str, str]) -> dict[str, list[str]]:
    """Recorded built files against the files the replay built or loaded, matched by content (a
    materialized tree may build the same file at another path) and then by path."""
    present = set(current.values())
    return {
        "unchanged": sorted(p for p, h in recorded.items() if h in present),
        "changed": sorted(p for p, h in recorded.items() if h not in present and p in current),
        "unchecked": sorted(p for p, h in recorded.items() if h not in present and p not in current),
    }
