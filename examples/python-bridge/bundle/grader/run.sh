#!/bin/sh
# The grader: pytest runs the hidden tests in this (the grader's) process,
# as the grader's uid, and writes the JUnit report itself. The tests reach
# the candidate's calc.py only through the bridge (/bundle/bridge), whose
# workers run as the code uid through the helper's exec service. The code
# uid can read neither /bundle nor the candidate's export, so the worker
# script and the candidate's files are copied where it can (read-only to it).
set -u
mkdir -p "$(dirname "$SANDBOXD_REPORT")" /work/bridge /work/candidate
cp /bundle/bridge/worker.py /work/bridge/worker.py
# A candidate whose files do not fit in the scratch space (their size is
# its own doing) is judged without them, where a full scratch space would
# have made the run inconclusive: every test then fails for want of its
# code.
if ! cp -r "$SANDBOXD_CANDIDATE"/. /work/candidate/; then
  echo "grader: the candidate's files do not fit in the scratch space: judged without them" >&2
  rm -rf /work/candidate && mkdir /work/candidate
fi
export BRIDGE_CANDIDATE=/work/candidate
cd /work
export HOME=/work
exec python3 -I -m pytest -p no:cacheprovider -q --rootdir=/bundle/tests \
  --junitxml="$SANDBOXD_REPORT" -o junit_family=xunit2 /bundle/tests
