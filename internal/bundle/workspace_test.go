package bundle

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"testing/iotest"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// TestChangedWhileRead: a file that changes between being listed and being
// read completely is refused.
func TestChangedWhileRead(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, p string)
	}{
		{"grows", func(t *testing.T, p string) {
			f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("more")
			f.Close()
		}},
		{"shrinks", func(t *testing.T, p string) {
			if err := os.Truncate(p, 3); err != nil {
				t.Fatal(err)
			}
		}},
		{"replaced by rename", func(t *testing.T, p string) {
			tmp := p + ".new"
			if err := os.WriteFile(tmp, []byte("same size!\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"rewritten in place, same size", func(t *testing.T, p string) {
			if err := os.WriteFile(p, []byte("SAME SIZE!\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			later := time.Now().Add(time.Minute)
			os.Chtimes(p, later, later) // a coarse clock may not have moved
		}},
		{"removed", func(t *testing.T, p string) {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}},
	}
	// The victim at the top and deeper, among files of other directories
	// (each file is opened relative to its directory's descriptor).
	for _, victim := range []string{"victim.txt", "d/e/victim.txt"} {
		for _, tc := range cases {
			t.Run(victim+"/"+tc.name, func(t *testing.T) {
				changedWhileRead(t, victim, tc.change)
			})
		}
	}
	t.Run("unchanged is accepted", func(t *testing.T) {
		dir := t.TempDir()
		buildTree(t, dir, []node{{path: "victim.txt", data: "same size?\n"}})
		testHookOpened = func(string) {}
		defer func() { testHookOpened = nil }()
		if _, err := WriteDir(context.Background(), dir, io.Discard, DefaultLimits()); err != nil {
			t.Errorf("got %v, want success", err)
		}
	})
}

func changedWhileRead(t *testing.T, victim string, change func(t *testing.T, p string)) {
	dir := t.TempDir()
	buildTree(t, dir, []node{{path: "a/before.txt", data: "x"}, {path: victim, data: "same size?\n"}, {path: "z/after.txt", data: "y"}})
	refusedIfChangedAt(t, dir, victim, func() { change(t, filepath.Join(dir, victim)) })
}

// refusedIfChangedAt ingests dir, running change once when the file at is
// opened, and wants ErrChanged with nothing stored.
func refusedIfChangedAt(t *testing.T, dir, at string, change func()) {
	t.Helper()
	fired := false
	testHookOpened = func(name string) {
		if name == at && !fired {
			fired = true
			change()
		}
	}
	defer func() { testHookOpened = nil }()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = Ingest(context.Background(), st, dir, Options{})
	if !fired {
		t.Fatal("the hook did not run")
	}
	checkRefused(t, err, ErrChanged)
	storeIsEmpty(t, st)
}

// TestTarMatchesDir: a tar of the golden tree, in any order, with "./"
// prefixes, missing parent directories, a root entry and a pax global
// header, ingests to the same digest as the directory; so does a symlink
// inside the tree, kept as a copy of its file.
func TestTarMatchesDir(t *testing.T) {
	dir := t.TempDir()
	buildTree(t, dir, goldenTree)
	want := digestDir(t, dir)

	var entries []tarEntry
	entries = append(entries, tarEntry{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "0123abcd"}}})
	entries = append(entries, dirEnt("./"))
	for i := len(goldenTree) - 1; i >= 0; i-- { // reversed
		n := goldenTree[i]
		if n.path[len(n.path)-1] == '/' {
			entries = append(entries, dirEnt("./"+n.path))
			continue
		}
		e := reg("./"+n.path, n.data)
		e.hdr.Mode = int64(n.mode)
		if n.mode == 0 {
			e.hdr.Mode = 0o664
		}
		e.hdr.Uid, e.hdr.Uname = 1000, "someone"
		entries = append(entries, e)
	}
	var out bytes.Buffer
	sum, err := WriteTar(context.Background(), bytes.NewReader(makeTar(t, entries...)), &out, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Digest != want {
		t.Errorf("tar digest: got %s, want %s", sum.Digest, want)
	}
	if sum.Files != 6 || sum.Dirs != 6 {
		t.Errorf("counts: got %d files %d dirs, want 6 files 6 dirs", sum.Files, sum.Dirs)
	}
	if sum.Digest != "sha256:"+sha256Hex(out.Bytes()) || sum.Size != int64(out.Len()) {
		t.Errorf("summary %+v does not describe the %d bytes written", sum, out.Len())
	}

	// Symlinks inside the tree become copies of their files.
	linked := t.TempDir()
	buildTree(t, linked, []node{{path: "sub/f", data: "content\n", mode: 0o755}, {path: "l", link: "sub/../sub/./f"}, {path: "sub/m", link: "../l"}})
	copied := t.TempDir()
	buildTree(t, copied, []node{{path: "sub/f", data: "content\n", mode: 0o755}, {path: "l", data: "content\n", mode: 0o755}, {path: "sub/m", data: "content\n", mode: 0o755}})
	if got, want := digestDir(t, linked), digestDir(t, copied); got != want {
		t.Errorf("symlinked tree: got %s, want the copied tree's %s", got, want)
	}
	tsum, err := WriteTar(context.Background(), bytes.NewReader(makeTar(t,
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "sub/../sub/./f"}},
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "sub/m", Linkname: "../l"}},
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "sub/f", Mode: 0o700, Size: 8}, data: "content\n"},
	)), io.Discard, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if want := digestDir(t, copied); tsum.Digest != want {
		t.Errorf("symlinked tar: got %s, want %s", tsum.Digest, want)
	}
}

// TestExpectedDigestIsAClaim: a matching claim stores the workspace, a
// different or malformed one is refused and stores nothing.
func TestExpectedDigestIsAClaim(t *testing.T) {
	dir := t.TempDir()
	buildTree(t, dir, goldenTree)
	want := digestDir(t, dir)
	cases := []struct {
		expect string
		ok     bool
	}{
		{"", true},
		{want, true},
		{"sha256:" + sha256Hex([]byte("something else")), false},
		{"sha256:ABC", false},
	}
	for _, tc := range cases {
		st, err := store.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		sum, err := Ingest(context.Background(), st, dir, Options{Expect: tc.expect})
		if tc.ok {
			if err != nil || sum.Digest != want || !st.Has(want) {
				t.Errorf("expect %q: got %v (stored %v), want %s stored", tc.expect, err, st.Has(want), want)
			}
			if err := st.Verify(want); err != nil {
				t.Errorf("stored blob: %v", err)
			}
			continue
		}
		checkRefused(t, err, ErrDigestMismatch)
		storeIsEmpty(t, st)
	}
}

// TestCheckTar: the writer's output passes; every deviation from the
// canonical form is refused.
func TestCheckTar(t *testing.T) {
	dir := t.TempDir()
	buildTree(t, dir, goldenTree)
	var canon bytes.Buffer
	sum, err := WriteDir(context.Background(), dir, &canon, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	got, err := CheckTar(context.Background(), bytes.NewReader(canon.Bytes()), DefaultLimits(), sum.Digest)
	if err != nil || got != sum {
		t.Fatalf("canonical stream: got %+v, %v; want %+v", got, err, sum)
	}
	_, err = CheckTar(context.Background(), bytes.NewReader(canon.Bytes()), DefaultLimits(), "sha256:"+sha256Hex(nil))
	checkRefused(t, err, ErrDigestMismatch)

	epoch := time.Unix(0, 0)
	cases := []struct {
		name    string
		entries []tarEntry
		want    error
	}{
		{"owner", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o644, Uid: 1000, ModTime: epoch, Format: tar.FormatPAX}}}, ErrNotCanonical},
		{"user name", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o644, Uname: "root", ModTime: epoch, Format: tar.FormatPAX}}}, ErrNotCanonical},
		{"mtime", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o644, ModTime: time.Unix(1, 0), Format: tar.FormatPAX}}}, ErrNotCanonical},
		{"mode", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o4755, ModTime: epoch, Format: tar.FormatPAX}}}, ErrNotCanonical},
		{"gnu format", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o644, ModTime: epoch, Format: tar.FormatGNU}}}, ErrNotCanonical},
		{"unsorted", []tarEntry{canonReg("b"), canonReg("a")}, ErrNotCanonical},
		{"duplicate", []tarEntry{canonReg("a"), canonReg("a")}, ErrDuplicate},
		{"missing directory", []tarEntry{canonReg("a/b")}, ErrNotCanonical},
		{"leading ./", []tarEntry{canonReg("./a")}, ErrUncleanPath},
		{"symlink", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "a", Linkname: "b", ModTime: epoch, Format: tar.FormatPAX}}}, ErrSymlink},
		{"xattr", []tarEntry{{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "a", Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX, PAXRecords: map[string]string{"SCHILY.xattr.user.x": "1"}}}}, ErrNotCanonical},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CheckTar(context.Background(), bytes.NewReader(makeTar(t, tc.entries...)), DefaultLimits(), "")
			checkRefused(t, err, tc.want)
		})
	}
	t.Run("trailing bytes", func(t *testing.T) {
		b := append(bytes.Clone(canon.Bytes()), make([]byte, 512)...)
		_, err := CheckTar(context.Background(), bytes.NewReader(b), DefaultLimits(), "")
		checkRefused(t, err, ErrNotCanonical)
	})
	// The stream is compared with its canonical form as both go: files
	// larger than any read, read a byte at a time or in large pieces, and
	// more trailing bytes than the comparison keeps.
	big := t.TempDir()
	if err := os.MkdirAll(filepath.Join(big, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{3<<20 + 7, 0, 1, 9 << 20} {
		if err := os.WriteFile(filepath.Join(big, "d", fmt.Sprintf("f%d", i)), bytes.Repeat([]byte{byte(i + 1)}, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var bigTar bytes.Buffer
	bigSum, err := WriteDir(context.Background(), big, &bigTar, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []io.Reader{
		bytes.NewReader(bigTar.Bytes()),
		iotest.HalfReader(bytes.NewReader(bigTar.Bytes())),
		bufio.NewReaderSize(bytes.NewReader(bigTar.Bytes()), 8<<20),
	} {
		if got, err := CheckTar(context.Background(), r, DefaultLimits(), bigSum.Digest); err != nil || got != bigSum {
			t.Fatalf("a canonical stream of large files (%T): got %+v, %v; want %+v", r, got, err, bigSum)
		}
	}
	t.Run("more trailing bytes than are kept", func(t *testing.T) {
		b := append(bytes.Clone(bigTar.Bytes()), make([]byte, maxPending+1)...)
		_, err := CheckTar(context.Background(), bytes.NewReader(b), DefaultLimits(), "")
		checkRefused(t, err, ErrNotCanonical)
	})
}

func canonReg(name string) tarEntry {
	return tarEntry{hdr: *canonicalHeader(name, false, false, 0)}
}

func TestLimitsValidate(t *testing.T) {
	for _, l := range []TreeLimits{{}, {MaxBytes: 1, MaxFiles: 1, MaxPathBytes: 5000, MaxDepth: 1}, {MaxBytes: -1, MaxFiles: 1, MaxPathBytes: 1, MaxDepth: 1}} {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v: got nil, want an error", l)
		}
		if _, err := CheckTar(context.Background(), bytes.NewReader(nil), l, ""); err == nil {
			t.Errorf("CheckTar with %+v: got nil, want an error", l)
		}
	}
	if err := DefaultLimits().Validate(); err != nil {
		t.Errorf("DefaultLimits: %v", err)
	}
}

// A tar written into a store writer that holds bytes already is hashed
// by the tar writer itself: its digest is the tar's, not the blob's.
func TestTarDigestIntoAWriterHoldingBytes(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	var plain bytes.Buffer
	want, err := WriteDir(context.Background(), dir, &plain, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	w, _ := st.NewWriter(-1)
	defer w.Abort()
	w.Write([]byte("before"))
	got, err := WriteDir(context.Background(), dir, w, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != want.Digest {
		t.Fatalf("digest %s, want the tar's %s", got.Digest, want.Digest)
	}
}

// A directory swapped for another (or for a link out of the tree) after it
// was listed and before its files are read is refused. Two checks stand in
// the way, each enough here: the directory opened to read its files must
// be the one listed (device and inode), and each file read must be the one
// listed (its identity, size and times; a file moved keeps its inode but
// not its change time).
func TestDirectorySwappedBeforeItsFilesAreRead(t *testing.T) {
	outside := t.TempDir()
	buildTree(t, outside, []node{{path: "victim.txt", data: "other text\n"}})
	swaps := map[string]func(t *testing.T, d string){
		"another directory": func(t *testing.T, d string) {
			os.Rename(d, d+".old")
			buildTree(t, d, []node{{path: "victim.txt", data: "other text\n"}})
		},
		"a link out of the tree": func(t *testing.T, d string) {
			os.Rename(d, d+".old")
			if err := os.Symlink(outside, d); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, swap := range swaps {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			buildTree(t, dir, []node{{path: "a/before.txt", data: "x"}, {path: "d/e/victim.txt", data: "same size?\n"}})
			refusedIfChangedAt(t, dir, "a/before.txt", func() { swap(t, filepath.Join(dir, "d", "e")) })
		})
	}
}
