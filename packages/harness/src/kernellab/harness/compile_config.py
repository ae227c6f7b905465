"""torch.compile set up the way a measured contender needs it, for every suite that times a compiled impl.

- Each case is a recompile of one function (a shape, a dtype, an activation): past dynamo's default limit of 8
  it would run later cases eagerly and time torch under the compiled impl's name, so the limit is raised and
  reaching it is an error, never a silent fallback.
- Inductor's first compile starts Python threads that stay alive (its compile worker pool, tqdm's monitor),
  and the harness fails a case whose contender leaves threads running (``threads``): it compiles in the calling
  thread, with no monitor, so the first compiled case is measured like every later one.
"""

from __future__ import annotations


def for_contenders(recompile_limit: int) -> None:
    """Apply both settings (idempotent; a limit already higher is kept)."""
    import torch

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), recompile_limit))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True
    torch._inductor.config.compile_threads = 1
    try:
        import tqdm
    except ImportError:
        return
    tqdm.tqdm.monitor_interval = 0
