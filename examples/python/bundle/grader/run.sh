#!/bin/sh
# The in-process grader: pytest imports the candidate's calc.py, so pytest
# runs as the code uid, through the helper's exec service, with an empty
# environment; the JUnit file it writes is the candidate's to forge. This
# grader, as its own uid, then writes the report the supervisor reads
# (report.py: only the expected tests, each from pytest's file, checked
# against pytest's exit code) in a directory the code uid cannot write.
# pytest writes its JUnit file in the code uid's own tmpfs (/.code-tmp,
# its $TMPDIR): the grader's scratch space is closed to the code uid.
set -u
mkdir -p "$(dirname "$SANDBOXD_REPORT")" /work/candidate /work/run
cp -r "$SANDBOXD_CANDIDATE"/. /work/candidate/
cp /bundle/tests/conftest.py /bundle/tests/test_calc.py /work/run/
cd /work/run
# What pytest prints (the candidate's output among it, for a failing test)
# goes to a file, whose end is kept in this job's log for people and which
# is removed before the grader writes again: printed straight to the log,
# a flood went over log_bytes, a limit of the grader's job (inconclusive),
# and kept whole, it could fill the scratch space.
env -i PATH=/usr/bin:/bin LANG=C.UTF-8 HOME=/.code-tmp PYTHONDONTWRITEBYTECODE=1 \
  timeout 20 /.sandboxd/shim exec /usr/bin/python3 -I -m pytest -p no:cacheprovider -q \
  --rootdir=/work/run --junitxml=/.code-tmp/junit.xml -o junit_family=xunit2 /work/run \
  >/work/pytest.out 2>&1 </dev/null
code=$?
tail -c 4096 /work/pytest.out
rm -f /work/pytest.out
exec python3 -I /bundle/grader/report.py "$code" /.code-tmp/junit.xml "$SANDBOXD_REPORT" \
  test_calc.test_add test_calc.test_fib test_calc.test_fib_large test_calc.test_fib_negative
