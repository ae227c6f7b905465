"""Ahead-of-time compile of every kernel variant: ``python -m kernellab.kernels.aot --arch sm_90a``.

Works without a GPU. Exits non-zero on the first compile error."""

import argparse
import sys
import time

from .gpu.compiler import compile_all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernellab.kernels.aot", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a", help="target architecture (default sm_90a)")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    names = compile_all(args.arch, log=lambda line: print(line, flush=True))
    print(f"compiled {len(names)} variants for {args.arch} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
