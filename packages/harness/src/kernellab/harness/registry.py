"""Suite discovery through the entry-point group ``kernellab.suites``.

Entry points name factories. One named ``<suite>`` gives a ``Suite`` (a problem family with its control impl); one
named ``<suite>.<part>`` gives an ``Impl`` or a list of them that join that suite. So the harness
never imports kernels or megakernel by name: installing a package is what adds its contenders.

In a materialized revision (a source tree that is not installed) the same table is read from
``packages/*/pyproject.toml``, so a revision's worker sees exactly that revision's suites.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import tomllib
from pathlib import Path

from . import threads
from .case import Impl, Suite, control_impl

GROUP = "kernellab.suites"
UNNAMEABLE = "/,"  # characters no impl name may hold: a case id is 'problem/impl', --impls patterns split at commas


class SuiteError(LookupError):
    """No such suite, or a suite that cannot run here; the message says which and why."""


def _entry_points_from_tree(root: Path) -> list[tuple[str, str, str]]:
    found = []
    for pyproject in sorted(root.glob("packages/*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text())
        dist = data.get("project", {}).get("name", pyproject.parent.name)
        table = data.get("project", {}).get("entry-points", {}).get(GROUP, {})
        found.extend((name, value, dist) for name, value in sorted(table.items()))
    return found


def _entry_points_installed(skip: set[str] = frozenset()) -> list[tuple[str, str, str]]:
    """Installed entry points (name, value, distribution), less those of the distributions in ``skip``."""
    out = set()
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        if _normal(dist) not in skip:
            out.add((ep.name, ep.value, dist))
    return sorted(out)


def _normal(dist: str) -> str:
    return dist.lower().replace("_", "-").replace(".", "-")


def _load(value: str):
    module, _, attr = value.partition(":")
    obj = importlib.import_module(module.strip())
    for part in attr.strip().split(".") if attr else []:
        obj = getattr(obj, part)
    if not callable(obj):
        raise SuiteError(f"entry point {value} must name a factory (a callable), got {type(obj).__name__}")
    return obj()


def entry_points(root: str | os.PathLike | None = None) -> list[tuple[str, str, str]]:
    """(name, value, distribution) of every entry point: a tree's own from its pyproject files plus those
    of installed distributions outside the ``kernellab`` namespace (contenders installed from elsewhere
    are measured, hashed and replayed like the tree's own); without a tree, the installed ones."""
    root = root or os.environ.get("KERNELLAB_SOURCE_ROOT")
    if not root:
        return _entry_points_installed()
    own = _entry_points_from_tree(Path(root))
    outside = _entry_points_installed({_normal(dist) for _, _, dist in own})
    # kernellab.* code installed elsewhere would shadow or mix with the tree's own: never taken from outside
    return own + [e for e in outside if not e[1].strip().startswith("kernellab.")]


def suite_names(root: str | os.PathLike | None = None) -> list[str]:
    """The suites' entry-point names (a suite's entry point is named as the suite), nothing imported."""
    return sorted({name for name, _, _ in entry_points(root) if "." not in name})


def discover(root: str | os.PathLike | None = None, impls: bool = True,
             names: set[str] | None = None) -> tuple[dict[str, Suite], dict[str, str]]:
    """All suites with their impls merged in (with ``impls`` False: the suites' problems and control only,
    no contender imported), and the suites that failed to load with the reason; with ``names``, only the suites
    of those names are imported (a suite's factory runs where it is loaded, in the driver too). Impl parts that
    fail to import are skipped with the reason kept in ``suite.unavailable`` (e.g. the CuTe impl on a machine
    without CuTe DSL). Each impl's ``origin`` names its entry point and distribution. A suite's entry point is
    named as the suite; one name given by two entry points is broken before either is imported (a later one had
    replaced the first silently, its control included)."""
    suites: dict[str, Suite] = {}
    broken: dict[str, str] = {}
    parts: list[tuple[str, str, str, str]] = []
    defined: dict[str, list[str]] = {}  # suite entry-point name -> the entry points of that name
    found = entry_points(root)
    for name, value, dist in found:
        if "." not in name:
            defined.setdefault(name, []).append(f"{name} = {value} ({dist})")
    for name, value, dist in found:
        base, dot, _ = name.partition(".")
        if names is not None and base not in names:
            continue
        if dot:
            parts.append((base, name, value, dist))
            continue
        if len(defined[name]) > 1:
            broken[name] = f"given by more than one entry point: {defined[name]}"
            continue
        try:
            suite = _load(value)
        except Exception as e:  # noqa: BLE001 - a suite that cannot load is reported by name, not fatal
            broken[name] = f"{type(e).__name__}: {e}"
            continue
        if not isinstance(suite, Suite):
            raise SuiteError(f"entry point {name} = {value} gives {type(suite).__name__}, not a Suite")
        if suite.name != name:  # it would stand in for the suite of its name, which its entry point never showed
            broken[name] = f"entry point {name} = {value} ({dist}) gives a suite named {suite.name!r}"
            continue
        if not any(i.name == suite.control for i in suite.impls):
            suite.impls.insert(0, control_impl())
        suite.unavailable = {}
        suites[suite.name] = suite
    for base, name, value, dist in parts if impls else []:
        if base not in suites:
            continue  # an impl for a suite this installation does not have
        try:
            contributed = threads.own(name.partition(".")[2], lambda value=value: _load(value))
        except Exception as e:  # noqa: BLE001 - one broken contender must not hide the others
            suites[base].unavailable[name.partition(".")[2]] = f"import failed: {type(e).__name__}: {e}"
            continue
        impls = contributed if isinstance(contributed, (list, tuple)) else [contributed]
        for impl in impls:
            if not isinstance(impl, Impl):
                raise SuiteError(f"entry point {name} = {value} gives {type(impl).__name__}, not an Impl")
            if not impl.name or set(impl.name) & set(UNNAMEABLE):  # a case id is 'problem/impl', patterns split at ,
                suites[base].unavailable[name.partition(".")[2]] = \
                    f"impl name {impl.name!r} is empty or holds one of {UNNAMEABLE!r}"
                continue
            if any(i.name == impl.name for i in suites[base].impls):
                raise SuiteError(f"suite {base!r} has two impls named {impl.name!r}")
            impl.origin = {"entry_point": f"{name} = {value}", "distribution": dist}
            suites[base].impls.append(impl)
    return suites, broken


def catalog_entry(suite: Suite) -> dict:
    """What the driver lists and matches of a suite a worker loaded with its impls (``revision.catalog``)."""
    return {"name": suite.name, "device": suite.device, "description": suite.description,
            "impls": [i.name for i in suite.impls], "unavailable": dict(getattr(suite, "unavailable", {})),
            "problems": [p.name for p in suite.make_problems()]}


def get(name: str, root: str | os.PathLike | None = None, impls: bool = True) -> Suite:
    suites, broken = discover(root, impls, {name})
    if name in broken:
        raise SuiteError(f"suite {name!r} failed to load: {broken[name]}")
    if name not in suites:
        raise SuiteError(f"unknown suite {name!r}; known suites: {suite_names(root) or 'none installed'}")
    return suites[name]
