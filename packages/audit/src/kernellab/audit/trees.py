"""Where a report's code is now, and whether it is still the code the report measured."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path, PurePosixPath

from kernellab.harness import provenance
from kernellab.harness.revision import materialize


def locate(report: dict, repo: Path, workdir: Path) -> dict:
    """The tree whose files a report is checked against: the checkout itself when the report came
    from its HEAD (or names no commit); for a report whose tree was dirty (its commit does not name
    its files then, their sha256s do), the checkout when it holds exactly those files, else the newest
    commit that does; else the report's commit, materialized from the repository."""
    git = report["provenance"].get("git", {})
    commit = git.get("commit")
    head = provenance.git_state(repo)["commit"]
    if commit is None or commit == head:
        return {"root": str(repo), "source": "working tree", "commit": head}
    recorded = report["provenance"].get("sources_sha256") or {}
    if git.get("dirty") and recorded:
        if not any(source_changes(report, repo).values()):
            return {"root": str(repo), "source": f"working tree (it holds the sources of dirty commit {commit})",
                    "commit": head}
        holder = commit_holding(recorded, repo)
        if holder:
            info = materialize(holder, repo, workdir)
            return {"root": info["root"], "source": f"commit {holder} (it holds the sources of dirty commit {commit})",
                    "commit": holder}
    info = materialize(commit, repo, workdir)
    return {"root": info["root"], "source": f"commit {commit}", "commit": commit}


def commit_holding(recorded: dict[str, str], repo: Path, depth: int = 200) -> str | None:
    """The newest of HEAD's last ``depth`` commits whose measured packages hold exactly the recorded
    source files (same names, same sha256), or None."""
    def git(*args: str, data: bytes | None = None) -> bytes:
        return subprocess.run(["git", "-C", str(repo), *args], input=data, capture_output=True, check=True).stdout

    packages = {key.split("/", 1)[0] for key in recorded}
    try:
        commits = git("rev-list", f"--max-count={depth}", "HEAD").decode().split()
    except (OSError, subprocess.CalledProcessError):
        return None
    for commit in commits:
        files = {}  # recorded key -> path in the commit
        for path in git("ls-tree", "-r", "--name-only", commit, "--", "packages").decode().splitlines():
            parts = PurePosixPath(path).parts  # packages/<dist>/src/kernellab/<package>/...
            if (len(parts) > 5 and parts[2:4] == ("src", "kernellab") and parts[4] in packages
                    and PurePosixPath(path).suffix in provenance.SOURCE_SUFFIXES and "__pycache__" not in parts):
                files["/".join(parts[4:])] = path
        if files.keys() != recorded.keys():
            continue
        if all(hashlib.sha256(git("show", f"{commit}:{files[key]}")).hexdigest() == digest
               for key, digest in recorded.items()):
            return commit
    return None


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


def artifact_changes(recorded: dict[str, str], current: dict[str, str], recorded_root: str | None = None,
                     current_root: str | None = None) -> dict[str, list[str]]:
    """Recorded built files against the files the replay built or loaded, matched by content (a
    materialized tree may build the same file at another path) and then by path, relative to each
    side's tree root where the file lies under it (a report made in another checkout names its files
    under that checkout)."""
    def relative(path: str, root: str | None) -> str:
        if root:
            try:
                return Path(path).relative_to(root).as_posix()
            except ValueError:
                pass
        return path

    present = set(current.values())
    current_paths = {relative(q, current_root) for q in current} | set(current)
    here = {p: relative(p, recorded_root) in current_paths or p in current for p in recorded}
    return {
        "unchanged": sorted(p for p, h in recorded.items() if h in present),
        "changed": sorted(p for p, h in recorded.items() if h not in present and here[p]),
        "unchecked": sorted(p for p, h in recorded.items() if h not in present and not here[p]),
    }
