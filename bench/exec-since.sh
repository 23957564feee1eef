#!/usr/bin/env bash
# Item 1's cold exec against an earlier build: `sandboxd exec ... -- /bin/true`
# of the minimal image by the build of REV (a git worktree and its binaries)
# and by this checkout's, alternated (the order swaps each round); medians,
# quartiles and their ratio. A change worth a few milliseconds is below the
# noise of `./bench/run -only 1` from run to run; alternating two builds many
# times shows it.
#   ./bench/exec-since.sh REV [rounds] [engine]
# (defaults 30, containerd). Both sides share one broker name and state
# (bench/since.sh, bench/oneshot.sh: removed at exit), each its own helper
# and probe.
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:?usage: bench/exec-since.sh REV [rounds] [engine]}"
rounds="${2:-30}"
engine="${3:-containerd}"
here="$PWD"
work="$here/.cache/bench-exec-since"
. bench/since.sh "$rev" "$work" # $base: the worktree of $rev, built; alternate
CGO_ENABLED=0 go build -trimpath -o bin/ ./cmd/sandboxd ./cmd/sandboxd-shim ./cmd/sandboxd-probe
image=$(bin/sandboxd image build -q images/minimal | tail -n 1)
export SANDBOXD_STATE="$work/state"

# One exec by one side, timed in tenths of a millisecond; it must succeed.
timed() {
  local src="$here" start
  [ "$1" = base ] && src="$base"
  start=$(date +%s%N)
  if ! "$src/bin/sandboxd" exec --engine "$engine" --image "$image" -- /bin/true > "$work/out-$1.txt" 2>&1; then
    echo "exec-since: the $1 side failed:" >&2
    tail -n 5 "$work/out-$1.txt" >&2
    exit 1
  fi
  echo $((($(date +%s%N) - start) / 100000))
}
timed base >/dev/null # warm: the selfcheck, the helper volume, the image in the engine
timed head >/dev/null
echo "sandboxd exec on $engine, $rounds rounds, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
alternate "$rounds"
# median, first and third quartile (nearest rank), in ms
stats() { sort -n | awk '{a[NR]=$1} END {printf "%.1f %.1f %.1f\n", a[int((NR+1)/2)]/10, a[int((NR+3)/4)]/10, a[int((3*NR+3)/4)]/10}'; }
read -r bm bq1 bq3 < <(stats < "$work/base.txt")
read -r hm hq1 hq3 < <(stats < "$work/head.txt")
echo "$(git rev-parse --short "$rev"): median $bm ms (quartiles $bq1, $bq3)"
echo "this checkout: median $hm ms (quartiles $hq1, $hq3)"
echo "ratio $(awk -v h="$hm" -v b="$bm" 'BEGIN {printf "%.3f", h / b}'), load $(cut -d' ' -f1-3 /proc/loadavg)"
