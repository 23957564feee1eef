#!/bin/sh
# An out-of-process grader: it builds the candidate's program (building runs
# no candidate code; it runs as the code uid all the same, below), then runs
# it through the helper's exec service, as the code uid, for each hidden
# case, and writes the TAP report itself. The
# candidate's program can neither write the report (the grader's uid owns
# it), nor reach the grader's descriptors or processes (another uid), nor
# take part in the report's framing: only its answers reach the grader.
set -u
umask 022
report=$SANDBOXD_REPORT
mkdir -p /work/src "$(dirname "$report")"
# build DIR OUT: go build of the package in DIR into OUT, as the code uid,
# through the exec service, with an environment made anew. The build runs
# no candidate code, but the candidate's source decides what the compiler
# and the linker do: a literal of millions of elements takes the
# compiler gigabytes, an array of 2^28 bytes makes a 256 MiB binary. As
# the code uid, that is the candidate's: the kernel's OOM kill of the
# compiler, or its full $TMPDIR (/.code-tmp, where the build keeps its
# cache and its output), fails the build; as the grader, it was the
# grader job's limit (inconclusive). The image's build cache is read where
# it lies, read-only, through the image's cache program
# (images/go/gocacheprog); what the build makes is kept in /.code-tmp.
build() {
  timeout 50 env -i PATH=/usr/local/go/bin:/bin HOME=/.code-tmp GOCACHE=/.code-tmp/gocache \
    GOPATH=/.code-tmp/gopath GOFLAGS=-mod=mod GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=0 \
    GOCACHEPROG="/usr/local/bin/gocacheprog /usr/local/share/gocache /.code-tmp/gocache" \
    /.sandboxd/shim exec /bin/sh -c 'cd "$1" && exec go build -o "$2" .' build "$1" "$2" \
    </dev/null >/work/build.log 2>&1
}
# emptied: everything the code uid left in its scratch space goes.
emptyCodeTmp() {
  env -i PATH=/bin /.sandboxd/shim exec /bin/sh -c 'rm -rf /.code-tmp/* /.code-tmp/.[!.]* /.code-tmp/..?*' </dev/null >/dev/null 2>&1
}
cp -r "$SANDBOXD_CANDIDATE"/. /work/src/
# A candidate that does not build fails every check: that is the
# candidate's fault, never an inconclusive run.
if ! build /work/src /.code-tmp/calc; then
  # Unless the go command itself fails here (its cache program, say): a
  # program of the grader's own is built the same way (compiled, put in
  # the cache, linked), with everything the candidate's build left gone
  # first (its files, its builds, the go command's scratch); if that fails
  # too, nothing is known of the candidate, and no report is written. The
  # end of the candidate's build errors goes to this job's stderr, for
  # people (never read as a result).
  echo "grader: the candidate does not build; the end of what go build said:" >&2
  tail -c 4096 /work/build.log >&2
  rm -rf /work/src /work/build.log
  # Twice: a build its timeout cut short is killed when the service sees
  # its client gone, which may come just after the first emptying.
  emptyCodeTmp
  sleep 1
  emptyCodeTmp
  mkdir -p /work/selftest
  printf 'module selftest\n\ngo 1.22\n' > /work/selftest/go.mod
  printf 'package main\n\nimport (\n\t"fmt"\n\t"os"\n\t"strconv"\n)\n\nfunc main() { fmt.Fprintln(os.Stderr, strconv.Itoa(len(os.Args))) }\n' > /work/selftest/main.go
  if ! build /work/selftest /.code-tmp/selftest; then
    echo "grader: the go command fails to build a program of its own; the candidate is not judged:" >&2
    tail -c 2048 /work/build.log >&2
    exit 3
  fi
  {
    echo "TAP version 13"
    echo "1..4"
    for name in "add small" "add negative" "fib 10" "fib 90"; do
      n=$((${n:-0} + 1))
      echo "not ok $n - $name # the candidate does not build"
    done
  } > "$report.tmp"
  mv "$report.tmp" "$report"
  exit 1
fi
rm -f /work/build.log

n=0
failed=0
check() { # name, expected output, arguments...
  name=$1 want=$2
  shift 2
  n=$((n + 1))
  # A fresh environment: nothing in the program's names the report. Its
  # answer goes to a file of its own, never a pipe: a process it left
  # behind (one that started a session of its own escapes the service's
  # kill) could hold a pipe open and the grader with it, until wall time.
  # The program may fill that file up to the file size limit, and the
  # scratch space with it: its first 100 bytes are all that is kept, and
  # the file is removed before the grader writes anything more (the exec
  # service kills what is left of the program when its call ends), so a
  # flood of output fails the case, never the grader's own writes.
  out=/work/case-$n.out
  timeout 10 env -i PATH=/bin HOME=/.code-tmp /.sandboxd/shim exec /.code-tmp/calc "$@" </dev/null >"$out" 2>/dev/null
  got=$(head -c 100 "$out")
  rm -f "$out"
  if [ "$got" = "$want" ]; then
    echo "ok $n - $name"
  else
    echo "not ok $n - $name"
    failed=1
  fi
}
{
  echo "TAP version 13"
  echo "1..4"
  check "add small" 3 add 1 2
  check "add negative" 0 add -4 4
  check "fib 10" 55 fib 10
  check "fib 90" 2880067194370816120 fib 90
} > "$report.tmp"
mv "$report.tmp" "$report"
exit $failed
