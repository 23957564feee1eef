package bundle

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares got with testdata/golden/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(p, []byte(got+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != strings.TrimSpace(string(want)) {
		t.Errorf("%s: got %s, want %s", name, got, strings.TrimSpace(string(want)))
	}
}

func digestDir(t *testing.T, dir string) string {
	t.Helper()
	sum, err := WriteDir(context.Background(), dir, &bytes.Buffer{}, DefaultLimits())
	if err != nil {
		t.Fatalf("WriteDir: %v", err)
	}
	return sum.Digest
}

func walkTree(t *testing.T, dir string, fn func(p string, fi os.FileInfo) error) {
	t.Helper()
	if err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return fn(p, fi)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenDigest: the same tree gives the same, checked-in digest however
// its files were touched, permissioned or owned; one changed byte or a
// removed execute bit changes it.
func TestGoldenDigest(t *testing.T) {
	base := t.TempDir()
	buildTree(t, base, goldenTree)
	want := digestDir(t, base)
	golden(t, "workspace.digest", want)

	same := []struct {
		name   string
		mutate func(t *testing.T, dir string)
	}{
		{"touch", func(t *testing.T, dir string) {
			later := time.Now().Add(time.Hour)
			walkTree(t, dir, func(p string, _ os.FileInfo) error { return os.Chtimes(p, later, later) })
		}},
		{"chmod group and other bits", func(t *testing.T, dir string) {
			walkTree(t, dir, func(p string, fi os.FileInfo) error {
				return os.Chmod(p, fi.Mode().Perm()&0o700|0o077)
			})
		}},
		{"chmod owner-only", func(t *testing.T, dir string) {
			walkTree(t, dir, func(p string, fi os.FileInfo) error { return os.Chmod(p, fi.Mode().Perm()&0o700) })
		}},
		{"setuid setgid sticky", func(t *testing.T, dir string) {
			walkTree(t, dir, func(p string, fi os.FileInfo) error {
				return os.Chmod(p, fi.Mode().Perm()|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
			})
		}},
		{"owner", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("chown needs root; owner independence is then covered only by the header rules")
			}
			walkTree(t, dir, func(p string, _ os.FileInfo) error { return os.Lchown(p, 4321, 8765) })
		}},
	}
	for _, tc := range same {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			buildTree(t, dir, goldenTree)
			tc.mutate(t, dir)
			if got := digestDir(t, dir); got != want {
				t.Errorf("got %s, want %s", got, want)
			}
		})
	}
	for _, umask := range []int{0o000, 0o077, 0o027} {
		t.Run("umask", func(t *testing.T) {
			old := syscall.Umask(umask)
			dir := t.TempDir()
			buildTree(t, dir, goldenTree)
			syscall.Umask(old)
			if got := digestDir(t, dir); got != want {
				t.Errorf("umask %04o: got %s, want %s", umask, got, want)
			}
		})
	}

	differ := []struct {
		name   string
		mutate func(t *testing.T, dir string)
	}{
		{"one changed byte", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("hello, grades\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"execute bit removed", func(t *testing.T, dir string) {
			if err := os.Chmod(filepath.Join(dir, "bin/run.sh"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"empty directory removed", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "empty")); err != nil {
				t.Fatal(err)
			}
		}},
		{"file renamed", func(t *testing.T, dir string) {
			if err := os.Rename(filepath.Join(dir, "a-c"), filepath.Join(dir, "a-d")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range differ {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			buildTree(t, dir, goldenTree)
			tc.mutate(t, dir)
			if got := digestDir(t, dir); got == want {
				t.Errorf("got the unchanged digest %s, want a different one", got)
			}
		})
	}
}

// TestCanonicalBytes pins the exact form of the stream, header by header.
func TestCanonicalBytes(t *testing.T) {
	dir := t.TempDir()
	buildTree(t, dir, goldenTree)
	var buf bytes.Buffer
	if _, err := WriteDir(context.Background(), dir, &buf, DefaultLimits()); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range readHeaders(t, buf.Bytes()) {
		got = append(got, h)
	}
	want := []string{
		"README.md 48 0644 0/0 '' '' 0 size=14",
		"a/ 53 0755 0/0 '' '' 0 size=0",
		"a-c 48 0644 0/0 '' '' 0 size=25", // '-' sorts before '/'
		"a/b.txt 48 0644 0/0 '' '' 0 size=9",
		"bin/ 53 0755 0/0 '' '' 0 size=0",
		"bin/run.sh 48 0755 0/0 '' '' 0 size=18",
		"empty/ 53 0755 0/0 '' '' 0 size=0",
		"src/ 53 0755 0/0 '' '' 0 size=0",
		"src/deep/ 53 0755 0/0 '' '' 0 size=0",
		"src/deep/er/ 53 0755 0/0 '' '' 0 size=0",
		"src/deep/er/main.go 48 0644 0/0 '' '' 0 size=29",
		"src/héllo.txt 48 0644 0/0 '' '' 0 size=38",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("headers:\ngot\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
