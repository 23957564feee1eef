#!/bin/sh
# go test -exec: runs the test binary go test built ($1) as the code uid,
# through the helper's exec service, with go test's own pipes as its output
# (as examples/go's). The binary is copied where the code uid can read it
# but not change it; its environment is made anew and names nothing of the
# grader's.
set -eu
mkdir -p /work/bin
bin=/work/bin/$(basename "$1")
cp "$1" "$bin"
chmod 0755 "$bin"
shift
exec env -i PATH=/bin HOME=/.code-tmp /.sandboxd/shim exec "$bin" "$@"
