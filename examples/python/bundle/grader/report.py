"""Writes the grader's JUnit report from pytest's (untrusted) one.

    report.py PYTEST_EXIT_CODE PYTEST_JUNIT REPORT CHECK...

Only the expected checks (CLASSNAME.NAME) are written, each once: passed,
failed or skipped as pytest's file says, an error if pytest's file does not
list it, lists it twice, cannot be read, or disagrees with pytest's exit
code. Exits 0 only if every check passed. pytest's file is opened without
following links, must be a regular file and is read to at most 4 MiB: the
code uid made it.
"""

import os
import stat
import sys
import xml.etree.ElementTree as ET
from xml.sax.saxutils import quoteattr

MAX = 4 << 20


def read_untrusted(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX + 1)
        if len(data) > MAX:
            raise ValueError("larger than 4 MiB")
        return data
    finally:
        os.close(fd)


def outcomes(data):
    seen = {}
    for case in ET.fromstring(data).iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status, message = child.tag, child.get("message", "")
                break
        seen.setdefault(name, []).append((status, message))
    return seen


def main():
    code, junit, report, checks = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    results = {}
    try:
        seen = outcomes(read_untrusted(junit))
        problem = None
        statuses = [s for v in seen.values() for s, _ in v]
        if code == 0 and any(s in ("failure", "error") for s in statuses):
            problem = f"pytest exited 0 but its report lists failures"
        if code != 0 and statuses and all(s in ("passed", "skipped") for s in statuses):
            problem = f"pytest exited {code} but its report lists no failure"
        for c in checks:
            got = seen.get(c, [])
            if problem:
                results[c] = ("error", problem)
            elif len(got) != 1:
                results[c] = ("error", f"pytest's report lists it {len(got)} times (exit code {code})")
            else:
                results[c] = got[0]
    except (OSError, ValueError, ET.ParseError) as e:
        for c in checks:
            results[c] = ("error", f"pytest left no readable report ({e}; exit code {code})")

    failures = sum(1 for s, _ in results.values() if s == "failure")
    errors = sum(1 for s, _ in results.values() if s == "error")
    skipped = sum(1 for s, _ in results.values() if s == "skipped")
    lines = ['<?xml version="1.0" encoding="utf-8"?>',
             f'<testsuites><testsuite name="in-process" tests="{len(checks)}" failures="{failures}" errors="{errors}" skipped="{skipped}">']
    for c in checks:
        classname, _, name = c.rpartition(".")
        status, message = results[c]
        if status == "passed":
            lines.append(f"<testcase classname={quoteattr(classname)} name={quoteattr(name)}/>")
        else:
            tag = {"failure": "failure", "error": "error", "skipped": "skipped"}[status]
            lines.append(f"<testcase classname={quoteattr(classname)} name={quoteattr(name)}>"
                         f"<{tag} message={quoteattr(message[:2000])}/></testcase>")
    lines.append("</testsuite></testsuites>")
    tmp = report + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(tmp, report)
    return 0 if failures == errors == skipped == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
