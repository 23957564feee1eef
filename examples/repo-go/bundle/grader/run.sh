#!/bin/sh
# Builds the grader (bundle/grader, the standard library only; building
# runs no candidate code) and runs it as this, the grader's, uid.
set -eu
umask 022
export HOME=/tmp GOCACHE=/tmp/gocache GOPATH=/tmp/gopath GOFLAGS=-mod=mod \
       GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=0
# The image's build cache is read where it lies, read-only, through the
# image's cache program (images/go/gocacheprog): no copy of it in scratch
# space; what this job builds is kept in $GOCACHE.
export GOCACHEPROG="/usr/local/bin/gocacheprog /usr/local/share/gocache $GOCACHE"
cd "$SANDBOXD_BUNDLE/grader"
go build -o /work/grader .
cd /work
exec /work/grader "$SANDBOXD_BUNDLE/instance.json"
