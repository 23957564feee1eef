package bundle

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var pythonRules = []string{"conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth", "pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "__pycache__", "*.pyc", "vendor/*.py"}

func TestRefusedBy(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"conftest.py", "conftest.py"},
		{"pkg/deep/conftest.py", "conftest.py"},
		{"lib/site-packages/evil.pth", "*.pth"},
		{"pkg/__pycache__", "__pycache__"},
		{"vendor/x.py", "vendor/*.py"},
		{"calc.py", ""},
		{"conftest.py.txt", ""},
		{"vendor/sub/x.py", ""}, // a slash pattern matches a whole path (or a directory's) only
		{"my_conftest.py", ""},
		// A refused name refuses everything under it, whether or not the
		// workspace lists the directory itself.
		{"pkg/__pycache__/notes.txt", "__pycache__"},
		{"conftest.py/x", "conftest.py"},
		{"vendor/x.py/inner.txt", "vendor/*.py"},
	} {
		if got := RefusedBy(pythonRules, c.name); got != c.want {
			t.Errorf("%s: got pattern %q, want %q", c.name, got, c.want)
		}
	}
}

// The Python examples refuse the interpreter's start-up hooks in every form
// the interpreter imports them: a module, a package directory, an extension
// module; and every extension module and .pth file.
func TestExamplePythonBundlesRefuseInterpreterHooks(t *testing.T) {
	for _, ex := range []string{"python", "python-bridge"} {
		tmpl, err := os.ReadFile(filepath.Join("..", "..", "examples", ex, "bundle.json.in"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := DecodeManifest(bytes.ReplaceAll(tmpl, []byte("@PYTHON_IMAGE@"), []byte("sha256:"+strings.Repeat("a", 64))))
		if err != nil {
			t.Fatalf("%s: %v", ex, err)
		}
		for _, name := range []string{
			"sitecustomize.py", "sitecustomize/__init__.py", "sitecustomize.so", "sitecustomize.cpython-311-x86_64-linux-gnu.so",
			"usercustomize.py", "usercustomize/__init__.py", "usercustomize.abi3.so", "lib/usercustomize.pyc",
			"calc/_speedups.cpython-311-x86_64-linux-gnu.so", "evil.pth", "tests/conftest.py", "conftest/__init__.py",
		} {
			if RefusedBy(m.Refused(), name) == "" {
				t.Errorf("%s: %s is not refused", ex, name)
			}
		}
		for _, name := range []string{"calc.py", "calc/__init__.py", "README.md", "site.txt"} {
			if p := RefusedBy(m.Refused(), name); p != "" {
				t.Errorf("%s: %s is refused (pattern %q)", ex, name, p)
			}
		}
	}
}

// Ingestion with a bundle's rules refuses a workspace holding a refused
// path, from a directory and from a tar, naming the path; without rules the
// same workspace is accepted.
func TestIngestRefusesBundleRules(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	buildTree(t, dir, []node{{path: "calc.py", data: "def add(a, b): return a + b\n"}, {path: "tests/conftest.py", data: "import os\n"}})
	tarball := filepath.Join(t.TempDir(), "ws.tar")
	if err := os.WriteFile(tarball, makeTar(t, reg("calc.py", "x"), reg("tests/conftest.py", "y")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{dir, tarball} {
		_, err := Ingest(ctx, nil, src, Options{Refuse: pythonRules})
		if !errors.Is(err, ErrRefusedPath) || !strings.Contains(err.Error(), `"tests/conftest.py"`) {
			t.Errorf("%s: got %v, want ErrRefusedPath naming tests/conftest.py", src, err)
		}
		if _, err := Ingest(ctx, nil, src, Options{}); err != nil {
			t.Errorf("%s without rules: %v", src, err)
		}
	}
}

func TestCheckRefused(t *testing.T) {
	var buf bytes.Buffer
	if _, err := WriteTar(context.Background(), bytes.NewReader(makeTar(t, reg("calc.py", "x"), reg("a/b/evil.pth", "y"))), &buf, DefaultLimits()); err != nil {
		t.Fatal(err)
	}
	err := CheckRefused(bytes.NewReader(buf.Bytes()), pythonRules)
	if !errors.Is(err, ErrRefusedPath) || !strings.Contains(err.Error(), `"a/b/evil.pth"`) {
		t.Errorf("got %v, want ErrRefusedPath naming a/b/evil.pth", err)
	}
	if err := CheckRefused(bytes.NewReader(buf.Bytes()), []string{"*.go"}); err != nil {
		t.Errorf("no match: got %v", err)
	}
}

func TestWorkspaceRulesManifest(t *testing.T) {
	valid := exampleManifest(t)
	withRules := func(v any) []byte {
		return edit(t, valid, func(m map[string]any) { m["workspace"] = map[string]any{"refuse": v} })
	}
	m, err := DecodeManifest(withRules([]any{"conftest.py", "*_test.go"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Refused(); len(got) != 2 || got[1] != "*_test.go" {
		t.Errorf("Refused: got %q", got)
	}
	for _, c := range []struct {
		name string
		v    any
		want string
	}{
		{"empty", []any{}, "bundle.json: workspace.refuse: empty"},
		{"bad glob", []any{"[a-"}, "bundle.json: workspace.refuse[0]: "},
		{"absolute", []any{"ok.py", "/etc/x"}, "bundle.json: workspace.refuse[1]: "},
		{"escapes", []any{"../x"}, "bundle.json: workspace.refuse[0]: "},
		{"empty pattern", []any{""}, "bundle.json: workspace.refuse[0]: "},
	} {
		if _, err := DecodeManifest(withRules(c.v)); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q…", c.name, err, c.want)
		}
	}
}

// The rules are part of bundle.json, and so of the bundle digest.
func TestWorkspaceRulesInDigest(t *testing.T) {
	plain := pack(t, exampleSource(t))
	src := exampleSource(t)
	doc := edit(t, exampleManifest(t), func(m map[string]any) { m["workspace"] = map[string]any{"refuse": []any{"conftest.py"}} })
	if err := os.WriteFile(filepath.Join(src, ManifestFile), doc, 0o644); err != nil {
		t.Fatal(err)
	}
	ruled := pack(t, src)
	if ruled.Digest == plain.Digest {
		t.Fatalf("adding workspace rules kept the bundle digest %s", plain.Digest)
	}
	if got := ruled.Manifest.Refused(); len(got) != 1 || got[0] != "conftest.py" {
		t.Errorf("packed manifest rules: got %q", got)
	}
}
