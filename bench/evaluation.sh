#!/usr/bin/env bash
# Item 7 (issue 26): the wall time of a whole evaluation, `sandboxd run` of
# examples/go (good candidate) and examples/python-bridge (good candidate),
# before and after its workspaces ran side by side: `--parallel 1` is one
# workspace at a time (known-good control, known-bad control, then the
# candidate, as before), the default runs them together. Rounds alternate
# the two, and the medians and their ratio are printed.
#   ./bench/evaluation.sh [rounds]   (default 5)
# It builds what it needs (binaries, the Go and Python images); each run
# removes its containers itself, and the cache volumes of its broker name
# are removed at exit (bench/oneshot.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
./scripts/setup >/dev/null
export SANDBOXD_STATE="${SANDBOXD_STATE:-$PWD/.cache/bench-state}"
work="$PWD/.cache/bench-evaluation"
rm -rf "$work" && mkdir -p "$work"
. bench/oneshot.sh "$work"

go_image=$(./bin/sandboxd image build -q images/go | tail -n 1)
py_image=$(./bin/sandboxd image build -q images/python | tail -n 1)
cp -r examples/go/bundle "$work/go-bundle"
sed "s/@GO_IMAGE@/$go_image/" examples/go/bundle.json.in > "$work/go-bundle/bundle.json"
cp -r examples/python-bridge/bundle "$work/py-bundle"
sed "s/@PYTHON_IMAGE@/$py_image/" examples/python-bridge/bundle.json.in > "$work/py-bundle/bundle.json"

# One run, timed in milliseconds; it must pass.
timed() { # bundle, workspace, parallel
  local start end
  start=$(date +%s%N)
  ./bin/sandboxd run --ephemeral-key --quiet --parallel "$3" --bundle "$1" --workspace "$2" > "$work/out.txt"
  end=$(date +%s%N)
  echo $(((end - start) / 1000000))
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}'; }

echo "evaluation wall time, $rounds rounds each, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for example in go:"$work/go-bundle":examples/go/candidates/good py:"$work/py-bundle":examples/python/candidates/good; do
  IFS=: read -r name bundle ws <<<"$example"
  timed "$bundle" "$ws" 0 >/dev/null # warm: the selfcheck cache, the page cache
  : > "$work/one.txt" && : > "$work/all.txt"
  for _ in $(seq "$rounds"); do
    timed "$bundle" "$ws" 1 >> "$work/one.txt"
    timed "$bundle" "$ws" 0 >> "$work/all.txt"
  done
  one=$(median < "$work/one.txt")
  all=$(median < "$work/all.txt")
  echo "$name: one workspace at a time ${one} ms, side by side ${all} ms, ratio $(awk -v a="$all" -v o="$one" 'BEGIN {printf "%.2f", a / o}')"
done
