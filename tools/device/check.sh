#!/usr/bin/env bash
# On the GPU host, after `source .device/b/env.sh`: one batched check per call, results under $OUT.
#   bash tools/device/check.sh tests PKG... [-- PYTEST_ARGS]   pytest -m gpu over the packages (junit XML + log),
#                                                e.g. -- -k "forced or wgmma" to run a subset
#   bash tools/device/check.sh sanitize PKG...   compute-sanitizer over every kernel of the packages ($OUT/sanitize-PKG.json)
#   bash tools/device/check.sh bench ARGS...     kernellab-bench ARGS --out $OUT (report, table, plot)
#   bash tools/device/check.sh report SANITIZE_JSON [ARGS...]
#                                                the megakernel engine report as committed (3 rounds x 50 samples:
#                                                the defaults, 5 x 200, ran past 10 minutes with torch.compile's
#                                                autotuning on a fresh host) -> $OUT/megakernel.json
#   bash tools/device/check.sh ab VARIANT_DIR [REPORT_ARGS...]
#                                                A/B of the tree (base) against the files under VARIANT_DIR (at their
#                                                repo paths; its commit in VARIANT_DIR.commit): restricted megakernel
#                                                reports run base, change, change, base (2 rounds x 20 samples; the
#                                                CUDA-core engines and torch-cublas at the nine smaller shapes unless
#                                                REPORT_ARGS say otherwise), then kernellab.megakernel.compare;
#                                                the tree's files are put back at the end -> $OUT/ab-*.json
set -u
out=${OUT:?OUT must name the folder whose files come back}
step=$1; shift
case "$step" in
  tests)
    pkgs=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do pkgs+=("$1"); shift; done
    [ $# -gt 0 ] && shift  # what follows -- goes to pytest
    for pkg in "${pkgs[@]}"; do
      timeout 500 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" -rfE "packages/$pkg/tests" \
        --junitxml="$out/$pkg-gpu.xml" "$@" > "$out/$pkg-gpu.log" 2>&1
      echo "$pkg: pytest exit $?"; grep -E "passed|failed|error" "$out/$pkg-gpu.log" | tail -3
      grep -E "^(FAILED|ERROR)" "$out/$pkg-gpu.log" | cut -c1-300 | head -30
    done ;;
  sanitize)  # the JSON comes back; the per-tool logs only when a tool failed (few files come back)
    for pkg in "$@"; do
      work=$(mktemp -d)
      timeout 500 python3 -m "kernellab.$pkg.sanitize" --out "$work" > "$out/sanitize-$pkg.log" 2>&1; code=$?
      cp "$work/sanitize.json" "$out/sanitize-$pkg.json" 2>/dev/null
      [ $code -ne 0 ] && cp -r "$work" "$out/sanitize-$pkg-logs"
      echo "$pkg: sanitize exit $code"; tail -15 "$out/sanitize-$pkg.log"
    done ;;
  bench)
    kernellab-bench "$@" --out "$out" 2>"$out/bench.log"; code=$?
    grep -E "VALIDATION|ERROR|error" "$out/bench.log" | head -20; echo "bench exit $code" ;;
  report)
    san=${1:?report needs SANITIZE_JSON: the sanitize run whose results go into the report}; shift
    work=$(mktemp -d)
    timeout 560 python3 -m kernellab.megakernel.report --rounds 3 --samples 50 --sanitizers "$san" \
      --out "$work/megakernel.json" "$@" > "$out/report.log" 2>&1; code=$?
    cp "$work/megakernel.json" "$out/" 2>/dev/null
    echo "report exit $code"; grep -E "^round|^wrote" "$out/report.log"; tail -16 "$out/report.log" | cut -c1-250 ;;
  ab)
    var=${1:?ab needs VARIANT_DIR: the changed files at their repo paths}; shift
    [ -f "$var.commit" ] || { echo "ab: $var.commit (the change's commit) is missing" >&2; exit 2; }
    [ $# -gt 0 ] || set -- --engines conventional,persistent,persistent-global,torch-cublas \
      --shapes 1x7x13,33x32x64,129x31x47,257x64x128,1024x128x256,assessment
    base=$(mktemp -d); files=$(cd "$var" && find . -type f)
    for f in $files; do mkdir -p "$base/$(dirname "$f")"; [ -f "$f" ] && cp "$f" "$base/$f"; done
    put_back() { for f in $files; do if [ -f "$base/$f" ]; then cp "$base/$f" "$f"; else rm -f "$f"; fi; done; }
    trap put_back EXIT
    commit_a=${KERNELLAB_GIT_COMMIT:?ab needs KERNELLAB_GIT_COMMIT, the commit of the tree}; commit_b=$(cat "$var.commit")
    n=0; runs=()
    for side in a b b a; do
      n=$((n + 1)); put_back; [ $side = b ] && cp -r "$var/." ./
      if [ $side = a ]; then c=$commit_a; else c=$commit_b; fi
      KERNELLAB_GIT_COMMIT=$c timeout 200 python3 -m kernellab.megakernel.report --rounds 2 --samples 20 --no-compiler \
        --quiet --out "$out/ab-$n-${c:0:7}.json" "$@" > "/tmp/ab-$n.log" 2>&1
      echo "run $n (${c:0:7}): exit $?"; tail -1 "/tmp/ab-$n.log" | cut -c1-200; runs+=("$out/ab-$n-${c:0:7}.json")
    done
    rm -f "$out"/ab-*.png
    python3 -m kernellab.megakernel.compare "${runs[@]}" --json "$out/ab-summary.json" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
