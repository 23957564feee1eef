"""The grader of a repository instance (SWE-bench style), run as the grader's uid.

    grade.py INSTANCE_JSON

1. reads the candidate: its workspace holds either a unified diff (the file
   instance.json's patch_file names) or the whole repository tree (the
   directory tree_dir names), and nothing else;
2. refuses it, before anything runs, if it is malformed, touches a trusted
   path (a test, pytest's configuration) or a name that would hook the
   interpreter or pytest (conftest.py, *.pth, …), or adds a line naming the
   test runner (refuse_added: hygiene, see README). A tree is refused as the
   patch of the same change would be (tree.py: its changes are those a
   patch could say, and the same checks judge them);
3. copies the repository at its base (/bundle/REPO) and applies the patch
   (patch.py: strict, no fuzz, refusing one that does not apply) or the
   tree's changes itself;
4. restores every trusted path from the bundle, whatever the candidate did;
5. runs the test command as the code uid, through the helper's exec service,
   with an empty environment; pytest's JUnit is the code's, so
6. writes the report the supervisor reads itself, in a directory the code
   uid cannot write: FAIL_TO_PASS and PASS_TO_PASS, each once, passed only if
   pytest's JUnit lists it once as passed and pytest's exit code agrees.
   A refused candidate, a test skipped or missing, no readable JUnit, an exit
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
import tree  # noqa: E402

BUNDLE = os.environ.get("SANDBOXD_BUNDLE", "/bundle")
CANDIDATE = os.environ.get("SANDBOXD_CANDIDATE", "/inputs/candidate-export")
REPORT = os.environ.get("SANDBOXD_REPORT", "/work/out/report.xml")
REPO = "/work/repo"
RUN = "/.code-tmp"  # the code uid's own tmpfs (its $TMPDIR): pytest writes its JUnit here
MAX_PATCH = 4 << 20
MAX_JUNIT = 4 << 20
# The code's environment: nothing of the grader's (not the report's path).
CODE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/.code-tmp", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def read_candidate(inst):
    """What the workspace holds: ("patch", the patch's file name) or ("tree",
    the tree's directory); raises patch.Refused naming the workspace's fault."""
    pname, tname = inst["patch_file"], inst["tree_dir"]
    entries = sorted(os.listdir(CANDIDATE))
    others = [e for e in entries if e not in (pname, tname)]
    if pname in entries and tname in entries:
        raise patch.Refused(f"workspace refused: it holds both {pname} and {tname}/: give one")
    if pname not in entries and tname not in entries:
        raise patch.Refused(f"workspace refused: it holds neither {pname} nor {tname}/ "
                            f"(it holds {', '.join(entries[:5]) or 'nothing'})")
    name = pname if pname in entries else tname
    if others:
        shown = name if name == pname else name + "/"
        raise patch.Refused(f"workspace refused: it holds other files than {shown}: {', '.join(others[:5])}")
    if name == tname:
        if not stat.S_ISDIR(os.lstat(os.path.join(CANDIDATE, tname)).st_mode):
            raise patch.Refused(f"workspace refused: {tname} is not a directory")
        return "tree", os.path.join(CANDIDATE, tname)
    return "patch", name


def read_patch(name):
    """The patch text, read without following a link, at most MAX_PATCH bytes."""
    fd = os.open(os.path.join(CANDIDATE, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which raises on a directory
        os.close(fd)
        raise patch.Refused(f"{name} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_PATCH + 1)
    if len(data) > MAX_PATCH:
        raise patch.Refused(f"{name} is larger than {MAX_PATCH} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise patch.Refused(f"{name} is not UTF-8 ({e})") from None


def check_paths(paths, inst):
    """Refuses a change touching a trusted path or a hook's name."""
    for p in paths:
        for t in inst["trusted"]:
            if p == t or p.startswith(t + "/"):
                raise patch.Refused(f"it touches {p}, a trusted path ({t}) restored from the bundle")
        for part in p.split("/"):
            for pat in inst["refuse_names"]:
                if fnmatch.fnmatchcase(part, pat):
                    raise patch.Refused(f"it touches {p}: {part!r} (pattern {pat!r}) could change how the tests run")


def check_added(added, inst):
    """Refuses added lines that name the test runner (hygiene: see README)."""
    for path, line in added:
        for w in inst.get("refuse_added", []):
            if w in line:
                raise patch.Refused(f"{path}: an added line names the test runner ({w!r}): {line.strip()[:120]!r}")


def patch_changes(text):
    """A patch's files, the paths it touches and the lines it adds."""
    files = patch.parse(text)
    paths = [p for fp in files for p in (fp.old, fp.new) if p is not None]
    added = [(fp.path, line) for fp in files for _, body in fp.hunks for tag, line in body if tag == "+"]
    return files, paths, added


def prepare(inst):
    """The repository at its base with the candidate's change applied and
    every trusted path restored; returns what was applied, for the log.
    Raises patch.Refused, whose message says what was refused and why."""
    kind, candidate = read_candidate(inst)
    base = os.path.join(BUNDLE, inst["repo"])
    try:
        if kind == "patch":
            files, paths, added = patch_changes(read_patch(candidate))
        else:
            files = tree.diff(base, candidate)
            paths = [c.path for c in files]
            added = [(c.path, line) for c in files for line in c.added_lines()]
        check_paths(paths, inst)
        check_added(added, inst)
        shutil.copytree(base, REPO)
        try:
            if kind == "patch":
                patch.apply(files, REPO)
            else:
                tree.apply(files, REPO)
        except (OSError, UnicodeDecodeError) as e:
            raise patch.Refused(f"does not apply: {e}") from None
    except patch.Refused as e:
        raise patch.Refused(f"{kind} refused: {e}") from None
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
    return f"{kind} of {len(files)} changed file(s) applied"


def run_tests(inst):
    """Runs the test command as the code uid; returns its exit code and
    the path of the JUnit file it was told to write."""
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
        applied = prepare(inst)
    except patch.Refused as e:
        print(f"grade: {e}", file=sys.stderr)
        return write_report(inst, {c: ("failure", str(e)) for c in checks})
    print(f"grade: {inst['instance_id']}: {applied}; trusted paths restored", file=sys.stderr)
    code, junit = run_tests(inst)
    return write_report(inst, judge(checks, code, junit))


if __name__ == "__main__":
    sys.exit(main())
