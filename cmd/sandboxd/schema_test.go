package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
	"github.com/santhosh-tekuri/jsonschema/v5"
)

// schemaBase is the $id prefix of every schema in docs/schema.
const schemaBase = "https://sandboxd.example/schema/"

// compileSchema compiles docs/schema/NAME with every schema of the
// directory available to its $refs.
func compileSchema(name string) (*jsonschema.Schema, error) {
	dir := filepath.Join("..", "..", "docs", "schema")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no schemas in %s: %v", dir, err)
	}
	c := jsonschema.NewCompiler()
	c.Draft = jsonschema.Draft2020
	c.AssertFormat = true
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var doc struct {
			ID string `json:"$id"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if want := schemaBase + filepath.Base(f); doc.ID != want {
			return nil, fmt.Errorf("%s: $id %q, want %q", f, doc.ID, want)
		}
		if err := c.AddResource(doc.ID, bytes.NewReader(b)); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return c.Compile(schemaBase + name)
}

// validateJSON checks that out is exactly one line holding one JSON value
// that docs/schema/NAME accepts.
func validateJSON(name string, out []byte) error {
	s, err := compileSchema(name)
	if err != nil {
		return err
	}
	if bytes.Count(out, []byte("\n")) != 1 || !bytes.HasSuffix(out, []byte("\n")) {
		return fmt.Errorf("--json output is not one line: %q", out)
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		return fmt.Errorf("--json output: %w", err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s: %#v", name, err)
	}
	return nil
}

// cmdSchema is the scripts' `schema NAME FILE`: FILE (or "stdout") holds
// one line of JSON that docs/schema/NAME accepts.
func cmdSchema(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: schema NAME FILE|stdout")
	}
	var out []byte
	if args[1] == "stdout" {
		out = []byte(ts.ReadFile("stdout"))
	} else {
		out = []byte(ts.ReadFile(args[1]))
	}
	err := validateJSON(args[0], out)
	switch {
	case err != nil && !neg:
		ts.Fatalf("%v", err)
	case err == nil && neg:
		ts.Fatalf("%s accepted %s", args[0], args[1])
	}
}

func TestSchemasCompile(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "docs", "schema", "*.json"))
	if len(files) < 8 {
		t.Fatalf("%d schemas in docs/schema, want one per --json output", len(files))
	}
	for _, f := range files {
		if _, err := compileSchema(filepath.Base(f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// --version, version and version --json name the same build.
func TestVersionJSON(t *testing.T) {
	shim, err := os.Executable() // any file: its digest is what is printed
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SANDBOXD_SHIM", shim)
	code, out, _ := runCmd(t, run, "version", "--json")
	if code != 0 {
		t.Fatalf("version --json exited %d", code)
	}
	if err := validateJSON("version.json", []byte(out)); err != nil {
		t.Error(err)
	}
	var v versionInfo
	json.Unmarshal([]byte(out), &v)
	if v.ShimPath != shim || v.Version != version || v.Commit == "" {
		t.Errorf("version --json: %+v", v)
	}
	code, text, _ := runCmd(t, run, "--version")
	if code != 0 || !strings.HasPrefix(text, "sandboxd "+version+"\n") || !strings.Contains(text, "helper:  "+v.ShimDigest+"\n") || !strings.Contains(text, "commit:  "+v.Commit) {
		t.Errorf("--version exited %d:\n%s", code, text)
	}
	if _, again, _ := runCmd(t, run, "version"); again != text {
		t.Errorf("version and --version differ:\n%s\n%s", again, text)
	}
	if code, _, _ := runCmd(t, run, "version", "extra"); code != exitUsage {
		t.Errorf("version extra exited %d, want usage", code)
	}
}

// bundle inspect --json describes a packed bundle as the schema says, and
// a document that is not one is refused (the check can fail).
func TestBundleInspectJSON(t *testing.T) {
	layout := filepath.Join(t.TempDir(), "layout")
	if code, _, stderr := runCmd(t, run, "bundle", "pack", "--quiet", filepath.Join("..", "..", "internal", "bundle", "testdata", "example-bundle"), "-o", layout); code != 0 {
		t.Fatalf("bundle pack exited %d: %s", code, stderr)
	}
	code, out, _ := runCmd(t, run, "bundle", "inspect", "--json", layout)
	if code != 0 {
		t.Fatalf("bundle inspect --json exited %d", code)
	}
	if err := validateJSON("bundle-inspect.json", []byte(out)); err != nil {
		t.Error(err)
	}
	if err := validateJSON("bundle-inspect.json", []byte(strings.Replace(out, `"layer_size":`, `"layer_size":-`, 1))); err == nil {
		t.Error("the schema accepted a negative layer size")
	}
	if err := validateJSON("version.json", []byte(out)); err == nil {
		t.Error("version.json accepted bundle inspect's output")
	}
}

// docs/ci.md's exit-code table is the commands' constants.
func TestCIDocExitCodes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "ci.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		code int
		what string
	}{{exitPassed, "passed"}, {exitVerdictFail, "failed"}, {exitInconclusive, "inconclusive"}, {exitBadInput, "bad input"}, {exitInfraError, "infrastructure"}, {exitUsage, "usage"}} {
		if row := fmt.Sprintf("\n| %d | %s", c.code, c.what); !strings.Contains(string(b), row) {
			t.Errorf("docs/ci.md has no row %q", strings.TrimSpace(row))
		}
	}
}
