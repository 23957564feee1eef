"""The off-by-one candidate (bad) that prints 400 KiB at each call, hoping
that what the grader shows of a failing test's output goes over the grader
job's log_bytes, a limit of the grader's job: the run would then be
inconclusive rather than failed."""

import sys

_NOISE = ("x" * 1023 + "\n") * 400


def add(a, b):
    sys.stdout.write(_NOISE)
    return a + b


def fib(n):
    sys.stdout.write(_NOISE)
    if n < 0:
        raise ValueError("fib of a negative number")
    a, b = 1, 1
    for _ in range(n):
        a, b = b, a + b
    return a
