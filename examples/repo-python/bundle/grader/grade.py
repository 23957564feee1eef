"""The grader of a repository instance (SWE-bench style), run as the grader's uid.

    grade.py INSTANCE_JSON

1. reads the candidate's unified diff (the one file of its workspace,
   instance.json's patch_file) and refuses it, before anything runs, if it
   is malformed, touches a trusted path (a test, pytest's configuration) or
   a name that would hook the interpreter or pytest (conftest.py, *.pth, …),
   or adds a line naming the test runner (refuse_added: hygiene, see README);
2. copies the repository at its base (/bundle/REPO) and applies the patch
   itself (patch.py: strict, no fuzz), refusing one that does not apply;
3. restores every trusted path from the bundle, whatever the patch did;
4. runs the test command as the code uid, through the helper's exec service,
   with an empty environment; pytest's JUnit is the code's, so
5. writes the report the supervisor reads itself, in a directory the code
   uid cannot write: FAIL_TO_PASS and PASS_TO_PASS, each once, passed only if
   pytest's JUnit lists it once as passed and pytest's exit code agrees.
   A refused patch, a test skipped or missing, no readable JUnit, an exit
   code that disagrees: every such test is a failure, with the reason.

Exits 0 only if every listed test passed.
"""

import fnmatch
import json
import os
import shutil
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from xml.sax.saxutils import quoteattr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import patch  # noqa: E402

BUNDLE = os.environ.get("SANDBOXD_BUNDLE", "/bundle")
CANDIDATE = os.environ.get("SANDBOXD_CANDIDATE", "/inputs/candidate-export")
REPORT = os.environ.get("SANDBOXD_REPORT", "/work/out/report.xml")
REPO = "/work/repo"
RUN = "/tmp/run"  # the code uid's: pytest writes its JUnit here
MAX_PATCH = 4 << 20
MAX_JUNIT = 4 << 20
# The code's environment: nothing of the grader's (not the report's path).
CODE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def read_candidate_patch(name):
    """The patch text, from a workspace that holds exactly that one file."""
    entries = sorted(os.listdir(CANDIDATE))
    if entries != [name]:
        others = [e for e in entries if e != name]
        if name not in entries:
            raise patch.Refused(f"the workspace holds no {name} (it holds {', '.join(entries[:5]) or 'nothing'})")
        raise patch.Refused(f"the workspace holds other files than {name}: {', '.join(others[:5])}")
    fd = os.open(os.path.join(CANDIDATE, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise patch.Refused(f"{name} is not a regular file")
        data = f.read(MAX_PATCH + 1)
    if len(data) > MAX_PATCH:
        raise patch.Refused(f"{name} is larger than {MAX_PATCH} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise patch.Refused(f"{name} is not UTF-8 ({e})") from None


def check_paths(files, inst):
    """Refuses a patch touching a trusted path or a hook's name."""
    for fp in files:
        for p in {fp.old, fp.new} - {None}:
            for t in inst["trusted"]:
                if p == t or p.startswith(t + "/"):
                    raise patch.Refused(f"it touches {p}, a trusted path ({t}) restored from the bundle")
            parts = p.split("/")
            for part in parts:
                for pat in inst["refuse_names"]:
                    if fnmatch.fnmatchcase(part, pat):
                        raise patch.Refused(f"it touches {p}: {part!r} (pattern {pat!r}) could change how the tests run")


def check_added(files, inst):
    """Refuses added lines that name the test runner (hygiene: see README)."""
    for fp in files:
        for _, body in fp.hunks:
            for tag, line in body:
                for w in inst.get("refuse_added", []):
                    if tag == "+" and w in line:
                        raise patch.Refused(f"{fp.path}: an added line names the test runner ({w!r}): {line.strip()[:120]!r}")


def prepare(inst):
    """The repository at its base with the candidate's patch applied and
    every trusted path restored; raises patch.Refused."""
    text = read_candidate_patch(inst["patch_file"])
    files = patch.parse(text)
    check_paths(files, inst)
    check_added(files, inst)
    base = os.path.join(BUNDLE, inst["repo"])
    shutil.copytree(base, REPO)
    try:
        patch.apply(files, REPO)
    except (OSError, UnicodeDecodeError) as e:
        raise patch.Refused(f"does not apply: {e}") from None
    for t in inst["trusted"]:
        src, dst = os.path.join(base, t), os.path.join(REPO, t)
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        elif os.path.lexists(dst):
            os.unlink(dst)
        if os.path.isdir(src):
            shutil.copytree(src, dst)
        elif os.path.exists(src):
            shutil.copy2(src, dst)
    return len(files)


def run_tests(inst):
    """Runs the test command as the code uid; returns its exit code and
    the path of the JUnit file it was told to write."""
    os.makedirs(RUN, exist_ok=True)
    os.chmod(RUN, 0o777)
    junit = os.path.join(RUN, "junit.xml")
    argv = [a.replace("@JUNIT@", junit) for a in inst["test_command"]]
    log = open("/work/tests.log", "wb")  # the grader's file; the code writes through its descriptor
    try:
        p = subprocess.run(["/.sandboxd/shim", "exec"] + argv, cwd=REPO, env=CODE_ENV, stdin=subprocess.DEVNULL,
                           stdout=log, stderr=subprocess.STDOUT, timeout=inst["test_timeout_s"])
        code = p.returncode
    except subprocess.TimeoutExpired:
        code = None
    finally:
        log.close()
    with open("/work/tests.log", "rb") as f:  # for people, never judged
        f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
        sys.stderr.write(f.read().decode("utf-8", "replace"))
    return code, junit


def read_untrusted(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_JUNIT + 1)
        if len(data) > MAX_JUNIT:
            raise ValueError(f"larger than {MAX_JUNIT} bytes")
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


def judge(checks, code, junit):
    """Each listed test: ("passed", "") or ("failure", why)."""
    if code is None:
        return {c: ("failure", "the tests did not end within the time limit") for c in checks}
    try:
        seen = outcomes(read_untrusted(junit))
    except (OSError, ValueError, ET.ParseError) as e:
        return {c: ("failure", f"pytest left no readable report ({e}; exit code {code})") for c in checks}
    bad = [s for v in seen.values() for s, _ in v if s in ("failure", "error")]
    if (code == 0 and bad) or (code in (1, 2) and not bad) or code not in (0, 1, 2):
        return {c: ("failure", f"pytest's exit code {code} disagrees with its report") for c in checks}
    results = {}
    for c in checks:
        got = seen.get(c, [])
        if len(got) != 1:
            results[c] = ("failure", f"pytest's report lists it {len(got)} times (exit code {code})")
        elif got[0][0] == "passed":
            results[c] = ("passed", "")
        elif got[0][0] == "skipped":
            results[c] = ("failure", f"skipped: {got[0][1]}")
        else:
            results[c] = ("failure", f"{got[0][0]}: {got[0][1]}")
    return results


def write_report(inst, results):
    checks = inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"]
    kind = {c: "FAIL_TO_PASS" for c in inst["FAIL_TO_PASS"]}
    failures = sum(1 for s, _ in results.values() if s != "passed")
    lines = ['<?xml version="1.0" encoding="utf-8"?>',
             f'<testsuites><testsuite name={quoteattr(inst["instance_id"])} tests="{len(checks)}" failures="{failures}" errors="0" skipped="0">']
    for c in checks:
        classname, _, name = c.rpartition(".")
        status, message = results[c]
        if status == "passed":
            lines.append(f"<testcase classname={quoteattr(classname)} name={quoteattr(name)}/>")
        else:
            why = f"{kind.get(c, 'PASS_TO_PASS')}: {message}"[:2000]
            lines.append(f"<testcase classname={quoteattr(classname)} name={quoteattr(name)}>"
                         f"<failure message={quoteattr(why)}/></testcase>")
    lines.append("</testsuite></testsuites>")
    os.makedirs(os.path.dirname(REPORT), exist_ok=True)
    tmp = REPORT + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(tmp, REPORT)
    return 0 if failures == 0 else 1


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        inst = json.load(f)
    os.umask(0o022)  # the code uid may read the repository, never write it
    checks = inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"]
    try:
        n = prepare(inst)
    except patch.Refused as e:
        print(f"grade: patch refused: {e}", file=sys.stderr)
        return write_report(inst, {c: ("failure", f"patch refused: {e}") for c in checks})
    print(f"grade: {inst['instance_id']}: patch of {n} file(s) applied; trusted paths restored", file=sys.stderr)
    code, junit = run_tests(inst)
    return write_report(inst, judge(checks, code, junit))


if __name__ == "__main__":
    sys.exit(main())
