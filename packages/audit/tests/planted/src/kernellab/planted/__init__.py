"""A softmax contender for the cpu-ops suite with one planted behaviour (tests rewrite BEHAVIOUR): honest,
or one of the cheats the harness and the audit must catch."""

from pathlib import Path

BEHAVIOUR = "honest"


def impls():
    import torch

    from kernellab.harness.case import Impl, Unsupported

    def bind(problem):
        if problem.op != "softmax":
            raise Unsupported("planted: softmax only")
        state = {"calls": 0, "cache": {}}

        if BEHAVIOUR == "patches_the_comparison":  # every check in this process passes from now on
            from kernellab.harness import validate

            validate.compare = lambda *a, **k: {"passed": True, "outputs": {}}
        if BEHAVIOUR == "patches_its_samples":  # every sample of this process 50 times smaller
            from kernellab.harness import timing

            real = timing.measure
            timing.measure = lambda *a, **k: [s / 50 for s in real(*a, **k)]

        def call(i, o):
            x, y = i["x"], o["y"]
            state["calls"] += 1
            if BEHAVIOUR == "skips_after_first_call" and state["calls"] > 1:
                return o
            if BEHAVIOUR in ("works_when_poisoned", "patches_the_comparison") and not bool(y.isnan().any()):
                return o  # a validation poisons the outputs; a timed call, it hopes, does not
            if BEHAVIOUR == "stale_graph" and torch.cuda.is_current_stream_capturing():
                y.copy_(state["last"])  # the graph records a copy of an old answer
            elif BEHAVIOUR == "caches_by_pointer":
                key = x.data_ptr()
                if key not in state["cache"]:
                    state["cache"][key] = torch.softmax(x, dim=-1)
                y.copy_(state["cache"][key])
            elif BEHAVIOUR == "writes_input":
                x.copy_(torch.softmax(x, dim=-1))
                y.copy_(x)
            elif BEHAVIOUR == "leaves_tail_unwritten":
                y[..., :-1] = torch.softmax(x, dim=-1)[..., :-1]
            else:
                torch.softmax(x, dim=-1, out=y)
                state["last"] = y.clone()
            return o

        return call

    return [Impl("planted", bind=bind, artifacts=lambda: [str(Path(__file__))], description="planted")]
