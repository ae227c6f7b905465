"""How often the A/B record calls a gain significant, on drawn samples: the interval's error where nothing changed
(``--gains 1``) and its power where something did, under noise models a machine shows.

    python3 tools/stats_coverage.py [--rounds 4,8] [--samples 5,20] [--phi 0,0.8,0.95] [--gains 1,1.03]
                                    [--trials 200] [--resamples 200] [--out PATH]

Each trial draws both sides' rounds, ``samples`` each, as log-normal times whose log follows an AR(1) process of
coefficient ``phi`` within a round (a sticky clock state, an autocorrelated load: phi 0 is independent samples),
the candidate ``gain`` times faster, and reads ``significant`` of ``stats.compare``, the harness's own record of a
pair, at its 95% level and with a comparison report's least rounds (``stats.MIN_ROUNDS``: fewer claim nothing).
The rate over the trials is printed per setting (and written as JSON with ``--out``): at gain 1 it is the
false-positive rate, which the interval promises to hold at 0.05. Seeded: every run prints the same table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random

from kernellab.harness import stats

SAMPLE_SD = 0.02  # the innovation's sd of log(time) within a round


def ar_round(rng: random.Random, samples: int, phi: float, log_level: float) -> list[float]:
    """One round of times (us) around exp(log_level) * 100, their log an AR(1) process started stationary."""
    x = rng.gauss(0.0, SAMPLE_SD / math.sqrt(1.0 - phi * phi))
    out = []
    for _ in range(samples):
        x = phi * x + rng.gauss(0.0, SAMPLE_SD)
        out.append(100.0 * math.exp(log_level + x))
    return out


def significant_rate(rounds: int, samples: int, phi: float, gain: float, trials: int, resamples: int,
                     independent: bool = False) -> float:
    """The share of ``trials`` in which ``stats.compare`` calls the gain significant, its interval allowing for the
    samples' correlation pooled over both sides as a comparison report does (``independent``: taking them as
    independent, as reports before ``interval_correlation`` did)."""
    hits = 0
    for trial in range(trials):
        rng = random.Random(f"{rounds}/{samples}/{phi}/{gain}/{trial}")
        reference = [ar_round(rng, samples, phi, math.log(gain)) for _ in range(rounds)]
        candidate = [ar_round(rng, samples, phi, 0.0) for _ in range(rounds)]
        correlation = 0.0 if independent else stats.sample_correlation(reference + candidate)
        hits += stats.compare(reference, candidate, bootstrap_seed=trial, resamples=resamples,
                              min_rounds=stats.MIN_ROUNDS, correlation=correlation)["significant"]
    return hits / trials


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x]
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"counts must be >= 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=ints, default=[4, 8])
    ap.add_argument("--samples", type=ints, default=[5, 20])
    ap.add_argument("--phi", type=floats, default=[0.0, 0.8, 0.95], help="AR(1) coefficients in [0, 1)")
    ap.add_argument("--gains", type=floats, default=[1.0, 1.03], help="reference time / candidate time, > 0")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--independent", action="store_true",
                    help="intervals that take the samples as independent (comparison reports before harness 0.12.1)")
    ap.add_argument("--out", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    if any(not 0.0 <= p < 1.0 for p in args.phi):
        ap.error(f"--phi: each coefficient must be in [0, 1), got {args.phi}")
    if any(g <= 0.0 for g in args.gains):
        ap.error(f"--gains: each gain must be > 0, got {args.gains}")
    if args.trials < 1 or args.resamples < 2:
        ap.error("--trials must be >= 1 and --resamples >= 2")
    rows = []
    print(f"{'gain':>6} {'phi':>5} {'rounds':>6} {'samples':>7}  significant")
    for gain, phi, rounds, samples in itertools.product(args.gains, args.phi, args.rounds, args.samples):
        rate = significant_rate(rounds, samples, phi, gain, args.trials, args.resamples, args.independent)
        rows.append({"gain": gain, "phi": phi, "rounds": rounds, "samples": samples, "trials": args.trials,
                     "significant_rate": rate})
        print(f"{gain:>6g} {phi:>5g} {rounds:>6} {samples:>7}  {rate:.3f}", flush=True)
    print("at gain 1 the rate is the interval's false-positive rate (promised: at most 0.05); elsewhere its power")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"sample_sd": SAMPLE_SD, "resamples": args.resamples, "independent": args.independent,
                       "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
