package archtest

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath   string
	Dir          string
	Name         string
	GoFiles      []string
	CgoFiles     []string
	TestGoFiles  []string
	XTestGoFiles []string
	Deps         []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "github.com/sandboxd/sandboxd/...")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, errb.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	// go test caches a result by the files a test reads, and it cannot see
	// what go list read: reading every package's directory and sources here
	// makes a new file or a changed import run these tests again.
	for _, p := range pkgs {
		if _, err := os.ReadDir(p.Dir); err != nil {
			t.Fatal(err)
		}
		for _, f := range append(append([]string{}, p.GoFiles...), p.CgoFiles...) {
			if _, err := os.Stat(filepath.Join(p.Dir, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return pkgs
}

// Every package states its purpose once, in doc.go, and nowhere else.
func TestOnePackageCommentInDocGo(t *testing.T) {
	for _, p := range listPackages(t) {
		if len(p.GoFiles)+len(p.CgoFiles) == 0 {
			continue // test-only packages (integration suites) document themselves in their tests
		}
		var withDoc []string
		files := append(append([]string{}, p.GoFiles...), p.CgoFiles...)
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc != nil && strings.TrimSpace(af.Doc.Text()) != "" {
				withDoc = append(withDoc, f)
			}
		}
		switch {
		case p.Name == "main":
			// Commands document themselves in main.go.
			if len(withDoc) != 1 || withDoc[0] != "main.go" {
				t.Errorf("%s: package comments in %v, want exactly main.go", p.ImportPath, withDoc)
			}
		case len(withDoc) != 1 || withDoc[0] != "doc.go":
			t.Errorf("%s: package comments in %v, want exactly doc.go", p.ImportPath, withDoc)
		}
	}
}

// The public package stays small: the standard library and sandboxd only.
func TestSandboxNeedsOnlyTheStandardLibrary(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.ImportPath != "github.com/sandboxd/sandboxd/sandbox" {
			continue
		}
		for _, d := range p.Deps {
			if strings.Contains(strings.Split(d, "/")[0], ".") && !strings.HasPrefix(d, "github.com/sandboxd/sandboxd/") {
				t.Errorf("sandbox depends on %s", d)
			}
		}
		return
	}
	t.Fatal("package sandbox not found")
}
