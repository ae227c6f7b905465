"""Put reports/<device>/ in its reading order, and fix every reference to a moved report.

The headline reports stay at the top of each device folder (the ones README.md of reports/ names);
experiment data moves by its name into one folder per topic (``RULES``): sweeps, profiles, launch-floor
probes, phase traces, A/B runs and the sanitize runs of earlier commits. ``megakernel-sanitize.json`` is the
sanitize run of the commit ``megakernel.json`` records; the other runs keep their commit in their names under
``sanitize-history/``. Moves use ``git mv``; then every tracked text file outside reports/ has its references
rewritten: ``reports/h200/NAME`` to the new path, and a bare ``NAME`` (or a glob or brace pattern of names
that all moved to one folder) to ``FOLDER/NAME``. Running it again moves and rewrites nothing, so after a
merge that adds reports at the top it re-applies the layout:

    python tools/reports_layout.py            # apply
    python tools/reports_layout.py --dry-run  # print the moves and the files it would rewrite
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = "tools/reports_layout.py"  # its own examples are not references
DEVICE_DIRS = ("reports/h200", "reports/h100", "reports/cpu")
RULES = (  # (shell pattern over a top-level file name, topic folder); first match wins
    ("megakernel-sweep*", "sweeps"),
    ("megakernel-profile*", "profiles"),
    ("megakernel-floor*", "floor"),
    ("megakernel-trace*", "traces"),
    ("megakernel-cuda-core-*", "ab"),
    ("megakernel-tc-*", "ab"),
    ("megakernel-sigmoid-activation-*", "ab"),
    ("megakernel-without-torch-compile-*", "ab"),
)
SANITIZE_FOLDER = "sanitize-history"  # megakernel-sanitize-<commit>.json but the headline's (sanitize_moves)
TEXT_SUFFIXES = {".md", ".py", ".sh", ".toml", ".txt", ".cfg", ".yaml", ".yml", ".ini"}
TOKEN = re.compile(r"(?<![\w/.{},*-])(?P<pre>reports/(?:h200|h100|cpu)/)?(?P<name>[\w{},*.-]+\.(?:json|png))")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def topic(name: str) -> str | None:
    return next((folder for pattern, folder in RULES if fnmatch.fnmatchcase(name, pattern)), None)


def short_commit(path: Path) -> str | None:
    """The commit a sanitize run records (7 hex digits), from its provenance."""
    try:
        prov = json.loads(path.read_text()).get("provenance") or {}
    except (OSError, json.JSONDecodeError):
        return None
    commit = (prov.get("git") or {}).get("commit") or prov.get("source_commit")
    return commit[:7] if commit else None


def sanitize_moves(device_dir: Path) -> dict[str, str]:
    """``megakernel-sanitize.json`` becomes the run of the headline report's commit; the others go to
    ``SANITIZE_FOLDER`` by commit."""
    headline = device_dir / "megakernel.json"
    if not headline.is_file():
        return {}
    wanted = (json.loads(headline.read_text()).get("source_commit") or "")[:7]
    runs = {p.name: short_commit(p) for p in sorted(device_dir.glob("megakernel-sanitize*.json"))}
    moves = {}
    current = runs.get("megakernel-sanitize.json")
    match = next((n for n, c in runs.items() if c == wanted and n != "megakernel-sanitize.json"), None)
    if match is None or current == wanted:
        return {n: f"{SANITIZE_FOLDER}/{n}" for n in runs if n != "megakernel-sanitize.json"}
    if current:
        moves["megakernel-sanitize.json"] = f"{SANITIZE_FOLDER}/megakernel-sanitize-{current}.json"
    moves[match] = "megakernel-sanitize.json"
    moves.update({n: f"{SANITIZE_FOLDER}/{n}" for n in runs if n not in moves and n != "megakernel-sanitize.json"})
    return moves


def plan(device_dir: Path) -> dict[str, str]:
    """Old name -> new path relative to the device folder, for the files at its top."""
    moves = sanitize_moves(device_dir)
    for path in sorted(device_dir.iterdir()):
        if path.is_file() and path.name not in moves and not path.name.startswith("megakernel-sanitize"):
            folder = topic(path.name)
            if folder:
                moves[path.name] = f"{folder}/{path.name}"
    return moves


def expand_braces(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


def rewrite(text: str, moves: dict[str, str], before: list[str]) -> str:
    """References to moved files rewritten; ``before`` is the device folder's top-level names before the moves."""
    def sub(m: re.Match) -> str:
        pre, name = m.group("pre") or "", m.group("name")
        if name in moves and moves[name] != name and (pre or moves[name].endswith("/" + name)):
            return pre + moves[name]
        matched = [n for p in expand_braces(name) for n in fnmatch.filter(before, p)]
        kept_names = all(moves.get(n, "").endswith("/" + n) for n in matched)  # moved, not renamed
        folders = {moves[n].rsplit("/", 1)[0] for n in matched} if kept_names else set()
        if matched and len(folders) == 1:
            return f"{pre}{folders.pop()}/{name}"
        return m.group(0)
    return TOKEN.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--dry-run", action="store_true")
    opts = args.parse_args(argv)
    tracked = git("ls-files").splitlines()
    for rel in DEVICE_DIRS:
        device_dir = ROOT / rel
        if not device_dir.is_dir():
            continue
        before = sorted(p.name for p in device_dir.iterdir() if p.is_file())
        moves = plan(device_dir)
        for old, new in sorted(moves.items(), key=lambda kv: kv[1].count("/"), reverse=True):
            print(f"{rel}/{old} -> {rel}/{new}")
        if opts.dry_run or not moves:
            continue
        staged = {}
        for old, new in moves.items():  # through a temporary name: the sanitize headline trades places
            tmp = device_dir / f".moving-{old}"
            git("mv", f"{rel}/{old}", str(tmp.relative_to(ROOT)))
            staged[tmp] = device_dir / new
        for tmp, dest in staged.items():
            dest.parent.mkdir(parents=True, exist_ok=True)
            git("mv", str(tmp.relative_to(ROOT)), str(dest.relative_to(ROOT)))
        for path in tracked:
            if path.startswith("reports/") or Path(path).suffix not in TEXT_SUFFIXES or path == SELF:
                continue
            text = (ROOT / path).read_text()
            new_text = rewrite(text, moves, before)
            if new_text != text:
                (ROOT / path).write_text(new_text)
                print(f"rewrote references in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
