"""Reports assembled from synthetic round data, with the harness's own assembly: real report
structure, no timing, the same numbers every run."""

import random
import types

from kernellab.harness import assemble
from kernellab.harness import report as report_io

SUITE = types.SimpleNamespace(name="synthetic", device="cpu", control="torch", ceiling_op="copy")
CONFIG = {"rounds": 3, "samples": 4, "warmup": 0, "iterations": 1, "seed": 0, "modes": None}
MODES = ("e2e_throughput", "e2e_latency")
DEVICE = {"kind": "cpu", "name": "Synthetic CPU 9000", "cpu": "Synthetic CPU 9000", "host": "nowhere",
          "cpu_count": 2}
PROBLEMS = {  # name -> (op, time in us of torch, of ours)
    "copy_64x64_fp32": ("copy", 4.0, None),
    "softmax_64x64_fp32": ("softmax", 10.0, 5.0),
    "softmax_32x96_fp32": ("softmax", 8.0, 8.8),
}


def _problem(name: str, op: str) -> dict:
    rows, cols = (int(x) for x in name.split("_")[1].split("x"))
    return {"name": name, "op": op, "shape": [rows, cols], "dtype": "fp32", "device": "cpu", "params": {},
            "bytes": 2 * rows * cols * 4, "flops": 0}


def _validation(passed: bool) -> dict:
    out = {"passed": passed, "elements": 4096, "violations": 0 if passed else 7, "unwritten_or_nan": 0,
           "max_abs_error": 1e-7 if passed else 0.5, "max_rel_error": 1e-6, "rtol": 1e-5, "atol": 1e-6}
    return {"passed": passed, "outputs": {"y": out}, "inputs_unchanged": True, "seed": 1}


def side(seed: int, speed: float = 1.0, failing: str | None = None) -> dict:
    """One revision's measured data: torch and ``ours`` on every problem, ``speed`` times faster;
    ``failing`` names a case id whose validation fails in the second round."""
    rng = random.Random(seed)
    cases, rounds = [], [{} for _ in range(CONFIG["rounds"])]
    for name, (op, torch_us, ours_us) in PROBLEMS.items():
        for impl, base in (("torch", torch_us), ("ours", ours_us)):
            if base is None:
                continue
            cid = f"{name}/{impl}"
            cases.append({"id": cid, "problem": _problem(name, op), "impl": impl, "status": "ok", "reason": None})
            scale = 1.0 if impl == "torch" else 1.0 / speed
            for r, data in enumerate(rounds):
                passed = not (cid == failing and r == 1)
                data[cid] = {
                    "validations": [_validation(passed)],
                    "samples_us": {m: [base * scale * (1.0 + 0.05 * rng.random()) * (2.0 if m == "e2e_latency" else 1.0)
                                       for _ in range(CONFIG["samples"])] for m in MODES},
                    "passed": passed,
                }
    provenance = {"device": dict(DEVICE), "git": {"commit": f"{seed:040x}", "dirty": False},
                  "sources_sha256": {}, "artifacts_sha256": {}, "packages": {}}
    return {"cases": cases, "rounds": rounds, "provenance": provenance,
            "revision": {"revision": "synthetic", "commit": f"{seed:040x}"}}


def run_report(**kw) -> dict:
    return report_io.seal(assemble.run_report(SUITE, CONFIG, side(1, **kw)))


def comparison_report(resamples: int = 50) -> dict:
    return report_io.seal(assemble.comparison_report(SUITE, CONFIG, side(1), side(2, speed=1.25),
                                                     resamples=resamples))


def before_after_report(comparison: dict) -> dict:
    return report_io.seal(assemble.before_after_report(comparison))
