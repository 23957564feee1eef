package image

import (
	"archive/tar"
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
