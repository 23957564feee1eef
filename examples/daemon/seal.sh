#!/bin/sh
# seal.sh IMAGE < JOB.json.in > JOB.json
#
# Seals a job for the daemon: fills in the image ID for @IMAGE@ and adds the
# job's digest, the SHA-256 of its canonical JSON (sorted keys, no white
# space) without the digest field. JOB.json.in is that canonical JSON, on
# one line. The daemon recomputes the digest and refuses a job whose digest
# is not its own.
set -eu
canon=$(sed "s/@IMAGE@/$1/" | tr -d '\n')
digest=sha256:$(printf '%s' "$canon" | sha256sum | cut -d' ' -f1)
printf '%s\n' "$canon" | sed "s/^{/{\"digest\":\"$digest\",/"
