"""tree.py: the changes a whole tree makes, refused where a patch could not
say them, and the same changes as the patches of testdata/patches."""

import os
import socket
import tempfile
import unittest
from unittest import mock

import helpers
import patch
import tree
from test_patch import FIXTURES, cases


class SameAsThePatch(unittest.TestCase):
    def test_every_fixture_that_applies(self):
        """For every fixture whose patch applies, the tree after it, as a
        candidate, touches the same paths, adds no line the patch does not,
        and gives the same tree."""
        n = 0
        for name in cases():
            case = os.path.join(FIXTURES, name)
            if os.path.exists(os.path.join(case, "refused")):
                continue
            n += 1
            with self.subTest(case=name), tempfile.TemporaryDirectory() as tmp:
                before, after, root = (os.path.join(tmp, d) for d in ("before", "after", "root"))
                helpers.copy_or_make(os.path.join(case, "before"), before)
                helpers.copy_or_make(os.path.join(case, "after"), after)
                helpers.copy_or_make(os.path.join(case, "before"), root)
                with open(os.path.join(case, "candidate.patch"), encoding="utf-8", newline="") as f:
                    files = patch.parse(f.read())
                changes = tree.diff(before, after)
                self.assertEqual(sorted(c.path for c in changes), sorted(fp.path for fp in files))
                plus = [line for fp in files for _, body in fp.hunks for tag, line in body if tag == "+"]
                for c in changes:
                    for line in c.added_lines():
                        self.assertIn(line, plus)
                tree.apply(changes, root)
                self.assertEqual(helpers.snapshot(root), helpers.snapshot(after))
        self.assertGreater(n, 8)


class Diff(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.base, self.tree = os.path.join(tmp.name, "base"), os.path.join(tmp.name, "tree")
        for root in (self.base, self.tree):
            helpers.write(root, "src/a.py", "one\ntwo\n")
            helpers.write(root, "src/run.sh", "echo\n", 0o755)
            helpers.write(root, "tests/test_a.py", "t\n")

    def refused(self, want):
        with self.assertRaises(patch.Refused) as cm:
            tree.diff(self.base, self.tree)
        self.assertIn(want, str(cm.exception))

    def paths(self):
        return [(c.path, c.old is not None, c.new is not None) for c in tree.diff(self.base, self.tree)]

    def test_unchanged(self):
        self.assertEqual(self.paths(), [])

    def test_changed_added_removed(self):
        helpers.write(self.tree, "src/a.py", "one\nTWO\n")
        helpers.write(self.tree, "src/new/b.py", "")
        os.unlink(os.path.join(self.tree, "src/run.sh"))
        self.assertEqual(self.paths(), [("src/a.py", True, True), ("src/new/b.py", False, True),
                                        ("src/run.sh", True, False)])

    def test_empty_directory_is_no_change(self):
        os.makedirs(os.path.join(self.tree, "src", "_pytest"))
        self.assertEqual(self.paths(), [])

    def test_symlink(self):
        os.symlink("a.py", os.path.join(self.tree, "src", "link.py"))
        self.refused("src/link.py is a symlink: only regular files and directories are taken")

    def test_symlink_replacing_a_file(self):
        os.unlink(os.path.join(self.tree, "src", "a.py"))
        os.symlink("/bundle/instance.json", os.path.join(self.tree, "src", "a.py"))
        self.refused("src/a.py is a symlink")

    def test_symlink_to_a_directory(self):
        os.symlink("/", os.path.join(self.tree, "root"))
        self.refused("root is a symlink")

    def test_fifo(self):
        os.mkfifo(os.path.join(self.tree, "src", "pipe"))
        self.refused("src/pipe is a FIFO")

    def test_socket(self):
        s = socket.socket(socket.AF_UNIX)
        self.addCleanup(s.close)
        s.bind(os.path.join(self.tree, "sock"))
        self.refused("sock is a socket")

    def test_executable_bit_set(self):
        os.chmod(os.path.join(self.tree, "src", "a.py"), 0o755)
        self.refused("src/a.py: its executable bit changes: only changes to the text of files are taken")

    def test_executable_bit_cleared(self):
        os.chmod(os.path.join(self.tree, "src", "run.sh"), 0o644)
        self.refused("src/run.sh: its executable bit changes")

    def test_new_executable_file(self):
        helpers.write(self.tree, "src/tool", "#!/bin/sh\n", 0o755)
        self.refused("src/tool: a new executable file")

    def test_group_and_other_bits_are_not_a_mode(self):
        os.chmod(os.path.join(self.tree, "src", "a.py"), 0o600)
        self.assertEqual(self.paths(), [])

    def test_binary(self):
        for data in (b"\xff\xfe\n", b"a\0b\n"):
            with self.subTest(data=data):
                helpers.write(self.tree, "src/blob", data)
                self.refused("src/blob: not UTF-8 text (its diff would be binary)")

    def test_binary_base_file_changed(self):
        helpers.write(self.base, "src/latin.txt", b"caf\xe9\n")
        helpers.write(self.tree, "src/latin.txt", b"caf\xe9!\n")
        self.refused("src/latin.txt: not UTF-8 text")

    def test_binary_base_file_unchanged(self):
        helpers.write(self.base, "src/latin.txt", b"caf\xe9\n")
        helpers.write(self.tree, "src/latin.txt", b"caf\xe9\n")
        self.assertEqual(self.paths(), [])

    def test_names_git_would_quote(self):
        for name in ('q"uote.py', "back\\slash.py", "new\nline.py", "tab\t.py"):
            with self.subTest(name=name):
                full = helpers.write(self.tree, "src/" + name, "x\n")
                self.refused("the name holds a quote, a backslash or a control character")
                os.unlink(full)

    def test_too_many_changed_files(self):
        for i in range(patch.MAX_FILES):
            helpers.write(self.tree, f"many/f{i}", "x\n")
        self.assertEqual(len(self.paths()), patch.MAX_FILES)
        helpers.write(self.tree, "many/one-more", "x\n")
        self.refused("more than 200 changed files")

    def test_too_many_bytes(self):
        helpers.write(self.tree, "src/big1", "x" * 60 + "\n")
        helpers.write(self.tree, "src/big2", "x" * 60 + "\n")
        with mock.patch.object(tree, "MAX_BYTES", 122):
            self.assertEqual(len(self.paths()), 2)
        with mock.patch.object(tree, "MAX_BYTES", 121):
            self.refused("the changed files hold more than 121 bytes")

    def test_too_many_entries(self):
        with mock.patch.object(tree, "MAX_ENTRIES", 5):
            self.assertEqual(self.paths(), [])  # src, a.py, run.sh, tests, test_a.py
        helpers.write(self.tree, "src/c.py", "")
        with mock.patch.object(tree, "MAX_ENTRIES", 5):
            self.refused("the tree holds more than 5 entries")

    def test_added_lines_are_those_the_new_text_holds_more_often(self):
        c = tree.Change("f", b"a\na\nb\n", b"a\nb\na\na\nc")
        self.assertEqual(c.added_lines(), ["a\n", "c"])
        self.assertEqual(tree.Change("f", b"x\n", None).added_lines(), [])
        self.assertEqual(tree.Change("f", None, b"x\r\ny\n").added_lines(), ["x\r\n", "y\n"])


class Apply(unittest.TestCase):
    def run_both_ways(self, base_files, tree_files):
        with tempfile.TemporaryDirectory() as tmp:
            base, cand, root = (os.path.join(tmp, d) for d in ("base", "tree", "root"))
            for root_, files in ((base, base_files), (cand, tree_files), (root, base_files)):
                os.makedirs(root_)
                for p, data in files.items():
                    helpers.write(root_, p, data)
            tree.apply(tree.diff(base, cand), root)
            self.assertEqual(helpers.snapshot(root), helpers.snapshot(cand))
            return sorted(d for d, _, _ in os.walk(root))

    def test_a_file_becomes_a_directory(self):
        self.run_both_ways({"a": "file\n", "b": "b\n"}, {"a/x": "in a dir\n", "b": "b\n"})

    def test_a_directory_becomes_a_file(self):
        dirs = self.run_both_ways({"d/e/f": "x\n", "b": "b\n"}, {"d": "a file\n", "b": "b\n"})
        self.assertEqual(len(dirs), 1)

    def test_emptied_directories_go(self):
        dirs = self.run_both_ways({"d/e/f": "x\n", "d/g": "g\n"}, {"d/g": "g\n"})
        self.assertFalse(any(d.endswith(os.path.join("d", "e")) for d in dirs))


if __name__ == "__main__":
    unittest.main()
