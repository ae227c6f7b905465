"""The gpu-norm contenders bind without a GPU: what they refuse, and that `compile` cannot quietly
become eager torch after dynamo's recompile limit."""

import types

import pytest
import torch

from kernellab.harness.case import Unsupported
from kernellab.kernels import bench


def _problem(op="softmax", device="cuda", dtype="fp32"):
    return types.SimpleNamespace(op=op, device=device, dtype=dtype, name=f"{op}_4x8_{dtype}", shape=(4, 8),
                                 params={"eps": 1e-6}, control=lambda i, o: {"y": torch.softmax(i["x"], -1)})


def test_compile_raises_the_recompile_limit_and_refuses_eager_fallback():
    # config.patch, not monkeypatch: monkeypatch's undo deletes dynamo config entries (they are not in the
    # module's __dict__), which breaks every later torch.compile in the process.
    config = torch._dynamo.config
    overrides = {"recompile_limit": 8}
    if hasattr(config, "fail_on_recompile_limit_hit"):
        overrides["fail_on_recompile_limit_hit"] = False
    with config.patch(**overrides):
        bench._compile_call(_problem())
        assert config.recompile_limit >= bench.RECOMPILE_LIMIT
        if hasattr(config, "fail_on_recompile_limit_hit"):
            assert config.fail_on_recompile_limit_hit
    assert hasattr(config, "recompile_limit"), "the patch must leave the entry in place"


def test_the_compiled_control_leaves_no_thread_behind():
    """The harness fails a case whose contender leaves a thread running; torch.compile's first call must not
    (compiled here for CPU tensors: the same Inductor compile path as on the GPU)."""
    import threading

    with torch._inductor.config.patch(compile_threads=torch._inductor.config.compile_threads,
                                      force_disable_caches=True):  # a cached artifact would compile nothing
        call = bench._compile_call(_problem())
        before = set(threading.enumerate())
        x = torch.randn(4, 8)
        torch.testing.assert_close(call({"x": x}, {})["y"], torch.softmax(x, -1))
        left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not left, f"threads left by the first compiled call: {left}"


@pytest.mark.parametrize("bind", [bench._compile_call, bench._quack_call, bench._cute_call])
@pytest.mark.parametrize("problem", [_problem(device="cpu"), _problem(op="copy"), _problem(dtype="fp64"),
                                     _problem(op="linear_forward")])
def test_gpu_contenders_refuse_what_they_cannot_run(bind, problem):
    with pytest.raises(Unsupported):
        bind(problem)
