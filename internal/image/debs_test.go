package image

import (
	"archive/tar"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildDeb makes a package with the real dpkg-deb: a setuid program, a
// hard link to it, a symlink, and a documentation file to exclude.
func buildDeb(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb is not installed")
	}
	root := filepath.Join(t.TempDir(), "pkg")
	for _, d := range []string{"DEBIAN", "usr/bin", "usr/share/doc/demo"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, text string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("DEBIAN/control", "Package: demo\nVersion: 1:1.0-1\nArchitecture: all\nMaintainer: t <t@example.invalid>\nDescription: demo\n", 0o644)
	write("usr/bin/tool", "#!/bin/sh\n", 0o4755|os.ModeSetuid)
	write("usr/share/doc/demo/README", "docs\n", 0o644)
	if err := os.Link(filepath.Join(root, "usr/bin/tool"), filepath.Join(root, "usr/bin/tool2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("tool", filepath.Join(root, "usr/bin/alias")); err != nil {
		t.Fatal(err)
	}
	deb := filepath.Join(t.TempDir(), "demo.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	return deb
}

func TestUnpackDeb(t *testing.T) {
	deb := buildDeb(t)
	got := map[string]*entry{}
	add := func(e *entry) error { got[e.name] = e; return nil }
	if err := unpackDeb(deb, "/", []string{"usr/share/doc"}, add); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		typ  byte
		mode int64
		text string
		link string
	}{
		{"usr/bin", tar.TypeDir, 0o755, "", ""},
		{"usr/bin/tool", tar.TypeReg, 0o755, "#!/bin/sh\n", ""},
		{"usr/bin/tool2", tar.TypeReg, 0o755, "#!/bin/sh\n", ""},
		{"usr/bin/alias", tar.TypeSymlink, 0o777, "", "tool"},
	} {
		e := got[c.name]
		if e == nil {
			t.Errorf("%s: missing", c.name)
			continue
		}
		if e.typ != c.typ || e.mode != c.mode || string(e.text) != c.text || e.linkname != c.link {
			t.Errorf("%s: got type %q mode %o text %q link %q, want %q %o %q %q", c.name, e.typ, e.mode, e.text, e.linkname, c.typ, c.mode, c.text, c.link)
		}
	}
	for name := range got {
		if strings.HasPrefix(name, "usr/share/doc") {
			t.Errorf("%s: excluded, but placed", name)
		}
	}
}

func TestDebPins(t *testing.T) {
	for _, c := range []struct {
		pins []string
		ok   bool
	}{
		{[]string{"libc6=2.36-9+deb12u14", "libcrypt1=1:4.4.33-2"}, true},
		{[]string{"libc6"}, false},                    // no version
		{[]string{"libc6=2.36", "libc6=2.37"}, false}, // pinned twice
		{[]string{"libc6=2.36 python3=3.11"}, false},  // not one pin
		{[]string{"../x=1"}, false},                   // not a package name
		{nil, false},                                  // none
	} {
		s := Spec{Schema: SpecSchema, Name: "t/x", Contents: []Content{{Type: "debs", Dst: "/", Packages: c.pins}}}
		if err := s.validate("."); (err == nil) != c.ok {
			t.Errorf("pins %q: got error %v, want ok=%v", c.pins, err, c.ok)
		}
	}
}

// pycompile places each source's .pyc where the interpreter looks for it,
// the same bytes every time, and refuses an interpreter of another version.
func TestPyCompile(t *testing.T) {
	const py = "/usr/bin/python3.11"
	out, err := exec.Command(py, "-c", "import platform; print(platform.python_version())").Output()
	if err != nil {
		t.Skip(py, "is not installed")
	}
	version := strings.TrimSpace(string(out))
	compile := func(c Content) (map[string]*entry, error) {
		m := map[string]*entry{
			"usr/lib/x/mod.py": {name: "usr/lib/x/mod.py", typ: tar.TypeReg, text: []byte("def f():\n    return 1\n")},
			"usr/lib/x/py2.py": {name: "usr/lib/x/py2.py", typ: tar.TypeReg, text: []byte("print 'python 2'\n")},
			"usr/lib/other.py": {name: "usr/lib/other.py", typ: tar.TypeReg, text: []byte("x = 1\n")},
		}
		got := map[string]*entry{}
		err := addPyCompile(c, "usr/lib/x", m, func(e *entry) error { got[e.name] = e; return nil })
		return got, err
	}
	c := Content{Type: "pycompile", Src: py, Python: version, Dst: "/usr/lib/x"}
	first, err := compile(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := compile(c)
	if err != nil {
		t.Fatal(err)
	}
	tag := "cpython-" + strings.ReplaceAll(version[:strings.LastIndex(version, ".")], ".", "")
	want := "usr/lib/x/__pycache__/mod." + tag + ".pyc"
	if len(first) != 1 || first[want] == nil {
		t.Fatalf("got %d entries %v, want only %s", len(first), first, want)
	}
	if !bytes.Equal(first[want].text, again[want].text) {
		t.Error("two compilations of the same source differ")
	}
	c.Python = "2.7.0"
	if _, err := compile(c); err == nil || !strings.Contains(err.Error(), "the image's is 2.7.0") {
		t.Errorf("another version: got %v", err)
	}
}
