#!/usr/bin/env bash
# On the GPU host, after `source .device/b/env.sh`: the megakernel report's models section (issue 33) in the three
# runs of reports/h200/models/README.md, named by the tree's commit. `decode` runs rows 1, 16, 64 of the four models
# (two reports, about 5 minutes on an H100), `large` rows 1024 and 4096 of the three small ones (about 2 minutes).
# Reports to $OUT/megakernel-models-NAME-REV.json (+ .png), each run's log beside it, its models table last.
set -u
out=${OUT:?OUT must name the folder whose files come back}
rev=$(git rev-parse --short=7 HEAD)
case "${1:-}" in
  decode) runs=("mlp8-swiglu2|mlp8*,swiglu2*|1,16,64" "mlp4-swiglu4|mlp4*,swiglu4*|1,16,64") ;;
  large) runs=("large-rows|mlp4*,mlp8*,swiglu2*|1024,4096") ;;
  *) echo "usage: bash tools/device/models_section.sh decode|large" >&2; exit 2 ;;
esac
for run in "${runs[@]}"; do
  IFS='|' read -r name cases rows <<< "$run"
  timeout 290 python3 -m kernellab.megakernel.report --rounds 3 --samples 50 --engines persistent-tc-graph \
    --shapes 1x7x13 --no-compiler --models --model-cases "$cases" --model-rows "$rows" \
    --out "$out/megakernel-models-$name-$rev.json" > "$out/megakernel-models-$name-$rev.log" 2>&1
  echo "$name: exit $?"
done
for run in "${runs[@]}"; do
  name=${run%%|*}
  grep -A40 "^models:" "$out/megakernel-models-$name-$rev.log" | grep -v "^plot:\|^wrote \|^$"
done
