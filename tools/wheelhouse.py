"""Collect every runtime wheel for a target platform and Python into one folder, for GPU hosts
that have no package index: our packages built as wheels, plus their dependencies downloaded as
binary wheels for the target. torch is left out unless asked for (GPU hosts bring their own).

    python tools/wheelhouse.py --platform manylinux_2_28_x86_64 --python 3.12 [--dest wheelhouse]
    # on the host: pip install --no-index --find-links wheelhouse kernellab-kernels[gpu] ...
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "kernellab-"


def requirements(extras: list[str], with_torch: bool) -> list[str]:
    """Third-party requirements of every package and the chosen extras, local packages left out."""
    reqs: list[str] = []
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        reqs += project.get("dependencies", [])
        for extra in extras:
            reqs += project.get("optional-dependencies", {}).get(extra, [])
    out = []
    for r in reqs:
        name = r.split(";")[0].strip()
        if name.startswith(LOCAL) or (name.startswith("torch") and not name.startswith("torch-") and not with_torch):
            continue
        if name not in out:
            out.append(name)
    return out


def expand(platform: str) -> list[str]:
    """pip matches platform tags exactly: a host of manylinux_2_N also takes every older manylinux tag."""
    prefix, _, arch = platform.partition("_2_")
    if prefix != "manylinux" or "_" not in arch:
        return [platform]
    minor, _, machine = arch.partition("_")
    tags = [f"manylinux_2_{m}_{machine}" for m in range(int(minor), 4, -1)]
    return tags + [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]


def needs_torch(wheel: Path) -> bool:
    """Whether a wheel's own requirements name torch (then its dependencies are not resolved, or
    pip would fetch a torch build the host already has)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode(errors="replace")
    return any(re.match(r"torch\b(?!-)", line.split(":", 1)[1].strip())
               for line in text.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line)


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower().replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--platform", action="append", required=True, help="pip platform tag (repeatable)")
    p.add_argument("--python", required=True, help="target Python version, e.g. 3.12")
    p.add_argument("--dest", default="wheelhouse", help="output folder (default: wheelhouse)")
    p.add_argument("--extras", default="gpu,bench,plot,ray", help="extras whose requirements to include")
    p.add_argument("--with-torch", action="store_true", help="include torch (several GB for CUDA builds)")
    args = p.parse_args(argv)
    dest = Path(args.dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for pkg in sorted(ROOT.glob("packages/*/pyproject.toml")):
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dest), str(pkg.parent)], check=True)
    reqs = requirements([e for e in args.extras.split(",") if e], args.with_torch)
    platforms = [a for plat in args.platform for tag in expand(plat) for a in ("--platform", tag)]
    download = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", args.python,
                "--implementation", "cp", *platforms, "--dest", str(dest)]
    subprocess.run([*download, "--no-deps", *reqs], check=True)
    if not args.with_torch:
        bound = {w.name.split("-")[0].lower() for w in dest.glob("*.whl") if needs_torch(w)}
        reqs = [r for r in reqs if _name(r) not in bound]
    subprocess.run([*download, *reqs], check=True)
    wheels = sorted(dest.glob("*.whl"))
    print(f"{len(wheels)} wheels in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
