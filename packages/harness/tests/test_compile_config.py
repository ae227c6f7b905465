import torch

from kernellab.harness import compile_config


def test_compiled_contenders_never_fall_back_and_start_no_threads():
    # config.patch, not monkeypatch: monkeypatch's undo deletes the config entries for every later compile
    dynamo, inductor = torch._dynamo.config, torch._inductor.config
    overrides = {"recompile_limit": 8}
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):
        overrides["fail_on_recompile_limit_hit"] = False
    with dynamo.patch(**overrides), inductor.patch(compile_threads=4):
        compile_config.for_contenders(300)
        assert dynamo.recompile_limit == 300 and inductor.compile_threads == 1
        if hasattr(dynamo, "fail_on_recompile_limit_hit"):
            assert dynamo.fail_on_recompile_limit_hit is True
        with dynamo.patch(recompile_limit=1000):
            compile_config.for_contenders(300)  # a higher limit is kept
            assert dynamo.recompile_limit == 1000
    assert hasattr(dynamo, "recompile_limit") and hasattr(inductor, "compile_threads")
