#!/bin/sh
# go test -exec: runs the test binary go test built ($1, in go test's private
# work directory) as the code uid, through the helper's exec service, with
# go test's own pipes as its output. The binary is copied where the code uid
# can read it but not change it, and its environment is made anew: nothing
# in it names the report or the grader's files.
set -eu
bin=/work/bin/$(basename "$1")
cp "$1" "$bin"
chmod 0755 "$bin"
shift
exec env -i PATH=/bin HOME=/.code-tmp /.sandboxd/shim exec "$bin" "$@"
