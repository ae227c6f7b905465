#!/usr/bin/env bash
# On the GPU host, after `source .device/b/env.sh`: the harness's seals beside every GPU library a contender imports.
# One short run of each GPU suite (every impl, 1 round x 3 samples) in the harness's worker, then the harness's GPU
# tests; a library that changes a sealed attribute, a speed setting or leaves a thread or process refuses the cases
# after it, naming what changed (the listing first: a process left by a contender's import refuses it). Reports to
# $OUT/SUITE-REV.json (REV: the tree's commit, short), a table last.
set -u
out=${OUT:?OUT must name the folder whose files come back}
rev=$(printf %.7s "${KERNELLAB_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}")
runs=(
  "gpu-norm|rmsnorm_256x3072_bf16,copy_256x3072_bf16"
  "gpu-norm-backward|rmsnorm_backward_256x3072_bf16,rmsnorm_train_256x3072_bf16,copy_256x3072_bf16"
  "gpu-megakernel-models|stack_1x512_fp16_mlp8*"
  "gpu-megakernel|residual_mlp_257x64x128_fp16_gelu"
)
# the listing worker imports every contender and refuses to list while a process one started runs (harness 0.11.0)
timeout 280 python3 -m kernellab.harness.cli --list > "$out/list-$rev.log" 2>&1
echo "kernellab-bench --list: exit $?"; grep -E "error|warning" "$out/list-$rev.log" | head -5
for run in "${runs[@]}"; do
  suite=${run%%|*}; cases=${run#*|}
  timeout 280 python3 -m kernellab.harness.cli --suite "$suite" --cases "$cases" --rounds 1 --samples 3 --no-plot \
    --quiet --out "$out/$suite-$rev.json" > "$out/$suite-$rev.log" 2>&1
  echo "$suite: exit $?"
done
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -o addopts="" -rfE \
  packages/harness/tests/test_timing_gpu.py > "$out/test_timing_gpu-$rev.log" 2>&1
echo "test_timing_gpu: pytest exit $?"; tail -3 "$out/test_timing_gpu-$rev.log"
# the suites' reports alone: another script's report in the same $OUT is not a suite run
python3 - "$out" "$rev" "${runs[@]%%|*}" <<'EOF'
import json, pathlib, sys
out, rev, suites = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
for path in (out / f"{suite}-{rev}.json" for suite in suites):
    if not path.exists():
        print(f"{path.name}: missing (its log says why)")
        continue
    cases = json.loads(path.read_text())["cases"]
    bad = [f"  {c['id']}: {c['status']} {c.get('reason') or ''}"[:240] for c in cases
           if c["status"] not in ("ok", "unsupported")]
    print(f"{path.name}: {len(cases)} cases, {len(cases) - len(bad)} ok or unsupported")
    print("\n".join(bad))
EOF
