#!/usr/bin/env bash
# Item 7 against an earlier build (issue 26: "at most 0.6x today's wall
# time"): `sandboxd run` of an example's good candidate by the build of
# REV (a git worktree, its binaries and its own bundle of the example) and by
# this checkout's, rounds alternating which goes first; medians and their
# ratio. Each side runs its own Go image, built by its own builder from its
# own images/go with this machine's toolchain (the image is part of what an
# evaluation costs).
#   ./bench/evaluation-since.sh REV [rounds] [engine] [example]
# (defaults 5, docker, go; example is go or python-bridge, whose good
# candidate is examples/python's).
# For issue 26, REV is f31c585 (the commit before its first change).
# Its containers and cache volumes carry a broker name of its own and are
# removed at exit (bench/oneshot.sh); the worktree stays in
# .cache/bench-since/src for the next run (`git worktree remove` drops it).
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:?usage: bench/evaluation-since.sh REV [rounds] [engine] [go|python-bridge]}"
rounds="${2:-5}"
engine="${3:-docker}"
example="${4:-go}"
case "$example" in
  go) img=go; placeholder=GO_IMAGE; candidate=examples/go/candidates/good ;;
  python-bridge) img=python; placeholder=PYTHON_IMAGE; candidate=examples/python/candidates/good ;;
  *) echo "evaluation-since: example $example: want go or python-bridge" >&2; exit 64 ;;
esac
here="$PWD"
work="$here/.cache/bench-since"
. bench/since.sh "$rev" "$work" # $base: the worktree of $rev, built; alternate
for side in base head; do
  src="$here"; [ "$side" = base ] && src="$base"
  image=$(cd "$src" && ./bin/sandboxd image build -q "images/$img" | tail -n 1)
  rm -rf "$work/bundle-$side" && cp -r "$src/examples/$example/bundle" "$work/bundle-$side"
  sed "s/@$placeholder@/$image/" "$src/examples/$example/bundle.json.in" > "$work/bundle-$side/bundle.json"
done

# One evaluation by one side, timed in milliseconds; it must pass.
timed() {
  local side="$1" src="$here" start
  [ "$side" = base ] && src="$base"
  start=$(date +%s%N)
  if ! (cd "$src" && SANDBOXD_STATE="$work/state-$side" ./bin/sandboxd run --engine "$engine" --ephemeral-key --quiet \
      --bundle "$work/bundle-$side" --workspace "$here/$candidate" > "$work/out-$side.txt" 2>&1); then
    echo "evaluation-since: the $side side failed:" >&2
    tail -n 5 "$work/out-$side.txt" >&2
    exit 1
  fi
  echo $((($(date +%s%N) - start) / 1000000))
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}'; }

timed base >/dev/null # warm: each side's selfcheck and helper volume, the page cache
timed head >/dev/null
echo "examples/$example on $engine, $rounds rounds, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
alternate "$rounds"
b=$(median < "$work/base.txt")
h=$(median < "$work/head.txt")
echo "$(git rev-parse --short "$rev"): $(tr '\n' ' ' < "$work/base.txt")(median $b ms)"
echo "this checkout: $(tr '\n' ' ' < "$work/head.txt")(median $h ms)"
echo "ratio $(awk -v h="$h" -v b="$b" 'BEGIN {printf "%.2f", h / b}'), load $(cut -d' ' -f1-3 /proc/loadavg)"
