"""A strict reader and applier of unified diffs (as `git diff` writes them).

    files = parse(text)        # [FilePatch], or raises Refused
    apply(files, root)         # applies all of them to the tree at root, or
                               # raises Refused and changes nothing

No fuzz: every context and removed line must match exactly; a hunk may sit
at another line than its header says (as `git apply` allows), never with
different context. Paths are taken as `git diff` writes them (`a/PATH`,
`b/PATH`, or /dev/null), must be relative and clean (no quote, backslash or
control character: git quotes such names), and each file is patched once.
An empty file created or deleted is a git header without a hunk, as git
writes it. Renames, copies, mode changes and binary patches are refused.
Text outside a file's diff (a commit message, format-patch's diffstat and
"-- " signature) is ignored. The candidate wrote the text: every malformed
piece is a Refused naming what and where, never an exception of another
kind. examples/repo-go/bundle/grader/patch.go is the same in Go; both are
tested on the same fixtures (examples/repo-python/grader-tests).
"""

import os
import re
import stat

MAX_FILES = 200

# Line numbers and counts of at most 9 digits: no file here has more lines,
# and int() of a longer one could fail otherwise than Refused.
_HUNK = re.compile(r"@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")
# git header lines that carry nothing this applier needs (or that it refuses).
_GIT_OK = ("index ", "new file mode 100644", "deleted file mode 100644")
_GIT_REFUSED = ("old mode", "new mode", "new file mode", "deleted file mode", "rename ", "copy ",
                "similarity index", "dissimilarity index", "GIT binary patch", "Binary files")


class Refused(Exception):
    """The patch cannot be applied: the message says why, for the report."""


class FilePatch:
    def __init__(self, old, new):
        self.old, self.new = old, new  # a path, or None for /dev/null
        self.hunks = []  # (old start, [(tag, line)]) with tag in " -+"

    @property
    def path(self):
        return self.new if self.new is not None else self.old


def _path(field, where):
    name = field.split("\t", 1)[0]
    if name == "/dev/null":
        return None
    if name.startswith('"'):
        raise Refused(f"{where}: quoted path {name} (a name git had to escape)")
    first, sep, rest = name.partition("/")
    if not sep or first not in ("a", "b"):
        raise Refused(f"{where}: path {name!r} is not a/PATH or b/PATH")
    if any(c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F for c in rest):
        raise Refused(f"{where}: path {name!r} holds a quote, a backslash or a control character"
                      " (a CR: the patch was saved with CRLF line ends)")
    if any(p in ("", ".", "..") for p in rest.split("/")):
        raise Refused(f"{where}: path {name!r} is not relative and clean")
    return rest


def _git_path(line, where):
    """The path of "diff --git a/P b/P" (no rename: both halves name P)."""
    rest = line[len("diff --git "):]
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 0 or rest[half] != " ":
        raise Refused(f"{where}: a git header without a diff, whose path cannot be read: {line[:80]!r}")
    old, new = _path(rest[:half], where), _path(rest[half + 1:], where)
    if old != new:
        raise Refused(f"{where}: {old} becomes {new}: renames are not taken")
    return old


def parse(text):
    """The file patches of a unified diff, in order."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files, seen, i = [], set(), 0

    def add(fp, at):
        if fp.path in seen:
            raise Refused(f"line {at + 1}: {fp.path} is patched twice")
        seen.add(fp.path)
        files.append(fp)
        if len(files) > MAX_FILES:
            raise Refused(f"more than {MAX_FILES} files")

    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            start, mode = i, None
            i += 1
            while i < len(lines) and not lines[i].startswith(("--- ", "diff --git ")):
                h = lines[i]
                if h.startswith(_GIT_OK):
                    mode = h.split(" ")[0] if "file mode" in h else mode
                    i += 1
                    continue
                if h.startswith(_GIT_REFUSED):
                    raise Refused(f"line {i + 1}: {h.split(' ')[0]} ...: only changes to the text of files are taken")
                raise Refused(f"line {i + 1}: unexpected line in a git header: {h[:80]!r}")
            if i < len(lines) and lines[i].startswith("--- "):
                continue
            # No "---": git writes an empty file created or deleted so.
            if mode is None:
                raise Refused(f"line {start + 1}: a git header without a diff of a file created or deleted")
            p = _git_path(line, f"line {start + 1}")
            add(FilePatch(None, p) if mode == "new" else FilePatch(p, None), start)
            continue
        if not line.startswith("--- "):
            i += 1  # text outside a file's diff (a commit message, a comment)
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise Refused(f"line {i + 1}: '---' without '+++' after it")
        fp = FilePatch(_path(line[4:], f"line {i + 1}"), _path(lines[i + 1][4:], f"line {i + 2}"))
        if fp.old is None and fp.new is None:
            raise Refused(f"line {i + 1}: /dev/null on both sides")
        if fp.old is not None and fp.new is not None and fp.old != fp.new:
            raise Refused(f"line {i + 1}: {fp.old} becomes {fp.new}: renames are not taken")
        at = i
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            i = _hunk(lines, i, fp)
        if not fp.hunks:
            raise Refused(f"line {i + 1}: {fp.path} has no hunk")
        # "-- " after the last hunk is format-patch's signature, not a line of it.
        if i < len(lines) and lines[i][:1] in ("+", "-", " ", "\\") and not lines[i].startswith("--- ") \
                and lines[i] != "-- ":
            raise Refused(f"line {i + 1}: a line of a hunk beyond the count its header gives")
        add(fp, at)
    if not files and text.strip():
        raise Refused("the patch holds no file diff")
    return files


def _hunk(lines, i, fp):
    m = _HUNK.match(lines[i])
    if not m:
        raise Refused(f"line {i + 1}: malformed hunk header {lines[i][:80]!r}")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_n = 1 if m.group(2) is None else int(m.group(2))
    new_n = 1 if m.group(4) is None else int(m.group(4))
    body, j = [], i + 1
    while old_n > 0 or new_n > 0:
        if j >= len(lines):
            raise Refused(f"line {i + 1}: the hunk ends early")
        s = lines[j]
        tag, rest = (s[:1], s[1:]) if s else (" ", "")  # an empty line: empty context, as some editors leave it
        if tag not in " -+":
            raise Refused(f"line {j + 1}: {s[:80]!r} is not a line of the hunk at line {i + 1}")
        if tag in " -":
            old_n -= 1
        if tag in " +":
            new_n -= 1
        if old_n < 0 or new_n < 0:
            raise Refused(f"line {i + 1}: the hunk has more lines than its header says")
        body.append([tag, rest + "\n"])
        j += 1
        if j < len(lines) and lines[j].startswith("\\"):  # "\ No newline at end of file"
            body[-1][1] = rest
            j += 1
    if fp.old is None and old_start != 0:
        raise Refused(f"line {i + 1}: a new file's hunk starts at line {old_start}")
    fp.hunks.append((old_start, [tuple(b) for b in body]))
    return j


def _read(root, path):
    full = os.path.join(root, path)
    try:
        st = os.lstat(full)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISDIR(st.st_mode):
        return None  # no file: one created here takes the place of a directory the patch empties
    if not os.path.isfile(full) or os.path.islink(full) or st.st_nlink != 1:
        raise Refused(f"{path}: not a regular file of the repository")
    with open(full, encoding="utf-8", newline="") as f:
        return f.read()


def _patched(fp, content):
    """The content of one file after its hunks, or raises Refused."""
    old = _lines(content)
    out, pos = [], 0
    for k, (start, body) in enumerate(fp.hunks, 1):
        want = [line for tag, line in body if tag in " -"]
        # "-N,0" (nothing removed, no context) inserts after line N.
        at = _find(old, want, max(start if not want else start - 1, 0), pos)
        if at is None:
            raise Refused(f"does not apply: {fp.path}: hunk {k} (line {start}): its context and removed lines are not in the file")
        out += old[pos:at]
        out += [line for tag, line in body if tag in " +"]
        pos = at + len(want)
    return "".join(out + old[pos:])


def _lines(s):
    """s split after each newline (only "\\n", as the patch is)."""
    parts = s.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _find(old, want, hint, lowest):
    """Where want occurs in old at or after lowest, nearest to hint."""
    n = len(want)
    for d in range(len(old) + 1):
        for at in {hint - d, hint + d}:
            if lowest <= at <= len(old) - n and old[at:at + n] == want:
                return at
        if hint - d < lowest and hint + d > len(old) - n:
            return None
    return None


def apply(files, root):
    """Applies every file patch to the tree at root, all or nothing."""
    results = []
    for fp in files:
        content = _read(root, fp.path)
        if fp.old is None and content is not None:
            raise Refused(f"does not apply: {fp.path}: created by the patch, but the repository has it")
        if fp.old is not None and content is None:
            raise Refused(f"does not apply: {fp.path}: not in the repository")
        new = _patched(fp, content or "")
        if fp.new is None and new != "":
            raise Refused(f"does not apply: {fp.path}: deleted, but the patch leaves lines in it")
        results.append((fp, new))
    for fp, _ in results:  # removals first: a file may take a removed directory's place, or the reverse
        if fp.new is None:
            remove(root, fp.path)
    for fp, new in results:
        if fp.new is None:
            continue
        full = os.path.join(root, fp.path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8", newline="") as f:
            f.write(new)


def remove(root, path):
    """Removes a file and then the directories that removing it left empty,
    as `git apply` does."""
    os.unlink(os.path.join(root, path))
    d = os.path.dirname(path)
    while d and not os.listdir(os.path.join(root, d)):
        os.rmdir(os.path.join(root, d))
        d = os.path.dirname(d)
