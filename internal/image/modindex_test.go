package image

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// entries lists the action entries of a build cache.
func entries(t *testing.T, cache string) map[string]bool {
	t.Helper()
	m := map[string]bool{}
	err := filepath.WalkDir(cache, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, "-a") {
			m[filepath.Base(p)] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The go command itself finds the rekeyed index: the host's toolchain
// indexes a package and its dependencies into a cache, an "image" copy of
// their directories (the same files, every time zero, at another GOROOT)
// is loaded with that cache after rekeyModuleIndex, and the go command
// stores no index of its own: every package was a hit. Without the
// rekeying it stores one per package.
func TestRekeyedModuleIndexMatchesTheGoCommand(t *testing.T) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	goroot := strings.TrimSpace(string(out))
	tmp := t.TempDir()
	image, cache := filepath.Join(tmp, "goroot"), filepath.Join(tmp, "cache")
	env := append(os.Environ(), "GOCACHE="+cache, "TZ=", "GOFLAGS=", "GOTOOLCHAIN=local", "GOTELEMETRY=off", "GOCACHEPROG=")
	goCmd := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Env, cmd.Dir = env, tmp
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	dirs := strings.Fields(goCmd(env, "list", "-deps", "-f", "{{.Dir}}", "strings"))
	if len(dirs) < 5 {
		t.Fatalf("go list: %v", dirs)
	}
	// The image's copy: the files of each package directory and of the
	// directories above it (the go command indexes those it passes
	// through), every time zero.
	copied := map[string]bool{}
	for _, d := range dirs {
		for ; d != goroot && !copied[d]; d = filepath.Dir(d) {
			copied[d] = true
			rel, err := filepath.Rel(goroot, d)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Fatalf("%s is not in GOROOT %s", d, goroot)
			}
			files, ok := listing(d)
			if !ok {
				t.Fatalf("%s: not a directory the go command indexes", d)
			}
			for _, fi := range files {
				copyFile(t, filepath.Join(d, fi.Name()), filepath.Join(image, rel, fi.Name()))
			}
		}
	}
	err = filepath.WalkDir(image, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, time.Unix(0, 0), time.Unix(0, 0))
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := &Spec{Contents: []Content{{Type: "tree", Src: goroot, Dst: image, Exclude: []string{"test"}}}}

	list := func() int {
		t.Helper()
		before := entries(t, cache)
		goCmd(append(env, "GOROOT="+image), "list", "-deps", "strings")
		n := 0
		for e := range entries(t, cache) {
			if !before[e] {
				n++
			}
		}
		return n
	}
	saved := filepath.Join(tmp, "saved")
	if err := os.CopyFS(saved, os.DirFS(cache)); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		t.Helper()
		os.RemoveAll(cache)
		if err := os.CopyFS(cache, os.DirFS(saved)); err != nil {
			t.Fatal(err)
		}
	}
	strs := filepath.Join(goroot, "src", "strings")
	files, _ := listing(strs)
	hostKey := indexKey(strings.TrimSpace(goCmd(env, "env", "GOVERSION")), filepath.Join(goroot, "src"), strs, files, fs.FileInfo.ModTime)
	if !entries(t, cache)[hostKey+"-a"] {
		t.Fatalf("the warm cache has no index of %s under the key computed for it", strs)
	}
	if err := rekeyModuleIndex(spec, env, cache); err != nil {
		t.Fatal(err)
	}
	if entries(t, cache)[hostKey+"-a"] {
		t.Errorf("the index of %s is still under the host's key", strs)
	}
	if n := list(); n != 0 {
		t.Errorf("after rekeying, the go command stored %d index entries of its own for the image's copy, want 0", n)
	}
	// The same without the rekeying: the test can tell.
	restore()
	if n := list(); n < len(dirs)/2 {
		t.Errorf("without rekeying, the go command stored %d index entries, want one per package (%d)", n, len(dirs))
	}

	// A file the image leaves out: the host's index of its directory
	// lists it, so that index must not serve the image's copy.
	restore()
	if err := os.Remove(filepath.Join(image, "src", "strings", "clone.go")); err != nil {
		t.Fatal(err)
	}
	spec.Contents[0].Exclude = append(spec.Contents[0].Exclude, "src/strings/clone.go")
	if err := rekeyModuleIndex(spec, env, cache); err != nil {
		t.Fatal(err)
	}
	if files := goCmd(append(env, "GOROOT="+image), "list", "-f", "{{.GoFiles}}", "strings"); strings.Contains(files, "clone.go") {
		t.Errorf("the image's strings, without clone.go, is listed with it: %s", files)
	}

	// A directory the image leaves out, and all below it: no entry of
	// theirs stays, under the host's key or the image's.
	restore()
	utf8 := filepath.Join(goroot, "src", "unicode", "utf8")
	files, _ = listing(utf8)
	hostKey = indexKey(strings.TrimSpace(goCmd(env, "env", "GOVERSION")), filepath.Join(goroot, "src"), utf8, files, fs.FileInfo.ModTime)
	if !entries(t, cache)[hostKey+"-a"] {
		t.Fatalf("the warm cache has no index of %s", utf8)
	}
	before := len(entries(t, cache))
	spec.Contents[0].Exclude = []string{"test", "src/unicode"}
	if err := rekeyModuleIndex(spec, env, cache); err != nil {
		t.Fatal(err)
	}
	after := entries(t, cache)
	if after[hostKey+"-a"] || len(after) != before-2 {
		t.Errorf("with src/unicode left out: %d entries (of %d), utf8's host entry kept: %v; want unicode's and utf8's gone", len(after), before, after[hostKey+"-a"])
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
