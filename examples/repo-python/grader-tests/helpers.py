"""What the grader's unit tests share: the grader's modules on the path,
trees read and made."""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.dirname(HERE)
GRADER = os.path.join(EXAMPLE, "bundle", "grader")
sys.path.insert(0, GRADER)


def read_optional(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def copy_or_make(src, dst):
    """dst as a copy of the tree src, or empty if there is no src (git keeps
    no empty directory)."""
    if os.path.isdir(src):
        shutil.copytree(src, dst)
    else:
        os.makedirs(dst)


def snapshot(root):
    """{path: bytes} of the regular files below root ({} if there is none)."""
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            full = os.path.join(d, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root)] = f.read()
    return out


def write(root, path, data=b"", mode=0o644):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    os.chmod(full, mode)
    return full
