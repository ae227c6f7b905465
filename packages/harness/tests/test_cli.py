import subprocess

import pytest

from kernellab.harness.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "expected a positive integer, got 0"),
    (["--samples", "many"], "expected a positive integer, got 'many'"),
    (["--warmup", "-3"], "expected an integer >= 0, got -3"),
])
def test_bad_numbers_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_suite(capsys):
    assert main(["--suite", "nonesuch"]) == 2
    assert "unknown suite 'nonesuch'; known suites: [" in capsys.readouterr().err


def test_gpu_suite_without_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["--suite", "gpu-norm"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_unknown_mode(capsys, tmp_path):
    assert main(["--suite", "cpu-ops", "--modes", "warp_speed", "--out", str(tmp_path)]) == 2
    assert "unknown modes ['warp_speed']" in capsys.readouterr().err


def test_no_matching_case(capsys, tmp_path):
    assert main(["--suite", "cpu-ops", "--cases", "nothing*", "--out", str(tmp_path)]) == 2
    assert "--cases pattern 'nothing*' matches none of ['copy_128x512_fp32', 'layernorm_128x512_fp32'" in \
        capsys.readouterr().err


def test_bad_baseline(capsys, tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"  # a checkout of its own: the test also runs from an unpacked sdist
    (checkout / "packages" / "harness").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    monkeypatch.chdir(checkout)
    code = main(["--suite", "cpu-ops", "--baseline", "no-such-rev-xyz", "--out", str(tmp_path), "--quiet"])
    assert code == 2
    assert "'no-such-rev-xyz' is neither a commit" in capsys.readouterr().err


def test_list(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "cpu-ops (cpu)" in out and "linear_backward_128x512x512_fp32" in out


def test_subcommands_dispatch_to_their_modules(tmp_path, capsys):
    assert main(["history", "list", "--store", str(tmp_path / "none.jsonl")]) == 2
    assert "history store" in capsys.readouterr().err
    assert main(["tables", str(tmp_path / "none.md")]) == 2
    assert "none.md: no such file" in capsys.readouterr().err
    assert main(["site", "--store", str(tmp_path / "none.jsonl")]) == 2
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "kernellab-bench history {index,list}" in capsys.readouterr().out


def tree(root, packages):
    """A source tree of packages, each ``(package, {entry point name: "module:factory"})``."""
    for package, points in packages:
        (root / "packages" / package).mkdir(parents=True)
        table = "".join(f'"{name}" = "{value}"\n' for name, value in points.items())
        (root / "packages" / package / "pyproject.toml").write_text(
            f'[project]\nname = "{package}"\n[project.entry-points."kernellab.suites"]\n{table}')
    return root


def test_a_suite_two_distributions_give_is_refused(tmp_path):
    """A contender's package that gives a suite of an existing suite's name (its own control inside) had replaced
    the first silently, the control with it; its factory ran in the driver before that was seen. A suite name two
    entry points give is broken before either is imported, and an entry point whose suite bears another name is
    broken too (it would stand in for that suite)."""
    import sys

    import pytest

    from kernellab.harness import registry

    (tmp_path / "planted_suite.py").write_text("raise RuntimeError('the planted suite was imported')\n"
                                               "from kernellab.harness.suites import cpu_ops\n")
    sys.path.insert(0, str(tmp_path))
    try:
        twice = tree(tmp_path / "twice", [("first", {"cpu-ops": "kernellab.harness.suites:cpu_ops"}),
                                          ("second", {"cpu-ops": "planted_suite:cpu_ops"})])
        suites, broken = registry.discover(twice, impls=False)
        renamed = tree(tmp_path / "renamed", [("first", {"cpu-ops": "kernellab.harness.suites:cpu_ops"}),
                                              ("second", {"cpu-ops-2": "kernellab.harness.suites:cpu_ops"})])
        suites_renamed, broken_renamed = registry.discover(renamed, impls=False)
    finally:
        sys.path.remove(str(tmp_path))
    assert "cpu-ops" not in suites and "more than one entry point" in broken["cpu-ops"], broken
    assert "first" in broken["cpu-ops"] and "second" in broken["cpu-ops"]  # neither imported: no RuntimeError
    with pytest.raises(registry.SuiteError, match="more than one entry point"):
        registry.get("cpu-ops", twice, impls=False)
    assert "cpu-ops" in suites_renamed and "gives a suite named 'cpu-ops'" in broken_renamed["cpu-ops-2"]


def test_an_impl_name_a_case_id_or_pattern_would_split_is_refused(tmp_path, monkeypatch):
    """A case id is 'problem/impl' and --impls patterns split at commas: an impl named 'v2/fast' had its case read
    as problem 'softmax.../v2' by the gate's selection, which then never asked for it."""
    from kernellab.harness import registry

    tree(tmp_path, [("bad", {"cpu-ops": "kernellab.harness.suites:cpu_ops", "cpu-ops.bad": "planted_names:impls"})])
    (tmp_path / "planted_names.py").write_text(
        "from kernellab.harness.case import Impl\n\n\ndef impls():\n"
        "    return [Impl(n, bind=lambda p: p.control) for n in ('v2/fast', 'a,b', '', 'fine')]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    suites, broken = registry.discover(tmp_path, names={"cpu-ops"})
    names = [i.name for i in suites["cpu-ops"].impls]
    assert "fine" in names and not {"v2/fast", "a,b", ""} & set(names), names
    assert "holds one of '/,'" in suites["cpu-ops"].unavailable["bad"]
