package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// For every fixture whose patch applies, the tree after it, as a
// candidate, touches the same paths, adds no line the patch does not, and
// makes the same tree.
func TestTreeIsThePatchOfEveryFixture(t *testing.T) {
	n := 0
	for _, name := range fixtureCases(t) {
		dir := filepath.Join(fixtures, name)
		if _, err := os.Stat(filepath.Join(dir, "refused")); err == nil {
			continue
		}
		n++
		t.Run(name, func(t *testing.T) {
			tmp := t.TempDir()
			before, after, root := filepath.Join(tmp, "before"), filepath.Join(tmp, "after"), filepath.Join(tmp, "root")
			copyOrMake(t, filepath.Join(dir, "before"), before)
			copyOrMake(t, filepath.Join(dir, "after"), after)
			copyOrMake(t, filepath.Join(dir, "before"), root)
			text, err := os.ReadFile(filepath.Join(dir, "candidate.patch"))
			if err != nil {
				t.Fatal(err)
			}
			files, err := parsePatch(string(text))
			if err != nil {
				t.Fatal(err)
			}
			changes, err := diffTree(before, after)
			if err != nil {
				t.Fatal(err)
			}
			var got, want, plus []string
			for _, c := range changes {
				got = append(got, c.path)
			}
			for _, fp := range files {
				want = append(want, fp.path())
				for _, h := range fp.hunks {
					for _, l := range h.lines {
						if l.tag == '+' {
							plus = append(plus, l.text)
						}
					}
				}
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("paths: got %q, want %q", got, want)
			}
			for _, c := range changes {
				for _, l := range c.addedLines() {
					if !slices.Contains(plus, l) {
						t.Errorf("%s: added line %q is not one the patch adds", c.path, l)
					}
				}
			}
			if err := applyTree(changes, root); err != nil {
				t.Fatal(err)
			}
			if d := diffSnapshots(snapshot(t, root), snapshot(t, after)); d != "" {
				t.Error(d)
			}
		})
	}
	if n < 8 {
		t.Fatalf("%d fixtures apply, want the whole set", n)
	}
}

// treeFixture is a base and a tree, both holding src/a.py, src/run.sh
// (executable) and tests/test_a.py.
func treeFixture(t *testing.T) (base, tree string) {
	t.Helper()
	tmp := t.TempDir()
	base, tree = filepath.Join(tmp, "base"), filepath.Join(tmp, "tree")
	for _, root := range []string{base, tree} {
		writeTestFile(t, root, "src/a.py", "one\ntwo\n", 0o644)
		writeTestFile(t, root, "src/run.sh", "echo\n", 0o755)
		writeTestFile(t, root, "tests/test_a.py", "t\n", 0o644)
	}
	return base, tree
}

func changePaths(t *testing.T, base, tree string) []string {
	t.Helper()
	changes, err := diffTree(base, tree)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range changes {
		s := c.path
		switch {
		case c.added:
			s += " added"
		case c.removed:
			s += " removed"
		}
		out = append(out, s)
	}
	return out
}

func TestDiffTree(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, base, tree string)
		want []string // the changes, or
		err  string   // a part of the refusal
	}{
		{name: "unchanged", edit: func(*testing.T, string, string) {}},
		{name: "changed, added, removed", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, "src/a.py", "one\nTWO\n", 0o644)
			writeTestFile(t, tree, "src/new/b.py", "", 0o644)
			rm(t, tree, "src/run.sh")
		}, want: []string{"src/a.py", "src/new/b.py added", "src/run.sh removed"}},
		{name: "an empty directory is no change", edit: func(t *testing.T, _, tree string) {
			mkdir(t, tree, "src/_pytest")
		}},
		{name: "symlink", edit: func(t *testing.T, _, tree string) {
			symlink(t, "a.py", tree, "src/link.py")
		}, err: "src/link.py is a symlink: only regular files and directories are taken"},
		{name: "symlink replacing a file", edit: func(t *testing.T, _, tree string) {
			rm(t, tree, "src/a.py")
			symlink(t, "/bundle/instance.json", tree, "src/a.py")
		}, err: "src/a.py is a symlink"},
		{name: "symlink to a directory", edit: func(t *testing.T, _, tree string) {
			symlink(t, "/", tree, "root")
		}, err: "root is a symlink"},
		{name: "fifo", edit: func(t *testing.T, _, tree string) {
			if err := syscall.Mkfifo(filepath.Join(tree, "src", "pipe"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, err: "src/pipe is a FIFO"},
		{name: "socket", edit: func(t *testing.T, _, tree string) {
			l, err := net.Listen("unix", filepath.Join(tree, "sock"))
			if err != nil {
				t.Fatal(err)
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			t.Cleanup(func() { l.Close() })
		}, err: "sock is a socket"},
		{name: "executable bit set", edit: func(t *testing.T, _, tree string) {
			chmod(t, tree, "src/a.py", 0o755)
		}, err: "src/a.py: its executable bit changes: only changes to the text of files are taken"},
		{name: "executable bit cleared", edit: func(t *testing.T, _, tree string) {
			chmod(t, tree, "src/run.sh", 0o644)
		}, err: "src/run.sh: its executable bit changes"},
		{name: "new executable file", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, "src/tool", "#!/bin/sh\n", 0o755)
		}, err: "src/tool: a new executable file"},
		{name: "group and other bits are no mode", edit: func(t *testing.T, _, tree string) {
			chmod(t, tree, "src/a.py", 0o600)
		}},
		{name: "not UTF-8", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, "src/blob", "\xff\xfe\n", 0o644)
		}, err: "src/blob: not UTF-8 text (its diff would be binary)"},
		{name: "NUL", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, "src/blob", "a\x00b\n", 0o644)
		}, err: "src/blob: not UTF-8 text"},
		{name: "a binary base file changed", edit: func(t *testing.T, base, tree string) {
			writeTestFile(t, base, "src/latin.txt", "caf\xe9\n", 0o644)
			writeTestFile(t, tree, "src/latin.txt", "caf\xe9!\n", 0o644)
		}, err: "src/latin.txt: not UTF-8 text"},
		{name: "a binary base file unchanged", edit: func(t *testing.T, base, tree string) {
			writeTestFile(t, base, "src/latin.txt", "caf\xe9\n", 0o644)
			writeTestFile(t, tree, "src/latin.txt", "caf\xe9\n", 0o644)
		}},
		{name: "a quote", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, `src/q"uote.py`, "x\n", 0o644)
		}, err: "the name holds a quote, a backslash or a control character"},
		{name: "a backslash", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, `src/back\slash.py`, "x\n", 0o644)
		}, err: "the name holds a quote, a backslash or a control character"},
		{name: "a newline", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, "src/new\nline.py", "x\n", 0o644)
		}, err: "the name holds a quote, a backslash or a control character"},
		{name: "a tab", edit: func(t *testing.T, _, tree string) {
			writeTestFile(t, tree, "src/tab\t.py", "x\n", 0o644)
		}, err: "the name holds a quote, a backslash or a control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, tree := treeFixture(t)
			tc.edit(t, base, tree)
			if tc.err != "" {
				if _, err := diffTree(base, tree); err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want a refusal holding %q", err, tc.err)
				}
				return
			}
			if got := changePaths(t, base, tree); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDiffTreeBounds(t *testing.T) {
	t.Run("files", func(t *testing.T) {
		base, tree := treeFixture(t)
		for i := range maxFiles {
			writeTestFile(t, tree, fmt.Sprintf("many/f%d", i), "x\n", 0o644)
		}
		if got := changePaths(t, base, tree); len(got) != maxFiles {
			t.Fatalf("%d changes, want %d", len(got), maxFiles)
		}
		writeTestFile(t, tree, "many/one-more", "x\n", 0o644)
		if _, err := diffTree(base, tree); err == nil || !strings.Contains(err.Error(), "more than 200 changed files") {
			t.Fatalf("got %v, want more than 200 changed files", err)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		base, tree := treeFixture(t)
		writeTestFile(t, tree, "src/big1", strings.Repeat("x", 60)+"\n", 0o644)
		writeTestFile(t, tree, "src/big2", strings.Repeat("x", 60)+"\n", 0o644)
		defer func(v int64) { maxChangeBytes = v }(maxChangeBytes)
		maxChangeBytes = 122
		if got := changePaths(t, base, tree); len(got) != 2 {
			t.Fatalf("got %q, want 2 changes", got)
		}
		maxChangeBytes = 121
		if _, err := diffTree(base, tree); err == nil || !strings.Contains(err.Error(), "the changed files hold more than 121 bytes") {
			t.Fatalf("got %v, want more than 121 bytes", err)
		}
	})
	t.Run("entries", func(t *testing.T) {
		base, tree := treeFixture(t)
		defer func(v int) { maxEntries = v }(maxEntries)
		maxEntries = 5 // src, a.py, run.sh, tests, test_a.py
		if got := changePaths(t, base, tree); len(got) != 0 {
			t.Fatalf("got %q, want no change", got)
		}
		writeTestFile(t, tree, "src/c.py", "", 0o644)
		if _, err := diffTree(base, tree); err == nil || !strings.Contains(err.Error(), "the tree holds more than 5 entries") {
			t.Fatalf("got %v, want more than 5 entries", err)
		}
	})
}

func TestAddedLines(t *testing.T) {
	for _, tc := range []struct {
		c    change
		want []string
	}{
		{change{old: []byte("a\na\nb\n"), new: []byte("a\nb\na\na\nc")}, []string{"a\n", "c"}},
		{change{old: []byte("x\n"), removed: true}, nil},
		{change{new: []byte("x\r\ny\n"), added: true}, []string{"x\r\n", "y\n"}},
	} {
		if got := tc.c.addedLines(); !slices.Equal(got, tc.want) {
			t.Errorf("addedLines(%q -> %q) = %q, want %q", tc.c.old, tc.c.new, got, tc.want)
		}
	}
}

func TestApplyTree(t *testing.T) {
	for _, tc := range []struct {
		name       string
		base, tree map[string]string
		dirs       int // directories in the result, the root included
	}{
		{"a file becomes a directory", map[string]string{"a": "file\n", "b": "b\n"}, map[string]string{"a/x": "in a dir\n", "b": "b\n"}, 2},
		{"a directory becomes a file", map[string]string{"d/e/f": "x\n", "b": "b\n"}, map[string]string{"d": "a file\n", "b": "b\n"}, 1},
		{"emptied directories go", map[string]string{"d/e/f": "x\n", "d/g": "g\n"}, map[string]string{"d/g": "g\n"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			base, tree, root := filepath.Join(tmp, "base"), filepath.Join(tmp, "tree"), filepath.Join(tmp, "root")
			for dir, files := range map[string]map[string]string{base: tc.base, tree: tc.tree, root: tc.base} {
				for p, data := range files {
					writeTestFile(t, dir, p, data, 0o644)
				}
			}
			changes, err := diffTree(base, tree)
			if err != nil {
				t.Fatal(err)
			}
			if err := applyTree(changes, root); err != nil {
				t.Fatal(err)
			}
			if d := diffSnapshots(snapshot(t, root), tc.tree); d != "" {
				t.Error(d)
			}
			dirs := 0
			filepath.WalkDir(root, func(_ string, d os.DirEntry, _ error) error {
				if d.IsDir() {
					dirs++
				}
				return nil
			})
			if dirs != tc.dirs {
				t.Errorf("%d directories, want %d", dirs, tc.dirs)
			}
		})
	}
}

func rm(t *testing.T, root, p string) {
	t.Helper()
	if err := os.Remove(filepath.Join(root, p)); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, root, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, root, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(filepath.Join(root, p), mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, root, p string) {
	t.Helper()
	if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
		t.Fatal(err)
	}
}
