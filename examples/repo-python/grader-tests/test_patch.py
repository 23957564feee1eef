"""patch.py on real `git diff` output: testdata/patches (make-fixtures.sh)."""

import os
import tempfile
import unittest

import helpers
import patch

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "patches")


def cases():
    return sorted(e for e in os.listdir(FIXTURES) if not e.startswith("."))


class Fixtures(unittest.TestCase):
    def test_every_fixture(self):
        self.assertGreater(len(cases()), 20)
        for name in cases():
            with self.subTest(case=name):
                self.check(os.path.join(FIXTURES, name))

    def check(self, case):
        with open(os.path.join(case, "candidate.patch"), encoding="utf-8", newline="") as f:
            text = f.read()
        want_refused = helpers.read_optional(os.path.join(case, "refused"))
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "repo")
            helpers.copy_or_make(os.path.join(case, "before"), root)
            try:
                patch.apply(patch.parse(text), root)
            except patch.Refused as e:
                if want_refused is None:
                    self.fail(f"refused: {e}")
                self.assertIn(want_refused.strip(), str(e))
                # All or nothing: a refused patch leaves the tree as it was.
                self.assertEqual(helpers.snapshot(root), helpers.snapshot(os.path.join(case, "before")))
                return
            if want_refused is not None:
                self.fail(f"applied, want refused: {want_refused.strip()}")
            self.assertEqual(helpers.snapshot(root), helpers.snapshot(os.path.join(case, "after")))


class Parse(unittest.TestCase):
    def test_more_than_max_files(self):
        one = "--- /dev/null\n+++ b/f{0}\n@@ -0,0 +1 @@\n+x\n"
        patch.parse("".join(one.format(i) for i in range(patch.MAX_FILES)))
        with self.assertRaisesRegex(patch.Refused, "more than 200 files"):
            patch.parse("".join(one.format(i) for i in range(patch.MAX_FILES + 1)))

    def test_refusals_are_refused_never_other_exceptions(self):
        # Pieces of patches cut anywhere: each parses or is Refused.
        with open(os.path.join(FIXTURES, "two-hunks-two-files", "candidate.patch"), encoding="utf-8") as f:
            text = f.read()
        for n in range(len(text)):
            try:
                patch.parse(text[:n])
            except patch.Refused:
                pass

    def test_header_only_paths(self):
        for line, want in [("diff --git a/x b/x", "x"), ("diff --git a/a b/c b/a b/c", "a b/c")]:
            self.assertEqual(patch._git_path(line, "line 1"), want)
        for line in ["diff --git a/x b/y", "diff --git a/x  b/x", "diff --git a/x"]:
            with self.assertRaises(patch.Refused):
                patch._git_path(line, "line 1")


class Apply(unittest.TestCase):
    def test_refuses_a_link_in_the_repository(self):
        with tempfile.TemporaryDirectory() as root:
            os.symlink("/etc/hostname", os.path.join(root, "f"))
            files = patch.parse("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+y\n")
            with self.assertRaisesRegex(patch.Refused, "not a regular file"):
                patch.apply(files, root)

    def test_a_file_takes_a_removed_directorys_place(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "d", "e"))
            with open(os.path.join(root, "d", "e", "f"), "w") as f:
                f.write("x\n")
            patch.apply(patch.parse("--- /dev/null\n+++ b/d\n@@ -0,0 +1 @@\n+now a file\n"
                                    "--- a/d/e/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"), root)
            self.assertEqual(helpers.snapshot(root), {"d": b"now a file\n"})

    def test_removing_the_last_file_removes_its_directories(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "a", "b"))
            with open(os.path.join(root, "a", "b", "f"), "w") as f:
                f.write("x\n")
            with open(os.path.join(root, "a", "keep"), "w") as f:
                f.write("k\n")
            patch.apply(patch.parse("--- a/a/b/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"), root)
            self.assertFalse(os.path.exists(os.path.join(root, "a", "b")))
            self.assertTrue(os.path.exists(os.path.join(root, "a", "keep")))


if __name__ == "__main__":
    unittest.main()
