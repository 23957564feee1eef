package main

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The fixtures are real git diff (and format-patch) output, written by
// examples/repo-python/grader-tests/make-fixtures.sh; patch.py takes the
// same ones. Each case: before/ (the tree), candidate.patch, and after/
// (the tree it makes) or refused (a part of the refusal).
const fixtures = "testdata/patches"

func fixtureCases(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(fixtures)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	if len(names) < 20 {
		t.Fatalf("%d fixtures in %s, want the whole set", len(names), fixtures)
	}
	return names
}

// snapshot is the regular files below root and their bytes (none if root
// does not exist: git keeps no empty directory).
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == root {
			return fs.SkipAll
		}
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// copyOrMake copies the tree src to dst, or makes dst empty if there is no src.
func copyOrMake(t *testing.T, src, dst string) {
	t.Helper()
	if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

func diffSnapshots(got, want map[string]string) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[p]; !ok {
			fmt.Fprintf(&b, "missing %s; ", p)
		} else if g != want[p] {
			fmt.Fprintf(&b, "%s: got %q, want %q; ", p, g, want[p])
		}
	}
	for _, p := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[p]; !ok {
			fmt.Fprintf(&b, "extra %s; ", p)
		}
	}
	return b.String()
}

func TestPatchFixtures(t *testing.T) {
	for _, name := range fixtureCases(t) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(fixtures, name)
			text, err := os.ReadFile(filepath.Join(dir, "candidate.patch"))
			if err != nil {
				t.Fatal(err)
			}
			wantRefused, err := os.ReadFile(filepath.Join(dir, "refused"))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			root := filepath.Join(t.TempDir(), "repo")
			copyOrMake(t, filepath.Join(dir, "before"), root)
			files, err := parsePatch(string(text))
			if err == nil {
				err = applyPatch(files, root)
			}
			var r *refused
			switch {
			case err != nil && !errors.As(err, &r):
				t.Fatalf("got %v (%T), want a refusal or nothing", err, err)
			case err != nil && wantRefused == nil:
				t.Fatalf("refused: %v", err)
			case err != nil:
				if want := strings.TrimSpace(string(wantRefused)); !strings.Contains(err.Error(), want) {
					t.Errorf("got %q, want it to hold %q", err, want)
				}
				// All or nothing: a refused patch leaves the tree as it was.
				if d := diffSnapshots(snapshot(t, root), snapshot(t, filepath.Join(dir, "before"))); d != "" {
					t.Errorf("a refused patch changed the tree: %s", d)
				}
			case wantRefused != nil:
				t.Fatalf("applied, want refused: %s", wantRefused)
			default:
				if d := diffSnapshots(snapshot(t, root), snapshot(t, filepath.Join(dir, "after"))); d != "" {
					t.Errorf("after: %s", d)
				}
			}
		})
	}
}

func TestPatchMoreThanMaxFiles(t *testing.T) {
	one := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "--- /dev/null\n+++ b/f%d\n@@ -0,0 +1 @@\n+x\n", i)
		}
		return b.String()
	}
	if _, err := parsePatch(one(maxFiles)); err != nil {
		t.Fatalf("%d files: %v", maxFiles, err)
	}
	if _, err := parsePatch(one(maxFiles + 1)); err == nil || !strings.Contains(err.Error(), "more than 200 files") {
		t.Fatalf("%d files: got %v, want more than 200 files", maxFiles+1, err)
	}
}

// Every prefix of a patch parses or is refused: never another error, never a panic.
func TestPatchPrefixesAreRefusedOrParsed(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(fixtures, "two-hunks-two-files", "candidate.patch"))
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(text) {
		var r *refused
		if _, err := parsePatch(string(text[:n])); err != nil && !errors.As(err, &r) {
			t.Fatalf("prefix of %d bytes: %v (%T)", n, err, err)
		}
	}
}

func TestGitPath(t *testing.T) {
	for line, want := range map[string]string{
		"diff --git a/x b/x":         "x",
		"diff --git a/a b/c b/a b/c": "a b/c",
		"diff --git a/x b/y":         "",
		"diff --git a/x  b/x":        "",
		"diff --git a/x":             "",
	} {
		got, err := gitPath(line, 1)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("gitPath(%q) = %q, %v; want %q", line, got, err, want)
		}
	}
}

func TestApplyPatchRefusesALink(t *testing.T) {
	root := t.TempDir()
	if err := os.Symlink("/etc/hostname", filepath.Join(root, "f")); err != nil {
		t.Fatal(err)
	}
	files, err := parsePatch("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-x\n+y\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := applyPatch(files, root); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("got %v, want not a regular file", err)
	}
}

func TestApplyPatchFileTakesARemovedDirectorysPlace(t *testing.T) {
	root := t.TempDir()
	writeTestFile(t, root, "d/e/f", "x\n", 0o644)
	files, err := parsePatch("--- /dev/null\n+++ b/d\n@@ -0,0 +1 @@\n+now a file\n--- a/d/e/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := applyPatch(files, root); err != nil {
		t.Fatal(err)
	}
	if d := diffSnapshots(snapshot(t, root), map[string]string{"d": "now a file\n"}); d != "" {
		t.Error(d)
	}
}

func TestApplyPatchRemovesEmptiedDirectories(t *testing.T) {
	root := t.TempDir()
	writeTestFile(t, root, "a/b/f", "x\n", 0o644)
	writeTestFile(t, root, "a/keep", "k\n", 0o644)
	files, err := parsePatch("--- a/a/b/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := applyPatch(files, root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a", "b")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a/b: got %v, want it gone", err)
	}
	if _, err := os.Stat(filepath.Join(root, "a", "keep")); err != nil {
		t.Error(err)
	}
}

func writeTestFile(t *testing.T, root, p, data string, mode os.FileMode) string {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(full, mode); err != nil {
		t.Fatal(err)
	}
	return full
}
