#!/bin/sh
# The grader: copies the candidate's files (read-only export) into scratch
# space, replaces every test file with the bundle's hidden tests, and runs
# them with go test -json. go test builds the test binary (building runs no
# candidate code) and, through -exec, runs it through the helper's exec
# service as the code uid (exec.sh): the candidate's code in the binary
# cannot write, unlink or replace the report, whose directory is the
# grader's, and nothing in its environment names it. go test, as the
# grader, turns the binary's output into the report; the exit code is go
# test's. What the binary prints on its own stdout is still read as the
# test framework's framing: see README.md.
set -u
umask 022
report=$SANDBOXD_REPORT
unset SANDBOXD_REPORT
export HOME=/tmp GOCACHE=/tmp/gocache GOPATH=/tmp/gopath GOFLAGS=-mod=mod \
       GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=0
# The image's build cache is read where it lies, read-only, through the
# image's cache program (images/go/gocacheprog): no copy of it in scratch
# space; what this job builds is kept in $GOCACHE.
export GOCACHEPROG="/usr/local/bin/gocacheprog /usr/local/share/gocache $GOCACHE"
mkdir -p /work/src /work/bin "$(dirname "$report")"
cp -r "$SANDBOXD_CANDIDATE"/. /work/src/
# The candidate's own tests (and any TestMain) never count. busybox find
# has no -delete (it failed, and the candidate's test files stayed): each
# is removed, and none may be left.
# A directory of that name is no test file and stays (refusing it would let
# a candidate make its evaluation inconclusive); a file or link goes.
find /work/src -name '*_test.go' ! -type d -exec rm -f {} +
if [ -n "$(find /work/src -name '*_test.go' ! -type d)" ]; then
  echo "grader: candidate test files are left: $(find /work/src -name '*_test.go' ! -type d)" >&2
  exit 3
fi
cp "$SANDBOXD_BUNDLE"/tests/*_test.go /work/src/
cd /work/src
exec go test -json -count=1 -timeout 60s -exec "/bin/sh $SANDBOXD_BUNDLE/grader/exec.sh" . > "$report"
