package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// layerFile returns the bytes and mode of the layer's entry name.
func layerFile(t *testing.T, layer []byte, name string) ([]byte, int64) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no %s in the layer: %v", name, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b, h.Mode
		}
	}
}

// A gobuild content is the program built from its sources by this
// machine's toolchain: it runs, and the same sources give the same image.
func TestGoBuildPlacesTheProgram(t *testing.T) {
	// The fixture's builds move XDG_CACHE_HOME, and with it the go
	// command's default cache: keep this machine's.
	cache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOCACHE", strings.TrimSpace(string(cache)))
	f := newFixture(t)
	src := filepath.Join(f.dir, "hello")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"go.mod":  "module hello\n\ngo 1.22\n",
		"main.go": "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"built here\\n\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.spec["contents"] = append(f.contents(), map[string]any{"type": "gobuild", "src": "hello", "dst": "/usr/local/bin/hello"})
	b1, img1 := f.build(t, newFakeEngine())
	bin, mode := layerFile(t, img1.layer, "usr/local/bin/hello")
	if mode != 0o755 {
		t.Errorf("mode %o, want 755", mode)
	}
	p := filepath.Join(t.TempDir(), "hello")
	if err := os.WriteFile(p, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(p).Output(); err != nil || string(out) != "built here\n" {
		t.Fatalf("the placed program: %q, %v", out, err)
	}
	if bytes.Contains(bin, []byte(f.dir)) {
		t.Error("the program holds the path of its sources on this machine")
	}
	// The builder's own settings of the go command do not reach it.
	t.Setenv("GOAMD64", "v3")
	b2, _ := f.build(t, newFakeEngine())
	if b1.ID != b2.ID {
		t.Errorf("image ID: got %s then %s from the same sources", b1.ID, b2.ID)
	}
	// Its module's go.mod is one of its inputs.
	spec, err := LoadSpec(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	k1, err := inputsKey(spec)
	if err != nil {
		t.Fatal(err)
	}
	rewrite(t, f, "hello/go.mod", "module hello\n\ngo 1.23\n")
	if k2, err := inputsKey(spec); err != nil || k2 == k1 {
		t.Errorf("inputs key %s after its go.mod changed (%v), want another than %s", k2, err, k1)
	}

	// Sources that do not build fail the image, naming them.
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nfunc main() { undefined() }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	_, err = Build(t.Context(), newFakeEngine(), f.dir, t.TempDir(), nil)
	if err == nil || !strings.Contains(err.Error(), "gobuild "+src) || !strings.Contains(err.Error(), "undefined") {
		t.Fatalf("got %v, want the build's error naming %s", err, src)
	}
}
