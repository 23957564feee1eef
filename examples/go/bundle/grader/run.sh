#!/bin/sh
# The grader: copies the candidate's files (read-only export) into scratch
# space, replaces every test file with the bundle's hidden tests, and runs
# them. The report is go test -json; the exit code is go test's.
set -u
export HOME=/tmp GOCACHE=/tmp/gocache GOPATH=/tmp/gopath GOFLAGS=-mod=mod \
       GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=0
cp -r /usr/local/share/gocache "$GOCACHE"
mkdir -p /work/src "$(dirname "$SANDBOXD_REPORT")"
cp -r "$SANDBOXD_CANDIDATE"/. /work/src/
# The candidate's own tests (and any TestMain) never count.
find /work/src -name '*_test.go' -delete
cp "$SANDBOXD_BUNDLE"/tests/*_test.go /work/src/
cd /work/src
exec go test -json -count=1 -timeout 60s . > "$SANDBOXD_REPORT"
