"""What a candidate's whole tree changes in the repository at its base.

    changes = diff(base, tree)   # [Change] sorted by path, or raises Refused
    apply(changes, root)         # writes them into root, a copy of base

A change is what a unified diff could say, and nothing else: the text of a
file changed, a file added (mode 0644), a file removed. The tree is the
candidate's, so whatever a patch could not say is refused, naming the path:
a symlink, FIFO, socket or device; a file whose executable bit differs from
the base's, or a new executable file (a mode change); a changed, added or
removed file that is not UTF-8 text or holds a NUL byte (its diff would be
binary); a name holding a quote, a backslash or a control character (git
would quote it). Directories carry no change of their own: an empty one is
ignored, as git ignores it. Bounds, checked while walking: at most
MAX_ENTRIES entries, at most patch.MAX_FILES changed files, at most
MAX_BYTES of changed and added content (a patch's own bound).
examples/repo-go/bundle/grader/tree.go is the same in Go.
"""

import os
import stat

from patch import MAX_FILES, Refused, remove

MAX_ENTRIES = 100_000
MAX_BYTES = 4 << 20
_CHUNK = 1 << 16


class Change:
    def __init__(self, path, old, new):
        self.path = path
        self.old, self.new = old, new  # bytes, or None: added (old) or removed (new)

    def added_lines(self):
        """The lines every diff of this change adds: those the new text holds
        more often than the old."""
        if self.new is None:
            return []
        counts = {}
        for line in _lines(self.old or b""):
            counts[line] = counts.get(line, 0) + 1
        added = []
        for line in _lines(self.new):
            if counts.get(line, 0) > 0:
                counts[line] -= 1
            else:
                added.append(line.decode("utf-8"))
        return added


def _lines(b):
    """b split after each newline (only b"\\n", as a patch is)."""
    parts = b.split(b"\n")
    return [x + b"\n" for x in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _walk(root, what, refuse_others):
    """{path: stat} of the regular files below root, walked depth first in
    lexical order (as Go's filepath.WalkDir)."""
    files, count = {}, 0

    def walk(rel):
        nonlocal count
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            count += 1
            if count > MAX_ENTRIES:
                raise Refused(f"the {what} holds more than {MAX_ENTRIES} entries")
            p = f"{rel}/{e.name}" if rel else e.name
            st = e.stat(follow_symlinks=False)
            if refuse_others:
                _check_name(p)
            if stat.S_ISDIR(st.st_mode):
                walk(p)
            elif stat.S_ISREG(st.st_mode):
                files[p] = st
            elif refuse_others:
                raise Refused(f"{p} is {_kind(st.st_mode)}: only regular files and directories are taken")

    walk("")
    return files


def _check_name(p):
    try:
        p.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"{p!r}: the name is not UTF-8") from None
    if any(c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F for c in p):
        raise Refused(f"{p!r}: the name holds a quote, a backslash or a control character (git would quote it)")


def _kind(mode):
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def _read(root, p, st, limit):
    fd = os.open(os.path.join(root, p), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise Refused(f"{p}: not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"the changed files hold more than {MAX_BYTES} bytes")
    return data


def _same(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(_CHUNK), fb.read(_CHUNK)
            if x != y:
                return False
            if not x:
                return True


def _text(p, data):
    if data is None:
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        ok = False
    else:
        ok = b"\0" not in data
    if not ok:
        raise Refused(f"{p}: not UTF-8 text (its diff would be binary): only changes to the text of files are taken")


def diff(base, tree):
    """The changes that make base's regular files tree's."""
    old = _walk(base, "base", False)
    new = _walk(tree, "tree", True)
    changes, budget = [], MAX_BYTES
    for p in sorted(old.keys() | new.keys()):
        o, n = old.get(p), new.get(p)
        if n is not None:
            was = bool(o.st_mode & stat.S_IXUSR) if o is not None else False
            if bool(n.st_mode & stat.S_IXUSR) != was:
                how = "a new executable file" if o is None else "its executable bit changes"
                raise Refused(f"{p}: {how}: only changes to the text of files are taken")
            if o is not None and o.st_size == n.st_size and _same(os.path.join(base, p), os.path.join(tree, p)):
                continue
        if len(changes) == MAX_FILES:
            raise Refused(f"more than {MAX_FILES} changed files")
        before = None
        if o is not None:
            with open(os.path.join(base, p), "rb") as f:
                before = f.read()
        after = None
        if n is not None:
            after = _read(tree, p, n, budget)
            budget -= len(after)
        _text(p, before)
        _text(p, after)
        changes.append(Change(p, before, after))
    return changes


def apply(changes, root):
    """Writes the changes into root: removals first (a directory they empty
    goes, as with a patch: the tree may have a file in its place), then
    every file's new text."""
    for c in changes:
        if c.new is None:
            remove(root, c.path)
    for c in changes:
        if c.new is None:
            continue
        full = os.path.join(root, c.path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(c.new)
