#!/usr/bin/env bash
# The Python examples' costs (issue 15): bridge calls per second through the
# real exec service, and the time of each Python bundle's evaluation of the
# good candidate (`sandboxd run`, end to end: ingest, selfcheck (cached),
# grader job, assessment) next to `docker run IMAGE python3 -m pytest` of the
# same hidden tests with the candidate mounted. Medians of ROUNDS (default 5).
#
#   bench/python.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
./scripts/setup >/dev/null
export SANDBOXD_STATE="${SANDBOXD_STATE:-$PWD/.cache/bench-python-state}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
image=$(./bin/sandboxd image build -q images/python)
echo "image $image; load $(cut -d' ' -f1-3 /proc/loadavg)"

render() { # example, output dir
  cp -r "examples/$1/bundle" "$2"
  sed "s/@PYTHON_IMAGE@/$image/" "examples/$1/bundle.json.in" > "$2/bundle.json"
}
render python "$work/inproc"
render python-bridge "$work/bridge"
# The throughput bundle: the bridge's bundle with calls.py as its grader.
render python-bridge "$work/calls"
cp bench/python/calls.py bench/python/run.sh "$work/calls/grader/"
sed -i 's|"required_checks": \[[^]]*\]|"required_checks": ["bench.calls"]|' "$work/calls/bundle.json"

good=examples/python/candidates/good
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

./bin/sandboxd run --ephemeral-key --bundle "$work/calls" --workspace "$good" --out "$work/calls-ev" >/dev/null
grep -h '^bridge:' "$work"/calls-ev/logs/*grader.stdout

# The same hidden tests in a bare container: no sandboxd, no code uid, the
# candidate imported straight into pytest (what a user would script).
mkdir -p "$work/plain"
cp examples/python/bundle/tests/test_calc.py examples/python/bundle/tests/conftest.py "$work/plain/"
plain() {
  docker run --rm --network none --read-only --tmpfs /tmp -u 65534 \
    -v "$work/plain:/t:ro" -v "$PWD/$good:/work/candidate:ro" "$image" \
    python3 -m pytest -p no:cacheprovider -q /t >/dev/null
}
run() { ./bin/sandboxd run --ephemeral-key --bundle "$1" --workspace "$good" >/dev/null; }
run "$work/bridge"; run "$work/inproc"; plain # warm: selfcheck cache, page cache
for _ in $(seq "$rounds"); do
  t=$(date +%s%N); plain; echo "plain $(ms "$t")"
  t=$(date +%s%N); run "$work/inproc"; echo "inproc $(ms "$t")"
  t=$(date +%s%N); run "$work/bridge"; echo "bridge $(ms "$t")"
done > "$work/samples"
for k in plain inproc bridge; do
  printf '%-7s median %s ms of %s\n' "$k" "$(awk -v k=$k '$1==k {print $2}' "$work/samples" | median)" "$rounds"
done | sed -e 's/^plain /docker run python3 -m pytest (same tests)/' \
  -e 's/^inproc /sandboxd run examples\/python (in process)/' -e 's/^bridge /sandboxd run examples\/python-bridge/'
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
