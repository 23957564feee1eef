package bundle

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// refusals are the sentinels a hostile input must be refused with; each
// case must match its own and no other.
var refusals = []error{
	ErrAbsolutePath, ErrPathEscapes, ErrUncleanPath, ErrControlChar, ErrInvalidUTF8,
	ErrPathTooLong, ErrTooDeep, ErrDuplicate, ErrSymlinkEscapes, ErrSymlink, ErrHardLink,
	ErrDevice, ErrFIFO, ErrUnsupportedType, ErrTooLarge, ErrTooManyFiles, ErrChanged,
	ErrNotCanonical, ErrDigestMismatch, ErrNotBundle,
}

// checkRefused fails unless err matches want, no other sentinel, and
// sandbox.ErrInvalid.
func checkRefused(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got error %v, want %v", err, want)
	}
	for _, other := range refusals {
		if other != want && errors.Is(err, other) {
			t.Errorf("error %v also matches %v", err, other)
		}
	}
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("error %v does not match sandbox.ErrInvalid", err)
	}
}

// storeIsEmpty fails if st holds a blob or a leftover temporary file.
func storeIsEmpty(t *testing.T, st *store.Store) {
	t.Helper()
	for _, sub := range []string{"sha256", "tmp"} {
		des, err := os.ReadDir(filepath.Join(st.Dir(), sub))
		if err != nil {
			t.Fatal(err)
		}
		if len(des) != 0 {
			t.Errorf("store %s holds %d files after a refusal, want none", sub, len(des))
		}
	}
}

func TestHostileTars(t *testing.T) {
	long := strings.Repeat("d/", 2499) + "xx" // 5,000 bytes
	cases := []struct {
		name string
		tar  func(t *testing.T) io.Reader
		want error
	}{
		{"parent traversal", tarOf(reg("../x", "x")), ErrPathEscapes},
		{"traversal inside", tarOf(reg("a/../../x", "x")), ErrPathEscapes},
		{"absolute", tarOf(reg("/etc/passwd", "root::0:0::/:/bin/sh\n")), ErrAbsolutePath},
		{"symlink chain leaving the tree", tarOf(
			tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "a", Linkname: "b"}},
			tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "b", Linkname: "sub/../../outside"}},
			dirEnt("sub/"),
		), ErrSymlinkEscapes},
		{"symlink to an absolute path", tarOf(tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "etc", Linkname: "/etc"}}), ErrSymlinkEscapes},
		{"entry through a symlink", tarOf(
			tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "etc", Linkname: "sub"}},
			dirEnt("sub/"),
			reg("etc/passwd", "x"),
		), ErrSymlink},
		{"hard link to /etc/passwd", tarOf(tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "passwd", Linkname: "/etc/passwd"}}), ErrHardLink},
		{"header claiming 2^40 bytes", tarOf(tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, Size: 1 << 40}}), ErrTooLarge},
		{"a million entries", func(t *testing.T) io.Reader { return &manyEntries{n: 1_000_000} }, ErrTooManyFiles},
		{"duplicate names", tarOf(reg("a", "1"), reg("a", "2")), ErrDuplicate},
		{"duplicate after ./", tarOf(reg("a", "1"), reg("./a", "2")), ErrDuplicate},
		{"name with a newline", tarOf(reg("a\nb", "x")), ErrControlChar},
		{"invalid UTF-8", tarOf(reg("bad\xff.txt", "x")), ErrInvalidUTF8},
		{"5,000-byte path", tarOf(reg(long, "x")), ErrPathTooLong},
		{"character device", tarOf(tarEntry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}}), ErrDevice},
		{"block device", tarOf(tarEntry{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}}), ErrDevice},
		{"fifo", tarOf(tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "pipe"}}), ErrFIFO},
		{"unclean name", tarOf(reg("a//b", "x")), ErrUncleanPath},
		{"file inside a file", tarOf(reg("a", "x"), reg("a/b", "y")), ErrDuplicate},
		{"garbage", func(t *testing.T) io.Reader { return strings.NewReader(strings.Repeat("not a tar ", 100)) }, ErrNotCanonical},
		{"truncated content", func(t *testing.T) io.Reader {
			b := makeTar(t, reg("a", strings.Repeat("x", 2000)))
			return bytes.NewReader(b[:1024])
		}, ErrNotCanonical},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			r := tc.tar(t)
			_, err = IngestTar(context.Background(), st, r, Options{})
			checkRefused(t, err, tc.want)
			storeIsEmpty(t, st)
			if g, ok := r.(*manyEntries); ok && g.Generated > int(DefaultLimits().MaxFiles)+1 {
				t.Errorf("generated %d entries before refusing, want at most %d", g.Generated, DefaultLimits().MaxFiles+1)
			}
			// The broker's check refuses the same stream for the same reason
			// (a canonical stream cannot hold the cases it could not parse).
			if _, ok := r.(*manyEntries); !ok {
				_, err := CheckTar(context.Background(), tc.tar(t), DefaultLimits(), "")
				if err == nil {
					t.Errorf("CheckTar accepted it")
				}
			}
		})
	}
}

func tarOf(entries ...tarEntry) func(t *testing.T) io.Reader {
	return func(t *testing.T) io.Reader { return bytes.NewReader(makeTar(t, entries...)) }
}

func TestHostileDirs(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		build func(t *testing.T, dir string)
		want  error
	}{
		{"symlink chain leaving the tree", func(t *testing.T, dir string) {
			rel, _ := filepath.Rel(dir, outside)
			buildTree(t, dir, []node{{path: "a", link: "b"}, {path: "b", link: "sub/c"}, {path: "sub/c", link: "../" + rel + "/secret"}})
		}, ErrSymlinkEscapes},
		{"absolute symlink", func(t *testing.T, dir string) {
			buildTree(t, dir, []node{{path: "passwd", link: "/etc/passwd"}})
		}, ErrSymlinkEscapes},
		{"symlink to a directory", func(t *testing.T, dir string) {
			buildTree(t, dir, []node{{path: "sub/f", data: "x"}, {path: "l", link: "sub"}})
		}, ErrSymlink},
		{"symlink loop", func(t *testing.T, dir string) {
			buildTree(t, dir, []node{{path: "a", link: "b"}, {path: "b", link: "a"}})
		}, ErrSymlink},
		{"dangling symlink", func(t *testing.T, dir string) {
			buildTree(t, dir, []node{{path: "a", link: "nowhere"}})
		}, ErrSymlink},
		{"hard link to /etc/passwd", func(t *testing.T, dir string) {
			if err := os.Link("/etc/passwd", filepath.Join(dir, "passwd")); err != nil {
				// Another filesystem or protected_hardlinks: a link to a
				// file outside the tree is the same case.
				if err := os.Link(filepath.Join(outside, "secret"), filepath.Join(dir, "passwd")); err != nil {
					t.Skipf("cannot make a hard link here: %v", err)
				}
			}
		}, ErrHardLink},
		{"name with a newline", func(t *testing.T, dir string) {
			buildTree(t, dir, []node{{path: "a\nb", data: "x"}})
		}, ErrControlChar},
		{"invalid UTF-8", func(t *testing.T, dir string) {
			buildTree(t, dir, []node{{path: "bad\xff.txt", data: "x"}})
		}, ErrInvalidUTF8},
		{"device node", func(t *testing.T, dir string) {
			if err := syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
				t.Skipf("mknod needs CAP_MKNOD: %v", err)
			}
		}, ErrDevice},
		{"fifo", func(t *testing.T, dir string) {
			if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, ErrFIFO},
		{"socket", func(t *testing.T, dir string) {
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Close(fd)
			if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: filepath.Join(dir, "sock")}); err != nil {
				t.Skipf("bind: %v", err)
			}
		}, ErrUnsupportedType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			buildTree(t, dir, []node{{path: "ok.txt", data: "fine\n"}})
			tc.build(t, dir)
			st, err := store.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			_, err = Ingest(context.Background(), st, dir, Options{})
			checkRefused(t, err, tc.want)
			storeIsEmpty(t, st)
		})
	}
}

// TestCeilings: each ceiling refuses a tree just over it, from a directory
// and from a tar, and accepts one at it.
func TestCeilings(t *testing.T) {
	base := TreeLimits{MaxBytes: 10, MaxFiles: 4, MaxPathBytes: 12, MaxDepth: 3}
	cases := []struct {
		name  string
		nodes []node
		want  error // nil: accepted
	}{
		{"within every ceiling", []node{{path: "a/b/c", data: "0123456789"}}, nil},
		{"one byte over", []node{{path: "a", data: "0123456"}, {path: "b", data: "0123"}}, ErrTooLarge},
		{"one entry over", []node{{path: "a"}, {path: "b"}, {path: "c"}, {path: "d"}, {path: "e"}}, ErrTooManyFiles},
		{"path over", []node{{path: "abcdefghijklm"}}, ErrPathTooLong},
		{"depth over", []node{{path: "a/b/c/d"}}, ErrTooDeep},
		{"symlink copies count", []node{{path: "a", data: "012345"}, {path: "b", link: "a"}}, ErrTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			buildTree(t, dir, tc.nodes)
			_, err := WriteDir(context.Background(), dir, io.Discard, base)
			var entries []tarEntry
			for _, n := range tc.nodes {
				if n.link != "" {
					entries = append(entries, tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: n.path, Linkname: n.link}})
				} else {
					entries = append(entries, reg(n.path, n.data))
				}
			}
			_, terr := WriteTar(context.Background(), bytes.NewReader(makeTar(t, entries...)), io.Discard, base)
			for src, err := range map[string]error{"dir": err, "tar": terr} {
				if tc.want == nil {
					if err != nil {
						t.Errorf("%s: got %v, want success", src, err)
					}
					continue
				}
				if !errors.Is(err, tc.want) {
					t.Errorf("%s: got %v, want %v", src, err, tc.want)
				}
			}
		})
	}
}

// TestRefusalsMatchTheirClass: every refusal is sandbox.ErrInvalid; the
// ceilings on bytes and files are sandbox.ErrTooLarge as well, and no
// refusal belongs to another class.
func TestRefusalsMatchTheirClass(t *testing.T) {
	tooLarge := map[error]bool{ErrTooLarge: true, ErrTooManyFiles: true}
	for _, r := range refusals {
		err := fmt.Errorf("%q: %w", "x", r)
		want := map[error]bool{sandbox.ErrInvalid: true, sandbox.ErrTooLarge: tooLarge[r]}
		for _, class := range []error{sandbox.ErrInvalid, sandbox.ErrTooLarge, sandbox.ErrNotFound, sandbox.ErrConflict, sandbox.ErrUncertain, sandbox.ErrImageRefused} {
			if got := errors.Is(err, class); got != want[class] {
				t.Errorf("errors.Is(%v, %v) = %v, want %v", err, class, got, want[class])
			}
		}
	}
}
