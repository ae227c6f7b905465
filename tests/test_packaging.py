"""What each package's metadata promises is what its code needs, so that each installs and runs alone
(``nox -s wheels`` then checks it for real, from the built wheels in fresh environments)."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["harness", "kernels", "megakernel", "audit"]
VERSIONS = {f"kernellab-{p}": Version(tomllib.loads((ROOT / "packages" / p / "pyproject.toml").read_text())
                                      ["project"]["version"]) for p in PACKAGES}


def project(package: str) -> dict:
    return tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]


def requirements(package: str, extra: str | None = None) -> dict[str, Requirement]:
    listed = project(package)["dependencies"] if extra is None else project(package)["optional-dependencies"][extra]
    return {r.name: r for r in map(Requirement, listed)}


def sources(package: str) -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "packages" / package / "src").rglob("*.py")))


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_ships_the_mit_license_its_metadata_names(package):
    assert project(package)["license"] == "MIT"
    license_text = (ROOT / "packages" / package / "LICENSE").read_text()
    assert license_text == (ROOT / "LICENSE").read_text() and license_text.startswith("MIT License")
    sdist = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert "LICENSE" in sdist["targets"]["sdist"]["include"]


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_whose_console_scripts_use_the_harness_depends_on_it(package):
    """kernellab-megakernel-report imports the harness: with the harness only in an extra, ``--help``
    failed in an environment holding the package alone."""
    if project(package).get("scripts") and package != "harness" and "kernellab.harness" in sources(package):
        assert "kernellab-harness" in requirements(package), package


@pytest.mark.parametrize("package, extra", [("audit", None), ("megakernel", None), ("kernels", "bench"),
                                            ("kernels", "test")])
def test_harness_floors_are_the_release_whose_apis_the_code_calls(package, extra):
    floor = requirements(package, extra)["kernellab-harness"].specifier
    assert not floor.contains("0.4.0") and floor.contains(str(VERSIONS["kernellab-harness"])), (package, extra, floor)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_kernellab_requirement_admits_the_version_in_this_tree(package):
    listed = [*project(package)["dependencies"], *sum(project(package).get("optional-dependencies", {}).values(), [])]
    for r in map(Requirement, listed):
        if r.name in VERSIONS:
            assert r.specifier.contains(str(VERSIONS[r.name])), (package, str(r))


def test_kernels_tests_get_the_harness_they_import():
    assert "kernellab.harness" in "\n".join(p.read_text() for p in (ROOT / "packages/kernels/tests").glob("*.py"))
    assert "kernellab-harness" in requirements("kernels", "test")


@pytest.mark.parametrize("package", PACKAGES)
def test_python_floor_covers_tarfile_data_filter(package):
    """``extractall(filter="data")`` exists from Python 3.11.4: a package running revision.py (its own or
    the harness's) must not claim 3.11.0."""
    uses = 'filter="data"' in sources(package) or (package != "harness" and "kernellab-harness" in
                                                   requirements(package))
    if uses:
        floor = re.sub(r"\s*#.*", "", project(package)["requires-python"])
        assert floor == ">=3.11.4", (package, floor)


def test_the_pytest_setup_reaches_tests_run_outside_the_repo():
    """An sdist's tests have no monorepo conftest.py: the harness ships the setup as a pytest11 plugin."""
    plugins = project("harness")["entry-points"]["pytest11"]
    assert plugins == {"kernellab.harness.pytest_plugin": "kernellab.harness.pytest_plugin"}
    assert (ROOT / "packages/harness/src/kernellab/harness/pytest_plugin.py").is_file()


def test_ray_is_an_extra_of_the_harness_the_wheelhouse_and_the_tests_take():
    """--ray needs Ray on every host: an optional extra (never a plain dependency), in the wheelhouse for
    offline GPU hosts, and in the test extra so CI runs the cluster tests."""
    assert "ray" not in requirements("harness")
    assert "ray" in requirements("harness", "ray") and "nvidia-ml-py" in requirements("harness", "ray")
    assert "ray" in requirements("harness", "test")
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import wheelhouse
    finally:
        sys.path.pop(0)
    assert any(str(r).startswith("ray") for r in wheelhouse.requirements(["ray"], with_torch=False))
    default = re.search(r'"--extras", default="([^"]*)"', (ROOT / "tools" / "wheelhouse.py").read_text()).group(1)
    assert "ray" in default.split(",")
