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
