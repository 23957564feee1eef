//go:build unix

package sandbox

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// WriteDirTree reads what WriteTree would be given for the same files,
// refuses a link or a FIFO in the tree, and refuses (never follows, never
// waits on) a file swapped for one between the walk and the read.
func TestWriteDirTree(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub", "empty"), 0o755)
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("alpha"), 0o644)
	os.WriteFile(filepath.Join(dir, "sub", "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	var got, want bytes.Buffer
	d, err := WriteDirTree(&got, dir)
	if err != nil {
		t.Fatal(err)
	}
	open := func(s string) func() (io.ReadCloser, error) {
		return func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(s)), nil }
	}
	wd, err := WriteTree(&want, []TreeEntry{
		{Name: "a.txt", Size: 5, Open: open("alpha")},
		{Name: "sub", Dir: true}, {Name: "sub/empty", Dir: true},
		{Name: "sub/run.sh", Size: 10, Exec: true, Open: open("#!/bin/sh\n")},
	})
	if err != nil || d != wd || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("got %s, want %s (%v)", d, wd, err)
	}

	for name, make := range map[string]func(p string) error{
		"a symbolic link": func(p string) error { return os.Symlink("/etc/passwd", p) },
		"a FIFO":          func(p string) error { return syscall.Mkfifo(p, 0o644) },
	} {
		bad := t.TempDir()
		if err := make(filepath.Join(bad, "x")); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteDirTree(&bytes.Buffer{}, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s in the tree: got %v, want ErrInvalid", name, err)
		}
	}

	// Swapped between the walk (Lstat) and the read.
	for name, swap := range map[string]func(p string) error{
		"a symbolic link": func(p string) error { return os.Symlink("g", p) },
		"a FIFO":          func(p string) error { return syscall.Mkfifo(p, 0o644) },
		"another file":    func(p string) error { return os.WriteFile(p, []byte("another"), 0o644) },
	} {
		d := t.TempDir()
		p := filepath.Join(d, "f")
		os.WriteFile(p, []byte("first"), 0o644)
		os.WriteFile(filepath.Join(d, "g"), []byte("linked"), 0o644)
		root, err := os.OpenRoot(d)
		if err != nil {
			t.Fatal(err)
		}
		info, err := root.Lstat("f")
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(p)
		if err := swap(p); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			f, err := openListed(root, "f", info)
			if err == nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("swapped for %s: got %v, want ErrInvalid", name, err)
			}
		case <-time.After(10 * time.Second): // a hang guard, not a measurement
			t.Errorf("swapped for %s: the open blocked", name)
		}
		root.Close()
	}
}
