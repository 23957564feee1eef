package bundle

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// node describes one member of a test tree.
type node struct {
	path string
	data string
	mode os.FileMode // permission bits; a trailing "/" in path makes a directory
	link string      // symlink target, if set
}

// buildTree creates nodes under dir.
func buildTree(t *testing.T, dir string, nodes []node) {
	t.Helper()
	for _, n := range nodes {
		p := filepath.Join(dir, n.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case n.link != "":
			if err := os.Symlink(n.link, p); err != nil {
				t.Fatal(err)
			}
		case n.path[len(n.path)-1] == '/':
			if err := os.MkdirAll(p, n.mode|0o700); err != nil {
				t.Fatal(err)
			}
		default:
			mode := n.mode
			if mode == 0 {
				mode = 0o644
			}
			if err := os.WriteFile(p, []byte(n.data), mode); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// goldenTree is the tree behind the golden workspace digest. "a-c" sorts
// between "a" and "a/…" bytewise, which a depth-first walk would get wrong.
var goldenTree = []node{
	{path: "README.md", data: "hello, grader\n"},
	{path: "a/b.txt", data: "inside a\n"},
	{path: "a-c", data: "sorts before a/ bytewise\n"},
	{path: "bin/run.sh", data: "#!/bin/sh\necho ok\n", mode: 0o755},
	{path: "empty/", mode: 0o755},
	{path: "src/deep/er/main.go", data: "package main\n\nfunc main() {}\n"},
	{path: "src/héllo.txt", data: "non-ASCII names get a PAX path record\n"},
}

// tarEntry is one header (and content) of a hand-made, possibly hostile tar.
type tarEntry struct {
	hdr  tar.Header
	data string
}

func reg(name, data string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}, data: data}
}

func dirEnt(name string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

// makeTar writes entries as given; a header whose Size exceeds its data is
// written without content (the stream ends there).
func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.ModTime.IsZero() && h.Typeflag != tar.TypeXGlobalHeader {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("header %q: %v", h.Name, err)
		}
		if int64(len(e.data)) < h.Size {
			tw.Flush() // fails: content missing; the header bytes are out
			return buf.Bytes()
		}
		if _, err := io.WriteString(tw, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// manyEntries generates a tar of n empty files lazily, so that a stream of
// a million entries costs nothing until it is read. Generated counts the
// entries produced so far.
type manyEntries struct {
	n, Generated int
	buf          bytes.Buffer
	done         bool
}

func (g *manyEntries) Read(p []byte) (int, error) {
	for g.buf.Len() == 0 {
		if g.done {
			return 0, io.EOF
		}
		if g.Generated == g.n {
			g.buf.Write(make([]byte, 1024))
			g.done = true
			break
		}
		tw := tar.NewWriter(&g.buf)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("f%07d", g.Generated), Mode: 0o644, ModTime: time.Unix(0, 0)})
		tw.Flush()
		g.Generated++
	}
	return g.buf.Read(p)
}

// readHeaders lists a tar's headers as "name typeflag mode uid/gid 'uname' 'gname' mtime size=N".
func readHeaders(t *testing.T, data []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %d %04o %d/%d '%s' '%s' %d size=%d", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime.Unix(), h.Size))
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
