#!/usr/bin/env bash
# One command over several revisions of this repository in one device call: each revision unpacked as a tree and
# selected by PYTHONPATH (its packages/*/src first), its output under $OUT/<name>/, its commit as the provenance's.
# Plain scripts only (tools/device/*.py, pytest): kernellab-bench's workers import the harness's own tree.
#   here:      bash tools/device/trees.sh pack REV...          .device/trees/<name>.zip and .commit per revision
#                                                              (name: REV with each of / ~ ^ as -)
#              bash tools/device/trees.sh patch PATCH [BASE]   a tree of BASE (default main) with PATCH applied, named
#                                                              after the patch file, its commit one made for it on
#                                                              BASE (no branch: BASE and the patch on main rebuild it)
#   GPU host:  bash tools/device/trees.sh run "CMD" NAME...    (carry .device/trees) CMD in each tree, in order
set -eu
step=${1:?pack, patch or run}; shift
trees=${KERNELLAB_TREES:-$PWD/.device/trees}  # where pack writes and run reads
case "$step" in
  pack)
    mkdir -p "$trees"
    for rev in "$@"; do
      name=${rev//[\/~^]/-}  # a plain file name (the device returns no odd characters): a/b~2 is a-b-2
      git archive --format=zip -o "$trees/$name.zip" "$rev" packages tools
      git rev-parse "$rev^{commit}" > "$trees/$name.commit"
    done
    du -sh "$trees" ;;
  patch)
    patch_file=$(realpath "${1:?the patch file}"); base=${2:-main}
    name=$(basename "$patch_file" .patch)
    work=$(mktemp -d)
    git worktree add -q --detach "$work" "$base"
    if git -C "$work" apply "$patch_file" && git -C "$work" add -A \
        && git -C "$work" -c user.name=trees -c user.email=trees@localhost commit -qm "patch $name on $base"; then
      rev=$(git -C "$work" rev-parse HEAD)
    else
      rev=""
    fi
    git worktree remove --force "$work"
    [ -n "$rev" ] || { echo "$patch_file does not apply to $base" >&2; exit 1; }
    mkdir -p "$trees"
    git archive --format=zip -o "$trees/$name.zip" "$rev" packages tools
    echo "$rev" > "$trees/$name.commit"
    echo "$name: $patch_file on $base as $rev" ;;
  run)
    cmd=${1:?the command}; shift
    out=${OUT:?OUT must name the folder whose files come back}
    for name in "$@"; do
      tree=${TMPDIR:-/tmp}/kernellab-trees/$name
      rm -rf "$tree"; mkdir -p "$tree" "$out/$name"
      python3 -m zipfile -e "$trees/$name.zip" "$tree"
      src=$(ls -d "$tree"/packages/*/src | paste -sd:)
      commit=$(cat "$trees/$name.commit")
      echo "== $name ($commit)"
      (cd "$tree" && PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}" OUT="$out/$name" KERNELLAB_GIT_COMMIT=$commit \
        KERNELLAB_GIT_DIRTY=0 bash -c "$cmd") || echo "== $name: exit $?"
    done ;;
  *) echo "unknown step $step: pack, patch or run" >&2; exit 2 ;;
esac
