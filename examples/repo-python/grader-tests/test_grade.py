"""grade.prepare on the example's own bundle and candidates, without an
engine: what the workspace may hold, the verdict-deciding refusals of
README's table, and a tree refused or applied as the patch of the same
change is."""

import json
import os
import shutil
import tempfile
import unittest
from unittest import mock

import helpers
import grade
import patch

BUNDLE = os.path.join(helpers.EXAMPLE, "bundle")
CANDIDATES = os.path.join(helpers.EXAMPLE, "candidates")

# What prepare says of each candidate of candidates/ (README's table; the
# verdicts of those it applies come from pytest, in the script test).
WANT = {
    "gold.patch": "patch of 1 changed file(s) applied",
    "wrong.patch": "patch of 1 changed file(s) applied",
    "skips-tests.patch": "patch of 1 changed file(s) applied",
    "probe-boundaries.patch": "applied",
    "patches-the-runner-disguised.patch": "applied",
    "edits-the-tests.patch": "patch refused: it touches tests/test_cart.py, a trusted path (tests) restored from the bundle",
    "adds-conftest.patch": "patch refused: it touches conftest.py, a trusted path (conftest.py)",
    "patches-the-runner.patch": "patch refused: src/pricing/__init__.py: an added line names the test runner ('pytest')",
    "does-not-apply.patch": "patch refused: does not apply: src/pricing/discounts.py: hunk 1 (line 2)",
    "tree-gold": "tree of 1 changed file(s) applied",
    "tree-edits-the-tests": "tree refused: it touches tests/test_cart.py, a trusted path (tests) restored from the bundle",
}


class Prepare(unittest.TestCase):
    def setUp(self):
        with open(os.path.join(BUNDLE, "instance.json"), encoding="utf-8") as f:
            self.inst = json.load(f)
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.n = 0

    def prepare(self, fill):
        """prepare on a new workspace that fill(dir) makes: what it says
        (refused or applied) and the repository it made."""
        self.n += 1
        ws, repo = os.path.join(self.tmp, f"ws{self.n}"), os.path.join(self.tmp, f"repo{self.n}")
        os.makedirs(ws)
        fill(ws)
        with mock.patch.multiple(grade, BUNDLE=BUNDLE, CANDIDATE=ws, REPO=repo):
            try:
                return grade.prepare(self.inst), repo
            except patch.Refused as e:
                return str(e), None

    def candidate(self, name):
        src = os.path.join(CANDIDATES, name)
        if name.endswith(".patch"):
            return lambda ws: shutil.copy(src, os.path.join(ws, "candidate.patch"))
        return lambda ws: shutil.copytree(os.path.join(src, "repo"), os.path.join(ws, "repo"))

    def test_every_candidate(self):
        names = sorted(os.listdir(CANDIDATES))
        self.assertEqual(names, sorted(WANT))
        for name in names:
            with self.subTest(candidate=name):
                got, _ = self.prepare(self.candidate(name))
                self.assertIn(WANT[name], got)

    def test_the_gold_tree_makes_what_the_gold_patch_makes(self):
        _, by_patch = self.prepare(self.candidate("gold.patch"))
        _, by_tree = self.prepare(self.candidate("tree-gold"))
        self.assertEqual(helpers.snapshot(by_tree), helpers.snapshot(by_patch))
        self.assertNotEqual(helpers.snapshot(by_tree), helpers.snapshot(os.path.join(BUNDLE, "repo")))

    def test_a_tree_is_judged_as_its_patch(self):
        """Every candidate patch that applies to the base, given as the tree
        it makes, is refused for the same reason or applied alike."""
        for name in sorted(WANT):
            if not name.endswith(".patch") or "does not apply" in WANT[name]:
                continue
            with self.subTest(candidate=name):
                with open(os.path.join(CANDIDATES, name), encoding="utf-8") as f:
                    files = patch.parse(f.read())

                def fill(ws):
                    shutil.copytree(os.path.join(BUNDLE, "repo"), os.path.join(ws, "repo"))
                    patch.apply(files, os.path.join(ws, "repo"))

                by_patch, repo_p = self.prepare(self.candidate(name))
                by_tree, repo_t = self.prepare(fill)
                self.assertEqual(by_tree.replace("tree ", "patch ", 1), by_patch)
                if repo_p is not None:
                    self.assertEqual(helpers.snapshot(repo_t), helpers.snapshot(repo_p))

    def test_trusted_paths_are_restored(self):
        # A trusted file the candidate cannot change is the bundle's in the repository made.
        _, repo = self.prepare(self.candidate("tree-gold"))
        for p in ("tests/test_cart.py", "pytest.ini"):
            with open(os.path.join(repo, p), "rb") as a, open(os.path.join(BUNDLE, "repo", p), "rb") as b:
                self.assertEqual(a.read(), b.read())

    def test_a_tree_adding_a_hook(self):
        for path, data, want in [
            ("src/pricing/conftest.py", "x = 1\n", "tree refused: it touches src/pricing/conftest.py: 'conftest.py' (pattern 'conftest.py')"),
            ("src/shop.pth", "import os\n", "tree refused: it touches src/shop.pth: 'shop.pth' (pattern '*.pth')"),
            # What a tree holds after pytest ran in it: a patch of it would be binary.
            ("src/pricing/__pycache__/discounts.cpython-311.pyc", b"\xa7\r\r\n\0",
             "tree refused: src/pricing/__pycache__/discounts.cpython-311.pyc: not UTF-8 text"),
        ]:
            def fill(ws):
                shutil.copytree(os.path.join(CANDIDATES, "tree-gold", "repo"), os.path.join(ws, "repo"))
                helpers.write(ws, "repo/" + path, data)
            with self.subTest(path=path):
                got, _ = self.prepare(fill)
                self.assertIn(want, got)

    def test_a_tree_with_a_symlink(self):
        def fill(ws):
            shutil.copytree(os.path.join(CANDIDATES, "tree-gold", "repo"), os.path.join(ws, "repo"))
            os.symlink("/bundle/instance.json", os.path.join(ws, "repo", "src", "pricing", "rates.py"))
        got, _ = self.prepare(fill)
        self.assertEqual(got, "tree refused: src/pricing/rates.py is a symlink: only regular files and directories are taken")

    def test_what_the_workspace_holds(self):
        def both(ws):
            self.candidate("gold.patch")(ws)
            self.candidate("tree-gold")(ws)

        def patch_and_notes(ws):
            self.candidate("gold.patch")(ws)
            helpers.write(ws, "notes.txt", "the fix\n")

        def tree_and_notes(ws):
            self.candidate("tree-gold")(ws)
            helpers.write(ws, "notes.txt", "the fix\n")

        for fill, want in [
            (both, "workspace refused: it holds both candidate.patch and repo/: give one"),
            (lambda ws: None, "workspace refused: it holds neither candidate.patch nor repo/ (it holds nothing)"),
            (lambda ws: helpers.write(ws, "fix.diff"), "workspace refused: it holds neither candidate.patch nor repo/ (it holds fix.diff)"),
            (patch_and_notes, "workspace refused: it holds other files than candidate.patch: notes.txt"),
            (tree_and_notes, "workspace refused: it holds other files than repo/: notes.txt"),
            (lambda ws: helpers.write(ws, "repo", "a file\n"), "workspace refused: repo is not a directory"),
            (lambda ws: os.symlink("/", os.path.join(ws, "repo")), "workspace refused: repo is not a directory"),
            (lambda ws: os.mkdir(os.path.join(ws, "candidate.patch")), "patch refused: candidate.patch is not a regular file"),
            (lambda ws: helpers.write(ws, "candidate.patch", b"\xff\n"), "patch refused: candidate.patch is not UTF-8"),
            (lambda ws: os.mkdir(os.path.join(ws, "repo")), "tree refused: it touches pytest.ini, a trusted path"),
        ]:
            with self.subTest(want=want):
                got, _ = self.prepare(fill)
                self.assertIn(want, got)

    def test_a_patch_too_large(self):
        with mock.patch.object(grade, "MAX_PATCH", 10):
            got, _ = self.prepare(self.candidate("gold.patch"))
        self.assertEqual(got, "patch refused: candidate.patch is larger than 10 bytes")


if __name__ == "__main__":
    unittest.main()
