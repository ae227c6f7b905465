"""Planted measurements: runner-shaped sides whose timings are chosen, not measured, so that the
statistics built on them (the gate, the history, the page) are tested deterministically."""

import random

from fakes import Affine, affine_suite

from kernellab.harness import assemble
from kernellab.harness import report as report_io
from kernellab.harness.case import Impl

SHAPES = ((64, 64), (256, 128))
MODES = ("e2e_latency", "e2e_throughput")


def suite():
    return affine_suite(Impl("ours", bind=lambda p: p.control), shapes=SHAPES)


def side(ours_us: float = 100.0, torch_us: float = 150.0, *, rounds: int = 5, samples: int = 20, seed: int = 0,
         commit: str = "a" * 40, dirty: bool = False, device: str = "Planted CPU") -> dict:
    """Every case at its impl's time (scaled by the shape's size), with 0.5% noise around it."""
    rng = random.Random(seed)
    problems = [Affine(s, "fp32", "cpu") for s in SHAPES]
    cases = [{"id": f"{p.name}/{impl}", "problem": p.describe(), "impl": impl, "status": "ok", "reason": None}
             for p in problems for impl in ("torch", "ours")]
    base = {"torch": torch_us, "ours": ours_us}
    data = []
    for _ in range(rounds):
        data.append({})
        for c in cases:
            scale = c["problem"]["shape"][0] * c["problem"]["shape"][1] / 4096
            data[-1][c["id"]] = {
                "passed": True, "validations": [{"inputs_unchanged": True, "outputs": {}}],
                "samples_us": {m: [base[c["impl"]] * scale * (1 + rng.uniform(-0.005, 0.005)) for _ in range(samples)]
                               for m in MODES}}
    prov = {"device": {"kind": "cpu", "name": device}, "git": {"commit": commit, "dirty": dirty}}
    return {"cases": cases, "rounds": data, "provenance": prov,
            "revision": {"revision": "working tree", "kind": "local", "commit": commit, "dirty": dirty}}


CONFIG = {"rounds": 5, "samples": 20, "warmup": 1, "iterations": 1, "seed": 0}


def run_report(**kw) -> dict:
    """A sealed run report of the planted suite."""
    return report_io.seal(assemble.run_report(suite(), CONFIG, side(**kw)))
