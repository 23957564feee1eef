#!/bin/sh
# The bench bundle's grader (see calls.py).
set -u
mkdir -p "$(dirname "$SANDBOXD_REPORT")" /work/bridge /work/candidate
cp /bundle/bridge/worker.py /work/bridge/worker.py
cp -r "$SANDBOXD_CANDIDATE"/. /work/candidate/
cd /work
exec python3 -I /bundle/grader/calls.py
